//! How this backend opens the connections of the locker's
//! [pool](crate::sql::pool): a session is a connection driven by its own
//! actor ([`Session`]); the fencing table is created on a fresh connection
//! before its actor starts.

use std::sync::Arc;

use super::config::Settings;
use super::errors::BACKEND;
use super::fencing::{ensure_table, FencingTable, Sql, RECORD_COLUMNS};
use super::marks;
use super::session::Session;
use crate::sql::core::{Core, Wording};
use crate::sql::pool::{Connector, Opening, Role};
use crate::Result;

/// The locker's connections.
pub(super) type Pool = crate::sql::pool::Pool<Connect>;
/// Which locks this locker holds, on which session, for which owner.
pub(super) type Registry = crate::session_registry::Registry<String, Session>;
/// A reservation of one lock.
pub(super) type Ticket = crate::session_registry::Ticket<String>;

/// Opens MySQL sessions with the locker's settings.
pub(crate) type Connect = crate::sql::pool::Connect<Arc<Settings>>;

/// The locker's core: its pool (no connection opened yet) and registry.
pub(super) fn core(settings: &Arc<Settings>) -> Core<Connect, String> {
    let fencing = settings.fencing.is_some();
    Core::new(
        BACKEND,
        settings.target.clone(),
        settings,
        fencing,
        settings.clone(),
    )
}

impl Connector for Connect {
    type Session = Session;

    const WORDING: Wording = Wording {
        unanswered: "was never taken",
        lost_after_grant: |target, key| {
            format!("the connection to {target} closed right after {key:?} was granted; the server has released it")
        },
        lock: "a GET_LOCK lock",
        holder: "connection",
        command: "KILL",
    };

    async fn open(&self, opening: Opening) -> Result<Arc<Session>> {
        let settings = &self.with;
        let (session, mut conn, incoming) =
            Session::open(settings, opening.id, opening.role).await?;
        if let Some(table) = settings.fencing.as_ref().filter(|_| opening.ensure_table) {
            let create = Sql::create_table(table);
            ensure_table(
                &mut conn,
                table,
                &create,
                &RECORD_COLUMNS,
                settings.query_timeout,
            )
            .await?;
        }
        session.start(
            conn,
            incoming,
            settings.clone(),
            opening.waiter_permit,
            self.on_closed.clone(),
        );
        Ok(session)
    }
}

crate::sql::pool::pooled_session!(Session);

/// Creates the marks table on a fresh connection of its own, unless it
/// exists (see [`marks`]).
pub(super) async fn ensure_marks_table(pool: &Pool) -> Result<()> {
    let settings = &pool.connector().with;
    let (session, mut conn, incoming) =
        Session::open(settings, pool.next_id(), Role::Waiter).await?;
    let table = FencingTable::marks_beside(settings.fencing.as_ref());
    let created = ensure_table(
        &mut conn,
        &table,
        &marks::create_table(&table),
        &[],
        settings.query_timeout,
    )
    .await;
    drop((session, incoming));
    let _ = tokio::time::timeout(settings.query_timeout, conn.disconnect()).await;
    created
}
