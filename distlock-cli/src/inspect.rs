//! `distlock status`, `distlock list` and `distlock release --force`: who
//! holds a lock, what is held, and the operator's release, over
//! [`Locker::inspect`], [`Locker::list`] and [`Locker::force_release`].
//!
//! Human output is aligned text on stdout; `--json` prints one JSON value
//! with plain field names, times as RFC 3339 and unix milliseconds,
//! durations in milliseconds.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::inspect::{Clock, ForceRelease, HeldLock};
use distlock::semaphore::Semaphore;
use distlock::{Error, Locker};
use serde::Serialize;

use crate::cli::{ListArgs, ReleaseArgs, StatusArgs};
use crate::exit;
use crate::run::{fail, open};

/// `distlock status`: 0 held, 1 free, 64 bad usage, 69 the backend failed
/// or cannot inspect.
pub(crate) async fn status(args: StatusArgs) -> u8 {
    let locker = match open(&args.backend).await {
        Ok(locker) => locker,
        Err(error) => return fail(&error),
    };
    if let Some(permits) = args.limit {
        return permit_status(locker, &args, permits).await;
    }
    let held = match locker.inspect(&args.key).await {
        Ok(held) => held,
        Err(error) => return fail_inspection(&error),
    };
    if args.json {
        let report = match &held {
            Some(held) => LockReport::from(held),
            None => LockReport::free(&args.key),
        };
        print_json(&report);
    } else {
        match &held {
            Some(held) => print!("{}", describe(held, SystemTime::now())),
            None => println!("{:?} is free", args.key),
        }
    }
    match held {
        Some(_) => 0,
        None => exit::NOT_HELD,
    }
}

/// `distlock status --limit N`: every holder of the semaphore's permits;
/// 0 when any is held, 1 when none is, 64, 69.
async fn permit_status(locker: Arc<dyn Locker>, args: &StatusArgs, permits: u32) -> u8 {
    let semaphore = match Semaphore::new(locker, args.key.clone(), permits) {
        Ok(semaphore) => semaphore,
        Err(error) => return fail(&error),
    };
    let held = match semaphore.holders().await {
        Ok(held) => held,
        Err(error) => return fail_inspection(&error),
    };
    if !args.json {
        println!("{:?}: {} of {permits} permits held", args.key, held.len());
    }
    print_held(&held, args.json);
    match held.is_empty() {
        false => 0,
        true => exit::NOT_HELD,
    }
}

/// `distlock list`: 0 (even when nothing is held), 64, 69.
pub(crate) async fn list(args: ListArgs) -> u8 {
    let locker = match open(&args.backend).await {
        Ok(locker) => locker,
        Err(error) => return fail(&error),
    };
    let held = match locker.list(&args.prefix).await {
        Ok(held) => held,
        Err(error) => return fail_inspection(&error),
    };
    print_held(&held, args.json);
    0
}

/// Held locks as `list` prints them: a table, or a JSON array.
fn print_held(held: &[HeldLock], json: bool) {
    if json {
        let reports: Vec<LockReport> = held.iter().map(LockReport::from).collect();
        print_json(&reports);
    } else {
        print!("{}", table(held, SystemTime::now()));
    }
}

/// `distlock release --force`: 0 evicted (naming whom), 1 nothing was held,
/// 77 the backend cannot free another's lock this way (the message says
/// what can), 69 the backend failed.
pub(crate) async fn force_release(args: ReleaseArgs) -> u8 {
    let locker = match open(&args.backend).await {
        Ok(locker) => locker,
        Err(error) => return fail(&error),
    };
    let how = match args.terminate_session {
        true => ForceRelease::TerminateSession,
        false => ForceRelease::Lock,
    };
    match locker.force_release(&args.key, how).await {
        Ok(Some(evicted)) => {
            let whom = match &evicted.holder {
                Some(holder) => format!(
                    "{} pid {}: {}",
                    holder.host,
                    holder.pid,
                    printable(&holder.label)
                ),
                None => "an unknown holder (it left no record)".to_owned(),
            };
            let token = evicted
                .fencing_token
                .map(|token| format!(", fencing token {token}"))
                .unwrap_or_default();
            let session = evicted
                .session
                .as_deref()
                .map(|session| format!(", session {session}"))
                .unwrap_or_default();
            println!("released {:?}, evicting {whom}{token}{session}", args.key);
            0
        }
        Ok(None) => {
            eprintln!("distlock: {:?} is not held; nothing was released", args.key);
            exit::NOT_HELD
        }
        Err(Error::Unsupported { reason, .. }) => {
            let hint = match how {
                ForceRelease::Lock if reason.contains("TerminateSession") => {
                    "; --terminate-session ends the holder's server session instead, freeing every \
                     lock it holds"
                }
                _ => "",
            };
            eprintln!(
                "distlock: the backend cannot force-release {:?} this way: {reason}{hint}",
                args.key
            );
            exit::HELD_BY_ANOTHER_PROCESS
        }
        Err(error) => fail(&error),
    }
}

