//! Each backend's server, its raw floor, distlock and the peers, as
//! contenders of a [`crate::harness::Group`].

pub mod etcd;
pub mod mysql;
pub mod postgres;
pub mod redis;

use std::time::Duration;

use distlock::Locker;

use crate::harness::{release, Release};

/// An error as the harness reports it.
pub fn err(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// distlock's uncontended cycle: `try_lock` + `release` of `key`.
pub async fn distlock_cycle(locker: impl Locker, key: String, ttl: Duration) -> Result<(), String> {
    let lease = locker
        .try_lock(&key, ttl)
        .await
        .map_err(err)?
        .ok_or("own key held")?;
    lease.release().await.map_err(err)
}

/// distlock's contended step: `lock` (waiting) for the shared key.
pub async fn distlock_handoff(
    locker: impl Locker,
    key: String,
    ttl: Duration,
) -> Result<Release, String> {
    let lease = locker
        .lock(&key, ttl, Duration::from_secs(30))
        .await
        .map_err(err)?;
    Ok(release(move || async move {
        lease.release().await.map_err(err)
    }))
}
