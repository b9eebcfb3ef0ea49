//! Certificates for TLS tests, made with `openssl` in a temporary directory:
//! a CA, a server certificate for `127.0.0.1` and `localhost`, a client
//! certificate, and a server certificate for another name (to test that a
//! mismatch is refused).

use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

/// A CA and the certificates it signed, as PEM files in a temporary
/// directory that lives as long as this value.
#[derive(Debug)]
pub struct TestCertificates {
    dir: TempDir,
}

impl TestCertificates {
    /// Makes the CA and every certificate (EC P-256, valid for two days).
    /// Panics with an install hint if `openssl` is missing.
    pub fn make() -> Self {
        let certificates = TestCertificates {
            dir: tempfile::tempdir().expect("temp dir for certificates"),
        };
        certificates.run(&[
            "req",
            "-x509",
            "-nodes",
            "-days",
            "2",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=distlock test CA",
        ]);
        certificates.sign(
            "server",
            "/CN=localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        );
        certificates.sign("client", "/CN=lock-client", "extendedKeyUsage=clientAuth");
        certificates.sign(
            "wrong-name",
            "/CN=elsewhere.invalid",
            "subjectAltName=DNS:elsewhere.invalid",
        );
        certificates
    }

    /// A key and a certificate `name.key`, `name.crt` signed by the CA.
    fn sign(&self, name: &str, subject: &str, extension: &str) {
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        self.run(&[
            "req",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ]);
        std::fs::write(self.dir.path().join(&ext), format!("{extension}\n"))
            .expect("write the extension file");
        self.run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ]);
    }

    fn run(&self, args: &[&str]) {
        let openssl = crate::find_binary("openssl", "openssl");
        let output = Command::new(openssl)
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run openssl");
        assert!(
            output.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The directory holding every file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// `name.crt`: `server`, `client` or `wrong-name`.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.crt"))
    }

    /// `name.key`, the private key of [`cert`](Self::cert).
    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.key"))
    }
}