/// As [`fail`], but a backend that cannot inspect is unavailable (69) for
/// this command, not bad usage.
fn fail_inspection(error: &Error) -> u8 {
    match error {
        Error::Unsupported { .. } => {
            eprintln!("distlock: {error}");
            exit::UNAVAILABLE
        }
        error => fail(error),
    }
}

fn print_json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        // Serializing plain strings and numbers cannot fail.
        Err(error) => eprintln!("distlock: cannot write JSON: {error}"),
    }
}

/// One lock as `--json` prints it.
#[derive(Debug, Serialize)]
struct LockReport {
    key: String,
    held: bool,
    /// `null` when held by a client that left no record.
    holder: Option<HolderReport>,
    granted: Option<String>,
    granted_unix_ms: Option<u64>,
    /// `server` or `holder`: whose clock `granted` was read on.
    granted_clock: Option<&'static str>,
    ttl_ms: Option<u64>,
    ttl_left_ms: Option<u64>,
    fencing_token: Option<u64>,
    session: Option<String>,
    /// What a holder that is not distlock wrote as the lock's value (an
    /// `etcdctl elect` candidate's proposal).
    value: Option<String>,
    /// Held by shared (reader) holders; `holder` is then one of them, or
    /// `null` where readers leave no record (file).
    shared: bool,
}

#[derive(Debug, Serialize)]
struct HolderReport {
    host: String,
    pid: u32,
    label: String,
}

impl LockReport {
    fn free(key: &str) -> Self {
        LockReport {
            key: key.to_owned(),
            held: false,
            holder: None,
            granted: None,
            granted_unix_ms: None,
            granted_clock: None,
            ttl_ms: None,
            ttl_left_ms: None,
            fencing_token: None,
            session: None,
            value: None,
            shared: false,
        }
    }
}

impl From<&HeldLock> for LockReport {
    fn from(held: &HeldLock) -> Self {
        LockReport {
            key: held.key.clone(),
            held: true,
            holder: held.holder.as_ref().map(|holder| HolderReport {
                host: holder.host.clone(),
                pid: holder.pid,
                label: holder.label.clone(),
            }),
            granted: held
                .granted
                .map(|granted| humantime::format_rfc3339_millis(granted.at).to_string()),
            granted_unix_ms: held.granted.map(|granted| unix_ms(granted.at)),
            granted_clock: held.granted.map(|granted| clock_name(granted.clock)),
            ttl_ms: held.ttl.map(millis),
            ttl_left_ms: held.ttl_left.map(millis),
            fencing_token: held.fencing_token,
            session: held.session.clone(),
            value: held.value.clone(),
            shared: held.shared,
        }
    }
}

