//! Errors from mysql_async and from the session actor, made readable: every
//! error names what the backend was doing, keeps the driver's error as its
//! source, and never shows a password.

use std::fmt;
use std::time::Duration;

use crate::Error;

pub(super) const BACKEND: &str = "mysql";

/// Why a statement sent to a session got no answer.
#[derive(Debug)]
pub(super) enum ExecError {
    /// The driver or the server reported a failure.
    Mysql(mysql_async::Error),
    /// No answer within the statement's bound: the session was closed.
    Timeout(Duration),
    /// The session was closed before (or while) the statement ran.
    Closed(String),
}

/// An [`ExecError`] and what the backend was doing.
#[derive(Debug)]
struct MysqlError {
    context: String,
    source: ExecError,
}

impl fmt::Display for MysqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            ExecError::Mysql(e) => write!(f, "{}: {e}", self.context),
            ExecError::Timeout(after) => write!(
                f,
                "{}: no answer within {after:?}; the session was closed",
                self.context
            ),
            ExecError::Closed(why) => write!(f, "{}: the session is closed ({why})", self.context),
        }
    }
}

impl std::error::Error for MysqlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.source {
            ExecError::Mysql(e) => Some(e),
            _ => None,
        }
    }
}

/// [`Error::Backend`] (or [`Error::DeadlineExceeded`] for a statement that
/// went unanswered) for a failure during `operation`.
pub(super) fn backend(
    operation: &'static str,
    context: impl Into<String>,
    source: ExecError,
) -> Error {
    if let ExecError::Timeout(after) = source {
        return Error::DeadlineExceeded {
            backend: BACKEND,
            operation,
            after,
        };
    }
    Error::backend(
        BACKEND,
        operation,
        MysqlError {
            context: context.into(),
            source,
        },
    )
}

/// [`Error::Backend`] for a driver failure outside a session (connecting).
pub(super) fn driver(
    operation: &'static str,
    context: impl Into<String>,
    source: mysql_async::Error,
) -> Error {
    backend(operation, context, ExecError::Mysql(source))
}

/// An answer that is not what the statement returns (`why`), as an error
/// of `operation` in `context`.
pub(super) fn malformed(
    operation: &'static str,
    context: impl FnOnce() -> String,
    why: impl fmt::Display,
) -> Error {
    Error::backend(BACKEND, operation, format!("{}: {why}", context()))
}

/// Server errors after which the connection is gone: shutdown (1053),
/// MariaDB's `ER_CONNECTION_KILLED` (1927), MySQL 8's
/// `ER_CLIENT_INTERACTION_TIMEOUT` (4031, `wait_timeout` expired).
const FATAL_SERVER_CODES: [u16; 3] = [1053, 1927, 4031];

/// True when the connection cannot be used after `error`: anything but an
/// ordinary server error (a failed statement leaves the session usable).
pub(super) fn is_fatal(error: &mysql_async::Error) -> bool {
    match error {
        mysql_async::Error::Server(server) => FATAL_SERVER_CODES.contains(&server.code),
        _ => true,
    }
}

/// True for a driver failure that says the server does not offer TLS, which
/// `ssl-mode=PREFERRED` answers by connecting without it.
pub(super) fn is_no_tls(error: &mysql_async::Error) -> bool {
    matches!(
        error,
        mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)
    )
}
