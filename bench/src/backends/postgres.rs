//! Postgres: the raw floors (plain and fenced), distlock with fencing on
//! and off, sqlx's `PgAdvisoryLock` and `distributed-lock-postgres`.

use std::sync::Arc;
use std::time::Duration;

use distlock::postgres::PostgresLocker;
use distributed_lock_core::{DistributedLock, LockHandle, LockProvider};
use sqlx::postgres::{PgAdvisoryLock, PgPoolOptions};
use sqlx::Either;
use test_servers::{PostgresOptions, PostgresServer};

use super::{distlock_handoff, distlock_uncontended, err, holder_record_off};
use crate::harness::{cycle, handoff, release, Contender, Group, Role, Workload};

const TTL: Duration = Duration::from_secs(30);

pub struct Postgres {
    server: PostgresServer,
    fencing_on: PostgresLocker,
    fencing_off: PostgresLocker,
    unrecorded: PostgresLocker,
}

/// The fenced floor's table: one counter per advisory-lock key, the least
/// a fenced lock stores (distlock's row also records the owner and holder).
const FENCE_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS floor_fence (k int8 PRIMARY KEY, n int8 NOT NULL)";

/// The fenced floor's grant, one statement: the WHERE clause of a FROM-less
/// SELECT runs once, so the counter is inserted or bumped only if the lock
/// was taken, and the token comes back in the same round trip (no row: not
/// taken). Autocommit: the bump is committed before the answer, as a fenced
/// lock needs (a token must never be handed out twice).
const FENCED_TRY_LOCK: &str = "INSERT INTO floor_fence AS f (k, n) \
     SELECT $1::int8, 1 WHERE pg_try_advisory_lock($1::int8) \
     ON CONFLICT (k) DO UPDATE SET n = f.n + 1 RETURNING f.n";

/// One raw connection with the statements of a cycle prepared.
struct Raw {
    client: tokio_postgres::Client,
    lock: tokio_postgres::Statement,
    unlock: tokio_postgres::Statement,
}

impl Raw {
    /// `pg_advisory_unlock(key)`, an error unless the lock was held.
    async fn unlock(&self, key: i64) -> Result<(), String> {
        let released: bool = self
            .client
            .query_one(&self.unlock, &[&key])
            .await
            .map_err(err)?
            .get(0);
        if released {
            Ok(())
        } else {
            Err(format!("pg_advisory_unlock({key}) found it not held"))
        }
    }
}

