//! Each backend's server, its raw floor, distlock and the peers, as
//! contenders of a [`crate::harness::Group`].

pub mod etcd;
pub mod mysql;
pub mod postgres;
pub mod redis;
pub mod zookeeper;

use std::time::Duration;

use distlock::Locker;

use crate::harness::{cycle, release, Contender, Group, Release, Role};

/// One backend's private server and its contenders, whichever backend:
/// what `all` measures and `profile` runs a contender of.
// One lives at a time, for a whole run: the size of its largest variant
// (etcd's client) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Started {
    Redis(redis::Redis),
    Postgres(postgres::Postgres),
    Etcd(etcd::Etcd),
    Mysql(mysql::Mysql),
    ZooKeeper(zookeeper::ZooKeeper),
}

impl Started {
    /// Starts `backend`'s server (one of `crate::BACKENDS`).
    pub async fn start(backend: &str) -> Result<Started, String> {
        Ok(match backend {
            "redis" => Started::Redis(redis::Redis::start().await),
            "postgres" => Started::Postgres(postgres::Postgres::start().await),
            "etcd" => Started::Etcd(etcd::Etcd::start().await),
            "mysql" => Started::Mysql(mysql::Mysql::start().await),
            "zookeeper" => Started::ZooKeeper(zookeeper::ZooKeeper::start().await),
            other => return Err(format!("unknown backend {other:?}")),
        })
    }

    /// The uncontended group at `clients` clients.
    pub async fn uncontended(&mut self, clients: usize) -> Group {
        match self {
            Started::Redis(redis) => redis.uncontended(clients),
            Started::Postgres(postgres) => postgres.uncontended(clients).await,
            Started::Etcd(etcd) => etcd.uncontended(clients).await,
            Started::Mysql(mysql) => mysql.uncontended(clients).await,
            Started::ZooKeeper(zookeeper) => zookeeper.uncontended(clients).await,
        }
    }

    /// The contended group at `clients` clients.
    pub async fn contended(&mut self, clients: usize) -> Group {
        match self {
            Started::Redis(redis) => redis.contended(clients),
            Started::Postgres(postgres) => postgres.contended(clients).await,
            Started::Etcd(etcd) => etcd.contended(clients).await,
            Started::Mysql(mysql) => mysql.contended(clients).await,
            Started::ZooKeeper(zookeeper) => zookeeper.contended(clients).await,
        }
    }

    /// The URL `distlock bench` (the hold workload) reaches the server by.
    pub fn url(&self) -> String {
        match self {
            Started::Redis(redis) => redis.url(),
            Started::Postgres(postgres) => postgres.url(),
            Started::Etcd(etcd) => etcd.url(),
            Started::Mysql(mysql) => mysql.url(),
            Started::ZooKeeper(zookeeper) => zookeeper.url(),
        }
    }
}

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
