//! The bound on a server backend's connect, and the error that names what
//! to check when it passes.

use std::future::Future;
use std::time::Duration;

use crate::{Error, Result};

/// Runs a backend's `connect` to `target` (an address or URL without
/// password), abandoning it after `limit`. A connect that does not finish
/// is an [`Error::Backend`] for `"connect"` (nothing that could take a lock
/// was sent) whose message names `target`, the settings that make the
/// bound (`bound_by`, such as "connect_timeout= plus query_timeout= in the
/// URL") and what to check: a silent server is otherwise a bare duration.
pub(crate) async fn bounded_connect<T>(
    backend: &'static str,
    target: &str,
    bound_by: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::backend(
            backend,
            "connect",
            ConnectTimeout {
                target: target.to_owned(),
                after: limit,
                bound_by,
            },
        )),
    }
}

/// A connect abandoned at its bound, as [`bounded_connect`] reports it.
#[derive(Debug)]
struct ConnectTimeout {
    target: String,
    after: Duration,
    bound_by: &'static str,
}

impl std::fmt::Display for ConnectTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} did not finish connecting within {:?} (the bound is {}): check that the server \
             is running there and that this is its port; a firewall dropping packets, or \
             another service on that port that never answers, looks like this",
            self.target, self.after, self.bound_by
        )
    }
}

impl std::error::Error for ConnectTimeout {}
