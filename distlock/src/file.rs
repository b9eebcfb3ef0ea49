//! Cross-process locks on one machine (`file:///dir`): the embedded default,
//! needing no server.
//!
//! Each key is one lock file in the directory, locked with `flock(2)` (through
//! [`std::fs::File::try_lock`]) on a file descriptor kept open for the hold.
//!
//! # Semantics
//!
//! - **ttl is not enforced.** A lock is held until it is released or the
//!   holding process exits; the kernel drops the `flock` the moment the
//!   process dies (even by `SIGKILL`), so a crash never strands a lock. The
//!   ttl only paces the keepalive and bounds `max_hold`. A holder that is
//!   alive but hung keeps the lock: use [`crate::KeepAlive::max_hold`] or a
//!   supervisor.
//! - **Fencing**: a per-key counter is stored in the lock file and bumped
//!   under the lock, so tokens keep increasing across processes and restarts.
//!   It is written without `fsync` unless [`FileLockerBuilder::durable`] is set; a
//!   power loss can then roll it back.
//! - **Release by owner** works only in the process holding the lock: a
//!   `flock` belongs to its open file. Elsewhere [`Locker::unlock`] with the
//!   right owner token is [`Error::Unsupported`] (naming the holder's pid),
//!   with a wrong one [`Error::NotHeld`].
//! - **Refresh** checks the lock is still held and that its file was not
//!   deleted or replaced (which would let another process lock a new file).
//! - **Waiting**: waiters in the same process are woken by a release; across
//!   processes they poll.
//! - **Directory safety**: a lock file another local user can replace is a
//!   lock that user can break. The locker opens its directory once, walking
//!   the path from `/` one component at a time without following a changed
//!   symlink, and refuses it unless every directory on the way (and every
//!   symlink followed) belongs to this user or root, and none is writable by
//!   its group or others (a sticky one such as `/tmp` excepted, but never the
//!   lock directory itself); see the rule in `file/dir.rs`. It then keeps
//!   that directory open and does every later open, `stat` and `unlink`
//!   relative to it (`openat(2)`), so a path swapped after the check (a
//!   symlink on the way replaced) cannot send its lock files elsewhere.
//!   Directories the locker creates are mode 0700; lock files are opened
//!   with `O_NOFOLLOW` and must be regular files, so a planted symlink is an
//!   error, never followed.
//! - **Marks** ([`Locker::advance_mark`]): one file per mark beside the lock
//!   files (`k-<name>.mark` or `h-<hash>.mark`), rewritten under its own
//!   `flock`; like fencing counters, not `fsync`ed unless durable.
//! - **Inspection** (Linux): [`Locker::inspect`] and [`Locker::list`] read
//!   the kernel's table of `flock`s (`/proc/locks`), never taking a lock
//!   themselves, so they cannot make a concurrent `try_lock` see contention;
//!   the holder's record (host, pid, label, grant time on the holder's
//!   clock, ttl, fencing token) is read from the lock file. A lock taken by
//!   a distlock older than holder records is held by an unknown holder;
//!   `ttl_left` and `session` are always `None` (file locks do not expire).
//!   **No force release**: a `flock` belongs to the holder's open file, so
//!   [`Locker::force_release`] is [`Error::Unsupported`], naming the pid to
//!   stop (the kernel frees the lock the moment that process exits).
//! - **Not guaranteed**: anything on network filesystems (NFS, SMB), where
//!   `flock` may be emulated or local to one client. Lock files are deleted
//!   only by [`Locker::forget`] (deleting a lock file races with a process
//!   opening it, see there); otherwise one small file per key stays in the
//!   directory.
//!
//! File names: a key of up to 100 bytes of `[A-Za-z0-9._-]` not starting with
//! `.` is used as is (`k-<key>.lock`); any other key is hashed
//! (`h-<first 128 bits of SHA-256, hex>.lock`).

use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use crate::inspect::{ForceRelease, HeldLock, HolderRecord};
use crate::wait::LocalReleases;
use crate::{
    new_owner_token, validate, Capabilities, Error, Lease, LeaseParts, Locker, MarkAdvance,
    ReleaseWatch, Result,
};

