//! What a SQL backend says differently, and the flows written once over
//! it: releasing a lock (here, or telling who holds it elsewhere),
//! confirming one lock or many.
//!
//! A dialect (a backend's locker state) answers a handful of questions,
//! each one statement on a session it is given: release this lock, who
//! holds it, does this session still hold it (or which of these). How the
//! statement is sent, bounded and read is the dialect's; what the answer
//! means for the caller and for the registry is decided here and in
//! [`Core`], once.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use super::core::{Core, Termination};
use super::pool::{Connector, SlotKey};
use crate::session_registry::Claim;
use crate::{RefreshRequest, Result};

/// A lock as a dialect handles it: the server's identity of it, and the
/// key the caller named it by (for errors, records and the lease).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lock<'a, Id> {
    /// What the server locks (an advisory key, a lock name).
    pub(crate) id: Id,
    /// The caller's key.
    pub(crate) key: &'a str,
}

/// The session type of dialect `D`.
pub(crate) type SessionOf<D> = <<D as Dialect>::Connect as Connector>::Session;

/// Builds, when asked, the context of an error ("release \"k\" on db:5432").
pub(crate) type Context<'a> = &'a (dyn Fn() -> String + Send + Sync);

/// A server's answer to "who holds this lock?": the holding session
/// described ("server process 42") with how to end it
/// (`pg_terminate_backend(42)`), `None` if nobody holds it; and whether the
/// holder's fencing row names the asking owner (`None` without a fencing
/// table).
pub(crate) type HolderAnswer = (Option<(String, String)>, Option<bool>);

/// What a SQL backend says differently (see the [module docs](self)).
/// Every statement is bounded by the dialect's query timeout, and its
/// failure described with `context`.
pub(crate) trait Dialect: Send + Sync + Sized {
    /// How the dialect opens its sessions.
    type Connect: Connector;
    /// The server's identity of a lock (an advisory key, a lock name).
    type Id: Clone + Eq + Hash + fmt::Debug + Send + Sync + SlotKey + 'static;

    /// How the dialect words its lock and the one force release it
    /// supports; [`Termination::lock`] also names the lock in releases.
    const TERMINATION: Termination;
    /// The most locks one statement of [`refresh_many`](Self::refresh_many)
    /// asks about.
    const HOLDS_PER_STATEMENT: usize;

    /// The locker's pool, registry and shared steps.
    fn core(&self) -> &Core<Self::Connect, Self::Id>;

    /// Releases `id` on `session`, which holds it: with `clear_record`, by
    /// the statement that also clears the holder record of its fencing row
    /// (the plain unlock without fencing), else by the unlock alone. True
    /// if the session held it.
    fn unlock(
        &self,
        session: &SessionOf<Self>,
        id: &Self::Id,
        clear_record: bool,
        context: Context<'_>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Who holds `id`, asked on `session` (a shared session), and whether
    /// under `owner`.
    fn holder(
        &self,
        session: &SessionOf<Self>,
        id: &Self::Id,
        owner: &str,
        context: Context<'_>,
    ) -> impl Future<Output = Result<HolderAnswer>> + Send;

    /// True if `session` holds `id` (and so, that it is alive).
    fn holds(
        &self,
        session: &SessionOf<Self>,
        id: &Self::Id,
        context: Context<'_>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Whether `session` holds each of `ids`, in order: one statement (at
    /// most [`HOLDS_PER_STATEMENT`](Self::HOLDS_PER_STATEMENT) ids). The
    /// statement is made before the future is, which borrows only `self`.
    fn held_among<'s>(
        &'s self,
        session: Arc<SessionOf<Self>>,
        ids: &[&Self::Id],
    ) -> impl Future<Output = Result<Vec<bool>>> + Send + use<'s, Self>;

    /// Releases `id` (the caller's `key`) if `owner` holds it through this
    /// locker; otherwise says whether somebody else holds it under that
    /// owner: [`Error::Unsupported`](crate::Error::Unsupported) if another
    /// client may (only the session holding a session lock can release
    /// it), [`Error::NotHeld`](crate::Error::NotHeld) if nobody does.
    ///
    /// # Cancel safety
    ///
    /// As the statements: dropping it leaves the lock to its session.
    async fn release(&self, id: &Self::Id, key: &str, owner: &str) -> Result<()> {
        let core = self.core();
        let Some(held) = core.take_for_release(id, key, owner)? else {
            let context = || format!("look up the holder of {key:?} on {}", core.target);
            let session = core.pool.shared(id).await?;
            let (holder, same_owner) = self.holder(&session, id, owner, &context).await?;
            let lock = Self::TERMINATION.lock;
            return Err(core.held_elsewhere(key, lock, holder, same_owner));
        };
        let context = || {
            format!(
                "release {key:?} on {}; the server frees it when the session ends",
                core.target
            )
        };
        let session = &held.session;
        let unlock = self.unlock(session, id, true, &context);
        let bare = || self.unlock(session, id, false, &context);
        let released = core.unlock_or_bare(key, unlock, bare).await?;
        // Only the session itself can release its lock; if it did not,
        // something released it by hand on the session.
        core.finish_release(held, key, released)
    }

    /// Confirms `owner` still holds `id` on a live session: a round trip on
    /// the holding session, asking the server (see [`Core::verify`]).
    async fn verify(&self, id: &Self::Id, key: &str, owner: &str) -> Result<()> {
        let core = self.core();
        let context = || format!("verify {key:?} is held on {}", core.target);
        let holds =
            |session: Arc<SessionOf<Self>>| async move { self.holds(&session, id, &context).await };
        core.verify(id, key, owner, holds).await
    }

    /// [`Locker::refresh_many`](crate::Locker::refresh_many): `id_of` maps
    /// a request to its lock (or the error that request gets); the valid
    /// ones are confirmed with one statement per
    /// [`HOLDS_PER_STATEMENT`](Self::HOLDS_PER_STATEMENT) locks on each
    /// session that holds some of them, all sent at once (see
    /// [`Registry::confirm_many`](crate::session_registry::Registry::confirm_many)).
    async fn refresh_many<'a>(
        &self,
        requests: &[RefreshRequest<'a>],
        id_of: impl Fn(&RefreshRequest<'a>) -> Result<Self::Id> + Send,
    ) -> Vec<Result<()>> {
        let claims = requests
            .iter()
            .map(|request| {
                id_of(request).map(|id| Claim {
                    id,
                    owner: request.owner,
                    key: request.key,
                })
            })
            .collect();
        let registry = &self.core().registry;
        let confirm = |session, ids: &[&Self::Id]| self.held_among(session, ids);
        registry
            .confirm_many(claims, Self::HOLDS_PER_STATEMENT, confirm)
            .await
    }
}
