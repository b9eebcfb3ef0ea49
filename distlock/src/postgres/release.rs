//! The statements of the shared release and verify flows
//! ([`Dialect`](crate::sql::dialect::Dialect)), on Postgres.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use super::errors;
use super::keys::owner_digest;
use super::pool::Connect;
use super::session::Session;
use super::Inner;
use crate::sql::core::{Core, Termination};
use crate::sql::dialect::{Context, Dialect, HolderAnswer};
use crate::Result;

impl Dialect for Inner {
    type Connect = Connect;
    type Id = i64;

    const TERMINATION: Termination = Termination {
        lock: "a session advisory lock",
        holder: "session",
        command: "pg_terminate_backend",
    };
    // One scan of `pg_locks` answers for any number of keys.
    const HOLDS_PER_STATEMENT: usize = usize::MAX;

    fn core(&self) -> &Core<Connect, i64> {
        &self.core
    }

    async fn unlock(
        &self,
        session: &Session,
        &id: &i64,
        clear_record: bool,
        context: Context<'_>,
    ) -> Result<bool> {
        let limit = self.settings.query_timeout;
        if clear_record {
            errors::within("release", limit, context, session.unlock(id)).await
        } else {
            errors::within("release", limit, context, session.unlock_if_held(id)).await
        }
    }

    async fn holder(
        &self,
        session: &Session,
        id: &i64,
        owner: &str,
        context: Context<'_>,
    ) -> Result<HolderAnswer> {
        let digest = owner_digest(owner);
        let lookup = async {
            if self.fencing() {
                session.query(&self.sql.holder, &[id, &digest]).await
            } else {
                session.query(&self.sql.holder, &[id]).await
            }
        };
        let limit = self.settings.query_timeout;
        let rows = errors::within("release", limit, context, lookup).await?;
        let Some(row) = rows.first() else {
            return Ok((None, None));
        };
        let columns =
            || Ok::<_, tokio_postgres::Error>((row.try_get::<_, i32>(0)?, row.try_get(1)?));
        let (pid, same_owner): (i32, Option<bool>) =
            columns().map_err(|e| errors::backend("release", context(), e))?;
        let who = format!("server process {pid}");
        Ok((
            Some((who, format!("pg_terminate_backend({pid})"))),
            same_owner,
        ))
    }

    async fn holds(&self, session: &Session, &id: &i64, context: Context<'_>) -> Result<bool> {
        let limit = self.settings.query_timeout;
        errors::within("refresh", limit, context, session.holds(id)).await
    }

    fn held_among<'s>(
        &'s self,
        session: Arc<Session>,
        ids: &[&i64],
    ) -> impl Future<Output = Result<Vec<bool>>> + Send + use<'s> {
        let ids: Vec<i64> = ids.iter().map(|&&id| id).collect();
        async move {
            let target = &self.settings.target;
            let context = || format!("verify {} held locks on {target}", ids.len());
            let limit = self.settings.query_timeout;
            let lost: HashSet<i64> =
                errors::within("refresh", limit, context, session.lost_among(&ids))
                    .await?
                    .into_iter()
                    .collect();
            Ok(ids.iter().map(|id| !lost.contains(id)).collect())
        }
    }
}