mod dir;
mod inspect;
mod mark;

use dir::LockDir;

const BACKEND: &str = "file";
const RECORD_MAGIC: &str = "distlock-file-v1";

/// The `flock` backend. Cheap to clone; clones share held locks.
///
/// Its calls are short non-blocking system calls on a local filesystem (open,
/// `flock(LOCK_NB)`, a read and a write of one small record), made directly on
/// the calling task: cheaper than a thread hop, and never waiting on another
/// process.
///
/// ```
/// use std::time::Duration;
/// use distlock::{file::FileLocker, Locker};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let dir = std::env::temp_dir().join("distlock-doc-example");
/// let locker = FileLocker::new(&dir)?;
/// let lease = locker.try_lock("backup", Duration::from_secs(30)).await?.unwrap();
/// assert!(lease.fencing_token().is_some());
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FileLocker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The `Arc` every lease of this locker and its clones shares.
    leases: crate::SharedLocker,
    /// Open for the locker's whole life: every file is reached through it.
    dir: LockDir,
    durable: bool,
    held: Mutex<HashMap<String, Held>>,
    releases: LocalReleases,
}

#[derive(Debug)]
struct Held {
    owner: String,
    /// Keeping this open is what holds the `flock`.
    file: File,
}

/// Options of a [`FileLocker`].
#[derive(Debug, Clone)]
pub struct FileLockerBuilder {
    dir: PathBuf,
    durable: bool,
}

impl FileLockerBuilder {
    /// Makes fencing counters durable: the lock file is `fdatasync`ed after
    /// each grant, so a power loss cannot roll a token back. Costs a disk flush
    /// per acquire. Off by default.
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Opens the directory, creating what is missing of it (mode 0700: only
    /// this user can plant or replace lock files in it), checks it is safe
    /// (see the [module docs](self)), and returns the locker, which keeps it
    /// open: the path is never resolved again.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] if the directory cannot be created or opened;
    /// [`Error::InvalidInput`] (`what = "lock directory"`), naming the
    /// offending path and what to do, if it or a directory (or symlink) on
    /// its way from `/` belongs to another user than this one or root, or if
    /// it or a directory on the way is writable by its group or others (a
    /// sticky directory on the way such as `/tmp` excepted): another local
    /// user could then replace lock files or plant symlinks, taking locks
    /// from under their holders.
    pub fn build(self) -> Result<FileLocker> {
        let dir = LockDir::open(&self.dir)?;
        Ok(FileLocker {
            inner: Arc::new(Inner {
                leases: crate::SharedLocker::default(),
                dir,
                durable: self.durable,
                held: Mutex::default(),
                releases: LocalReleases::default(),
            }),
        })
    }
}

/// The record kept in each lock file: a first line with the fencing
/// counter, the holder's pid and owner token (all a distlock before holder
/// records wrote), then the holder record and the key.
#[derive(Debug, PartialEq)]
struct Record {
    fencing_token: u64,
    pid: u32,
    owner: String,
    /// Absent in files written before holder records.
    holder: Option<HolderRecord>,
    /// The key the file locks (its name may be a hash of it); absent in
    /// files written before holder records.
    key: Option<String>,
}

/// The longest record read from a lock file: the first line, a holder
/// record with a label of [`crate::inspect::MAX_LABEL_LEN`] and a key of
/// [`validate::MAX_KEY_LEN`], each escaped at worst to twice its length.
const MAX_RECORD_LEN: usize = 8192;

impl FileLocker {
    /// A locker keeping its lock files in `dir`, created if missing; see
    /// [`FileLocker::builder`] for options.
    ///
    /// Fails as [`FileLockerBuilder::build`]: [`Error::Backend`] if the
    /// directory cannot be created or opened, [`Error::InvalidInput`] if
    /// another local user could tamper with it.
    pub fn new(dir: impl AsRef<Path>) -> Result<Self> {
        Self::builder(dir).build()
    }

