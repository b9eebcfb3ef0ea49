//! Who holds a file lock, without taking it: the kernel's table of `flock`s
//! (`/proc/locks`) says which lock files are locked and by which process;
//! the lock file's record says the rest.
//!
//! Probing with `flock(LOCK_NB)` instead would hold the lock for a moment,
//! and a `try_lock` by a real contender in that moment would report
//! contention for a free lock.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::time::Duration;

use super::{read_record, with_path, LockDir, Record, BACKEND};
use crate::inspect::HeldLock;
use crate::{Error, Result};

/// A lock file is identified by its device and inode, as `/proc/locks`
/// names it.
type FileId = (u64, u64);

/// How a lock file is `flock`ed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Exclusively (`LOCK_EX`), by the process with this pid.
    Write(u32),
    /// Shared (`LOCK_SH`), by one or more processes.
    Read,
}

/// How often a record written by another holder than the one the kernel
/// names is read again: the new holder writes its record right after its
/// `flock` is granted, so a mismatch lasts microseconds.
const STALE_RECORD_RETRIES: u32 = 20;
const STALE_RECORD_PAUSE: Duration = Duration::from_millis(1);

/// What the file `name` of `dir` (the lock file of `key`) is held by, if
/// anyone.
pub(super) async fn one(dir: &LockDir, name: &str, key: &str) -> Result<Option<HeldLock>> {
    let path = &dir.path_of(name);
    for attempt in 0..=STALE_RECORD_RETRIES {
        let id = match dir.file_id(name) {
            Ok(id) => id,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::backend(BACKEND, "inspect", with_path(e, path))),
        };
        let holder_pid = match flock_holders()?.get(&id) {
            None => return Ok(None),
            Some(Access::Write(pid)) => *pid,
            Some(Access::Read) => return shared(dir, name, key),
        };
        let record = match dir.open_file(name, false) {
            Ok(file) => read_record(&file, path)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::backend(BACKEND, "inspect", with_path(e, path))),
        };
        match record {
            Some(record) if record.pid == holder_pid => return Ok(Some(held(key, record))),
            _ if attempt < STALE_RECORD_RETRIES => tokio::time::sleep(STALE_RECORD_PAUSE).await,
            // Locked by a process whose record is not (yet) there: held, by
            // an unknown holder, rather than reported with a former one's.
            _ => break,
        }
    }
    Ok(Some(HeldLock::new(key)))
}

/// Every lock file in `dir` held now whose key starts with `prefix`, sorted
/// by key. A file whose record names no key (written before holder records)
/// is named by its file name if that is the key itself (`k-<key>.lock`), and
/// left out if its name is a hash.
pub(super) async fn all(dir: &LockDir, prefix: &str) -> Result<Vec<HeldLock>> {
    let holders = flock_holders()?;
    let names = dir
        .names()
        .map_err(|e| Error::backend(BACKEND, "list", with_path(e, dir.path())))?;
    let mut listed = Vec::new();
    for name in names {
        let Some(name) = name.to_str().filter(|n| n.ends_with(".lock")) else {
            continue;
        };
        let Ok(id) = dir.file_id(name) else {
            continue; // forgotten meanwhile
        };
        if !holders.contains_key(&id) {
            continue;
        }
        let Some(key) = key_of(dir, name)? else {
            continue;
        };
        if !key.starts_with(prefix) {
            continue;
        }
        // Read again through `one`, which checks the record is the current
        // holder's.
        if let Some(held) = one(dir, name, &key).await? {
            listed.push(held);
        }
    }
    listed.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(listed)
}

fn key_of(dir: &LockDir, name: &str) -> Result<Option<String>> {
    let path = &dir.path_of(name);
    let recorded = match dir.open_file(name, false) {
        Ok(file) => read_record(&file, path)?.and_then(|record| record.key),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::backend(BACKEND, "list", with_path(e, path))),
    };
    let named = name
        .strip_prefix("k-")
        .and_then(|rest| rest.strip_suffix(".lock"))
        .map(str::to_owned);
    Ok(recorded.or(named))
}

