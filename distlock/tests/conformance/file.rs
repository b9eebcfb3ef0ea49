//! The conformance suite on the `flock` backend, every client a separate
//! `FileLocker` on one directory (as separate processes would be).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use distlock::file::FileLocker;
use distlock::Locker;

fn lock_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
        .to_path_buf()
}

distlock::conformance_suite!(|| async {
    Arc::new(FileLocker::new(lock_dir()).expect("lock dir")) as Arc<dyn Locker>
});
