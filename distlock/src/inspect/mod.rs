//! Who holds a lock: the holder record every grant leaves beside its lock,
//! what [`Locker::inspect`](crate::Locker::inspect) and
//! [`Locker::list`](crate::Locker::list) report, and operator release
//! ([`Locker::force_release`](crate::Locker::force_release)).
//!
//! The first question an operator asks when a job did not run is "who holds
//! the lock, since when, and until when?". Each backend answers it the same
//! way: at acquire, the lease records a [`Holder`] (host, process id, label)
//! and the grant time beside the lock, in the same script or statement that
//! takes it where the backend allows (no extra round trip), and it goes away
//! with the lock. [`HeldLock`] is what an inspection finds.
//!
//! # Which label a grant records
//!
//! [`Holder::current`] is read when an acquire starts, on the caller's task:
//!
//! 1. the label of an enclosing [`with_label`] scope on this task (one job
//!    of several in a process, as `distlock cron` runs them);
//! 2. else the process-wide label from [`set_process_label`] (`distlock run`
//!    sets the command it runs);
//! 3. else the process's own command line, through [`command_label`].
//!
//! Labels are cut to [`MAX_LABEL_LEN`] bytes. Nothing secret belongs in one:
//! anybody who can inspect the lock reads it, and the operator's own label
//! is logged at `warn` by every forced release. A caller-given label
//! ([`with_label`], [`set_process_label`]) is recorded as given.
//!
//! # What a label derived from a command line keeps
//!
//! A command line is the best description of what a holder is doing, and
//! the usual place for a careless secret (`--password=...`, a database URL
//! with its password). [`command_label`] keeps every word but the values
//! that *look* secret, read word by word (a script given as one argument,
//! `sh -c '...'`, is read as the command line it is):
//!
//! - `--NAME=VALUE` and `--NAME VALUE` (any number of dashes) where NAME
//!   contains `pass`, `pwd`, `secret`, `token`, `auth`, `credential`,
//!   `cookie` or `private`, or ends a longer word with `key` (`--api-key`);
//! - `NAME=VALUE` words (environment assignments, libpq keywords) whose NAME
//!   does;
//! - the password of every URL (`postgres://user:***@host`, the user name
//!   kept) and the values of secret-named query parameters
//!   (`?password=***`).
//!
//! The rule is by name, never by guessing at values, so it is predictable:
//! `--key nightly` (a lock's name here, a key file or id in most tools)
//! stays. What it cannot recognise stays too: a program's own short options
//! (`mysql -pSECRET`, `redis-cli -a SECRET`), a secret in a positional
//! argument or inside a file. Pass secrets through the environment or a
//! file (`PGPASSWORD`, `~/.pgpass`, `REDISCLI_AUTH`), or give a label of
//! your own. Labels derived from the command line are written by every
//! grant into the lock's value (Redis, etcd, the lock file) or its fencing
//! row (Postgres, MySQL: cleared again by the release, see those backends).
//!
//! ```
//! use std::time::Duration;
//! use distlock::{inspect, memory::MemoryLocker, Locker};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = MemoryLocker::new();
//! let lease = inspect::with_label("nightly backup", async {
//!     locker.try_lock("backup", Duration::from_secs(30)).await
//! })
//! .await?
//! .expect("free");
//!
//! let held = locker.inspect("backup").await?.expect("held");
//! let holder = held.holder.as_ref().expect("memory records its holders");
//! assert_eq!(holder.label, "nightly backup");
//! assert_eq!(holder.pid, std::process::id());
//! assert_eq!(held.fencing_token, lease.fencing_token());
//! lease.release().await?;
//! assert!(locker.inspect("backup").await?.is_none());
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

mod label;
mod record;

pub use label::command_label;
use label::{command_line, truncate};
// Server times arrive as Unix milliseconds only on the backends that read them.
#[cfg(any(feature = "redis", feature = "mysql", feature = "zookeeper"))]
pub(crate) use record::from_unix_millis;
pub(crate) use record::{push_field, record_field, HolderRecord};

/// Longest label recorded, in bytes; longer ones are cut at a character
/// boundary.
pub const MAX_LABEL_LEN: usize = 256;

