//! What undoes an abandoned attempt or wait on the server (see
//! [`acquire`](super::acquire) for why each is needed): [`Attempt`], the
//! guard of an attempt on a shared session, which releases a lock its
//! statement may have taken, and [`CancelWait`], which cancels and closes a
//! native wait's connection.

use std::sync::Arc;
use std::time::Duration;

use super::errors::{self, BACKEND};
use super::pool::{Registry, Ticket};
use super::session::Session;
use crate::sql::core::AbandonWait;

/// An attempt on a shared session whose outcome is not yet recorded.
pub(super) struct Attempt {
    pub(super) registry: Arc<Registry>,
    /// The keys reserved for it: its one key, or the keys a
    /// [`try_lock_any`](crate::Locker::try_lock_any) tries, of which it takes at
    /// most one.
    pub(super) tickets: Vec<Ticket>,
    /// Set once the statement may have reached the server.
    pub(super) sent_on: Option<Arc<Session>>,
    pub(super) query_timeout: Duration,
    /// A shared attempt (`pg_try_advisory_lock_shared`): its cleanup
    /// releases a shared hold. The reservation guarantees no reader of this
    /// locker holds the key on that session, so any shared hold there is
    /// the attempt's own. (An exclusive attempt's cleanup releases whichever
    /// of its keys the session holds exclusively: reserved, none is held by
    /// this locker, so any such hold there is the attempt's own.)
    pub(super) shared: bool,
}

impl Attempt {
    /// The outcome is recorded: only the reservation is left to end, which
    /// dropping does.
    pub(super) fn finish(mut self) {
        self.sent_on = None;
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let tickets = std::mem::take(&mut self.tickets);
        let Some(session) = self.sent_on.take() else {
            // Finished, or never sent: the reservations are all there is to
            // undo.
            for ticket in tickets {
                self.registry.release(ticket);
            }
            return;
        };
        // The keys stay reserved until the cleanup is done, so no other
        // attempt of this locker can take one on this session meanwhile (the
        // cleanup would then release *that* lock); marked as cleaning up, so
        // callers asking meanwhile are told the truth (unknown), not
        // "contention" or "not held".
        let (registry, query_timeout, shared) =
            (self.registry.clone(), self.query_timeout, self.shared);
        for &ticket in &tickets {
            registry.cleaning_up(ticket);
        }
        let keys: Vec<i64> = tickets.iter().map(|ticket| ticket.key).collect();
        let release_all = move |registry: &Registry| {
            for ticket in tickets {
                registry.release(ticket);
            }
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            session.close();
            release_all(&registry);
            return;
        };
        runtime.spawn(async move {
            let unlock = async {
                if !shared {
                    let released = session.unlock_any_if_held(&keys).await?;
                    return Ok::<_, tokio_postgres::Error>(released > 0);
                }
                let mut released = false;
                for &key in &keys {
                    released |= session.unlock_shared_if_held(key).await?;
                }
                Ok(released)
            };
            match errors::within("acquire", query_timeout, String::new, unlock).await {
                Ok(true) => tracing::debug!(
                    component = "distlock",
                    backend = BACKEND,
                    advisory_keys = ?keys,
                    "released a lock whose attempt was abandoned"
                ),
                Ok(false) => {}
                Err(_) => {
                    tracing::warn!(
                        component = "distlock",
                        backend = BACKEND,
                        advisory_keys = ?keys,
                        "cannot tell whether an abandoned attempt took its lock; closing its session, which frees every lock on it"
                    );
                    session.close();
                }
            }
            release_all(&registry);
        });
    }
}

/// How an abandoned native wait ends: the statement is cancelled on the
/// server and the connection closed, so whether or not the lock was granted
/// in the meantime, the server ends the session and nothing stays held.
pub(super) struct CancelWait {
    pub(super) tls: super::tls::Tls,
}

impl AbandonWait<Session> for CancelWait {
    fn abandon(&self, session: Arc<Session>) {
        // Closing alone would do, eventually: a backend blocked in a lock
        // wait notices its client is gone only when the wait ends. The cancel
        // request ends the wait now.
        let token = session.cancel_token();
        let tls = self.tls.clone();
        session.close();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = tls.cancel(&token).await {
                    tracing::debug!(component = "distlock", backend = BACKEND, %error, "cancel request for an abandoned wait failed; its lock timeout ends it");
                }
            });
        }
    }
}
