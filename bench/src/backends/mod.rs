//! Each backend's server, its raw floor, distlock and the peers, as
//! contenders of a [`crate::harness::Group`].

pub mod etcd;
pub mod mysql;
pub mod postgres;
pub mod redis;
pub mod zookeeper;

use std::time::Duration;

use distlock::Locker;

use crate::harness::{cycle, release, Contender, Release, Role};

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

/// distlock's uncontended cycle as a contender, with `fencing` on or off:
/// the harness pairs it with the fenced floor or with the plain one.
pub fn distlock_uncontended(
    name: &str,
    locker: impl Locker + Clone,
    fencing: bool,
    ttl: Duration,
) -> Contender {
    let does = if fencing {
        "try_lock + release, fencing counter bumped under the lock"
    } else {
        "try_lock + release, no fencing token"
    };
    Contender::cycle(
        name,
        Role::Distlock,
        does,
        cycle(move |client| distlock_cycle(locker.clone(), format!("distlock-{client}"), ttl)),
    )
    .fencing(fencing)
}

/// distlock's uncontended cycle on `locker`, opened with `holder=false`:
/// beside the same cycle with the record, what recording the holder (host,
/// pid, label, grant time) in every acquire costs. `name` says which
/// distlock it is a variant of.
pub fn holder_record_off(name: &str, locker: impl Locker + Clone, ttl: Duration) -> Contender {
    Contender::cycle(
        &format!("{name}, holder=false"),
        Role::Variant,
        "the same cycle with the holder record turned off",
        cycle(move |client| distlock_cycle(locker.clone(), format!("unrecorded-{client}"), ttl)),
    )
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
