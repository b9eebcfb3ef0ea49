//! Turning redis-rs errors into [`Error`]s that say what happened, where, and
//! what the caller can conclude about the lock.

use std::fmt;
use std::time::Duration;

use redis::{ErrorKind, RedisError};

use super::BACKEND;
use crate::Error;

/// What a failed request may have done on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The request never reached a server that would run it (connection
    /// refused, authentication failed, ...).
    NotApplied,
    /// The request may have run: the reply timed out, or the connection broke
    /// after it was sent.
    Unknown,
}

/// Classifies `err` for a request that changes state (an acquire).
///
/// Only failures that happen before a command can be written count as "not
/// applied"; everything else, including a server error raised half-way
/// through a script, may have taken effect.
pub(crate) fn outcome(err: &RedisError) -> Outcome {
    // `NOPERM` refuses a command before it runs; a script refused a
    // command half-way ("can't run this command") may have written already.
    let before_sending = is_authentication_failure(err)
        || err.code() == Some("NOPERM")
        || err.is_connection_refusal()
        || matches!(
            err.kind(),
            ErrorKind::InvalidClientConfig | ErrorKind::RESP3NotSupported
        );
    if before_sending {
        Outcome::NotApplied
    } else {
        Outcome::Unknown
    }
}

/// The server rejected the credentials (`WRONGPASS`), or demands some
/// (`NOAUTH`).
pub(crate) fn is_authentication_failure(err: &RedisError) -> bool {
    err.kind() == ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("WRONGPASS" | "NOAUTH"))
}

/// The server refused a command, key or channel to this ACL user: `NOPERM`
/// for a command sent directly, or the error a script gets for a command
/// it may not run (Redis 7: "The user executing the script can't run this
/// command or subcommand").
pub(crate) fn is_permission_denied(err: &RedisError) -> bool {
    if err.code() == Some("NOPERM") {
        return true;
    }
    let text = err.to_string();
    text.contains("can't run this command") || text.contains("no permissions")
}

/// The server an operation talked to, and the bounds it ran under: what an
/// error message needs besides the redis-rs error.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The server's URL without password.
    pub(crate) endpoint: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

impl Target {
    /// Builds the [`Error::Backend`] for `operation`, with `err` as its
    /// source.
    ///
    /// The message names authentication failures and timeouts plainly, and
    /// says when an acquire's outcome is unknown and it is being undone in the
    /// background.
    pub(crate) fn error(
        &self,
        operation: &'static str,
        err: RedisError,
        acquire_outcome_unknown: bool,
    ) -> Error {
        let endpoint = &self.endpoint;
        // The message still spells out the redis-rs error (callers print the
        // top-level message only); it is also kept whole as the `source`.
        let mut message = if err.code() == Some("NOAUTH") {
            format!("authentication failed at {endpoint}: the server requires a password ({err})")
        } else if is_authentication_failure(&err) {
            format!(
                "authentication failed at {endpoint}: the server rejected the user name or password ({err})"
            )
        } else if is_permission_denied(&err) {
            format!(
                "permission denied at {endpoint}: the ACL user may not run a command, or use a \
                 key or channel, that the backend needs (the rules it needs: \
                 {}) ({err})",
                super::ACL_RULES
            )
        } else if err.kind() == ErrorKind::Parse {
            // redis-rs's parse error is several lines ("Parse error at 1",
            // "Unexpected `83`"): one line here, the whole error as source.
            let said = err
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            format!(
                "{endpoint} did not answer as a Redis server ({said}): check the port, and the \
                 scheme (rediss:// if the server expects TLS)"
            )
        } else if err.is_timeout() {
            format!(
                "{endpoint} timed out (connect timeout {:?}, response timeout {:?})",
                self.connect_timeout, self.response_timeout
            )
        } else {
            format!("{endpoint}: {err}")
        };
        if acquire_outcome_unknown {
            message.push_str(
                "; the lock may have been acquired, so it is being released by its owner token \
                 in the background (failing that, it expires at its ttl)",
            );
        }
        let error = Error::backend(
            BACKEND,
            operation,
            Failure {
                message,
                source: err,
            },
        );
        if acquire_outcome_unknown {
            error.with_outcome_unknown()
        } else {
            error
        }
    }
}

/// A failed Redis call: what it means for the caller, with the redis-rs
/// error kept as the source (its kind, server code and I/O error stay
/// inspectable through [`std::error::Error::source`]).
#[derive(Debug)]
pub(crate) struct Failure {
    message: String,
    source: RedisError,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}
