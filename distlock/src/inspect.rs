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

/// The process's command line as [`command_label`] makes it, read once.
fn command_line() -> &'static Arc<str> {
    static LINE: OnceLock<Arc<str>> = OnceLock::new();
    LINE.get_or_init(|| command_label(std::env::args_os()).into())
}

/// A holder label for the command line `argv`: its words joined by spaces,
/// with every value that looks like a secret replaced by `***`, cut to
/// [`MAX_LABEL_LEN`] bytes. Every label distlock derives from a command line
/// goes through it (see the [module docs](self#what-a-label-derived-from-a-command-line-keeps)
/// for what it redacts and what it cannot recognise).
///
/// ```
/// use distlock::inspect::command_label;
///
/// let label = command_label([
///     "pg_dump",
///     "--dbname=postgres://backup:hunter2@db1/app?sslpassword=k3y",
///     "--password",
///     "hunter2",
///     "PGPASSWORD=hunter2",
///     "--key",
///     "nightly",
/// ]);
/// assert_eq!(
///     label,
///     "pg_dump --dbname=postgres://backup:***@db1/app?sslpassword=*** --password *** \
///      PGPASSWORD=*** --key nightly"
/// );
/// ```
pub fn command_label<S: AsRef<std::ffi::OsStr>>(argv: impl IntoIterator<Item = S>) -> String {
    let words: Vec<String> = argv
        .into_iter()
        .map(|arg| arg.as_ref().to_string_lossy().into_owned())
        .collect();
    // Word by word over the joined line, so that a script passed as one
    // argument (`sh -c '... --password=x'`) is read as the command line it is.
    let line = words.join(" ");
    let mut label = String::with_capacity(line.len());
    let mut value_follows = false;
    for piece in line.split_inclusive(char::is_whitespace) {
        let word = piece.trim_end_matches(char::is_whitespace);
        let (redacted, next_is_value) = redact_word(word, value_follows);
        label.push_str(&redacted);
        label.push_str(&piece[word.len()..]);
        value_follows = next_is_value;
    }
    truncate(label)
}

/// What replaces a secret in a label.
const REDACTED: &str = "***";

/// One whitespace-free word of a command line, redacted, and whether the
/// word after it is a secret option's value (`--password hunter2`).
/// `is_value` says this word is one.
fn redact_word(word: &str, is_value: bool) -> (String, bool) {
    // Quotes and brackets around a word of a script (`'--token=x'`) are kept
    // but not read as part of it.
    const AROUND: &[char] = &['\'', '"', '`', '(', ')', ';'];
    let body = word.trim_start_matches(AROUND);
    let before = &word[..word.len() - body.len()];
    let body = body.trim_end_matches(AROUND);
    let after = &word[before.len() + body.len()..];
    if body.is_empty() {
        return (word.to_owned(), is_value);
    }
    let redacted = |inner: &str| format!("{before}{inner}{after}");
    if is_value && !body.starts_with('-') {
        return (redacted(REDACTED), false);
    }
    let dashes = body.len() - body.trim_start_matches('-').len();
    if dashes > 0 {
        // An option: `--name=value` or `--name` (its value may follow).
        return match body.split_once('=') {
            Some((name, _)) if is_secret_name(name) => {
                (redacted(&format!("{name}={REDACTED}")), false)
            }
            Some((name, value)) => (redacted(&format!("{name}={}", redact_urls(value))), false),
            None => (redacted(&redact_urls(body)), is_secret_name(body)),
        };
    }
    // `NAME=value`: an environment assignment (`env PGPASSWORD=x cmd`) or a
    // libpq keyword (`"host=db password=x"`).
    if let Some((name, value)) = body.split_once('=') {
        let is_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if is_name {
            let value = match is_secret_name(name) {
                true => REDACTED.to_owned(),
                false => redact_urls(value),
            };
            return (redacted(&format!("{name}={value}")), false);
        }
    }
    (redacted(&redact_urls(body)), false)
}

/// Whether an option or variable named `name` carries a secret: its name
/// contains `pass`, `pwd`, `secret`, `token`, `auth`, `credential`,
/// `cookie` or `private`, or ends a longer word with `key` (`--api-key`,
/// `AWS_SECRET_ACCESS_KEY`), but not `key` alone or first: `--key` names a
/// lock in distlock and a key file or id in most tools, `--keys` a count.
fn is_secret_name(name: &str) -> bool {
    let name = name.trim_start_matches('-').to_ascii_lowercase();
    const SECRET: [&str; 8] = [
        "pass",
        "pwd",
        "secret",
        "token",
        "auth",
        "credential",
        "cookie",
        "private",
    ];
    SECRET.iter().any(|part| name.contains(part)) || name.match_indices("key").any(|(at, _)| at > 0)
}

