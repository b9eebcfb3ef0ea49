//! Acquires still running on slow nodes after a grant, so that a release by
//! the same token cannot overtake them.
//!
//! A grant returns once a majority holds the key; the other nodes' acquires
//! finish in the background. A release sent to such a node before its
//! acquire has landed finds nothing to delete, and the acquire then lands
//! after it and holds the key there until its ttl (for example when the
//! node answers the acquire's `EVALSHA` with `NOSCRIPT` and the script is
//! loaded and sent again after the release). So each node's acquire call
//! carries a marker that is dropped when the call ends, and the release by
//! that token waits on the node's marker before it sends anything there.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use crate::util;

/// One node's acquire, held by the call while it runs: dropped (completed,
/// failed or cut off by its bound) it lets the node's release go.
pub(super) type Marker = watch::Sender<()>;

/// Each node's endpoint and the receiving end of its call's marker.
type Calls = Vec<(Arc<str>, watch::Receiver<()>)>;

/// The acquires of one attempt, as the calls were started.
#[derive(Default)]
pub(super) struct Attempt(Mutex<Calls>);

impl Attempt {
    /// The marker for the acquire call on the node at `endpoint`.
    pub(super) fn marker(&self, endpoint: &str) -> Marker {
        let (marker, landed) = watch::channel(());
        util::lock(&self.0).push((endpoint.into(), landed));
        marker
    }
}

/// The attempts with acquires still running, by owner token.
#[derive(Default)]
pub(super) struct Landings(Mutex<HashMap<Arc<str>, Calls>>);

impl Landings {
    /// Keeps the calls of `attempt` by `owner` that are still running until
    /// they end; none running (the usual case), nothing is kept.
    pub(super) fn track(self: &Arc<Self>, owner: &str, attempt: Attempt) {
        let mut running = attempt
            .0
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        // `has_changed` fails once the marker is dropped: that call ended.
        running.retain(|(_, landed)| landed.has_changed().is_ok());
        if running.is_empty() {
            return;
        }
        let owner: Arc<str> = owner.into();
        let waits: Vec<_> = running.iter().map(|(_, landed)| landed.clone()).collect();
        self.by_owner().insert(owner.clone(), running);
        let landings = Arc::clone(self);
        // The calls are bounded, so this ends, and the entry with it.
        tokio::spawn(async move {
            for mut landed in waits {
                // Nothing is ever sent: this returns when the marker drops.
                let _ = landed.changed().await;
            }
            landings.by_owner().remove(&owner);
        });
    }

    /// Waits until the acquire by `owner` on the node at `endpoint` has
    /// ended, if it is still running.
    pub(super) fn landed(
        &self,
        owner: &str,
        endpoint: &str,
    ) -> impl Future<Output = ()> + Send + 'static {
        let running = self.by_owner().get(owner).and_then(|calls| {
            calls
                .iter()
                .find(|(node, _)| &**node == endpoint)
                .map(|(_, landed)| landed.clone())
        });
        async move {
            if let Some(mut landed) = running {
                let _ = landed.changed().await;
            }
        }
    }

    fn by_owner(&self) -> MutexGuard<'_, HashMap<Arc<str>, Calls>> {
        util::lock(&self.0)
    }
}
