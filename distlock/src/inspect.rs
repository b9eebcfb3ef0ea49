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
//! 3. else the process's own command line.
//!
//! Labels are cut to [`MAX_LABEL_LEN`] bytes. Nothing secret belongs in one:
//! anybody who can inspect the lock reads it.
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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
            key_name: Some(key_name).filter(|name| !name.contains('\0')),
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

/// The process's command line, space-separated and cut to
/// [`MAX_LABEL_LEN`], read once.
fn command_line() -> &'static Arc<str> {
    static LINE: OnceLock<Arc<str>> = OnceLock::new();
    LINE.get_or_init(|| {
        let words: Vec<String> = std::env::args_os()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        truncate(words.join(" ")).into()
    })
}

fn truncate(mut label: String) -> String {
    if label.len() > MAX_LABEL_LEN {
        let mut end = MAX_LABEL_LEN;
        while !label.is_char_boundary(end) {
            end -= 1;
        }
        label.truncate(end);
    }
    label
}

/// Milliseconds since the Unix epoch on this host's clock (0 before 1970).
pub(crate) fn unix_millis(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// The instant `millis` after the Unix epoch, saturating far in the future.
pub(crate) fn from_unix_millis(millis: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(millis))
        .unwrap_or(UNIX_EPOCH)
}

/// A holder record as one string, for backends that keep it as a value
/// (a lock file's contents, an etcd value): one `name=value` line per field,
/// with `\` and line breaks in values escaped, so any label round-trips and
/// a record written by a newer version with more fields still decodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderRecord {
    pub(crate) holder: Holder,
    /// Holder's wall clock, milliseconds since the Unix epoch.
    pub(crate) granted_ms: u64,
    pub(crate) ttl_ms: u64,
}

const RECORD_MAGIC: &str = "distlock-holder 1";

impl HolderRecord {
    /// The record of a grant made now by [`Holder::current`].
    pub(crate) fn now(ttl: Duration) -> Self {
        HolderRecord {
            holder: Holder::current(),
            granted_ms: unix_millis(SystemTime::now()),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        }
    }

    pub(crate) fn encode(&self) -> String {
        let mut out = String::with_capacity(64 + self.holder.label.len());
        out.push_str(RECORD_MAGIC);
        for (name, value) in [
            ("host", self.holder.host.as_str()),
            ("pid", &self.holder.pid.to_string()),
            ("granted_ms", &self.granted_ms.to_string()),
            ("ttl_ms", &self.ttl_ms.to_string()),
            ("label", self.holder.label.as_str()),
        ] {
            push_field(&mut out, name, value);
        }
        out
    }

    /// `None` for anything that is not a record this version can read.
    pub(crate) fn decode(text: &str) -> Option<Self> {
        let mut lines = text.split('\n');
        if lines.next()? != RECORD_MAGIC {
            return None;
        }
        let (mut host, mut pid, mut granted, mut ttl, mut label) = (None, None, None, None, None);
        for line in lines {
            let (name, raw) = line.split_once('=')?;
            let value = unescape(raw)?;
            match name {
                "host" => host = Some(value),
                "pid" => pid = value.parse().ok(),
                "granted_ms" => granted = value.parse().ok(),
                "ttl_ms" => ttl = value.parse().ok(),
                "label" => label = Some(value),
                _ => {} // a field of a newer version
            }
        }
        Some(HolderRecord {
            holder: Holder {
                host: host?,
                pid: pid?,
                label: label?,
            },
            granted_ms: granted?,
            ttl_ms: ttl?,
        })
    }

    /// Fills `held` from this record, the grant time read on the holder's clock.
    pub(crate) fn fill(self, held: &mut HeldLock) {
        held.granted = Some(GrantTime {
            at: from_unix_millis(self.granted_ms),
            clock: Clock::Holder,
        });
        held.ttl = Some(Duration::from_millis(self.ttl_ms));
        held.holder = Some(self.holder);
    }
}