/// Who holds (or held) a lock: recorded by the holder at acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's host name (`gethostname`), or empty if it could not be
    /// read.
    pub host: String,
    /// The holder's process id on that host.
    pub pid: u32,
    /// What the holder is doing: a caller-given label or its command line
    /// (see the [module docs](self)).
    pub label: String,
}

impl Holder {
    /// This process, with the label in force on the current task (see the
    /// [module docs](self)).
    pub fn current() -> Holder {
        Holder::this_process(&current_label())
    }

    /// This process, doing `label`.
    pub(crate) fn this_process(label: &str) -> Holder {
        Holder {
            host: host_name().to_owned(),
            pid: std::process::id(),
            label: label.to_owned(),
        }
    }
}

/// The label in force on the current task (see the [module docs](self)),
/// shared rather than copied: a backend that writes the holder into every
/// acquire (Redis) builds its request from it.
pub(crate) fn current_label() -> Arc<str> {
    TASK_LABEL
        .try_with(Arc::clone)
        .ok()
        .or_else(|| {
            PROCESS_LABEL
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        })
        .unwrap_or_else(|| Arc::clone(command_line()))
}

/// When a lock was granted, and whose clock said so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantTime {
    /// The wall-clock time of the grant.
    pub at: SystemTime,
    /// Whose clock `at` was read from.
    pub clock: Clock,
}

/// Whose clock a [`GrantTime`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The backend server's (Redis `TIME`, Postgres and MySQL `now()`): one
    /// clock for every holder of the lock.
    Server,
    /// The holder's own wall clock (file, memory, etcd, which has no server
    /// time to read): comparable across holders only as far as their clocks
    /// agree.
    Holder,
}

/// What an inspection found about a held lock.
///
/// Fields a backend cannot tell are `None`; each backend's docs say which.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The key as the caller of the inspecting locker names it.
    pub key: String,
    /// The holder's record, or `None` if the lock is held by a client that
    /// left none (redis-py's `Lock`, `etcdctl lock`, a distlock that predates
    /// holder records, or one with recording turned off): held by an unknown
    /// holder, never reported as free.
    pub holder: Option<Holder>,
    /// When the current grant was made.
    pub granted: Option<GrantTime>,
    /// The ttl the lock was granted or last refreshed with.
    pub ttl: Option<Duration>,
    /// How long the lock stays held without a refresh, where the backend
    /// expires locks and can tell; `None` where locks do not expire (file,
    /// Postgres, MySQL). etcd reports its holder's session lease's time to
    /// live (whole seconds): how long the lock would outlive a holder that
    /// stopped renewing now.
    pub ttl_left: Option<Duration>,
    /// The fencing token of the current grant, where the backend has one.
    pub fencing_token: Option<u64>,
    /// The server session holding the lock, for finding it in the server's
    /// own tools: `pid 4242` (Postgres: `pg_stat_activity.pid`), `connection
    /// 17` (MySQL: the processlist id), `lease 694d7f1e2a6b3c01` (etcd).
    pub session: Option<String>,
    /// What an election's leader published as its key's value, where that
    /// is non-empty text: on etcd, the proposal of an `etcdctl elect`
    /// candidate (which [`crate::elect::Observer`] reports as its
    /// proclaimed value) or a distlock candidate's proclaimed value (what
    /// `etcdctl elect -l` prints; its record is in [`holder`](Self::holder)
    /// as well). `None` for every other lock, distlock's own grants
    /// included, whose record is in [`holder`](Self::holder).
    pub value: Option<String>,
    /// Held by shared (reader) holders ([`Locker::try_lock_shared`](crate::Locker::try_lock_shared)),
    /// not by one exclusive holder. [`holder`](Self::holder) is then one of
    /// the readers where the backend records them (memory: the longest
    /// held), or `None` where readers leave no record (file, Postgres).
    pub shared: bool,
}

impl HeldLock {
    /// A lock held by an unknown holder, every other field unknown: for
    /// backends to fill in.
    pub fn new(key: impl Into<String>) -> Self {
        HeldLock {
            key: key.into(),
            holder: None,
            granted: None,
            ttl: None,
            ttl_left: None,
            fencing_token: None,
            session: None,
            value: None,
            shared: false,
        }
    }
}

