//! The Redlock acquire: one attempt on every node at once, a grant once a
//! majority holds the token with enough validity left, and every other end
//! undone on every node by that token ([`PendingAcquire`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::landing;
use super::quorum::{self, remaining_validity};
use super::RedlockLocker;
use crate::inspect::Holder;
use crate::pending::PendingAcquire;
use crate::{new_owner_token, Lease, LeaseParts, Result};

impl RedlockLocker {
    /// One attempt on every node; see the module docs. Not bounded by
    /// itself: every node call is. Every exit that may leave the key on a
    /// node, including being dropped, releases it by token in the
    /// background.
    pub(super) async fn acquire(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let nodes = self.inner.nodes.len();
        let quorum = self.inner.quorum;
        let pending = PendingAcquire::arm(
            self,
            std::slice::from_ref(&key),
            new_owner_token(),
            ttl,
            "a Redlock acquire that did not reach a majority, or was abandoned",
        );
        let owner = pending.owner();
        let bound = self.acquire_bound(ttl);
        let (shared_key, shared_owner): (Arc<str>, Arc<str>) = (key.into(), owner.into());
        // Read on the caller's task: its label scope.
        let holder = Arc::new(Holder::current());
        let started = Instant::now();
        let attempt = landing::Attempt::default();
        // The validity counts from the moment the majority is in; slower
        // nodes are not waited for (their calls go on in the background, so
        // the lock lands on every node that answers in time).
        let tally = self
            .on_nodes(
                "acquire",
                bound,
                |node| {
                    let (key, owner) = (shared_key.clone(), shared_owner.clone());
                    let holder = holder.clone();
                    let marker = attempt.marker(node.endpoint());
                    async move {
                        let result = node.acquire_as(&key, &owner, ttl, Some(&holder)).await;
                        drop(marker);
                        result
                    }
                },
                |tally| tally.yes >= quorum,
            )
            .await;
        // A release by this token, granted or undone, waits on the nodes
        // whose acquire is still running (see `landing.rs`).
        self.inner.landings.track(owner, attempt);
        let elapsed = started.elapsed();
        let drift = self.drift(ttl);
        let validity = remaining_validity(ttl, elapsed, drift);
        let min_validity = self.inner.min_validity;
        if tally.yes >= quorum && validity.is_some_and(|left| left > min_validity) {
            let valid_until = ttl
                .checked_sub(drift)
                .and_then(|valid| started.checked_add(valid));
            let factor = self.inner.drift_factor;
            let parts = LeaseParts {
                key: key.to_owned(),
                owner: pending.settle(),
                fencing_token: None,
                ttl,
                valid_until,
            };
            let lease = Lease::new(
                parts,
                self.inner.leases.get_or_init(|| Arc::new(self.clone())),
            )
            .with_validity_discount(move |ttl| quorum::drift(ttl, factor));
            return Ok(Some(lease));
        }
        if tally.yes == 0 && !tally.outcome_unknown() {
            // No node has our token: nothing to undo.
            pending.settle();
        }
        // From here `pending` is dropped armed (unless settled above): the
        // attempt is released on every node by its token in the background.
        if tally.yes >= quorum {
            let summary = format!(
                "granted by {} of {nodes} nodes, but only {:?} of the {ttl:?} ttl was left \
                 after {elapsed:?} and the {drift:?} drift allowance (minimum {min_validity:?}): \
                 the nodes answered too slowly for this ttl; released",
                tally.yes,
                validity.unwrap_or_default()
            );
            return Err(self.quorum_error("acquire", summary, tally));
        }
        if tally.refused_by_majority(nodes) {
            return Ok(None);
        }
        let summary = format!(
            "granted by {} and refused by {} of {nodes} nodes; the others failed, so no majority \
             ({quorum}) could be reached; released",
            tally.yes, tally.no
        );
        Err(self.quorum_error("acquire", summary, tally))
    }
}
