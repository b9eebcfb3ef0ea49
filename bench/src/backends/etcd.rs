//! etcd: the raw floor (the recipe's two transactions), distlock, and
//! etcd-client's `lock` RPC (etcd's server-side lock).

use std::sync::Arc;
use std::time::Duration;

use distlock::etcd::EtcdLocker;
use etcd_client::{
    Compare, CompareOp, GetOptions, LockOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use test_servers::EtcdServer;

use super::{distlock_cycle, distlock_handoff, err, holder_record_off};
use crate::harness::{cycle, handoff, release, Contender, Group, Role, Workload};

const TTL: Duration = Duration::from_secs(30);

pub struct Etcd {
    server: EtcdServer,
    locker: EtcdLocker,
    unrecorded: EtcdLocker,
    client: etcd_client::Client,
    /// One lease for every raw and RPC cycle, as the locker has one per ttl
    /// class; 60 s outlives every measurement, so no keep-alive is sent.
    lease: i64,
}

impl Etcd {
    pub async fn start() -> Etcd {
        let server = EtcdServer::start();
        let locker = EtcdLocker::from_url(&server.url())
            .await
            .expect("connect distlock");
        let unrecorded = EtcdLocker::from_url(&format!("{}?holder=false", server.url()))
            .await
            .expect("connect distlock");
        let client = etcd_client::Client::connect([format!("http://{}", server.endpoint())], None)
            .await
            .expect("connect etcd-client");
        Etcd {
            server,
            locker,
            unrecorded,
            client,
            lease: 0,
        }
    }

    /// A fresh lease for the next group's raw and RPC cycles.
    async fn grant(&mut self) -> i64 {
        self.lease = self
            .client
            .lease_client()
            .grant(600, None)
            .await
            .expect("grant a lease")
            .id();
        self.lease
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn pids(&self) -> Vec<u32> {
        vec![self.server.pid()]
    }

    pub async fn uncontended(&mut self, clients: usize) -> Group {
        let lease = self.grant().await;
        let mut contenders = Vec::new();

        let client = self.client.clone();
        contenders.push(Contender::cycle(
            "floor: txn put-if-absent + txn delete",
            Role::Floor,
            "the etcd mutex recipe's 2 transactions: put-if-absent + read the queue head, compare-and-delete",
            cycle(move |task| {
                let mut kv = client.kv_client();
                async move {
                    let name = format!("raw-{task}");
                    let key = format!("{name}/{lease:x}");
                    let acquire = Txn::new()
                        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                        .and_then([
                            TxnOp::put(key.clone(), "secret", Some(PutOptions::new().with_lease(lease))),
                            TxnOp::get(
                                format!("{name}/"),
                                Some(
                                    GetOptions::new()
                                        .with_prefix()
                                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                                        .with_limit(1),
                                ),
                            ),
                        ])
                        .or_else([TxnOp::get(key.clone(), None)]);
                    let response = kv.txn(acquire).await.map_err(err)?;
                    if !response.succeeded() {
                        return Err("own key held".into());
                    }
                    let revision = response.header().map(|h| h.revision()).unwrap_or_default();
                    let release = Txn::new()
                        .when([
                            Compare::create_revision(key.clone(), CompareOp::Equal, revision),
                            Compare::value(key.clone(), CompareOp::Equal, "secret"),
                        ])
                        .and_then([TxnOp::delete(key, None)]);
                    kv.txn(release).await.map_err(err)?;
                    Ok(())
                }
            }),
        ));

        let locker = self.locker.clone();
        contenders.push(Contender::cycle(
            "distlock",
            Role::Distlock,
            "try_lock + release",
            cycle(move |task| distlock_cycle(locker.clone(), format!("distlock-{task}"), TTL)),
        ));
        contenders.push(holder_record_off("distlock", self.unrecorded.clone(), TTL));

        let client = self.client.clone();
        contenders.push(Contender::cycle(
            "etcd-client lock RPC",
            Role::Peer,
            "Lock + Unlock RPCs on one lease (server-side recipe)",
            cycle(move |task| {
                let mut lock = client.lock_client();
                async move {
                    let granted = lock
                        .lock(
                            format!("rpc-{task}"),
                            Some(LockOptions::new().with_lease(lease)),
                        )
                        .await
                        .map_err(err)?;
                    lock.unlock(granted.key()).await.map_err(err)?;
                    Ok(())
                }
            }),
        ));

        Group {
            backend: "etcd",
            workload: Workload::Uncontended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }

    pub async fn contended(&mut self, clients: usize) -> Group {
        // One lease per client: the Lock RPC's key is the name plus the
        // lease, so clients sharing a lease would all hold the lock at once.
        let mut leases = Vec::with_capacity(clients);
        for _ in 0..clients {
            leases.push(self.grant().await);
        }
        let leases = Arc::new(leases);
        let mut contenders = Vec::new();

        let locker = self.locker.clone();
        contenders.push(Contender::handoff(
            "distlock",
            Role::Distlock,
            "lock(timeout): watches the key ahead in the queue",
            handoff(move |_| distlock_handoff(locker.clone(), "distlock-shared".into(), TTL)),
        ));

        let client = self.client.clone();
        contenders.push(Contender::handoff(
            "etcd-client lock RPC",
            Role::Peer,
            "Lock RPC (the server waits), Unlock",
            handoff(move |task| {
                let (mut lock, lease) = (client.lock_client(), leases[task]);
                async move {
                    let granted = lock
                        .lock("rpc-shared", Some(LockOptions::new().with_lease(lease)))
                        .await
                        .map_err(err)?;
                    Ok(release(move || async move {
                        lock.unlock(granted.key()).await.map_err(err)?;
                        Ok(())
                    }))
                }
            }),
        ));

        Group {
            backend: "etcd",
            workload: Workload::Contended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }
}
