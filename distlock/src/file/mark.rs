//! Durable marks ([`Locker::advance_mark`](crate::Locker::advance_mark)) for
//! the file backend: one small file per mark beside the lock files, updated
//! under its own `flock`.

use std::fs::{File, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use super::record::read_small_file;
use super::{with_path, LockDir, BACKEND};
use crate::{Error, MarkAdvance, Result};

const MARK_MAGIC: &str = "distlock-mark-v1";

/// How long an advance waits for another process's advance of the same mark.
/// Each holds the mark's `flock` for one read and one write, so only a
/// stopped or hung process holds it this long.
const LOCK_WAIT: Duration = Duration::from_secs(5);
const RETRY_EVERY: Duration = Duration::from_millis(2);

/// Raises the mark stored in the file `name` of `dir` to `value` if it is
/// lower or absent.
pub(super) async fn advance(
    dir: &LockDir,
    name: &str,
    value: i64,
    durable: bool,
) -> Result<MarkAdvance> {
    let path = &dir.path_of(name);
    let io_error = |e| Error::backend(BACKEND, "advance_mark", with_path(e, path));
    let file = dir.open_file(name, true).map_err(io_error)?;
    lock_briefly(&file, path).await?;
    let advance = match read(&file, path)? {
        Some(current) if current >= value => MarkAdvance::AlreadyAt { current },
        previous => {
            write(&file, value).map_err(io_error)?;
            if durable {
                file.sync_data().map_err(io_error)?;
            }
            MarkAdvance::Advanced { previous }
        }
    };
    // Closing `file` drops the flock, after the write.
    Ok(advance)
}

/// Takes the mark file's `flock` without blocking the runtime: another
/// process holds it only for one read and one write.
async fn lock_briefly(file: &File, path: &Path) -> Result<()> {
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                tokio::time::sleep(RETRY_EVERY).await;
            }
            Err(TryLockError::WouldBlock) => {
                return Err(Error::DeadlineExceeded {
                    backend: BACKEND,
                    operation: "advance_mark",
                    after: LOCK_WAIT,
                })
            }
            Err(TryLockError::Error(e)) => {
                return Err(Error::backend(BACKEND, "advance_mark", with_path(e, path)))
            }
        }
    }
}

fn read(file: &File, path: &Path) -> Result<Option<i64>> {
    // Never guess: a mark read as absent would let a finished tick run again.
    read_small_file(
        file,
        path,
        64,
        "read the mark file",
        parse,
        "does not hold a distlock mark; remove it only if no scheduler uses it",
    )
}

fn parse(text: &str) -> Option<i64> {
    let mut fields = text.split_whitespace();
    if fields.next()? != MARK_MAGIC {
        return None;
    }
    let value = fields.next()?.parse().ok()?;
    fields.next().is_none().then_some(value)
}

fn write(file: &File, value: i64) -> io::Result<()> {
    // Fixed width (sign and 19 digits hold every i64), so one positioned
    // write replaces the whole record and the file never shrinks.
    let text = format!("{MARK_MAGIC} {value:+020}\n");
    file.write_all_at(text.as_bytes(), 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips_in_one_width() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let file = LockDir::open(dir.path())
            .unwrap()
            .open_file("m", true)
            .unwrap();
        let mut widths = Vec::new();
        for value in [i64::MIN, -1, 0, 7, i64::MAX] {
            write(&file, value).unwrap();
            assert_eq!(read(&file, &path).unwrap(), Some(value));
            widths.push(file.metadata().unwrap().len());
        }
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{widths:?}");
    }

    #[test]
    fn a_foreign_file_is_an_error_not_an_absent_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        std::fs::write(&path, "hello\n").unwrap();
        let file = LockDir::open(dir.path())
            .unwrap()
            .open_file("m", true)
            .unwrap();
        let err = read(&file, &path).unwrap_err().to_string();
        assert!(err.contains("does not hold a distlock mark"), "{err}");
    }

    #[tokio::test]
    async fn a_mark_locked_by_a_stuck_process_is_a_bounded_outage() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        let dir = LockDir::open(dir.path()).unwrap();
        let stuck = dir.open_file("m", true).unwrap();
        stuck.try_lock().unwrap();
        let err = advance(&dir, "m", 1, false).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::DeadlineExceeded {
                    operation: "advance_mark",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
