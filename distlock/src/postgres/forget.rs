//! Forgetting a key: deleting its fencing row while nobody holds it.

use super::errors;
use super::keys::LockKey;
use super::pool::{Registry, Ticket};
use super::Inner;
use crate::session_registry::Busy;
use crate::{Error, Result};

impl Inner {
    /// [`crate::Locker::forget`] for string and raw keys alike.
    ///
    /// The key is reserved in the registry first, exactly as an attempt
    /// would be: while reserved, no lease or attempt of this locker can hold
    /// it on one of its sessions, so the statement's transaction lock can
    /// only be refused by *another* session, never granted re-entrantly
    /// over a lock of ours.
    pub(super) async fn forget(&self, key: LockKey<'_>) -> Result<()> {
        let ticket = match self.core.registry.reserve(key.id) {
            Ok(ticket) => ticket,
            Err(Busy::Contended) => return Err(held(key)),
            Err(Busy::CleaningUp) => return Err(self.core.cleanup_pending(key.name, "forget")),
        };
        // No cleanup is ever needed on the server: the statement's lock ends
        // with its transaction, whether or not we wait for the answer. A
        // later attempt on the shared session is queued behind it.
        let _reservation = Reservation {
            registry: &self.core.registry,
            ticket,
        };
        let session = self.core.pool.shared(&key.id).await?;
        let context = || format!("forget {:?} on {}", key.name, self.settings.target);
        let rows = errors::within(
            "forget",
            self.settings.query_timeout,
            context,
            session.query(&self.sql.forget, &[&key.id]),
        )
        .await?;
        let free = rows
            .first()
            .map(|row| row.try_get::<_, bool>(0))
            .transpose()
            .map_err(|e| errors::backend("forget", context(), e))?;
        match free {
            Some(true) => Ok(()),
            Some(false) => Err(held(key)),
            None => Err(Error::backend(
                errors::BACKEND,
                "forget",
                format!("{}: the server returned no row", context()),
            )),
        }
    }
}

fn held(key: LockKey<'_>) -> Error {
    Error::NotAcquired {
        key: key.name.to_owned(),
    }
}

/// Ends the forget's reservation however the call ends (answered, failed,
/// dropped).
struct Reservation<'a> {
    registry: &'a Registry,
    ticket: Ticket,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.registry.release(self.ticket);
    }
}
