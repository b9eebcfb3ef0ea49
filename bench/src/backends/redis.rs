//! Redis: the raw floors, distlock with fencing on and off, `rslock` and
//! `distributed-lock-redis`.

use std::sync::Arc;
use std::time::Duration;

use distlock::redis::RedisLocker;
use distributed_lock_core::{DistributedLock, LockHandle, LockProvider};
use redis::aio::ConnectionManager;
use test_servers::RedisServer;

use super::{distlock_cycle, distlock_handoff, err, holder_record_off};
use crate::harness::{cycle, handoff, release, Contender, Group, Role, Workload};

/// Long enough that no cycle ever meets an expiry.
const TTL: Duration = Duration::from_secs(10);
const TTL_MS: u64 = 10_000;

/// The fenced floor's acquire: what distlock's grant needs at least, a
/// `SET NX PX` and the fence counter's `INCR` in one atomic step.
const FENCED_ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return redis.call('INCR', KEYS[2])
end
return 0
";
/// The owner-checked release: compare-and-delete.
const CHECKED_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
";

pub struct Redis {
    server: RedisServer,
    raw: ConnectionManager,
    locker: RedisLocker,
    unfenced: RedisLocker,
    unrecorded: RedisLocker,
    rslock: rslock::LockManager,
    peer: distributed_lock_redis::RedisLockProvider,
}

