//! Forgetting a key: deleting its fencing row while nobody holds it.

use super::acquire::Reserved;
use super::errors::{self, BACKEND};
use super::fencing::Sql;
use super::names::LockName;
use super::session::Request;
use super::Inner;
use crate::session_registry::Busy;
use crate::{Error, Result};

impl Inner {
    /// [`crate::Locker::forget`].
    ///
    /// The name is reserved in the registry first, exactly as an attempt
    /// would be: while reserved, no lease or attempt of this locker holds
    /// it on its shared session, so the statement's `GET_LOCK` can only be
    /// refused by *another* session, never granted re-entrantly over a lock
    /// of ours. The reservation travels with the request and ends only once
    /// the statement (and, had it failed halfway, the release of its lock)
    /// has run.
    pub(super) async fn forget(&self, name: LockName<'_>) -> Result<()> {
        let ticket = match self.core.registry.reserve(name.server.clone()) {
            Ok(ticket) => ticket,
            Err(Busy::Contended) => return Err(held(&name)),
            Err(Busy::CleaningUp) => return Err(self.core.cleanup_pending(name.key, "forget")),
        };
        let reserved = Reserved::new(self.core.registry.clone(), ticket);
        let session = self.core.pool.shared(&name.server).await?;
        let limit = self.settings.query_timeout;
        let request = Request {
            sql: self.sql.forget(&name),
            limit,
            undo: Some(Sql::undo(&name)),
            keep: Some(Box::new(reserved)),
            close_if_abandoned: false,
        };
        let context = || format!("forget {:?} on {}", name.key, self.settings.target);
        let answer = crate::deadline::bounded(BACKEND, "forget", limit, async {
            session
                .run(request)
                .await
                .map_err(|e| errors::backend("forget", context(), e))
        })
        .await?;
        let free = answer
            .int(0)
            .map_err(|why| Error::backend(BACKEND, "forget", format!("{}: {why}", context())))?;
        answer.settle();
        match free {
            Some(1) => Ok(()),
            Some(_) => Err(held(&name)),
            None => Err(Error::backend(
                BACKEND,
                "forget",
                format!(
                    "{}: GET_LOCK returned NULL (the statement was killed, or the server failed)",
                    context()
                ),
            )),
        }
    }
}

fn held(name: &LockName<'_>) -> Error {
    Error::NotAcquired {
        key: name.key.to_owned(),
    }
}