    /// Options for a locker in `dir`.
    pub fn builder(dir: impl AsRef<Path>) -> FileLockerBuilder {
        FileLockerBuilder {
            dir: dir.as_ref().to_path_buf(),
            durable: false,
        }
    }

    /// A locker in [`FileLocker::default_dir`].
    pub fn in_default_dir() -> Result<Self> {
        Self::new(Self::default_dir())
    }

    /// The per-user default directory: `$XDG_STATE_HOME/distlock/locks`, else
    /// `$HOME/.local/state/distlock/locks`, else
    /// `/var/tmp/distlock-<uid>/locks`. A state directory, never one that a
    /// reboot empties (`/tmp`, `$XDG_RUNTIME_DIR`): the fencing counters in
    /// the lock files must survive a reboot, or tokens would start again
    /// from one. `/var/tmp` is kept across reboots on FHS systems; where it
    /// is not, set `XDG_STATE_HOME` or name a directory.
    pub fn default_dir() -> PathBuf {
        let non_empty = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        default_dir_from(non_empty("XDG_STATE_HOME"), non_empty("HOME"), uid)
    }

    /// The directory holding the lock files, as it was named to the
    /// locker (which opened it once and uses it through a descriptor since).
    pub fn dir(&self) -> &Path {
        self.inner.dir.path()
    }

    /// The path of the lock file for `key`, under [`FileLocker::dir`]: where
    /// a person finds it as long as that path still leads to the directory
    /// the locker opened.
    pub fn path_for(&self, key: &str) -> PathBuf {
        self.inner.dir.path_of(&file_name(key, "lock"))
    }

    fn held(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the lock on `key` if `owner` holds it here; true if it did.
    fn release_held(&self, key: &str, owner: &str) -> bool {
        let mut held = self.held();
        if held.get(key).is_none_or(|h| h.owner != owner) {
            return false;
        }
        // Dropping the file closes the descriptor, which frees the flock.
        held.remove(key);
        drop(held);
        self.inner.releases.notify(key);
        true
    }

    /// A new descriptor of the open lock file through which `owner` holds
    /// `key` here (it shares the `flock`: see [`Lease::duplicate_lock_fd`]).
    fn duplicate_held(&self, key: &str, owner: &str) -> Option<io::Result<std::os::fd::OwnedFd>> {
        let held = self.held();
        let file = &held.get(key).filter(|h| h.owner == owner)?.file;
        Some(file.try_clone().map(std::os::fd::OwnedFd::from))
    }

    /// Unlock of a lock this instance does not hold: tell the caller whether
    /// it is held elsewhere under `owner` (which only its process can free).
    fn unlock_elsewhere(&self, key: &str, owner: &str) -> Result<()> {
        let name = file_name(key, "lock");
        let path = self.inner.dir.path_of(&name);
        let not_held = || Error::NotHeld {
            key: key.to_owned(),
        };
        let file = match self.inner.dir.open_file(&name, false) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_held()),
            Err(e) => return Err(Error::backend(BACKEND, "release", with_path(e, &path))),
        };
        match file.try_lock() {
            // Nobody holds it (our probe lock goes away with `file`).
            Ok(()) => Err(not_held()),
            Err(TryLockError::WouldBlock) => match read_record(&file, &path)? {
                Some(record) if record.owner == owner => Err(Error::unsupported(BACKEND, "release", format!(
                        "the lock on {key:?} is held by process {} through an open file, and a flock can only be \
                         released by that process; stop it and the kernel frees the lock",
                        record.pid
                    ))),
                _ => Err(not_held()),
            },
            Err(TryLockError::Error(e)) => Err(Error::backend(BACKEND, "release", with_path(e, &path))),
        }
    }
}