fn clock_name(clock: Clock) -> &'static str {
    match clock {
        Clock::Server => "server",
        Clock::Holder => "holder",
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    millis(at.duration_since(UNIX_EPOCH).unwrap_or_default())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `status`'s human output: one line per field.
fn describe(held: &HeldLock, now: SystemTime) -> String {
    let mut rows: Vec<(&str, String)> = Vec::new();
    match &held.holder {
        Some(holder) => {
            rows.push(("host", holder.host.clone()));
            rows.push(("pid", holder.pid.to_string()));
            rows.push(("label", printable(&holder.label)));
        }
        None if held.shared => rows.push((
            "holder",
            "unknown (shared holders leave no record on this backend)".into(),
        )),
        None => rows.push((
            "holder",
            "unknown (held by a client that left no record)".into(),
        )),
    }
    if let Some(granted) = held.granted {
        rows.push((
            "since",
            format!(
                "{} ({} clock, {} ago)",
                humantime::format_rfc3339_seconds(granted.at),
                clock_name(granted.clock),
                age(granted.at, now)
            ),
        ));
    }
    if let Some(ttl) = held.ttl {
        rows.push(("ttl", short_duration(ttl)));
    }
    rows.push((
        "ttl left",
        held.ttl_left
            .map_or_else(|| "does not expire".to_owned(), short_duration),
    ));
    if let Some(token) = held.fencing_token {
        rows.push(("token", token.to_string()));
    }
    if let Some(session) = &held.session {
        rows.push(("session", session.clone()));
    }
    if let Some(value) = &held.value {
        rows.push(("value", printable(value)));
    }
    let how = if held.shared { " shared" } else { "" };
    let mut out = format!("{:?} is held{how}\n", held.key);
    for (name, value) in rows {
        out.push_str(&format!("  {name:<9} {value}\n"));
    }
    out
}

const COLUMNS: [&str; 8] = [
    "KEY", "HOST", "PID", "LABEL", "SINCE", "TTL LEFT", "TOKEN", "SESSION",
];

/// `list`'s human output: a header and one aligned row per lock (`-` for
/// what the backend cannot tell, `?` for an unknown holder).
fn table(held: &[HeldLock], now: SystemTime) -> String {
    let rows: Vec<[String; 8]> = held.iter().map(|held| row(held, now)).collect();
    let mut widths = COLUMNS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = COLUMNS.map(str::to_owned);
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (index, (cell, width)) in row.iter().zip(widths).enumerate() {
            if index + 1 == COLUMNS.len() {
                line.push_str(cell);
            } else {
                let pad = width.saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn row(held: &HeldLock, now: SystemTime) -> [String; 8] {
    let dash = || "-".to_owned();
    let (host, pid, label) = match &held.holder {
        Some(holder) => (
            holder.host.clone(),
            holder.pid.to_string(),
            printable(&holder.label),
        ),
        None if held.shared => ("?".into(), "?".into(), "(shared holders)".into()),
        None => ("?".into(), "?".into(), "(unknown holder)".into()),
    };
    let label = if held.shared && held.holder.is_some() {
        format!("{label} (shared)")
    } else {
        label
    };
    [
        printable(&held.key),
        host,
        pid,
        label,
        held.granted.map_or_else(dash, |granted| {
            format!(
                "{} ({} ago)",
                humantime::format_rfc3339_seconds(granted.at),
                age(granted.at, now)
            )
        }),
        held.ttl_left.map_or_else(dash, short_duration),
        held.fencing_token
            .map_or_else(dash, |token| token.to_string()),
        held.session.clone().unwrap_or_else(dash),
    ]
}

/// How long ago `at` was, to the second ("0s" for a time in the future:
/// a server clock ahead of ours).
fn age(at: SystemTime, now: SystemTime) -> String {
    let ago = now.duration_since(at).unwrap_or_default();
    humantime::format_duration(Duration::from_secs(ago.as_secs())).to_string()
}

/// A duration to the tenth of a second: `29.8s`, `1h 2m 3.4s`.
fn short_duration(duration: Duration) -> String {
    let tenths = duration.as_millis() / 100;
    let (secs, tenth) = (tenths / 10, tenths % 10);
    let whole =
        humantime::format_duration(Duration::from_secs(u64::try_from(secs).unwrap_or(u64::MAX)))
            .to_string();
    match (tenth, whole.strip_suffix('s')) {
        (0, _) | (_, None) => whole,
        (tenth, Some(rest)) => format!("{rest}.{tenth}s"),
    }
}

/// `text` on one line: control characters (a label's line breaks, tabs)
/// escaped, so a row stays a row.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::inspect::{GrantTime, Holder};

    fn held(key: &str, label: &str) -> HeldLock {
        let mut held = HeldLock::new(key);
        held.holder = Some(Holder {
            host: "web-1".into(),
            pid: 4242,
            label: label.into(),
        });
        held.granted = Some(GrantTime {
            at: UNIX_EPOCH + Duration::from_secs(1_796_119_200),
            clock: Clock::Server,
        });
        held.ttl = Some(Duration::from_secs(30));
        held.ttl_left = Some(Duration::from_millis(17_250));
        held.fencing_token = Some(7);
        held
    }

    #[test]
    fn the_table_is_aligned_and_marks_unknown_holders() {
        let now = UNIX_EPOCH + Duration::from_secs(1_796_119_212);
        let foreign = {
            let mut foreign = HeldLock::new("jobs/py");
            foreign.ttl_left = Some(Duration::from_secs(5));
            foreign
        };
        let text = table(&[held("jobs/nightly", "backup --full\nnow"), foreign], now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let column = |name: &str| lines[0].find(name).expect("a header column");
        for name in ["HOST", "PID", "LABEL", "SINCE", "TTL LEFT", "TOKEN"] {
            let at = column(name);
            for line in &lines[1..] {
                let before = line.as_bytes().get(at.wrapping_sub(1)).copied();
                assert_eq!(before, Some(b' '), "{name} aligned in {text}");
            }
        }
        assert!(lines[1].contains("backup --full\\nnow"), "{text}");
        assert!(
            lines[1].contains("2026-12-01T10:00:00Z (12s ago)"),
            "{text}"
        );
        assert!(lines[1].contains("17.2s"), "{text}");
        assert!(lines[2].contains("(unknown holder)"), "{text}");
    }

    #[test]
    fn json_has_plain_fields_times_in_both_forms_and_durations_in_ms() {
        let value = serde_json::to_value(LockReport::from(&held("k", "job"))).unwrap();
        assert_eq!(value["holder"]["pid"], 4242);
        assert_eq!(value["granted"], "2026-12-01T10:00:00.000Z");
        assert_eq!(value["granted_unix_ms"], 1_796_119_200_000u64);
        assert_eq!(value["granted_clock"], "server");
        assert_eq!(value["ttl_ms"], 30_000);
        assert_eq!(value["ttl_left_ms"], 17_250);
        let free = serde_json::to_value(LockReport::free("k")).unwrap();
        assert_eq!(
            (free["held"].clone(), free["holder"].clone()),
            (false.into(), serde_json::Value::Null)
        );
    }

    #[test]
    fn durations_read_to_the_tenth() {
        assert_eq!(short_duration(Duration::from_millis(29_870)), "29.8s");
        assert_eq!(short_duration(Duration::from_secs(60)), "1m");
        assert_eq!(
            short_duration(Duration::from_millis(3_723_400)),
            "1h 2m 3.4s"
        );
        assert_eq!(short_duration(Duration::from_millis(40)), "0s");
    }
}
