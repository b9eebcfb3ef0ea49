//! Forgetting a key: deleting its fencing row while nobody holds it.

use super::errors;
use super::fencing::Sql;
use super::names::LockName;
use super::session::Request;
use super::Inner;
use crate::{Error, Result};

impl Inner {
    /// [`crate::Locker::forget`]: the name reserved first (see
    /// [`Core::reserve_to_forget`](crate::sql::core::Core::reserve_to_forget)).
    /// The reservation travels with the request and ends only once the
    /// statement (and, had it failed halfway, the release of its lock) has
    /// run.
    pub(super) async fn forget(&self, name: LockName<'_>) -> Result<()> {
        let reserved = self.core.reserve_to_forget(name.id.clone(), name.key)?;
        let session = self.core.pool.shared(&name.id).await?;
        let limit = self.settings.query_timeout;
        let request = Request {
            sql: self.sql.forget(&name),
            limit,
            undo: Some(Sql::undo(&name)),
            keep: Some(Box::new(reserved)),
            close_if_abandoned: false,
        };
        let context = || format!("forget {:?} on {}", name.key, self.settings.target);
        let answer = session.ask(request, "forget", &context).await?;
        let free = answer.int_in(0, "forget", &context)?;
        answer.settle();
        match free {
            Some(1) => Ok(()),
            Some(_) => Err(held(&name)),
            None => Err(errors::malformed(
                "forget",
                context,
                "GET_LOCK returned NULL (the statement was killed, or the server failed)",
            )),
        }
    }
}

fn held(name: &LockName<'_>) -> Error {
    Error::NotAcquired {
        key: name.key.to_owned(),
    }
}