/// A lock file held shared: readers write no record (concurrent readers
/// would clobber one another's), so the holders are unknown; the record,
/// the last writer's, gives the key's current fencing token, which is
/// what each reader's lease carries.
fn shared(dir: &LockDir, name: &str, key: &str) -> Result<Option<HeldLock>> {
    let path = &dir.path_of(name);
    let record = match dir.open_file(name, false) {
        Ok(file) => read_record(&file, path)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::backend(BACKEND, "inspect", with_path(e, path))),
    };
    Ok(Some(HeldLock {
        fencing_token: Some(record.map_or(0, |r| r.fencing_token)),
        shared: true,
        ..HeldLock::new(key)
    }))
}

fn held(key: &str, record: Record) -> HeldLock {
    let mut held = HeldLock {
        fencing_token: Some(record.fencing_token),
        ..HeldLock::new(key)
    };
    if let Some(holder) = record.holder {
        holder.fill(&mut held);
    }
    held
}

/// The files `flock`ed now, each with how (and for writing, by which pid).
fn flock_holders() -> Result<HashMap<FileId, Access>> {
    const LOCKS: &str = "/proc/locks";
    let table = std::fs::read_to_string(LOCKS)
        .map_err(|e| Error::backend(BACKEND, "inspect", with_path(e, Path::new(LOCKS))))?;
    Ok(table.lines().filter_map(parse_lock_line).collect())
}

/// One granted `flock` of `/proc/locks` (`1: FLOCK  ADVISORY  WRITE 4242
/// fe:00:5311144 0 EOF`, `READ` for a shared one; see proc(5)); `None` for
/// other lock kinds and for waiters (`1: -> FLOCK ...`).
fn parse_lock_line(line: &str) -> Option<(FileId, Access)> {
    let mut fields = line.split_whitespace().skip(1);
    let (kind, _mode, access) = (fields.next()?, fields.next()?, fields.next()?);
    if kind != "FLOCK" || !matches!(access, "WRITE" | "READ") {
        return None;
    }
    let pid = fields.next()?.parse().ok()?;
    let access = if access == "WRITE" {
        Access::Write(pid)
    } else {
        Access::Read
    };
    let mut id = fields.next()?.split(':');
    let major = u32::from_str_radix(id.next()?, 16).ok()?;
    let minor = u32::from_str_radix(id.next()?, 16).ok()?;
    let inode = id.next()?.parse().ok()?;
    Some(((libc::makedev(major, minor), inode), access))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn granted_flocks_are_read_and_waiters_and_posix_locks_are_not() {
        let dev = libc::makedev(0xfe, 0);
        assert_eq!(
            parse_lock_line("1: FLOCK  ADVISORY  WRITE 4242 fe:00:5311144 0 EOF"),
            Some(((dev, 5311144), Access::Write(4242)))
        );
        assert_eq!(
            parse_lock_line("3: FLOCK  ADVISORY  READ 100 fe:00:78 0 EOF"),
            Some(((dev, 78), Access::Read))
        );
        for other in [
            "1: -> FLOCK  ADVISORY  WRITE 4243 fe:00:5311144 0 EOF",
            "1: -> FLOCK  ADVISORY  READ 4243 fe:00:5311144 0 EOF",
            "2: POSIX  ADVISORY  WRITE 99 fe:00:77 0 EOF",
            "garbage",
        ] {
            assert_eq!(parse_lock_line(other), None, "{other:?}");
        }
        let wide_minor = libc::makedev(0x103, 0x1a2);
        assert_eq!(
            parse_lock_line("4: FLOCK  ADVISORY  WRITE 7 103:1a2:12 0 EOF"),
            Some(((wide_minor, 12), Access::Write(7)))
        );
    }

    #[test]
    fn a_record_without_a_key_is_named_by_a_plain_file_name_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let old = format!(
            "{} {:020} {:010} owner\n",
            super::super::record::RECORD_MAGIC,
            3,
            1
        );
        assert!(super::super::record::parse_record(&old).is_some_and(|r| r.key.is_none()));
        let lock_dir = LockDir::open(dir.path()).expect("open");
        for (name, expected) in [("k-nightly.lock", Some("nightly")), ("h-0123.lock", None)] {
            std::fs::write(dir.path().join(name), &old).expect("write");
            assert_eq!(key_of(&lock_dir, name).expect("read").as_deref(), expected);
        }
    }
}
