//! Forgetting a key: deleting its fencing row while nobody holds it.

use super::errors;
use super::keys::LockKey;
use super::Inner;
use crate::{Error, Result};

impl Inner {
    /// [`crate::Locker::forget`] for string and raw keys alike: the key
    /// reserved first (see
    /// [`Core::reserve_to_forget`](crate::sql::core::Core::reserve_to_forget)).
    pub(super) async fn forget(&self, lock: LockKey<'_>) -> Result<()> {
        // No cleanup is ever needed on the server: the statement's lock ends
        // with its transaction, whether or not we wait for the answer. A
        // later attempt on the shared session is queued behind it.
        let _reserved = self.core.reserve_to_forget(lock.id, lock.key)?;
        let session = self.core.pool.shared(&lock.id).await?;
        let context = || format!("forget {:?} on {}", lock.key, self.settings.target);
        let rows = errors::within(
            "forget",
            self.settings.query_timeout,
            context,
            session.query(&self.sql.forget, &[&lock.id]),
        )
        .await?;
        let free = rows
            .first()
            .map(|row| row.try_get::<_, bool>(0))
            .transpose()
            .map_err(|e| errors::backend("forget", context(), e))?;
        match free {
            Some(true) => Ok(()),
            Some(false) => Err(held(lock)),
            None => Err(Error::backend(
                errors::BACKEND,
                "forget",
                format!("{}: the server returned no row", context()),
            )),
        }
    }
}

fn held(lock: LockKey<'_>) -> Error {
    Error::NotAcquired {
        key: lock.key.to_owned(),
    }
}