/// How [`Locker::force_release`](crate::Locker::force_release) frees a lock
/// whatever its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForceRelease {
    /// Delete the lock itself (Redis, etcd, memory). The holder is not told
    /// at once: its next refresh is `NotHeld` and its lost signal fires then
    /// (within ttl/3 under a keepalive); until then it may still be working.
    /// Its fencing token makes its late writes rejectable.
    Lock,
    /// End the server session that holds the lock (Postgres
    /// `pg_terminate_backend`, MySQL `KILL`): **every other lock that
    /// session holds is freed too**, and the holding process sees its
    /// connection die. Backends whose locks live on sessions offer only
    /// this, and only when asked for it by name.
    TerminateSession,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// What a SQL backend's grant writes into the lock's fencing row beside
/// its counter, in the statement that takes the lock: the key's name (so
/// [`Locker::list`](crate::Locker::list) can name and filter locks), the
/// ttl, and the [`Holder`] unless recording is off. The statement adds the
/// server's grant time and the holding session's id.
#[derive(Debug, Clone)]
pub(crate) struct GrantRecord<'a> {
    /// `None` for a key with a zero byte, which SQL text columns cannot
    /// hold (Postgres refuses it): such a lock is inspected by its key but
    /// not listed.
    pub(crate) key_name: Option<&'a str>,
    /// The holder's host, pid and label: all `None` when recording is off,
    /// which clears those columns.
    pub(crate) host: Option<String>,
    pub(crate) pid: Option<i64>,
    pub(crate) label: Option<String>,
    pub(crate) ttl_ms: i64,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<'a> GrantRecord<'a> {
    /// How the key `key_name` is recorded: as itself, or `None` if it has
    /// a zero byte (see [`key_name`](Self::key_name)).
    pub(crate) fn name_of(key_name: &str) -> Option<&str> {
        Some(key_name).filter(|name| !name.contains('\0'))
    }

    /// The record of a grant made now by [`Holder::current`] (read on the
    /// caller's task), or without a holder if `record_holder` is false. A
    /// zero byte in a label is recorded as U+FFFD.
    pub(crate) fn new(key_name: &'a str, ttl: Duration, record_holder: bool) -> Self {
        let holder = record_holder.then(Holder::current);
        let pid = holder.as_ref().map(|h| i64::from(h.pid));
        let without_zero = |text: String| match text.contains('\0') {
            true => text.replace('\0', "\u{fffd}"),
            false => text,
        };
        let (host, label) = match holder {
            Some(h) => (Some(without_zero(h.host)), Some(without_zero(h.label))),
            None => (None, None),
        };
        GrantRecord {
            key_name: Self::name_of(key_name),
            host,
            pid,
            label,
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
        }
    }
}

/// Runs `future` with `label` as the holder label of every lock it
/// acquires on this task (see the [module docs](self)).
///
/// Only acquires made on the same task see it: a task spawned inside
/// `future` does not inherit it.
pub async fn with_label<F: Future>(label: impl Into<String>, future: F) -> F::Output {
    TASK_LABEL
        .scope(truncate(label.into()).into(), future)
        .await
}

/// Sets the holder label of every lock this process acquires outside a
/// [`with_label`] scope (see the [module docs](self)).
pub fn set_process_label(label: impl Into<String>) {
    *PROCESS_LABEL
        .write()
        .unwrap_or_else(PoisonError::into_inner) = Some(truncate(label.into()).into());
}

tokio::task_local! {
    static TASK_LABEL: Arc<str>;
}

static PROCESS_LABEL: RwLock<Option<Arc<str>>> = RwLock::new(None);

/// This host's name, read once; empty if it cannot be read.
pub(crate) fn host_name() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut buffer = [0u8; 256];
        // SAFETY: the buffer is valid for its length; gethostname writes at
        // most that many bytes.
        let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0;
        let end = buffer.iter().position(|b| *b == 0).unwrap_or(buffer.len());
        match ok {
            true => String::from_utf8_lossy(&buffer[..end]).into_owned(),
            false => String::new(),
        }
    })
}

