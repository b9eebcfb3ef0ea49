//! Waiting for the key ahead: a watch for its deletion, from the revision
//! the queue was read at, so a deletion in between is not missed.

use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::time::Instant;

/// How a watch for a deletion ended.
pub(in crate::etcd) enum Watched {
    /// The key was deleted (released, or its lease expired).
    Deleted,
    /// `deadline` passed first.
    TimedOut,
}

/// Watches `key` from revision `after + 1` until it is deleted or
/// `deadline` passes. `request_timeout` bounds opening the watch.
pub(in crate::etcd) async fn wait_deleted(
    watch: &mut etcd_client::WatchClient,
    key: Vec<u8>,
    after: i64,
    deadline: Option<Instant>,
    request_timeout: Duration,
) -> Result<Watched, WatchFailure> {
    let options = WatchOptions::new().with_start_revision(after.saturating_add(1));
    let mut stream =
        match tokio::time::timeout(request_timeout, watch.watch(key, Some(options))).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Err(WatchFailure::Etcd(error)),
            Err(_) => return Err(WatchFailure::TimedOut),
        };
    let wait = async {
        loop {
            match stream.message().await {
                Ok(Some(response)) => {
                    if response
                        .events()
                        .iter()
                        .any(|event| event.event_type() == EventType::Delete)
                    {
                        return Ok(Watched::Deleted);
                    }
                    if response.canceled() {
                        // Compacted past our start, or the member lost its
                        // leader (`require_leader`): look at the queue again.
                        return Err(WatchFailure::Canceled(response.cancel_reason().to_owned()));
                    }
                }
                Ok(None) => return Err(WatchFailure::Canceled("the watch stream ended".into())),
                Err(error) => return Err(WatchFailure::Etcd(error)),
            }
        }
    };
    tokio::select! {
        ended = wait => ended,
        () = crate::deadline::sleep_until(deadline) => Ok(Watched::TimedOut),
    }
}

/// Why a watch ended without an answer.
#[derive(Debug)]
pub(in crate::etcd) enum WatchFailure {
    Etcd(etcd_client::Error),
    Canceled(String),
    TimedOut,
}