#[async_trait]
impl Locker for FileLocker {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            expires: false,
            refresh: true,
            unlock_by_owner: false,
            release_wakeup: false,
            // Only releases made in this process are announced.
            release_notifications: false,
            fencing: true,
            marks: true,
            // `/proc/locks` tells which files are locked, by whom.
            inspect: cfg!(target_os = "linux"),
            list: cfg!(target_os = "linux"),
            force_release: false,
        }
    }

    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        validate::acquire(key, ttl)?;
        let name = file_name(key, "lock");
        let path = self.inner.dir.path_of(&name);
        let io_error = |e| Error::backend(BACKEND, "acquire", with_path(e, &path));
        let file = self.inner.dir.open_file(&name, true).map_err(io_error)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(io_error(e)),
        }
        let previous = read_record(&file, &path)?.map_or(0, |r| r.fencing_token);
        let owner = new_owner_token();
        let record = Record {
            fencing_token: previous + 1,
            pid: std::process::id(),
            owner: owner.clone(),
            holder: Some(HolderRecord::now(ttl)),
            key: Some(key.to_owned()),
        };
        write_record(&file, &record).map_err(io_error)?;
        if self.inner.durable {
            file.sync_data().map_err(io_error)?;
        }
        self.held().insert(
            key.to_owned(),
            Held {
                owner: owner.clone(),
                file,
            },
        );
        let parts = LeaseParts {
            key: key.to_owned(),
            owner: owner.clone(),
            fencing_token: Some(record.fencing_token),
            ttl,
            valid_until: None,
        };
        let (this, sync_key) = (self.clone(), key.to_owned());
        let (dup_this, dup_key, dup_owner) = (self.clone(), key.to_owned(), owner.clone());
        Ok(Some(
            Lease::new(
                parts,
                self.inner.leases.get_or_init(|| Arc::new(self.clone())),
            )
            .with_sync_release(move || {
                this.release_held(&sync_key, &owner);
            })
            .with_lock_fd(move || dup_this.duplicate_held(&dup_key, &dup_owner)),
        ))
    }

    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        validate::key(key)?;
        if self.release_held(key, owner) {
            return Ok(());
        }
        self.unlock_elsewhere(key, owner)
    }

    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        validate::acquire(key, ttl)?;
        let name = file_name(key, "lock");
        let mut held = self.held();
        let still_ours = match held.get(key) {
            Some(h) if h.owner == owner => same_file(&self.inner.dir, &h.file, &name),
            _ => {
                return Err(Error::NotHeld {
                    key: key.to_owned(),
                })
            }
        };
        if !still_ours {
            // Deleted or replaced: another process can lock the new file, so
            // this lock no longer excludes anybody.
            held.remove(key);
            return Err(Error::NotHeld {
                key: key.to_owned(),
            });
        }
        Ok(())
    }

    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        Ok(Some(self.inner.releases.subscribe(key)))
    }

    /// Deletes `key`'s lock file (and with it its fencing counter) while
    /// holding its `flock`, so no process holds the lock at the moment of
    /// the `unlink`. A key held here or by another process is
    /// [`Error::NotAcquired`]; a missing file is already forgotten.
    ///
    /// **Remaining race**: a process that opened the file just before the
    /// `unlink` and locks it just after gets a lock on the deleted file,
    /// while the next process to open the path creates a new file and
    /// locks that one: both hold "the" lock. Only a `try_lock` that starts
    /// while the key is being forgotten can be caught this way (its
    /// [`Locker::refresh`] then reports [`Error::NotHeld`], as for any
    /// deleted lock file), which is why forget is only for keys nobody
    /// locks any more.
    async fn forget(&self, key: &str) -> Result<()> {
        validate::key(key)?;
        if self.held().contains_key(key) {
            return Err(Error::NotAcquired {
                key: key.to_owned(),
            });
        }
        let name = file_name(key, "lock");
        let path = self.inner.dir.path_of(&name);
        let io_error = |e| Error::backend(BACKEND, "forget", with_path(e, &path));
        let file = match self.inner.dir.open_file(&name, false) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error(e)),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(Error::NotAcquired {
                    key: key.to_owned(),
                })
            }
            Err(TryLockError::Error(e)) => return Err(io_error(e)),
        }
        // Unlink only the file we locked: if another forget replaced or
        // deleted it meanwhile, the path is no longer ours to delete.
        if !same_file(&self.inner.dir, &file, &name) {
            return Ok(());
        }
        match self.inner.dir.remove(&name) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(e)),
        }
        // `file` closes here, after the unlink: its flock is what kept every
        // other process out while the file was deleted.
    }

    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        validate::key(key)?;
        inspect::one(&self.inner.dir, &file_name(key, "lock"), key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        inspect::all(&self.inner.dir, prefix).await
    }

    /// Always [`Error::Unsupported`]: only the holding process can release
    /// a `flock` (the reason names it).
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        validate::key(key)?;
        let holder = match self.inspect(key).await {
            Ok(Some(HeldLock {
                holder: Some(h), ..
            })) => format!("process {} on {}", h.pid, h.host),
            _ => "the holding process".to_owned(),
        };
        Err(Error::unsupported(
            BACKEND,
            "force_release",
            format!(
                "{how:?}: a flock belongs to the open file of {holder}, and only that process can \
                 release it; stop it (kill it) and the kernel frees the lock at once"
            ),
        ))
    }

    /// Stores the mark in its own file beside the lock files (the lock
    /// file's name with `.mark` for `.lock`), read and rewritten under that
    /// file's `flock`; `fdatasync`ed when the locker is
    /// [`durable`](FileLockerBuilder::durable). Another process holding the
    /// mark's `flock` for more than 5 s (stopped mid-update) makes the call
    /// [`Error::DeadlineExceeded`].
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        validate::key(name)?;
        mark::advance(
            &self.inner.dir,
            &file_name(name, "mark"),
            value,
            self.inner.durable,
        )
        .await
    }
}

