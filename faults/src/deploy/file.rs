//! The file backend: `flock` in a private directory. No server, so only
//! the holder's own faults apply.

use tempfile::TempDir;

use super::Deployment;

/// A lock directory of its own.
#[derive(Debug)]
pub struct FileDeployment {
    dir: TempDir,
}

impl FileDeployment {
    /// Creates the directory.
    pub fn start() -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("distlock-faults-")
            .tempdir()
            .map_err(|err| format!("cannot create a lock directory: {err}"))?;
        Ok(FileDeployment { dir })
    }
}

impl Deployment for FileDeployment {
    fn url(&self) -> String {
        format!("file://{}", self.dir.path().display())
    }

    fn server_ports(&self) -> Vec<u16> {
        Vec::new()
    }
}
