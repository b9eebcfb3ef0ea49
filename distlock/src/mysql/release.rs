//! The statements of the shared release and verify flows
//! ([`Dialect`](crate::sql::dialect::Dialect)), on MySQL.

use std::future::Future;
use std::sync::Arc;

use super::fencing::Sql;
use super::names::owner_digest;
use super::pool::Connect;
use super::session::{Request, Session};
use super::Inner;
use crate::sql::core::{Core, Termination};
use crate::sql::dialect::{Context, Dialect, HolderAnswer};
use crate::Result;

impl Dialect for Inner {
    type Connect = Connect;
    type Id = String;

    const TERMINATION: Termination = Termination {
        lock: "a GET_LOCK lock",
        holder: "connection",
        command: "KILL",
    };
    /// A column each: a statement of about 30 KB, far under the default
    /// `max_allowed_packet` (16 MB on MariaDB 10.11, 64 MB on MySQL 8).
    const HOLDS_PER_STATEMENT: usize = 256;

    fn core(&self) -> &Core<Connect, String> {
        &self.core
    }

    async fn unlock(
        &self,
        session: &Session,
        server: &String,
        clear_record: bool,
        context: Context<'_>,
    ) -> Result<bool> {
        let sql = if clear_record {
            self.sql.release(server)
        } else {
            Sql::release_only(server)
        };
        let limit = self.settings.query_timeout;
        let answer = session
            .ask(Request::new(sql, limit), "release", context)
            .await?;
        let released = answer.int_in(0, "release", context)?;
        answer.settle();
        // 0: another session holds it; NULL: nobody does. Either way this
        // session lost it (a `RELEASE_LOCK` or `RELEASE_ALL_LOCKS()` run on
        // it by hand?).
        Ok(released == Some(1))
    }

    async fn holder(
        &self,
        session: &Session,
        server: &String,
        owner: &str,
        context: Context<'_>,
    ) -> Result<HolderAnswer> {
        let sql = self.sql.holder(server, &owner_digest(owner));
        let limit = self.settings.query_timeout;
        let answer = session
            .ask(Request::new(sql, limit), "release", context)
            .await?;
        let holder = answer.int_in(0, "release", context)?;
        let same_owner = answer.int_in(1, "release", context)?;
        answer.settle();
        let holder = holder.map(|id| (format!("connection {id}"), format!("KILL {id}")));
        // Without fencing the holder's row, if any, says nothing of its owner.
        Ok((holder, self.sql.fencing().then_some(same_owner == Some(1))))
    }

    async fn holds(
        &self,
        session: &Session,
        server: &String,
        context: Context<'_>,
    ) -> Result<bool> {
        let limit = self.settings.query_timeout;
        let answer = session
            .ask(Request::new(Sql::holds(server), limit), "refresh", context)
            .await?;
        let holds = answer.int_in(0, "refresh", context)?;
        answer.settle();
        Ok(holds == Some(1))
    }

    /// Asks, in one statement, which of the names the session still holds
    /// (a session runs its statements in turn).
    fn held_among<'s>(
        &'s self,
        session: Arc<Session>,
        servers: &[&String],
    ) -> impl Future<Output = Result<Vec<bool>>> + Send + use<'s> {
        let sql = Sql::holds_many(servers.iter().map(|server| server.as_str()));
        let count = servers.len();
        async move {
            let target = &self.settings.target;
            let context = || format!("verify {count} held locks on {target}");
            let limit = self.settings.query_timeout;
            let answer = session
                .ask(Request::new(sql, limit), "refresh", &context)
                .await?;
            let held = (0..count)
                .map(|column| Ok(answer.int_in(column, "refresh", &context)? == Some(1)))
                .collect::<Result<Vec<bool>>>()?;
            answer.settle();
            Ok(held)
        }
    }
}
