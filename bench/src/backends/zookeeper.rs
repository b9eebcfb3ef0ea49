//! ZooKeeper: the raw floor (the lock recipe's own requests through
//! zookeeper-client: create an ephemeral sequential child, list the
//! children, delete; one session per client, and the same on one shared
//! session), and distlock's `ZooKeeperLocker`.
//!
//! The recipe is ZooKeeper's "Locks" recipe
//! (<https://zookeeper.apache.org/doc/r3.8.4/recipes.html>) as Apache
//! Curator's `InterProcessMutex` names it (`<lock path>/_c_<random>-lock-<seq>`
//! under a container node), which is what `distlock/src/zookeeper/` sends.
//! No peer: zookeeper-client's own `Client::lock` (Curator's naming too)
//! releases only when its guard is dropped, by a delete spawned in the
//! background that nobody awaits, so its cycle cannot be timed like the
//! others.

use std::sync::Arc;
use std::time::Duration;

use distlock::zookeeper::ZooKeeperLocker;
use test_servers::ZooKeeperServer;
use zookeeper_client::{self as zk, Acls, CreateMode};

use super::{distlock_cycle, distlock_handoff, err, holder_record_off};
use crate::harness::{cycle, handoff, release, Contender, Group, Role, Workload};

const TTL: Duration = Duration::from_secs(30);
/// The session timeout the floor's sessions ask for: distlock's default.
const SESSION_TIMEOUT: Duration = distlock::zookeeper::DEFAULT_SESSION_TIMEOUT;
/// Where the floor's lock paths live (distlock's live under
/// `/distlock/locks/`).
const FLOOR_ROOT: &str = "/bench-floor";
/// Curator's lock name, which ZooKeeper follows with the sequence number.
const LOCK_NAME: &str = "-lock-";

pub struct ZooKeeper {
    server: ZooKeeperServer,
    locker: ZooKeeperLocker,
    unrecorded: ZooKeeperLocker,
    /// distlock with every lock on one session (`sessions=1`).
    one_session: ZooKeeperLocker,
    /// The floor's sessions, one per client, opened as groups need them.
    sessions: Vec<zk::Client>,
}

impl ZooKeeper {
    pub async fn start() -> ZooKeeper {
        let server = ZooKeeperServer::start();
        let locker = ZooKeeperLocker::from_url(&server.url())
            .await
            .expect("connect distlock");
        let unrecorded = ZooKeeperLocker::from_url(&format!("{}?holder=false", server.url()))
            .await
            .expect("connect distlock");
        let one_session = ZooKeeperLocker::from_url(&format!("{}?sessions=1", server.url()))
            .await
            .expect("connect distlock");
        let mut zookeeper = ZooKeeper {
            server,
            locker,
            unrecorded,
            one_session,
            sessions: Vec::new(),
        };
        let first = zookeeper.sessions(1).await[0].clone();
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        match first.create(FLOOR_ROOT, &[], &persistent).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(error) => panic!("create {FLOOR_ROOT}: {error}"),
        }
        zookeeper
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn pids(&self) -> Vec<u32> {
        vec![self.server.pid()]
    }

    /// The floor's first `clients` sessions, opening the missing ones.
    async fn sessions(&mut self, clients: usize) -> Arc<Vec<zk::Client>> {
        while self.sessions.len() < clients {
            let client = zk::Client::connector()
                .with_session_timeout(SESSION_TIMEOUT)
                .connect(&self.server.connect_string())
                .await
                .expect("connect zookeeper-client");
            self.sessions.push(client);
        }
        Arc::new(self.sessions[..clients].to_vec())
    }

