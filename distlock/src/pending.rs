//! An acquire whose outcome may be unknown, undone by its owner token when
//! it is dropped armed: written once for every backend whose grant is a
//! value under a token the caller chose (Redis, Redlock).

use std::sync::Arc;
use std::time::Duration;

use crate::{Locker, DEFAULT_RELEASE_TIMEOUT};

/// An acquire that may have taken effect on the server: armed while its
/// outcome is unknown, it releases the lock by its owner token when dropped
/// (the caller cancelled, the bound elapsed, the reply was lost, or too few
/// nodes granted it), so an unknown outcome never leaves a lock under a
/// token nobody knows until its ttl. [`settle`](Self::settle) disarms it
/// on a definite answer.
pub(crate) struct PendingAcquire<'a, L: Locker + Clone> {
    locker: &'a L,
    /// The keys the attempt may have taken (at most one of them: see
    /// [`Locker::try_lock_any`]).
    keys: &'a [&'a str],
    /// `None` once settled.
    owner: Option<String>,
    ttl: Duration,
    /// Names the release in the log (`"an acquire whose outcome is unknown"`).
    what: &'static str,
}

impl<'a, L: Locker + Clone> PendingAcquire<'a, L> {
    /// Armed from the start: the caller is about to send an acquire of one
    /// of `keys` (usually one key) under `owner`, and any await after this
    /// may be the last.
    pub(crate) fn arm(
        locker: &'a L,
        keys: &'a [&'a str],
        owner: String,
        ttl: Duration,
        what: &'static str,
    ) -> Self {
        PendingAcquire {
            locker,
            keys,
            owner: Some(owner),
            ttl,
            what,
        }
    }

    /// The owner token the attempt writes.
    pub(crate) fn owner(&self) -> &str {
        self.owner.as_deref().unwrap_or_default()
    }

    /// The answer is definite: nothing to undo. Returns the owner token.
    pub(crate) fn settle(mut self) -> String {
        self.owner.take().unwrap_or_default()
    }
}

impl<L: Locker + Clone> Drop for PendingAcquire<'_, L> {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            // Deletes the lock if (and only if) it holds `owner`, a token
            // nobody else has, so retrying is safe; never past the ttl, after
            // which the server has freed the key anyway. Of several keys,
            // the one that holds it.
            crate::background::release_first_held(
                tokio::runtime::Handle::try_current().ok(),
                Arc::new(self.locker.clone()),
                self.keys.iter().map(|&key| key.to_owned()).collect(),
                owner,
                self.ttl.min(DEFAULT_RELEASE_TIMEOUT),
                self.what,
            );
        }
    }
}
