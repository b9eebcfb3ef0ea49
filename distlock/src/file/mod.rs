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
//! - **Shared locks** ([`Locker::try_lock_shared`]): `flock(LOCK_SH)` on the
//!   same lock file, on a descriptor of its own, so the kernel lets readers
//!   in beside readers (of any process, this one included) and keeps them
//!   out while a `LOCK_EX` is held, and the other way round. A reader
//!   writes no record: readers hold the file at the same time and would
//!   clobber each other's. It reads the fencing counter instead, and its
//!   lease carries that token, not advanced (the last writer's, 0 if none):
//!   the next writer's is larger. Inspection reports a file held shared as
//!   held, [`HeldLock::shared`], by unknown holders (`holder: None`), with
//!   that token. Release by owner from another process: [`Error::NotHeld`]
//!   (the record names no reader). **A waiting writer does not block new
//!   readers**: waits poll with `LOCK_NB`, so a writer gets the file only
//!   once no reader holds it, and overlapping readers can starve it.
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
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::inspect::{ForceRelease, HeldLock, HolderRecord};
use crate::util;
use crate::wait::LocalReleases;
use crate::{
    new_owner_token, validate, Capabilities, Error, Lease, LeaseParts, Locker, MarkAdvance,
    ReleaseWatch, Result,
};

mod dir;
mod inspect;
mod mark;
mod record;

use dir::LockDir;
use record::{read_record, write_record, Record};

