//! How this backend opens the connections of the locker's
//! [pool](crate::sql::pool): a session is a tokio-postgres client whose
//! driver task it owns, set up by [`Session::open`] (which also creates the
//! fencing table when asked to).

use std::sync::Arc;

use super::config::Settings;
use super::errors::BACKEND;
use super::fencing::Sql;
use super::session::Session;
use crate::sql::core::{Core, Wording};
use crate::sql::pool::{Connector, Opening};
use crate::Result;

/// Which locks this locker holds, on which session, for which owner.
pub(super) type Registry = crate::session_registry::Registry<i64, Session>;
/// A reservation of one lock.
pub(super) type Ticket = crate::session_registry::Ticket<i64>;

/// Opens Postgres sessions with the locker's settings and statements.
pub(crate) type Connect = crate::sql::pool::Connect<(Arc<Settings>, Arc<Sql>)>;

/// The locker's core: its pool (no connection opened yet) and registry.
pub(super) fn core(settings: &Arc<Settings>, sql: &Arc<Sql>) -> Core<Connect, i64> {
    let with = (settings.clone(), sql.clone());
    Core::new(
        BACKEND,
        settings.target.clone(),
        settings,
        settings.fencing.is_some(),
        with,
    )
}

impl Connector for Connect {
    type Session = Session;

    const WORDING: Wording = Wording {
        unanswered: "never arrived",
        lost_after_grant: |target, key| {
            format!(
                "the session on {target} was lost right after {key:?} was granted (closed, or given up as silent); \
                 the server releases it when the session ends"
            )
        },
        lock: "a session advisory lock",
        holder: "session",
        command: "pg_terminate_backend",
    };

    async fn open(&self, opening: Opening) -> Result<Arc<Session>> {
        let (settings, sql) = &self.with;
        Session::open(settings, sql, opening, self.on_closed.clone()).await
    }
}

crate::sql::pool::pooled_session!(Session);

#[cfg(test)]
mod tests {
    use crate::postgres::PostgresLocker;

    /// Idle waiter connections count toward `max_waiters` (so the bound is
    /// `sessions + max_waiters` in all), are reused before a new one is
    /// opened, and give their permit back once they die.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_waiters_count_toward_max_waiters() {
        let server = test_servers::PostgresServer::start();
        let url = format!("{}&max_waiters=2&idle_waiters=5", server.url());
        let locker = PostgresLocker::from_url(&url).await.unwrap();
        let pool = &locker.inner.core.pool;
        let idle_count = || pool.idle_count();

        let (a, b) = (
            pool.waiter().await.unwrap().expect("a permit"),
            pool.waiter().await.unwrap().expect("a permit"),
        );
        assert!(pool.waiter().await.unwrap().is_none(), "two are open");
        let (a_id, b_id) = (a.id, b.id);
        pool.recycle(a);
        pool.recycle(b);
        assert_eq!((idle_count(), pool.waiters_in_use()), (2, 0));
        assert_eq!(pool.free_permits(), 0, "idle ones hold theirs");

        // Reused, not opened anew.
        let reused = pool.waiter().await.unwrap().expect("an idle one");
        assert!([a_id, b_id].contains(&reused.id));
        assert_eq!((idle_count(), pool.waiters_in_use()), (1, 1));

        // An idle connection that died gives its permit back to the next
        // checkout, which opens a fresh one.
        let pid: i32 = {
            let idle = pool.first_idle().expect("one idle");
            idle.query("SELECT pg_backend_pid()", &[]).await.unwrap()[0].get(0)
        };
        server.psql(&format!("SELECT pg_terminate_backend({pid}, 5000)"));
        let started = tokio::time::Instant::now();
        while !pool.first_idle().expect("one idle").is_closed() {
            assert!(started.elapsed() < std::time::Duration::from_secs(5));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let fresh = pool.waiter().await.unwrap().expect("the dead one's permit");
        assert!(![a_id, b_id].contains(&fresh.id), "a new connection");
        assert_eq!((idle_count(), pool.waiters_in_use()), (0, 2));
        assert!(pool.waiter().await.unwrap().is_none());
        drop((reused, fresh));
        assert_eq!(pool.free_permits(), 2);
    }
}