impl Postgres {
    pub async fn start() -> Postgres {
        // Room in the shared lock table for the hold workload's 100,000
        // advisory locks (it has max_locks_per_transaction x max_connections
        // slots, 64 x 300 by default here).
        let server = PostgresServer::start_with(PostgresOptions {
            settings: vec![("max_locks_per_transaction".into(), "1024".into())],
            ..PostgresOptions::default()
        });
        let fencing_on = PostgresLocker::from_url(&server.url())
            .await
            .expect("connect distlock");
        let fencing_off = PostgresLocker::from_url(&format!("{}&fencing=off", server.url()))
            .await
            .expect("connect distlock");
        let unrecorded = PostgresLocker::from_url(&format!("{}&holder=off", server.url()))
            .await
            .expect("connect distlock");
        Postgres {
            server,
            fencing_on,
            fencing_off,
            unrecorded,
        }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn pids(&self) -> Vec<u32> {
        vec![self.server.pid()]
    }

    /// One connection per client, `lock_sql` and the unlock prepared.
    async fn raw(&self, clients: usize, lock_sql: &str) -> Arc<Vec<Raw>> {
        let mut raws = Vec::with_capacity(clients);
        for _ in 0..clients {
            let (client, connection) =
                tokio_postgres::connect(&self.server.url(), tokio_postgres::NoTls)
                    .await
                    .expect("connect the raw client");
            tokio::spawn(connection);
            // Before the prepare, which needs the table to exist.
            if lock_sql == FENCED_TRY_LOCK {
                client
                    .batch_execute(FENCE_TABLE)
                    .await
                    .expect("create the fenced floor's table");
            }
            let lock = client.prepare(lock_sql).await.expect("prepare the lock");
            let unlock = client
                .prepare("SELECT pg_advisory_unlock($1)")
                .await
                .expect("prepare the unlock");
            raws.push(Raw {
                client,
                lock,
                unlock,
            });
        }
        Arc::new(raws)
    }

    async fn sqlx_pool(&self, clients: usize) -> sqlx::PgPool {
        PgPoolOptions::new()
            .max_connections(u32::try_from(clients).unwrap_or(u32::MAX))
            .min_connections(u32::try_from(clients).unwrap_or(u32::MAX))
            .connect(&self.server.url())
            .await
            .expect("connect sqlx")
    }

    async fn peer(&self, clients: usize) -> distributed_lock_postgres::PostgresLockProvider {
        let pool = self.sqlx_pool(clients).await;
        distributed_lock_postgres::PostgresLockProvider::builder()
            .pool(pool)
            .build()
            .await
            .expect("connect distributed-lock-postgres")
    }

    pub async fn uncontended(&self, clients: usize) -> Group {
        let mut contenders = Vec::new();

        let raws = self.raw(clients, "SELECT pg_try_advisory_lock($1)").await;
        contenders.push(
            Contender::cycle(
                "floor: pg_try_advisory_lock + unlock",
                Role::Floor,
                "2 prepared statements on one connection per client: 2 round trips",
                cycle(move |client| {
                    let raws = raws.clone();
                    async move {
                        let raw = &raws[client];
                        let key = 1_000_000 + client as i64;
                        let got: bool = raw
                            .client
                            .query_one(&raw.lock, &[&key])
                            .await
                            .map_err(err)?
                            .get(0);
                        if !got {
                            return Err("own key held".into());
                        }
                        raw.unlock(key).await
                    }
                }),
            )
            .fencing(false),
        );

        let raws = self.raw(clients, FENCED_TRY_LOCK).await;
        contenders.push(
            Contender::cycle(
                "fenced floor: try_lock+upsert, unlock",
                Role::Floor,
                "2 prepared statements on one connection per client: \
                 pg_try_advisory_lock feeding the counter's INSERT … ON CONFLICT DO UPDATE … \
                 RETURNING (1 round trip, 1 commit), pg_advisory_unlock",
                cycle(move |client| {
                    let raws = raws.clone();
                    async move {
                        let raw = &raws[client];
                        let key = 2_000_000 + client as i64;
                        // No row: the lock was not taken, and nothing was
                        // written.
                        let token: i64 = raw
                            .client
                            .query_opt(&raw.lock, &[&key])
                            .await
                            .map_err(err)?
                            .ok_or("own key held")?
                            .get(0);
                        if token < 1 {
                            return Err(format!("fencing token {token}"));
                        }
                        raw.unlock(key).await
                    }
                }),
            )
            .fencing(true),
        );

        for (name, locker, fencing) in [
            ("distlock fencing on", &self.fencing_on, true),
            ("distlock fencing off", &self.fencing_off, false),
        ] {
            contenders.push(distlock_uncontended(name, locker.clone(), fencing, TTL));
        }
        contenders.push(
            holder_record_off("distlock fencing on", self.unrecorded.clone(), TTL).fencing(true),
        );

        let pool = self.sqlx_pool(clients).await;
        let locks: Arc<Vec<PgAdvisoryLock>> = Arc::new(
            (0..clients)
                .map(|client| PgAdvisoryLock::new(format!("sqlx-{client}")))
                .collect(),
        );
        contenders.push(Contender::cycle(
            "sqlx PgAdvisoryLock",
            Role::Peer,
            "pool.acquire, try_acquire, release_now (no fence)",
            cycle(move |client| {
                let (pool, locks) = (pool.clone(), locks.clone());
                async move {
                    let conn = pool.acquire().await.map_err(err)?;
                    match locks[client].try_acquire(conn).await.map_err(err)? {
                        Either::Left(guard) => {
                            guard.release_now().await.map_err(err)?;
                            Ok(())
                        }
                        Either::Right(_) => Err("own key held".into()),
                    }
                }
            }),
        ));

        let peer = self.peer(clients).await;
        let locks: Arc<Vec<_>> = Arc::new(
            (0..clients)
                .map(|client| peer.create_lock(&format!("dlp-{client}")))
                .collect(),
        );
        contenders.push(Contender::cycle(
            "distributed-lock-postgres",
            Role::Peer,
            "try_acquire + release (no fence)",
            cycle(move |client| {
                let locks = locks.clone();
                async move {
                    let handle = locks[client]
                        .try_acquire()
                        .await
                        .map_err(err)?
                        .ok_or("own key held")?;
                    handle.release().await.map_err(err)
                }
            }),
        ));

        Group {
            backend: "postgres",
            workload: Workload::Uncontended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }

    pub async fn contended(&self, clients: usize) -> Group {
        let mut contenders = Vec::new();

        for (name, locker) in [
            ("distlock fencing on", &self.fencing_on),
            ("distlock fencing off", &self.fencing_off),
        ] {
            let locker = locker.clone();
            let key = format!("{}-shared", name.replace(' ', "-"));
            contenders.push(Contender::handoff(
                name,
                Role::Distlock,
                "lock(timeout)",
                handoff(move |_| distlock_handoff(locker.clone(), key.clone(), TTL)),
            ));
        }

        let raws = self.raw(clients, "SELECT pg_advisory_lock($1)").await;
        contenders.push(Contender::handoff(
            "floor: pg_advisory_lock + unlock",
            Role::Floor,
            "the server's own wait queue, one connection per client",
            handoff(move |client| {
                let raws = raws.clone();
                async move {
                    let key = 42i64;
                    raws[client]
                        .client
                        .query_one(&raws[client].lock, &[&key])
                        .await
                        .map_err(err)?;
                    Ok(release(
                        move || async move { raws[client].unlock(key).await },
                    ))
                }
            }),
        ));

        let pool = self.sqlx_pool(clients).await;
        // The guard borrows its lock, and the release runs in a 'static
        // closure: one lock leaked per run of the bench binary.
        let lock: &'static PgAdvisoryLock = Box::leak(Box::new(PgAdvisoryLock::new("sqlx-shared")));
        contenders.push(Contender::handoff(
            "sqlx PgAdvisoryLock",
            Role::Peer,
            "acquire (pg_advisory_lock), release_now",
            handoff(move |_| {
                let pool = pool.clone();
                async move {
                    let conn = pool.acquire().await.map_err(err)?;
                    let guard = lock.acquire(conn).await.map_err(err)?;
                    Ok(release(move || async move {
                        guard.release_now().await.map_err(err)?;
                        Ok(())
                    }))
                }
            }),
        ));

        let peer = self.peer(clients).await;
        let lock = Arc::new(peer.create_lock("dlp-shared"));
        contenders.push(Contender::handoff(
            "distributed-lock-postgres",
            Role::Peer,
            "acquire(timeout): pg_advisory_lock under lock_timeout",
            handoff(move |_| {
                let lock = lock.clone();
                async move {
                    let handle = lock
                        .acquire(Some(Duration::from_secs(30)))
                        .await
                        .map_err(err)?;
                    Ok(release(move || async move {
                        handle.release().await.map_err(err)
                    }))
                }
            }),
        ));

        Group {
            backend: "postgres",
            workload: Workload::Contended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }
}