/// `text` with the password of every URL in it (`scheme://user:PASSWORD@`)
/// and the value of every secret-named query parameter (`?password=`,
/// `&token=`) replaced by `***`. The user name stays: it says who
/// connected, and a URL without a password is not redacted.
fn redact_urls(text: &str) -> String {
    if !text.contains("://") {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#' | ',') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match authority.rfind('@') {
            Some(at_sign) => {
                let userinfo = &authority[..at_sign];
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push(':');
                        out.push_str(REDACTED);
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at_sign..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority_end..];
        let next = rest.find("://").map_or(rest.len(), |at| {
            // The next URL's scheme starts after the last separator before it.
            rest[..at]
                .rfind(|c: char| matches!(c, ',' | '=' | '?' | '&') || c.is_whitespace())
                .map_or(0, |sep| sep + 1)
        });
        out.push_str(&redact_query(&rest[..next]));
        rest = &rest[next..];
    }
    out.push_str(&redact_query(rest));
    out
}

/// A URL's path and query with the values of secret-named parameters
/// replaced by `***`.
fn redact_query(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (index, piece) in text.split_inclusive(['?', '&']).enumerate() {
        let separator = piece.len() - piece.trim_end_matches(['?', '&']).len();
        let (param, end) = piece.split_at(piece.len() - separator);
        match param.split_once('=') {
            // The first piece is the path, before any `?`.
            Some((name, value)) if index > 0 && is_secret_name(name) => {
                out.push_str(name);
                out.push('=');
                out.push_str(REDACTED);
                // A fragment, or the next URL of a list, is not the value.
                let value_end = value.find([',', '#']).unwrap_or(value.len());
                out.push_str(&value[value_end..]);
            }
            _ => out.push_str(param),
        }
        out.push_str(end);
    }
    out
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
    Err(crate::Error::unsupported(
        backend,
        "force_release",
        format!(
            "{how:?}: a {backend} lock is {lock_is}, not a session; use ForceRelease::Lock \
             (`distlock release --force` without --terminate-session)"
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

    #[test]
    fn command_labels_keep_the_command_and_redact_secret_looking_values() {
        for (argv, label) in [
            // The issue's case: the script is read word by word too.
            (
                &["sh", "-c", "sleep 3", "dump-job", "--password=hunter2"][..],
                "sh -c sleep 3 dump-job --password=***",
            ),
            (
                &["distlock", "release", "--url", "postgres://ops:hunter2@db:5432/app", "--key", "K", "--force"],
                "distlock release --url postgres://ops:***@db:5432/app --key K --force",
            ),
            (&["redis-cli", "-u", "redis://:hunter2@r1:6379/0"], "redis-cli -u redis://:***@r1:6379/0"),
            (
                &["job", "--api-key", "hunter2", "--token", "hunter2", "--verbose", "x"],
                "job --api-key *** --token *** --verbose x",
            ),
            // A flag without a value does not swallow the next option.
            (&["psql", "--no-password", "-c", "select 1"], "psql --no-password -c select 1"),
            (
                &["env", "PGPASSWORD=hunter2", "AWS_SECRET_ACCESS_KEY=hunter2", "TZ=UTC", "pg_dump"],
                "env PGPASSWORD=*** AWS_SECRET_ACCESS_KEY=*** TZ=UTC pg_dump",
            ),
            (
                &["sh", "-c", "psql 'host=db password=hunter2' && curl \"--oauth2-bearer=hunter2\""],
                "sh -c psql 'host=db password=***' && curl \"--oauth2-bearer=***\"",
            ),
            (
                &["app", "--db=mysql://u:hunter2@h/d?ssl-mode=REQUIRED&password=hunter2,redis://:hunter2@h2"],
                "app --db=mysql://u:***@h/d?ssl-mode=REQUIRED&password=***,redis://:***@h2",
            ),
            // Nothing secret-looking: kept word for word.
            (
                &["distlock", "bench", "--keys", "100000", "--key", "jobs/a=b", "https://example.com/x?a=1"],
                "distlock bench --keys 100000 --key jobs/a=b https://example.com/x?a=1",
            ),
            (&["curl", "https://token-user@example.com/"], "curl https://token-user@example.com/"),
        ] {
            assert_eq!(command_label(argv), label, "{argv:?}");
        }
    }

    proptest! {
        #[test]
        fn no_password_of_a_url_or_secret_option_survives(
            secret in "[a-zA-Z0-9!%^*+]{6,20}",
            user in "[a-z]{1,8}",
            before in proptest::collection::vec("[a-z0-9/._-]{1,10}", 0..4),
        ) {
            let url = format!("postgres://{user}:{secret}@db/app?password={secret}");
            let mut argv = before.clone();
            argv.extend([url, format!("--password={secret}"), "--secret".into(), secret.clone()]);
            argv.push(format!("sh -c 'PGPASSWORD={secret} psql'"));
            let label = command_label(&argv);
            prop_assert!(!label.contains(&secret), "{label}");
            prop_assert!(label.starts_with(&before.join(" ")), "{label}");
        }
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
