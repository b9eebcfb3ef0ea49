//! The locker's [`session_registry`](crate::session_registry) over lock
//! names on MySQL sessions.

pub(super) use crate::session_registry::{Busy, HoldingSession, SessionClosed};

use super::session::Session;

/// Which lock names this locker holds, on which session, for which owner.
pub(super) type Registry = crate::session_registry::Registry<String, Session>;
/// A lock this locker holds.
pub(super) type Held = crate::session_registry::Held<Session>;
/// A reservation of one lock name.
pub(super) type Ticket = crate::session_registry::Ticket<String>;

impl HoldingSession for Session {
    fn id(&self) -> u64 {
        self.id
    }
    fn is_closed(&self) -> bool {
        Session::is_closed(self)
    }
}