/// [`Locker::force_release`](crate::Locker::force_release) on a backend
/// whose locks belong to no server session (Redis, Redlock, memory): checks
/// `key`, refuses every [`ForceRelease`] but [`ForceRelease::Lock`]
/// (`lock_is` says what such a lock is instead, "a key", ..., for the
/// error), then runs `delete` and logs what it evicted with
/// [`log_forced_release`]. A force release of a free lock did nothing, so
/// it is not logged.
pub(crate) async fn release_by_deleting(
    backend: &'static str,
    key: &str,
    how: ForceRelease,
    lock_is: &str,
    delete: impl std::future::Future<Output = crate::Result<Option<HeldLock>>>,
) -> crate::Result<Option<HeldLock>> {
    crate::validate::key(key)?;
    if how != ForceRelease::Lock {
        return Err(crate::Error::unsupported(
            backend,
            "force_release",
            format!(
                "{how:?}: a {backend} lock is {lock_is}, not a session; use ForceRelease::Lock \
                 (`distlock release --force` without --terminate-session)"
            ),
        ));
    }
    let evicted = delete.await?;
    if evicted.is_some() {
        log_forced_release(backend, key, how, evicted.as_ref());
    }
    Ok(evicted)
}

/// How often a force release of a backend whose holder can change between
/// its read and its eviction ([`release_holder`]) looks again.
#[cfg(any(
    feature = "etcd",
    feature = "zookeeper",
    feature = "postgres",
    feature = "mysql"
))]
const RELEASE_ATTEMPTS: usize = 3;

/// [`Locker::force_release`](crate::Locker::force_release) of a backend
/// that must read the holder before it can evict it (etcd, ZooKeeper, the
/// SQL backends), written once: `find` reads the holder (`None`: the lock
/// is free), `evict` frees that holder and answers what it evicted, or
/// `None` when the holder was gone meanwhile. Then the lock may have
/// changed hands, so it looks again, a few times, before giving up with
/// [`Error::Backend`](crate::Error::Backend). An eviction is logged with
/// [`log_forced_release`].
#[cfg(any(
    feature = "etcd",
    feature = "zookeeper",
    feature = "postgres",
    feature = "mysql"
))]
pub(crate) async fn release_holder<T, Found, Evicted>(
    backend: &'static str,
    key: &str,
    how: ForceRelease,
    mut find: impl FnMut() -> Found,
    mut evict: impl FnMut(T) -> Evicted,
) -> crate::Result<Option<HeldLock>>
where
    Found: std::future::Future<Output = crate::Result<Option<T>>>,
    Evicted: std::future::Future<Output = crate::Result<Option<HeldLock>>>,
{
    for _ in 0..RELEASE_ATTEMPTS {
        let Some(holder) = find().await? else {
            return Ok(None);
        };
        if let Some(held) = evict(holder).await? {
            log_forced_release(backend, key, how, Some(&held));
            return Ok(Some(held));
        }
    }
    Err(crate::Error::backend(
        backend,
        "force_release",
        format!(
            "{key:?} changed hands {RELEASE_ATTEMPTS} times while being force-released; inspect it again"
        ),
    ))
}

/// Logs a forced release at `warn`, naming who forced it (this process) and
/// whom it evicted. Every backend's `force_release` calls it once the lock
/// is gone, so no forced release goes unrecorded.
pub(crate) fn log_forced_release(
    backend: &'static str,
    key: &str,
    how: ForceRelease,
    evicted: Option<&HeldLock>,
) {
    let operator = Holder::current();
    let (host, pid, label) = match evicted.and_then(|held| held.holder.as_ref()) {
        Some(h) => (h.host.as_str(), Some(h.pid), h.label.as_str()),
        None => ("", None, ""),
    };
    tracing::warn!(
        component = "distlock",
        backend,
        key,
        method = ?how,
        operator_host = operator.host,
        operator_pid = operator.pid,
        operator_label = operator.label,
        evicted = evicted.is_some(),
        holder_host = host,
        holder_pid = pid,
        holder_label = label,
        fencing_token = evicted.and_then(|held| held.fencing_token),
        "lock force-released by an operator"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_label_overrides_the_process_label_only_inside_its_scope() {
        set_process_label("process-wide");
        assert_eq!(Holder::current().label, "process-wide");
        let inside = with_label("job a", async { Holder::current() }).await;
        assert_eq!(inside.label, "job a");
        assert_eq!(inside.pid, std::process::id());
        assert_eq!(inside.host, host_name());
        assert_eq!(Holder::current().label, "process-wide");
    }
}
