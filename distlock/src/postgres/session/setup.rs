//! The one setup statement every session runs as it opens: the server-side
//! settings a held lock depends on, and a warning when the server lacks one.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_postgres::SimpleQueryMessage;

use crate::postgres::config::Settings;
use crate::postgres::errors::BACKEND;

/// The one setup statement of every session, skipping settings the server
/// does not have (`idle_session_timeout` is Postgres 14+,
/// `tcp_user_timeout` 12+):
///
/// - `statement_timeout` and `idle_in_transaction_session_timeout` off: a
///   role or database default would otherwise turn a native wait into an
///   error, or end a session that holds locks (and so free them under their
///   holders);
/// - `idle_session_timeout` as configured (off unless set): the server ends
///   a session it has heard nothing from for that long, whatever sits in
///   between; the watch's pings keep a live one inside it;
/// - `lock_timeout` (see [`Settings::session_lock_timeout_ms`]);
/// - the server's keepalive for this connection, unless left alone. On a
///   Unix socket the server accepts and ignores it.
pub(super) fn session_setup_sql(settings: &Settings) -> String {
    let mut values = vec![
        ("statement_timeout", "0".to_owned()),
        (
            "idle_session_timeout",
            settings
                .idle_session_timeout
                .map_or_else(|| "0".to_owned(), |idle| format!("{}ms", idle.as_millis())),
        ),
        ("idle_in_transaction_session_timeout", "0".to_owned()),
        (
            "lock_timeout",
            format!("{}ms", settings.session_lock_timeout_ms()),
        ),
    ];
    if let Some(keepalive) = settings.server_keepalive {
        values.extend([
            (
                "tcp_keepalives_idle",
                format!("{}s", whole_seconds(keepalive.idle)),
            ),
            (
                "tcp_keepalives_interval",
                format!("{}s", whole_seconds(keepalive.interval)),
            ),
            ("tcp_keepalives_count", keepalive.retries.to_string()),
            (
                "tcp_user_timeout",
                format!("{}ms", keepalive.user_timeout.as_millis()),
            ),
        ]);
    }
    // Every value is generated here (names above, integers), never caller
    // text.
    let rows: Vec<String> = values
        .iter()
        .map(|(name, value)| format!("('{name}', '{value}')"))
        .collect();
    format!(
        "SELECT s.name, set_config(s.name, s.value, false) FROM (VALUES {}) AS s(name, value) \
         WHERE s.name IN (SELECT name FROM pg_settings)",
        rows.join(", ")
    )
}

/// Warns once per process when `idle_session_timeout` is configured but the
/// server has no such setting (Postgres 13 and older): the one bound on a
/// vanished holder's locks that holds whatever sits in between is then
/// missing, and behind a pooler or proxy that keeps the server session open
/// only the pooler's own keepalive ends it.
pub(super) fn warn_if_idle_session_timeout_is_missing(
    settings: &Settings,
    applied: &[SimpleQueryMessage],
) {
    use std::sync::atomic::AtomicBool;
    static WARNED: AtomicBool = AtomicBool::new(false);
    let applied: Vec<&str> = applied
        .iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => row.get(0),
            _ => None,
        })
        .collect();
    if !idle_session_timeout_missing(settings.idle_session_timeout, &applied) {
        return;
    }
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            component = "distlock",
            backend = BACKEND,
            server = %settings.target,
            "the server has no idle_session_timeout (Postgres 13 or older): behind a pooler \
             or proxy that keeps a vanished holder's server session open (PgBouncer, a \
             sidecar), its locks stay until that pooler notices; set its client keepalive \
             (PgBouncer: tcp_keepalive, tcp_keepidle=2, tcp_keepintvl=2, tcp_keepcnt=5, \
             tcp_user_timeout=12000), or upgrade to Postgres 14+"
        );
    }
}

/// True when an `idle_session_timeout` was asked for and the setup statement
/// did not apply it (the names of the settings it applied are `applied`).
fn idle_session_timeout_missing(wanted: Option<Duration>, applied: &[&str]) -> bool {
    wanted.is_some() && !applied.contains(&"idle_session_timeout")
}

fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_idle_session_timeout_is_noticed_only_when_one_was_asked_for() {
        let pg13 = ["statement_timeout", "lock_timeout", "tcp_keepalives_idle"];
        let pg14 = ["statement_timeout", "idle_session_timeout", "lock_timeout"];
        let ten = Some(Duration::from_secs(10));
        assert!(idle_session_timeout_missing(ten, &pg13));
        assert!(!idle_session_timeout_missing(ten, &pg14));
        assert!(!idle_session_timeout_missing(None, &pg13));
    }
}
