//! zookeeper-client's errors as distlock's: every failure is an outage
//! ([`Error::Backend`] or [`Error::DeadlineExceeded`]), never contention,
//! with the client's error kept as the source and the ensemble it happened
//! on in the message.

use std::fmt;
use std::time::Duration;

use zookeeper_client as zk;

use crate::Error;

use super::BACKEND;

/// A zookeeper-client error with where it happened (the ensemble, without
/// the password).
#[derive(Debug)]
pub(super) struct Failure {
    ensemble: String,
    source: zk::Error,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.ensemble, self.source)?;
        match self.source {
            zk::Error::ConnectionLoss | zk::Error::NoHosts | zk::Error::Timeout => f.write_str(
                " (is the ensemble running and reachable? check the endpoints and the servers' \
                 clientPort)",
            ),
            zk::Error::AuthFailed | zk::Error::NoAuth => {
                f.write_str(" (check the user name, the password and the lock path's ACL)")
            }
            zk::Error::SessionExpired => f.write_str(
                " (the session expired: its locks are gone; the next call opens a new one)",
            ),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// `source` as [`Error::Backend`] of `operation` on `ensemble`.
/// `writes`: the request changes data, so unless ZooKeeper certainly
/// refused it, it may have been applied ([`Error::is_outcome_unknown`]).
pub(super) fn backend(
    ensemble: &str,
    operation: &'static str,
    source: zk::Error,
    writes: bool,
) -> Error {
    Error::Backend {
        backend: BACKEND,
        operation,
        outcome_unknown: writes && !certainly_not_applied(&source),
        source: Box::new(Failure {
            ensemble: ensemble.to_owned(),
            source,
        }),
    }
}

/// A failure this backend found itself (not a zookeeper-client error), as
/// [`Error::Backend`].
pub(super) fn plain(operation: &'static str, message: String) -> Error {
    Error::backend(BACKEND, operation, message)
}

/// A request that got no answer within `after`.
pub(super) fn deadline(operation: &'static str, after: Duration) -> Error {
    Error::DeadlineExceeded {
        backend: BACKEND,
        operation,
        after,
    }
}

/// Whether a request that failed with `error` was certainly not applied:
/// the server answered with a refusal, or the session is gone (and an
/// ephemeral node with it). A lost connection or an unknown failure may
/// have been applied.
pub(super) fn certainly_not_applied(error: &zk::Error) -> bool {
    matches!(
        error,
        zk::Error::NoNode
            | zk::Error::NodeExists
            | zk::Error::BadVersion
            | zk::Error::NotEmpty
            | zk::Error::NoAuth
            | zk::Error::AuthFailed
            | zk::Error::InvalidAcl
            | zk::Error::BadArguments(_)
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::Unimplemented
            | zk::Error::QuotaExceeded
            | zk::Error::Throttled
            | zk::Error::NotReadOnly
            | zk::Error::SessionExpired
            | zk::Error::ClientClosed
            | zk::Error::SessionMoved
    )
}

/// Whether `error` means the session (and every ephemeral node of it) is
/// gone for good.
pub(super) fn session_ended(error: &zk::Error) -> bool {
    matches!(
        error,
        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed
    )
}