    pub async fn uncontended(&mut self, clients: usize) -> Group {
        let sessions = self.sessions(clients).await;
        let mut contenders = Vec::new();

        let own = sessions.clone();
        contenders.push(Contender::cycle(
            "floor: create + children + delete",
            Role::Floor,
            "the lock recipe's 3 requests: create an ephemeral sequential child of the lock path, \
             list the children (ours is the lowest), delete it; one session per client",
            cycle(move |task| floor_cycle(own[task].clone(), format!("{FLOOR_ROOT}/raw-{task}"))),
        ));
        if clients > 1 {
            let shared = sessions[0].clone();
            contenders.push(Contender::cycle(
                "floor: the same on one session",
                Role::Floor,
                "the same 3 requests, every client on one session (one connection), as distlock's \
                 locker has",
                cycle(move |task| {
                    floor_cycle(
                        shared.clone(),
                        format!("{FLOOR_ROOT}/shared-session-{task}"),
                    )
                }),
            ));
        }

        let locker = self.locker.clone();
        contenders.push(Contender::cycle(
            "distlock",
            Role::Distlock,
            "try_lock + release: the same 3 requests, the keys spread over the locker's \
             sessions (4 by default), the holder record as the node's data",
            cycle(move |task| distlock_cycle(locker.clone(), format!("distlock-{task}"), TTL)),
        ));
        contenders.push(holder_record_off("distlock", self.unrecorded.clone(), TTL));
        if clients > 1 {
            let locker = self.one_session.clone();
            contenders.push(Contender::cycle(
                "distlock, sessions=1",
                Role::Variant,
                "the same cycle with every lock on one session, as the floor's one-session row",
                cycle(move |task| {
                    distlock_cycle(locker.clone(), format!("one-session-{task}"), TTL)
                }),
            ));
        }

        Group {
            backend: "zookeeper",
            workload: Workload::Uncontended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }

    pub async fn contended(&mut self, clients: usize) -> Group {
        let sessions = self.sessions(clients).await;
        let mut contenders = Vec::new();

        let locker = self.locker.clone();
        contenders.push(Contender::handoff(
            "distlock",
            Role::Distlock,
            "lock(timeout): watches the contender just ahead (exists watch), lists again when it \
             is deleted",
            handoff(move |_| distlock_handoff(locker.clone(), "distlock-shared".into(), TTL)),
        ));

        contenders.push(Contender::handoff(
            "floor: the recipe, waiting",
            Role::Floor,
            "create, list; if not first, an exists watch on the contender just ahead, list again \
             when it fires; delete to release; one session per client",
            handoff(move |task| floor_wait(sessions[task].clone(), format!("{FLOOR_ROOT}/shared"))),
        ));

        Group {
            backend: "zookeeper",
            workload: Workload::Contended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }
}

/// The sequence number ZooKeeper appended to a contender's name, if the
/// name is one of the recipe's.
fn sequence(name: &str) -> Option<i64> {
    let (head, digits) = name.rsplit_once(LOCK_NAME)?;
    (!head.is_empty() && digits.len() >= 10)
        .then(|| digits.parse().ok())
        .flatten()
}

/// Creates this attempt's contender under `dir` and returns its name: the
/// recipe's first request, and the container lock path again first if the
/// server deleted it (it deletes empty containers, so a lock path comes
/// and goes as distlock's does).
async fn create_contender(client: &zk::Client, dir: &str) -> Result<String, String> {
    let prefix = format!("_c_{:032x}{LOCK_NAME}", rand::random::<u128>());
    let path = format!("{dir}/{prefix}");
    let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    for _ in 0..3 {
        match client.create(&path, &[], &ephemeral).await {
            Ok((_, sequence)) => return Ok(format!("{prefix}{sequence}")),
            Err(zk::Error::NoNode) => {
                let container = CreateMode::Container.with_acls(Acls::anyone_all());
                match client.create(dir, &[], &container).await {
                    Ok(_) | Err(zk::Error::NodeExists) => {}
                    Err(error) => return Err(err(error)),
                }
            }
            Err(error) => return Err(err(error)),
        }
    }
    Err(format!("{dir} kept disappearing"))
}

/// The contender just ahead of `ours` among `children`, `Ok(None)` when
/// ours is the lowest.
fn ahead_of(children: &[String], ours: &str) -> Result<Option<String>, String> {
    let mine = sequence(ours).ok_or("our node has no sequence number")?;
    Ok(children
        .iter()
        .filter_map(|c| sequence(c).map(|s| (s, c)))
        .filter(|&(s, _)| s < mine)
        .max_by_key(|&(s, _)| s)
        .map(|(_, c)| c.clone()))
}

/// One uncontended cycle of the raw recipe on `dir`, a lock path only this
/// client uses: create, list, delete.
async fn floor_cycle(client: zk::Client, dir: String) -> Result<(), String> {
    let node = create_contender(&client, &dir).await?;
    let children = client.list_children(&dir).await.map_err(err)?;
    let path = format!("{dir}/{node}");
    if ahead_of(&children, &node)?.is_some() {
        let _ = client.delete(&path, None).await;
        return Err("own key held".into());
    }
    client.delete(&path, None).await.map_err(err)
}

/// The raw recipe waiting for `dir`: create, then list until ours is the
/// lowest, each time watching the contender just ahead (an exists watch)
/// and listing again once it fires. The release deletes our node.
async fn floor_wait(client: zk::Client, dir: String) -> Result<crate::harness::Release, String> {
    let node = create_contender(&client, &dir).await?;
    let path = format!("{dir}/{node}");
    loop {
        let children = client.list_children(&dir).await.map_err(err)?;
        let Some(ahead) = ahead_of(&children, &node)? else {
            break;
        };
        let (stat, watcher) = client
            .check_and_watch_stat(&format!("{dir}/{ahead}"))
            .await
            .map_err(err)?;
        if stat.is_some() {
            watcher.changed().await;
        }
    }
    Ok(release(move || async move {
        client.delete(&path, None).await.map_err(err)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_are_ordered_by_their_sequence_number() {
        let children: Vec<String> = [
            "_c_ab-lock-0000000007",
            "_c_cd-lock-0000000003",
            "_c_ef-lock-0000000005",
            "stray",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            ahead_of(&children, "_c_ab-lock-0000000007"),
            Ok(Some("_c_ef-lock-0000000005".to_owned()))
        );
        assert_eq!(ahead_of(&children, "_c_cd-lock-0000000003"), Ok(None));
        assert_eq!(sequence("stray"), None);
        assert_eq!(sequence("-lock-0000000001"), None);
    }
}
