//! MySQL (MariaDB): the raw floor (`GET_LOCK` + `RELEASE_LOCK` on
//! mysql_async) and distlock with fencing on and off.

use std::sync::Arc;
use std::time::Duration;

use distlock::mysql::MysqlLocker;
use mysql_async::prelude::Queryable;
use test_servers::MariaDbServer;
use tokio::sync::Mutex;

use super::{distlock_cycle, distlock_handoff, err, holder_record_off};
use crate::harness::{cycle, handoff, release, Contender, Group, Role, Workload};

const TTL: Duration = Duration::from_secs(30);

pub struct Mysql {
    server: MariaDbServer,
    fencing_on: MysqlLocker,
    fencing_off: MysqlLocker,
    unrecorded: MysqlLocker,
}

impl Mysql {
    pub async fn start() -> Mysql {
        let server = MariaDbServer::start();
        let fencing_on = MysqlLocker::from_url(&server.url())
            .await
            .expect("connect distlock");
        let fencing_off = MysqlLocker::from_url(&format!("{}&fencing=off", server.url()))
            .await
            .expect("connect distlock");
        let unrecorded = MysqlLocker::from_url(&format!("{}&holder=off", server.url()))
            .await
            .expect("connect distlock");
        Mysql {
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

    /// One raw connection per client.
    async fn raw(&self, clients: usize) -> Arc<Vec<Mutex<mysql_async::Conn>>> {
        let url = self.server.url().replace("?ssl-mode=DISABLED", "");
        let mut conns = Vec::with_capacity(clients);
        for _ in 0..clients {
            let conn = mysql_async::Conn::from_url(url.as_str())
                .await
                .expect("connect the raw client");
            conns.push(Mutex::new(conn));
        }
        Arc::new(conns)
    }

    fn distlock(&self) -> [(&'static str, &'static str, MysqlLocker); 2] {
        [
            (
                "distlock fencing on",
                "try_lock + release, fencing counter bumped under the lock",
                self.fencing_on.clone(),
            ),
            (
                "distlock fencing off",
                "try_lock + release, no fencing token",
                self.fencing_off.clone(),
            ),
        ]
    }

    pub async fn uncontended(&self, clients: usize) -> Group {
        let mut contenders = Vec::new();
        let conns = self.raw(clients).await;
        contenders.push(Contender::cycle(
            "floor: GET_LOCK + RELEASE_LOCK",
            Role::Floor,
            "2 text queries on one connection per client: 2 round trips",
            cycle(move |client| {
                let conns = conns.clone();
                async move {
                    let mut conn = conns[client].lock().await;
                    let got: Option<i64> = conn
                        .query_first(format!("SELECT GET_LOCK('raw-{client}', 0)"))
                        .await
                        .map_err(err)?;
                    if got != Some(1) {
                        return Err("own key held".into());
                    }
                    let _: Option<i64> = conn
                        .query_first(format!("SELECT RELEASE_LOCK('raw-{client}')"))
                        .await
                        .map_err(err)?;
                    Ok(())
                }
            }),
        ));
        for (name, does, locker) in self.distlock() {
            contenders.push(Contender::cycle(
                name,
                Role::Distlock,
                does,
                cycle(move |client| {
                    distlock_cycle(locker.clone(), format!("distlock-{client}"), TTL)
                }),
            ));
        }
        contenders.push(holder_record_off(
            "distlock fencing on",
            self.unrecorded.clone(),
            TTL,
        ));
        Group {
            backend: "mysql",
            workload: Workload::Uncontended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }

    pub async fn contended(&self, clients: usize) -> Group {
        let mut contenders = Vec::new();
        let conns = self.raw(clients).await;
        contenders.push(Contender::handoff(
            "floor: GET_LOCK(30) + RELEASE_LOCK",
            Role::Floor,
            "the server's own wait, one connection per client",
            handoff(move |client| {
                let conns = conns.clone();
                async move {
                    let got: Option<i64> = conns[client]
                        .lock()
                        .await
                        .query_first("SELECT GET_LOCK('raw-shared', 30)")
                        .await
                        .map_err(err)?;
                    if got != Some(1) {
                        return Err(format!("GET_LOCK answered {got:?}"));
                    }
                    Ok(release(move || async move {
                        let _: Option<i64> = conns[client]
                            .lock()
                            .await
                            .query_first("SELECT RELEASE_LOCK('raw-shared')")
                            .await
                            .map_err(err)?;
                        Ok(())
                    }))
                }
            }),
        ));
        for (name, _, locker) in self.distlock() {
            let key = format!("{}-shared", name.replace(' ', "-"));
            contenders.push(Contender::handoff(
                name,
                Role::Distlock,
                "lock(timeout)",
                handoff(move |_| distlock_handoff(locker.clone(), key.clone(), TTL)),
            ));
        }
        Group {
            backend: "mysql",
            workload: Workload::Contended,
            clients,
            contenders,
            server_pids: self.pids(),
        }
    }
}
