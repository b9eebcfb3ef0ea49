//! etcd-client's errors as distlock's: every failure is an outage
//! ([`Error::Backend`]), never contention, with the client's error kept as
//! the source and the cluster it happened on in the message.

use std::fmt;

use crate::Error;

use super::BACKEND;

/// An etcd-client error with where it happened (the cluster, without the
/// password).
#[derive(Debug)]
pub(super) struct Failure {
    cluster: String,
    source: etcd_client::Error,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.cluster, describe(&self.source))
    }
}

/// What to check when a server does not speak etcd's gRPC on that port.
const NOT_ETCD: &str = "is this an etcd client port (2379)? is TLS needed (etcd+https://)?";

/// `error` in one line saying what to check. etcd-client's own `Display`
/// for a gRPC status prints tonic's `Debug` of the transport error
/// (`source: tonic::transport::Error(Transport, hyper::Error(Canceled, ...))`);
/// the statuses a wrong address or port produce are named here instead,
/// and any other keeps the status's code and message with the transport
/// error's own words.
fn describe(error: &etcd_client::Error) -> String {
    use tonic::Code;
    let etcd_client::Error::GRpcStatus(status) = error else {
        return error.to_string();
    };
    // The transport failure under the status, in its `Debug` form: the
    // only form that names hyper's kind (`Canceled`, `KeepAliveTimedOut`).
    let transport = std::error::Error::source(status)
        .map(|source| format!("{source:?}"))
        .unwrap_or_default();
    let words = causes(status);
    match status.code() {
        Code::Cancelled | Code::Unavailable
            if transport.contains("connection closed") || transport.contains("IncompleteMessage") =>
        {
            format!("connection closed during the gRPC handshake: {NOT_ETCD}")
        }
        // Bytes that are not HTTP/2 frames (an SSH banner, a Redis
        // reply) read as a frame of some wrong size or kind.
        Code::Internal if status.message().starts_with("h2 protocol error") => format!(
            "the server's answer is not HTTP/2 ({}{words}): {NOT_ETCD}",
            status.message()
        ),
        Code::Unavailable if transport.contains("KeepAliveTimedOut") => {
            format!("no answer to HTTP/2 keepalive pings: {NOT_ETCD}")
        }
        Code::Unavailable if not_sent(error) => format!(
            "cannot connect ({}{words}): is etcd running there, and is this its client port (2379)?",
            status.message()
        ),
        Code::Unauthenticated => format!(
            "authentication failed ({}): check the user and password in the URL",
            status.message()
        ),
        Code::PermissionDenied => format!(
            "permission denied ({}): the etcd user needs read and write on the key prefix",
            status.message()
        ),
        code => format!("{} (gRPC status {code:?}{words})", status.message()),
    }
}

/// The `Display` text of `error`'s innermost source after ": " (the OS's
/// or TLS's words; the layers between repeat the status's message), or
/// nothing without one.
fn causes(error: &dyn std::error::Error) -> String {
    let mut innermost = None;
    let mut cause = error.source();
    while let Some(inner) = cause {
        innermost = Some(inner);
        cause = inner.source();
    }
    innermost.map_or_else(String::new, |inner| format!(": {inner}"))
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// `source` as [`Error::Backend`] of `operation` on `cluster`.
/// `outcome_unknown`: the request may have been applied (see
/// [`Error::is_outcome_unknown`]).
pub(super) fn backend(
    cluster: &str,
    operation: &'static str,
    source: etcd_client::Error,
    outcome_unknown: bool,
) -> Error {
    Error::Backend {
        backend: BACKEND,
        operation,
        outcome_unknown,
        source: Box::new(Failure {
            cluster: cluster.to_owned(),
            source,
        }),
    }
}

/// A failure this backend found itself (not an etcd-client error), as
/// [`Error::Backend`].
pub(super) fn plain(operation: &'static str, message: String) -> Error {
    Error::backend(BACKEND, operation, message)
}

/// Whether a request that failed with `error` was certainly not applied:
/// the server refused it before proposing it (bad arguments, auth, a lease
/// it does not know). Anything else (a transport error, a timeout, no
/// leader, an unknown status) may have been applied.
pub(super) fn certainly_not_applied(error: &etcd_client::Error) -> bool {
    use tonic::Code;
    match error {
        etcd_client::Error::GRpcStatus(status) if !not_sent(error) => matches!(
            status.code(),
            Code::InvalidArgument
                | Code::NotFound
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::FailedPrecondition
                | Code::OutOfRange
                | Code::ResourceExhausted
        ),
        etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => true,
        other => not_sent(other),
    }
}

/// Whether `error` means the request never left this process (no
/// connection to the member the balancer picked: refused, or no route), so
/// sending it again, to another member, cannot apply it twice.
pub(super) fn not_sent(error: &etcd_client::Error) -> bool {
    let text = match error {
        etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable => {
            status.message().to_owned()
        }
        etcd_client::Error::TransportError(error) => format!("{error:?}"),
        _ => return false,
    };
    text.contains("connect error") || text.contains("ConnectError")
}

/// Whether etcd says the lease a request named does not exist (it expired
/// or was revoked): the session behind it is gone.
pub(super) fn lease_not_found(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status)
        if status.message().contains("requested lease not found"))
}