const BACKEND: &str = "file";

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
    /// By key: the exclusive hold, or any number of shared ones, taken
    /// through this locker (each on a descriptor of its own).
    held: Mutex<HashMap<String, Vec<Held>>>,
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

    fn held(&self) -> MutexGuard<'_, HashMap<String, Vec<Held>>> {
        util::lock(&self.inner.held)
    }

    /// Removes `owner`'s hold of `key` from `held`, if it has one.
    fn take_held(held: &mut HashMap<String, Vec<Held>>, key: &str, owner: &str) -> Option<Held> {
        let holds = held.get_mut(key)?;
        let index = holds.iter().position(|h| h.owner == owner)?;
        let taken = holds.swap_remove(index);
        if holds.is_empty() {
            held.remove(key);
        }
        Some(taken)
    }

    /// Drops the lock on `key` if `owner` holds it here; true if it did.
    fn release_held(&self, key: &str, owner: &str) -> bool {
        let mut held = self.held();
        let Some(taken) = Self::take_held(&mut held, key, owner) else {
            return false;
        };
        drop(held);
        // Closing the descriptor frees the flock; the last reader's release
        // is what a waiting writer here needs to hear.
        drop(taken);
        self.inner.releases.notify(key);
        true
    }

    /// A new descriptor of the open lock file through which `owner` holds
    /// `key` here (it shares the `flock`: see [`Lease::duplicate_lock_fd`]).
    fn duplicate_held(&self, key: &str, owner: &str) -> Option<io::Result<std::os::fd::OwnedFd>> {
        let held = self.held();
        let file = &held.get(key)?.iter().find(|h| h.owner == owner)?.file;
        Some(file.try_clone().map(std::os::fd::OwnedFd::from))
    }

    /// Opens `key`'s lock file and tries `flock` on it without waiting
    /// (`try_flock` is [`File::try_lock`] or [`File::try_lock_shared`]): the
    /// file and its path if taken, `None` if another holder has it. The
    /// first half of both acquisitions, which differ only in the `flock`
    /// and in what they do with the record.
    fn try_flock(
        &self,
        key: &str,
        ttl: Duration,
        try_flock: fn(&File) -> std::result::Result<(), TryLockError>,
    ) -> Result<Option<(File, PathBuf)>> {
        validate::acquire(key, ttl)?;
        let name = file_name(key, "lock");
        let path = self.inner.dir.path_of(&name);
        let io_error = |e| acquire_error(e, &path);
        let file = self.inner.dir.open_file(&name, true).map_err(io_error)?;
        match try_flock(&file) {
            Ok(()) => Ok(Some((file, path))),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(io_error(e)),
        }
    }

    /// Records `file` as `owner`'s hold of `key` and builds its lease.
    fn grant(&self, key: &str, owner: String, file: File, parts: LeaseParts) -> Lease {
        self.held().entry(key.to_owned()).or_default().push(Held {
            owner: owner.clone(),
            file,
        });
        let (this, sync_key) = (self.clone(), key.to_owned());
        let (dup_this, dup_key, dup_owner) = (self.clone(), key.to_owned(), owner.clone());
        Lease::new(
            parts,
            self.inner.leases.get_or_init(|| Arc::new(self.clone())),
        )
        .with_sync_release(move || {
            this.release_held(&sync_key, &owner);
        })
        .with_lock_fd(move || dup_this.duplicate_held(&dup_key, &dup_owner))
    }

    /// Unlock of a lock this instance does not hold: tell the caller whether
    /// it is held elsewhere under `owner` (which only its process can free).
    fn unlock_elsewhere(&self, key: &str, owner: &str) -> Result<()> {
        let name = file_name(key, "lock");
        let path = self.inner.dir.path_of(&name);
        let file = match self.inner.dir.open_file(&name, false) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Error::not_held(key)),
            Err(e) => return Err(Error::backend(BACKEND, "release", with_path(e, &path))),
        };
        match file.try_lock() {
            // Nobody holds it (our probe lock goes away with `file`).
            Ok(()) => Err(Error::not_held(key)),
            Err(TryLockError::WouldBlock) => match read_record(&file, &path)? {
                Some(record) if record.owner == owner => Err(Error::unsupported(BACKEND, "release", format!(
                        "the lock on {key:?} is held by process {} through an open file, and a flock can only be \
                         released by that process; stop it and the kernel frees the lock",
                        record.pid
                    ))),
                _ => Err(Error::not_held(key)),
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
            unlock_by_owner: false,
            release_wakeup: false,
            // Only releases made in this process are announced.
            release_notifications: false,
            // `/proc/locks` tells which files are locked, by whom.
            inspect: cfg!(target_os = "linux"),
            list: cfg!(target_os = "linux"),
            force_release: false,
            // Waits poll with `LOCK_NB`: new readers get in meanwhile.
            writer_priority: false,
            ..Capabilities::ALL
        }
    }

    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let Some((file, path)) = self.try_flock(key, ttl, File::try_lock)? else {
            return Ok(None);
        };
        let io_error = |e| acquire_error(e, &path);
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
        let parts = LeaseParts::unexpiring(key, owner.clone(), Some(record.fencing_token), ttl);
        Ok(Some(self.grant(key, owner, file, parts)))
    }

    /// `flock(LOCK_SH)` on the key's lock file, on a descriptor of its own;
    /// see the [module docs](self) (readers write no record).
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let Some((file, path)) = self.try_flock(key, ttl, File::try_lock_shared)? else {
            return Ok(None);
        };
        // Writers write the record under `LOCK_EX`, which our `LOCK_SH`
        // excludes: this read cannot see half a record.
        let current = read_record(&file, &path)?.map_or(0, |r| r.fencing_token);
        let owner = new_owner_token();
        let parts = LeaseParts::unexpiring(key, owner.clone(), Some(current), ttl);
        Ok(Some(self.grant(key, owner, file, parts)))
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
        let still_ours = match held
            .get(key)
            .and_then(|h| h.iter().find(|h| h.owner == owner))
        {
            Some(h) => same_file(&self.inner.dir, &h.file, &name),
            None => return Err(Error::not_held(key)),
        };
        if !still_ours {
            // Deleted or replaced: another process can lock the new file, so
            // this lock no longer excludes anybody.
            Self::take_held(&mut held, key, owner);
            return Err(Error::not_held(key));
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
            return Err(Error::not_acquired(key));
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
            Err(TryLockError::WouldBlock) => return Err(Error::not_acquired(key)),
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

/// A failed acquisition's error: `error` with `path` in its message.
fn acquire_error(error: io::Error, path: &Path) -> Error {
    Error::backend(BACKEND, "acquire", with_path(error, path))
}

/// `error` with `path` in its message.
fn with_path(error: io::Error, path: &Path) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

#[cfg(test)]
mod tests;
