//! MySQL (MariaDB): the raw floors (`GET_LOCK` + `RELEASE_LOCK` on
//! mysql_async, plain and with a fencing counter) and distlock with fencing
//! on and off.

use std::sync::Arc;
use std::time::Duration;

use distlock::mysql::MysqlLocker;
use mysql_async::prelude::Queryable;
use test_servers::MariaDbServer;
use tokio::sync::Mutex;

use super::{distlock_handoff, distlock_uncontended, err, holder_record_off};
use crate::harness::{cycle, handoff, release, Contender, Group, Role, Workload};

const TTL: Duration = Duration::from_secs(30);

/// The fenced floor's table: one counter per lock name, the least a fenced
/// lock stores (distlock's row also records the owner and holder).
const FENCE_TABLE: &str = "CREATE TABLE IF NOT EXISTS floor_fence \
     (k VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, n BIGINT NOT NULL) \
     ENGINE=InnoDB";

/// The fenced floor's grant: ONE prepared statement, not a multi-statement
/// (the binary protocol runs one statement per `COM_STMT_EXECUTE`). The
/// WHERE clause of the table-less SELECT runs once, so `GET_LOCK` is tried
/// once, before any row is touched, and the counter is inserted or bumped
/// only if it answered 1; affected rows 0 means not taken. The token comes
/// back in the OK packet's last-insert-id: `LAST_INSERT_ID(expr)` sets it
/// with no AUTO_INCREMENT column (the documented counter idiom,
/// <https://dev.mysql.com/doc/refman/8.0/en/information-functions.html#function_last-insert-id>),
/// the UPDATE's call last when the row exists. A duplicate primary key
/// takes an index-record lock, not a next-key lock
/// (<https://dev.mysql.com/doc/refman/8.0/en/innodb-locks-set.html>), so
/// clients on other names do not wait on each other's gaps. Autocommit: the
/// bump is committed before the answer. Sound as a fence: every writer of a
/// row holds its named lock, so bumps of one name are serialised and each
/// grant reads a token above every earlier one.
const FENCED_GET_LOCK: &str = "INSERT INTO floor_fence (k, n) \
     SELECT ?, LAST_INSERT_ID(1) FROM DUAL WHERE GET_LOCK(?, 0) = 1 \
     ON DUPLICATE KEY UPDATE n = LAST_INSERT_ID(n + 1)";

/// One raw connection with the fenced floor's statements prepared.
struct Fenced {
    conn: mysql_async::Conn,
    lock: mysql_async::Statement,
    unlock: mysql_async::Statement,
    /// The token of this client's last grant: each must be above it, which
    /// checks that the OK packet carries the counter (0 before the first).
    last_token: u64,
}

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
    async fn connect(&self, clients: usize) -> Vec<mysql_async::Conn> {
        let url = self.server.url().replace("?ssl-mode=DISABLED", "");
        let mut conns = Vec::with_capacity(clients);
        for _ in 0..clients {
            let conn = mysql_async::Conn::from_url(url.as_str())
                .await
                .expect("connect the raw client");
            conns.push(conn);
        }
        conns
    }

    /// One raw connection per client, shared with the cycle.
    async fn raw(&self, clients: usize) -> Arc<Vec<Mutex<mysql_async::Conn>>> {
        Arc::new(
            self.connect(clients)
                .await
                .into_iter()
                .map(Mutex::new)
                .collect(),
        )
    }

    /// One raw connection per client, the fenced floor's grant and release
    /// prepared.
    async fn fenced(&self, clients: usize) -> Arc<Vec<Mutex<Fenced>>> {
        let mut fenced = Vec::with_capacity(clients);
        for mut conn in self.connect(clients).await {
            conn.query_drop(FENCE_TABLE)
                .await
                .expect("create the fenced floor's table");
            let lock = conn.prep(FENCED_GET_LOCK).await.expect("prepare the grant");
            let unlock = conn
                .prep("SELECT RELEASE_LOCK(?)")
                .await
                .expect("prepare the release");
            fenced.push(Mutex::new(Fenced {
                conn,
                lock,
                unlock,
                last_token: 0,
            }));
        }
        Arc::new(fenced)
    }

    fn distlock(&self) -> [(&'static str, MysqlLocker, bool); 2] {
        [
            ("distlock fencing on", self.fencing_on.clone(), true),
            ("distlock fencing off", self.fencing_off.clone(), false),
        ]
    }

    pub async fn uncontended(&self, clients: usize) -> Group {
        let mut contenders = Vec::new();
        let conns = self.raw(clients).await;
        contenders.push(
            Contender::cycle(
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
            )
            .fencing(false),
        );

        let fenced = self.fenced(clients).await;
        contenders.push(
            Contender::cycle(
                "fenced floor: GET_LOCK+upsert, RELEASE_LOCK",
                Role::Floor,
                "2 prepared statements on one connection per client: INSERT … SELECT … \
                 WHERE GET_LOCK(?, 0) = 1 ON DUPLICATE KEY UPDATE, the token in the OK \
                 packet (1 round trip, 1 commit), then RELEASE_LOCK",
                cycle(move |client| {
                    let fenced = fenced.clone();
                    async move {
                        let mut guard = fenced[client].lock().await;
                        let Fenced {
                            conn,
                            lock,
                            unlock,
                            last_token,
                        } = &mut *guard;
                        let name = format!("fenced-{client}");
                        conn.exec_drop(&*lock, (&name, &name)).await.map_err(err)?;
                        if conn.affected_rows() == 0 {
                            return Err("own key held".into());
                        }
                        match conn.last_insert_id() {
                            Some(token) if token > *last_token => *last_token = token,
                            other => {
                                return Err(format!("fencing token {other:?} after {last_token}"))
                            }
                        }
                        let released: Option<i64> =
                            conn.exec_first(&*unlock, (&name,)).await.map_err(err)?;
                        if released != Some(1) {
                            return Err(format!("RELEASE_LOCK answered {released:?}"));
                        }
                        Ok(())
                    }
                }),
            )
            .fencing(true),
        );

        for (name, locker, fencing) in self.distlock() {
            contenders.push(distlock_uncontended(name, locker, fencing, TTL));
        }
        contenders.push(
            holder_record_off("distlock fencing on", self.unrecorded.clone(), TTL).fencing(true),
        );
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
        for (name, locker, _) in self.distlock() {
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