impl Redis {
    pub async fn start() -> Redis {
        let server = RedisServer::start();
        let url = server.url();
        let raw = ConnectionManager::new(redis::Client::open(url.as_str()).expect("a redis URL"))
            .await
            .expect("connect the raw client");
        let locker = RedisLocker::from_url(&url).await.expect("connect distlock");
        let unfenced = RedisLocker::from_url(&format!("{url}?fencing=off"))
            .await
            .expect("connect distlock");
        let unrecorded = RedisLocker::from_url(&format!("{url}?holder=false"))
            .await
            .expect("connect distlock");
        let rslock = rslock::LockManager::new(vec![url.clone()]);
        let peer = distributed_lock_redis::RedisLockProvider::builder()
            .url(url.clone())
            // Its defaults: a 30 s expiry and a 27 s minimum validity (a
            // shorter expiry with the default validity never succeeds).
            .build()
            .await
            .expect("connect distributed-lock-redis");
        Redis {
            server,
            raw,
            locker,
            unfenced,
            unrecorded,
            rslock,
            peer,
        }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn pids(&self) -> Vec<u32> {
        vec![self.server.pid()]
    }

    pub fn uncontended(&self, clients: usize) -> Group {
        let mut contenders = Vec::new();

        let raw = self.raw.clone();
        let acquire = Arc::new(redis::Script::new(FENCED_ACQUIRE));
        let release = Arc::new(redis::Script::new(CHECKED_RELEASE));
        contenders.push(Contender::cycle(
            "floor: Lua SET NX PX+INCR, Lua CAD",
            Role::Floor,
            "EVALSHA (SET NX PX + INCR), EVALSHA (GET + DEL): 2 round trips, fenced, owner-checked",
            cycle(move |client| {
                let (mut raw, acquire, release) = (raw.clone(), acquire.clone(), release.clone());
                async move {
                    let key = format!("floor-{client}");
                    let fence: i64 = acquire
                        .key(&key)
                        .key(format!("{key}:fence"))
                        .arg("token")
                        .arg(TTL_MS)
                        .invoke_async(&mut raw)
                        .await
                        .map_err(err)?;
                    if fence == 0 {
                        return Err("own key held".into());
                    }
                    let _: i64 = release
                        .key(&key)
                        .arg("token")
                        .invoke_async(&mut raw)
                        .await
                        .map_err(err)?;
                    Ok(())
                }
            }),
        ).fencing(true));

        let raw = self.raw.clone();
        contenders.push(
            Contender::cycle(
                "floor: SET NX PX + DEL",
                Role::Floor,
                "SET NX PX, DEL: 2 round trips, no fence, no owner check",
                cycle(move |client| {
                    let mut raw = raw.clone();
                    async move {
                        let key = format!("plain-{client}");
                        let set: Option<String> = redis::cmd("SET")
                            .arg(&key)
                            .arg("token")
                            .arg("NX")
                            .arg("PX")
                            .arg(TTL_MS)
                            .query_async(&mut raw)
                            .await
                            .map_err(err)?;
                        if set.is_none() {
                            return Err("own key held".into());
                        }
                        let _: i64 = redis::cmd("DEL")
                            .arg(&key)
                            .query_async(&mut raw)
                            .await
                            .map_err(err)?;
                        Ok(())
                    }
                }),
            )
            .fencing(false),
        );

        let locker = self.locker.clone();
        contenders.push(
            Contender::cycle(
                "distlock",
                Role::Distlock,
                "try_lock + release (fenced, owner-checked)",
                cycle(move |client| {
                    distlock_cycle(locker.clone(), format!("distlock-{client}"), TTL)
                }),
            )
            .fencing(true),
        );
        contenders.push(holder_record_off("distlock", self.unrecorded.clone(), TTL).fencing(true));
        let unfenced = self.unfenced.clone();
        contenders.push(
            Contender::cycle(
                "distlock fencing off",
                Role::Distlock,
                "try_lock + release (owner-checked, no fence: like rslock and distributed-lock-redis)",
                cycle(move |client| {
                    distlock_cycle(unfenced.clone(), format!("unfenced-{client}"), TTL)
                }),
            )
            .fencing(false),
        );

        let rslock = self.rslock.clone();
        contenders.push(Contender::cycle(
            "rslock",
            Role::Peer,
            "LockManager::lock + unlock (no fence)",
            cycle(move |client| {
                let rslock = rslock.clone();
                async move {
                    let key = format!("rslock-{client}");
                    let lock = rslock.lock(key.as_bytes(), TTL).await.map_err(err)?;
                    rslock.unlock(&lock).await;
                    Ok(())
                }
            }),
        ));

        let locks: Arc<Vec<_>> = Arc::new(
            (0..clients)
                .map(|client| self.peer.create_lock(&format!("dlr-{client}")))
                .collect(),
        );
        contenders.push(Contender::cycle(
            "distributed-lock-redis",
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
            backend: "redis",
            workload: Workload::Uncontended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }

    pub fn contended(&self, clients: usize) -> Group {
        let mut contenders = Vec::new();

        let locker = self.locker.clone();
        contenders.push(Contender::handoff(
            "distlock",
            Role::Distlock,
            "lock(timeout): woken by the release's PUBLISH",
            handoff(move |_| distlock_handoff(locker.clone(), "distlock-shared".into(), TTL)),
        ));

        for (name, does, min_ms, max_ms) in [
            (
                "raw polling 10 ms",
                "SET NX PX every 10 ms until granted, DEL",
                10,
                10,
            ),
            (
                "raw polling 5-15 ms",
                "SET NX PX every 5-15 ms (jittered) until granted, DEL",
                5,
                15,
            ),
        ] {
            let raw = self.raw.clone();
            let key = format!("poll-{min_ms}-{max_ms}");
            contenders.push(Contender::handoff(
                name,
                Role::Floor,
                does,
                handoff(move |client| {
                    let (mut raw, key) = (raw.clone(), key.clone());
                    async move {
                        let token = format!("t{client}");
                        loop {
                            let set: Option<String> = redis::cmd("SET")
                                .arg(&key)
                                .arg(&token)
                                .arg("NX")
                                .arg("PX")
                                .arg(TTL_MS)
                                .query_async(&mut raw)
                                .await
                                .map_err(err)?;
                            if set.is_some() {
                                break;
                            }
                            let pause = if max_ms > min_ms {
                                rand::random_range(min_ms..=max_ms)
                            } else {
                                min_ms
                            };
                            tokio::time::sleep(Duration::from_millis(pause)).await;
                        }
                        Ok(release(move || async move {
                            let _: i64 = redis::cmd("DEL")
                                .arg(&key)
                                .query_async(&mut raw)
                                .await
                                .map_err(err)?;
                            Ok(())
                        }))
                    }
                }),
            ));
        }

        let rslock = self.rslock.clone();
        contenders.push(Contender::handoff(
            "rslock",
            Role::Peer,
            "acquire_no_guard: retries with a random 0-200 ms delay (its defaults)",
            handoff(move |_| {
                let rslock = rslock.clone();
                async move {
                    let lock = rslock
                        .acquire_no_guard(&b"rslock-shared"[..], TTL)
                        .await
                        .map_err(err)?;
                    Ok(release(move || async move {
                        rslock.unlock(&lock).await;
                        Ok(())
                    }))
                }
            }),
        ));

        // Not distributed-lock-redis: with one server its acquire(timeout)
        // makes one attempt and answers Timeout at once if the key is held
        // (redlock/acquire.rs, acquire_single_client), so it does not wait.

        Group {
            backend: "redis",
            workload: Workload::Contended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }
}
