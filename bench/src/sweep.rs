//! `sweep`: distlock's `sessions` setting on Postgres, MySQL and ZooKeeper
//! at a fixed number of clients (issue 28: which default serves sixteen
//! clients; issue 27: how many sessions ZooKeeper's locker needs). One
//! locker per setting, all of them contenders of one group, so the settings
//! are measured in the same interleaved rounds; each line printed gives a
//! setting's cycles/s, cycle p99 and the server connections its locker had
//! open after one burst of every client at once (before the rounds). `all`
//! runs it after the other groups and writes it into the results, the
//! tables and `sweep.svg`; `sweep` runs it alone and prints the tables.

use std::time::Duration;

use distlock::Locker;
use serde::{Deserialize, Serialize};

use crate::backends::{distlock_cycle, err};
use crate::harness::{self, cycle, Contender, Group, GroupResult, Role, Settings, Workload};
use crate::report;

/// The settings swept, as issue 28 lists them.
pub const SESSIONS: [usize; 6] = [1, 2, 4, 8, 16, 32];

const TTL: Duration = Duration::from_secs(30);

/// A locker per setting of one backend, and how to count the server's
/// client connections.
pub enum Server {
    Postgres(test_servers::PostgresServer),
    Mysql(test_servers::MariaDbServer),
    ZooKeeper(test_servers::ZooKeeperServer),
}

impl Server {
    fn name(&self) -> &'static str {
        match self {
            Server::Postgres(_) => "postgres",
            Server::Mysql(_) => "mysql",
            Server::ZooKeeper(_) => "zookeeper",
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Server::Postgres(server) => server.pid(),
            Server::Mysql(server) => server.pid(),
            Server::ZooKeeper(server) => server.pid(),
        }
    }

    async fn locker(&self, sessions: usize) -> Result<std::sync::Arc<dyn Locker>, String> {
        // The SQL test URLs carry a query already; ZooKeeper's does not.
        let url = match self {
            Server::Postgres(server) => format!("{}&", server.url()),
            Server::Mysql(server) => format!("{}&", server.url()),
            Server::ZooKeeper(server) => format!("{}?", server.url()),
        };
        distlock::connect(&format!("{url}sessions={sessions}"))
            .await
            .map_err(err)
    }

    /// The client connections the server has open now, the asking one
    /// left out.
    async fn connections(&self) -> Result<i64, String> {
        match self {
            Server::Postgres(server) => {
                let (client, connection) =
                    tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
                        .await
                        .map_err(err)?;
                let task = tokio::spawn(connection);
                let row = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity \
                         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                        &[],
                    )
                    .await
                    .map_err(err)?;
                drop(client);
                task.abort();
                Ok(row.get(0))
            }
            Server::Mysql(server) => {
                use mysql_async::prelude::Queryable;
                let url = server.url().replace("?ssl-mode=DISABLED", "");
                let mut conn = mysql_async::Conn::from_url(url.as_str())
                    .await
                    .map_err(err)?;
                let threads: Option<(String, i64)> = conn
                    .query_first("SHOW STATUS LIKE 'Threads_connected'")
                    .await
                    .map_err(err)?;
                conn.disconnect().await.map_err(err)?;
                let (_, threads) = threads.ok_or("no Threads_connected")?;
                Ok(threads - 1)
            }
            Server::ZooKeeper(server) => {
                // `mntr` counts its own connection too.
                let alive = server
                    .mntr("zk_num_alive_connections")
                    .ok_or("no zk_num_alive_connections in mntr")?;
                Ok(i64::try_from(alive).map_err(err)? - 1)
            }
        }
    }
}

/// One backend's sweep: the group of its settings measured in interleaved
/// rounds, and the server connections each setting's locker had open after
/// the burst.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepResult {
    pub backend: String,
    pub clients: usize,
    /// The `sessions` settings, in the order of the group's contenders.
    pub sessions: Vec<usize>,
    /// Server connections opened by each setting's locker.
    pub connections: Vec<i64>,
    pub group: GroupResult,
}

impl SweepResult {
    /// The contender measuring `sessions`.
    pub fn contender(&self, sessions: usize) -> Option<&str> {
        let index = self.sessions.iter().position(|&s| s == sessions)?;
        self.group.contenders.get(index).map(|c| c.name.as_str())
    }

    /// The table, one row per setting: cycles/s (median and range), cycle
    /// p99, and the server connections.
    pub fn table(&self) -> String {
        let mut table = format!(
            "| sessions | cycles/s (median) | min–max | cycle p99 µs (median) | server connections after a {}-client burst |\n\
             | ---: | ---: | ---: | ---: | ---: |\n",
            self.clients
        );
        for (&sessions, connections) in self.sessions.iter().zip(&self.connections) {
            let Some(name) = self.contender(sessions) else {
                continue;
            };
            let ops = report::stat(&self.group, name, |m| m.ops_per_s);
            let p99 = report::stat(&self.group, name, |m| m.latency.p99_us);
            table.push_str(&format!(
                "| {sessions} | {} | {} | {} | {connections} |\n",
                ops.map_or("-".into(), |s| format!("{:.0}", s.median)),
                ops.map_or("-".into(), |s| format!("{:.0}–{:.0}", s.min, s.max)),
                p99.map_or("-".into(), |s| format!("{:.0}", s.median)),
            ));
        }
        table
    }
}

/// Sweeps `sessions` on `backend` (`postgres`, `mysql` or `zookeeper`) at `clients`
/// clients on a server of its own.
pub async fn run(
    backend: &str,
    clients: usize,
    settings: &Settings,
) -> Result<SweepResult, String> {
    let server = match backend {
        "postgres" => Server::Postgres(test_servers::PostgresServer::start()),
        "mysql" => Server::Mysql(test_servers::MariaDbServer::start()),
        "zookeeper" => Server::ZooKeeper(test_servers::ZooKeeperServer::start()),
        other => return Err(format!("sweep: {other:?} has no sessions setting")),
    };
    let mut contenders = Vec::new();
    let mut opened = Vec::new();
    for sessions in SESSIONS {
        let before = server.connections().await?;
        let locker = server.locker(sessions).await?;
        // Every client at once, so a pool that opens sessions on demand
        // opens all it will. Counted after the burst, before the rounds:
        // sessions a pool opens on demand later are not in it.
        let burst = (0..clients).map(|client| {
            distlock_cycle(locker.clone(), format!("sweep-{sessions}-{client}"), TTL)
        });
        for outcome in futures_util::future::join_all(burst).await {
            outcome?;
        }
        opened.push(server.connections().await? - before);
        contenders.push(
            Contender::cycle(
                &format!("distlock fencing on, sessions={sessions}"),
                Role::Distlock,
                "try_lock + release",
                cycle(move |client| {
                    distlock_cycle(locker.clone(), format!("sweep-{sessions}-{client}"), TTL)
                }),
            )
            .fencing(true),
        );
    }
    let group = Group {
        backend: server.name(),
        workload: Workload::Uncontended,
        clients,
        contenders,
        server_pids: vec![server.pid()],
    };
    Ok(SweepResult {
        backend: backend.to_owned(),
        clients,
        sessions: SESSIONS.to_vec(),
        connections: opened,
        group: harness::run_group(&group, settings).await,
    })
}