/// [`FileLocker::default_dir`] for the given environment.
fn default_dir_from(
    xdg_state_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
    uid: libc::uid_t,
) -> PathBuf {
    if let Some(state) = xdg_state_home {
        return PathBuf::from(state).join("distlock/locks");
    }
    if let Some(home) = home {
        return PathBuf::from(home).join(".local/state/distlock/locks");
    }
    PathBuf::from(format!("/var/tmp/distlock-{uid}/locks"))
}

/// The name of the file for `key` with `extension` (`lock`, or `mark` for a
/// mark; see the module docs).
fn file_name(key: &str, extension: &str) -> String {
    let plain = key.len() <= 100
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain {
        format!("k-{key}.{extension}")
    } else {
        format!(
            "h-{}.{extension}",
            crate::util::sha256_hex128(key.as_bytes())
        )
    }
}

/// Whether `name` in `dir` is still the open `file` (not deleted, not
/// replaced).
fn same_file(dir: &LockDir, file: &File, name: &str) -> bool {
    match (file.metadata(), dir.file_id(name)) {
        (Ok(open), Ok(named)) => (open.dev(), open.ino()) == named,
        _ => false,
    }
}

fn read_record(file: &File, path: &Path) -> Result<Option<Record>> {
    let mut buf = vec![0u8; MAX_RECORD_LEN];
    let len = file
        .read_at(&mut buf, 0)
        .map_err(|e| Error::backend(BACKEND, "read the lock file", with_path(e, path)))?;
    let text = String::from_utf8_lossy(&buf[..len]);
    if text.trim().is_empty() {
        return Ok(None);
    }
    parse_record(&text).map(Some).ok_or_else(|| {
        // Never guess a counter: restarting from zero would hand out smaller
        // fencing tokens than earlier holders had.
        Error::backend(
            BACKEND,
            "read the lock file",
            format!(
                "{} does not hold a distlock record; remove it only if no process uses it",
                path.display()
            ),
        )
    })
}

fn parse_record(text: &str) -> Option<Record> {
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let mut fields = first.split_whitespace();
    if fields.next()? != RECORD_MAGIC {
        return None;
    }
    Some(Record {
        fencing_token: fields.next()?.parse().ok()?,
        pid: fields.next()?.parse().ok()?,
        owner: fields.next()?.to_owned(),
        holder: HolderRecord::decode(rest.trim_end_matches('\n')),
        key: crate::inspect::record_field(rest, "key"),
    })
}