/// Appends `\nname=value` to a record, escaping `\` and line breaks in
/// `value`: for backends that store more fields after a [`HolderRecord`]
/// (decoding ignores fields it does not know; read them with
/// [`record_field`]).
pub(crate) fn push_field(out: &mut String, name: &str, value: &str) {
    out.push('\n');
    out.push_str(name);
    out.push('=');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

/// The value of field `name` in a record's `name=value` lines, if present
/// and well escaped.
pub(crate) fn record_field(text: &str, name: &str) -> Option<String> {
    text.split('\n')
        .filter_map(|line| line.split_once('='))
        .find(|(field, _)| *field == name)
        .and_then(|(_, raw)| unescape(raw))
}

fn unescape(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                '\\' => out.push('\\'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
}

/// Refuses every [`ForceRelease`] but [`ForceRelease::Lock`] on a backend
/// whose locks belong to no server session (Redis, Redlock, memory):
/// `lock_is` says what such a lock is instead ("a key", ...), for the
/// error.
pub(crate) fn require_lock_release(
    backend: &'static str,
    how: ForceRelease,
    lock_is: &str,
) -> crate::Result<()> {
    if how == ForceRelease::Lock {
        return Ok(());
    }
    Err(crate::Error::Unsupported {
        backend,
        operation: "force_release",
        reason: format!(
            "{how:?}: a {backend} lock is {lock_is}, not a session; use ForceRelease::Lock \
             (`distlock release --force` without --terminate-session)"
        ),
    })
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
    use proptest::prelude::*;

    fn record(label: &str) -> HolderRecord {
        HolderRecord {
            holder: Holder {
                host: "web-1".into(),
                pid: 4242,
                label: label.into(),
            },
            granted_ms: 1_764_000_000_123,
            ttl_ms: 30_000,
        }
    }

    #[test]
    fn a_record_round_trips_with_line_breaks_and_backslashes_in_its_label() {
        let original = record("sh -c 'echo a\\b\nrm -rf /tmp/x'\r");
        let text = original.encode();
        assert_eq!(text.lines().count(), 6, "one line per field: {text:?}");
        assert_eq!(HolderRecord::decode(&text), Some(original));
    }

    #[test]
    fn anything_else_is_not_a_record() {
        for text in [
            "",
            "7",
            "distlock-holder 2\nhost=a",
            "distlock-holder 1\nhost=a",
        ] {
            assert_eq!(HolderRecord::decode(text), None, "{text:?}");
        }
        let bad_escape = record("x").encode().replace("label=x", "label=\\q");
        assert_eq!(HolderRecord::decode(&bad_escape), None);
    }

    #[test]
    fn fields_of_a_newer_version_are_ignored_and_readable_on_their_own() {
        let mut text = record("job").encode();
        push_field(&mut text, "key", "jobs/a=b\nc");
        assert_eq!(HolderRecord::decode(&text), Some(record("job")));
        assert_eq!(record_field(&text, "key").as_deref(), Some("jobs/a=b\nc"));
        assert_eq!(record_field(&text, "zone"), None);
    }

    #[test]
    fn labels_are_cut_at_a_character_boundary() {
        let label = "é".repeat(MAX_LABEL_LEN);
        let cut = truncate(label);
        assert!(cut.len() <= MAX_LABEL_LEN && cut.len() > MAX_LABEL_LEN - 2);
        assert!(cut.chars().all(|c| c == 'é'));
    }

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

    proptest! {
        #[test]
        fn any_record_round_trips(host in ".{0,40}", pid: u32, label in ".{0,80}", granted: u64, ttl: u64) {
            let original = HolderRecord {
                holder: Holder { host, pid, label },
                granted_ms: granted,
                ttl_ms: ttl,
            };
            prop_assert_eq!(HolderRecord::decode(&original.encode()), Some(original));
        }
    }
}