fn write_record(file: &File, record: &Record) -> io::Result<()> {
    // One positioned write of a record that only grows: a concurrent reader in
    // another process sees the old or the new record, never an empty file.
    let mut text = format!(
        "{RECORD_MAGIC} {:020} {:010} {}\n",
        record.fencing_token, record.pid, record.owner
    );
    if let Some(holder) = &record.holder {
        text.push_str(&holder.encode());
        if let Some(key) = &record.key {
            crate::inspect::push_field(&mut text, "key", key);
        }
        text.push('\n');
    }
    file.write_all_at(text.as_bytes(), 0)?;
    if file.metadata()?.len() > text.len() as u64 {
        file.set_len(text.len() as u64)?;
    }
    Ok(())
}

fn with_path(error: io::Error, path: &Path) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    const TTL: Duration = Duration::from_secs(30);

    #[test]
    fn plain_keys_keep_their_name_and_others_are_hashed() {
        assert_eq!(
            file_name("nightly-backup_1.0", "lock"),
            "k-nightly-backup_1.0.lock"
        );
        for odd in ["a/b", "../etc", ".hidden", "ключ", "a b", &"x".repeat(101)] {
            let name = file_name(odd, "lock");
            assert!(
                name.starts_with("h-") && name.len() == 2 + 32 + 5,
                "{odd:?} -> {name}"
            );
        }
        assert_ne!(file_name("a/b", "lock"), file_name("a/c", "lock"));
    }

    #[test]
    fn records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.lock");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        assert_eq!(read_record(&file, &path).unwrap(), None);
        let record = Record {
            fencing_token: 7,
            pid: 42,
            owner: "abc".into(),
            holder: Some(HolderRecord::now(Duration::from_secs(30))),
            key: Some("jobs/nightly\nbackup".into()),
        };
        write_record(&file, &record).unwrap();
        assert_eq!(read_record(&file, &path).unwrap(), Some(record));
        // A shorter record after a longer one leaves no tail behind.
        let short = Record {
            fencing_token: 8,
            pid: 43,
            owner: "abd".into(),
            holder: None,
            key: None,
        };
        write_record(&file, &short).unwrap();
        assert_eq!(read_record(&file, &path).unwrap(), Some(short));
    }

    #[test]
    fn a_record_of_a_distlock_before_holder_records_still_reads() {
        let text = format!("{RECORD_MAGIC} {:020} {:010} owner-token\n", 9, 77);
        let record = parse_record(&text).expect("the old one-line record");
        assert_eq!(
            (record.fencing_token, record.pid, record.holder, record.key),
            (9, 77, None, None)
        );
    }

    #[test]
    fn a_foreign_file_is_an_error_not_a_reset_counter() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k-x.lock");
        std::fs::write(&path, "hello").unwrap();
        let file = File::open(&path).unwrap();
        let err = read_record(&file, &path).unwrap_err().to_string();
        assert!(err.contains("does not hold a distlock record"), "{err}");
    }

    #[test]
    fn the_default_directory_survives_reboots() {
        assert_eq!(
            default_dir_from(Some("/st".into()), Some("/home/u".into()), 7),
            PathBuf::from("/st/distlock/locks")
        );
        assert_eq!(
            default_dir_from(None, Some("/home/u".into()), 7),
            PathBuf::from("/home/u/.local/state/distlock/locks")
        );
        assert_eq!(
            default_dir_from(None, None, 7),
            PathBuf::from("/var/tmp/distlock-7/locks"),
            "not /tmp, which a reboot empties (and fencing counters with it)"
        );
    }

    #[test]
    fn created_directories_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("a/b/locks");
        FileLocker::new(&locks).unwrap();
        for path in [dir.path().join("a"), dir.path().join("a/b"), locks] {
            let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
            assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", path.display());
        }
    }

    #[test]
    fn a_directory_every_user_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = FileLocker::new(&open).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput { what: "lock directory", reason } if reason.contains("writable by every user")),
            "{err}"
        );
        // Inside a world-writable parent without the sticky bit, too.
        let inner = open.join("locks");
        std::fs::create_dir(&inner).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o700)).unwrap();
        let err = FileLocker::new(&inner).unwrap_err();
        assert!(err.to_string().contains("writable by every user"), "{err}");
        // A sticky parent (as /tmp) is fine.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        FileLocker::new(&inner).unwrap();
    }

    /// Gives `path` (not following a symlink) to `uid`: a directory or link
    /// of another local user. Needs root, as these tests do.
    fn give_to(path: &Path, uid: u32) {
        std::os::unix::fs::lchown(path, Some(uid), Some(uid))
            .expect("chown to another uid (these tests run as root)");
    }

    fn set_mode(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn refusal(err: Error) -> String {
        match err {
            Error::InvalidInput {
                what: "lock directory",
                reason,
            } => reason,
            other => panic!("not refused as a lock directory: {other:?}"),
        }
    }

    /// The path of the lock directory was resolved again at every open: a
    /// symlink on the way swapped after the check sent the lock files to
    /// another directory, where another process (in the original one) did
    /// not see them.
    #[tokio::test]
    async fn an_ancestor_symlink_swapped_after_the_build_does_not_move_the_lock_files() {
        let root = tempfile::tempdir().unwrap();
        let (first, second) = (root.path().join("first"), root.path().join("second"));
        for dir in [&first, &second] {
            std::fs::create_dir_all(dir.join("locks")).unwrap();
        }
        let link = root.path().join("current");
        std::os::unix::fs::symlink(&first, &link).unwrap();
        let locker = FileLocker::new(link.join("locks")).unwrap();
        // Swapped atomically: a new link renamed over the old one.
        let next = root.path().join("next");
        std::os::unix::fs::symlink(&second, &next).unwrap();
        std::fs::rename(&next, &link).unwrap();

        let mut lease = locker.try_lock("k", TTL).await.unwrap().unwrap();
        assert!(first.join("locks/k-k.lock").is_file());
        assert!(!second.join("locks/k-k.lock").exists());
        let beside = FileLocker::new(first.join("locks")).unwrap();
        assert!(
            beside.try_lock("k", TTL).await.unwrap().is_none(),
            "the lock is in the directory that was checked"
        );
        lease.refresh(TTL).await.expect("still its file");
        #[cfg(target_os = "linux")]
        assert_eq!(
            locker.inspect("k").await.unwrap().map(|held| held.key),
            Some("k".to_owned())
        );
        locker.advance_mark("m", 1).await.unwrap();
        assert!(first.join("locks/k-m.mark").is_file());
        assert!(!second.join("locks/k-m.mark").exists());
        lease.release().await.unwrap();
        locker.forget("k").await.unwrap();
        assert!(!first.join("locks/k-k.lock").exists(), "forgotten there");
    }

    /// Only the lock directory and its parent were checked.
    #[test]
    fn a_directory_on_the_way_owned_by_another_user_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let theirs = root.path().join("theirs");
        let locks = theirs.join("mine/locks");
        std::fs::create_dir_all(&locks).unwrap();
        give_to(&theirs, 4242);
        let reason = refusal(FileLocker::new(&locks).unwrap_err());
        assert!(
            reason.contains(&format!(
                "the directory {} belongs to uid 4242",
                theirs.display()
            )),
            "{reason}"
        );
        // The lock directory itself, too.
        let other = root.path().join("other");
        std::fs::create_dir(&other).unwrap();
        give_to(&other, 4242);
        let reason = refusal(FileLocker::new(&other).unwrap_err());
        assert!(reason.contains("belongs to uid 4242"), "{reason}");
    }

    /// Only writable-by-every-user was refused: a group's members could
    /// replace the lock directory or its files just as well.
    #[test]
    fn a_directory_writable_by_its_group_is_refused_unless_sticky_on_the_way() {
        let root = tempfile::tempdir().unwrap();
        let group = root.path().join("group");
        std::fs::create_dir(&group).unwrap();
        set_mode(&group, 0o770);
        let reason = refusal(FileLocker::new(&group).unwrap_err());
        assert!(
            reason.contains(&format!(
                "{} is writable by its group (mode 770)",
                group.display()
            )) && reason.contains("chmod go-w"),
            "{reason}"
        );
        let locks = group.join("locks");
        std::fs::create_dir(&locks).unwrap();
        set_mode(&locks, 0o700);
        let reason = refusal(FileLocker::new(&locks).unwrap_err());
        assert!(
            reason.contains("writable by its group (mode 770) without the sticky bit"),
            "{reason}"
        );
        // Sticky on the way (as /tmp) is fine; for the lock directory it is not.
        set_mode(&group, 0o1770);
        FileLocker::new(&locks).unwrap();
        let reason = refusal(FileLocker::new(&group).unwrap_err());
        assert!(reason.contains("writable by its group"), "{reason}");
    }

    /// A symlink on the way in a shared sticky directory, owned by another
    /// user, who can replace it at will: canonicalizing followed it.
    #[test]
    fn a_symlink_on_the_way_owned_by_another_user_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("shared");
        let mine = root.path().join("mine");
        std::fs::create_dir(&shared).unwrap();
        std::fs::create_dir(&mine).unwrap();
        // Group-writable and sticky: accepted on the way, and the kernel's
        // protected_symlinks (world-writable sticky directories only) lets
        // it be followed.
        set_mode(&shared, 0o1770);
        let link = shared.join("link");
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        give_to(&link, 4242);
        let reason = refusal(FileLocker::new(link.join("locks")).unwrap_err());
        assert!(
            reason.contains(&format!(
                "the symbolic link {} belongs to uid 4242",
                link.display()
            )),
            "{reason}"
        );
        // Ours, it is followed.
        // SAFETY: geteuid has no preconditions and cannot fail.
        give_to(&link, unsafe { libc::geteuid() });
        let locker = FileLocker::new(link.join("locks")).unwrap();
        assert!(mine.join("locks").is_dir());
        assert_eq!(locker.dir(), link.join("locks"));
    }

    #[tokio::test]
    async fn the_default_directory_under_var_tmp_works() {
        // SAFETY: getuid has no preconditions and cannot fail.
        let dir = default_dir_from(None, None, unsafe { libc::getuid() });
        assert!(dir.starts_with("/var/tmp"));
        let locker = FileLocker::new(&dir).unwrap();
        let key = format!("default-dir-test-{}", crate::new_owner_token());
        let lease = locker.try_lock(&key, TTL).await.unwrap().unwrap();
        assert!(locker.path_for(&key).is_file());
        lease.release().await.unwrap();
        locker.forget(&key).await.unwrap();
    }

    #[tokio::test]
    async fn a_symlink_planted_as_a_lock_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let locker = FileLocker::new(dir.path().join("locks")).unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, "precious\n").unwrap();
        std::os::unix::fs::symlink(&target, locker.path_for("k")).unwrap();
        let err = locker
            .try_lock("k", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Backend { .. }) && err.to_string().contains("symbolic link"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
    }

    #[tokio::test]
    async fn a_duplicated_lock_fd_keeps_the_lock_held_after_the_release() {
        let dir = tempfile::tempdir().unwrap();
        let (holder, other) = (
            FileLocker::new(dir.path()).unwrap(),
            FileLocker::new(dir.path()).unwrap(),
        );
        let lease = holder
            .try_lock("k", Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        let duplicate = lease.duplicate_lock_fd().expect("a file lock").unwrap();
        lease.release().await.unwrap();
        assert!(
            other
                .try_lock("k", Duration::from_secs(5))
                .await
                .unwrap()
                .is_none(),
            "the open file is still held through the duplicate"
        );
        drop(duplicate);
        let next = other.try_lock("k", Duration::from_secs(5)).await.unwrap();
        assert!(
            next.is_some(),
            "closing the last descriptor frees the flock"
        );
    }
}
