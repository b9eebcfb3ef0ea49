//! One master, one replica and three sentinels on free loopback ports.
//!
//! Each sentinel is `redis-server FILE --sentinel` with `sentinel monitor
//! NAME 127.0.0.1 PORT 2` and short `down-after-milliseconds` and
//! `failover-timeout`, so a forced failover (`SENTINEL FAILOVER`) completes
//! in a few seconds. Sentinels rewrite their file, so it lives in a temp dir
//! of their own.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{find_binary, free_port, wait_for_port, RedisOptions, RedisServer};

/// The name the sentinels monitor the master under.
pub const SENTINEL_MASTER_NAME: &str = "distlock-test";

/// A master, its replica and three sentinels; all killed when dropped.
#[derive(Debug)]
pub struct RedisSentinelSet {
    servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
}

#[derive(Debug)]
struct Sentinel {
    child: Option<Child>,
    port: u16,
    _dir: TempDir,
}

impl RedisSentinelSet {
    /// Starts the set and waits until every sentinel knows the replica and
    /// the replica is in sync.
    pub fn start() -> Self {
        let master = RedisServer::start();
        let replica = RedisServer::start_with(RedisOptions {
            replica_of: Some(master.port()),
            ..RedisOptions::default()
        });
        let binary = find_binary("redis-server", "redis-server");
        let sentinels = (0..3)
            .map(|_| Sentinel::spawn(&binary, master.port()))
            .collect();
        let set = RedisSentinelSet {
            servers: vec![master, replica],
            sentinels,
        };
        set.wait_until_ready();
        set
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/distlock-test`.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!(
            "redis+sentinel://{}/{SENTINEL_MASTER_NAME}",
            sentinels.join(",")
        )
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The port of the master, as the first sentinel names it.
    pub fn master_port(&self) -> u16 {
        let answer =
            self.sentinel_cli(&["sentinel", "get-master-addr-by-name", SENTINEL_MASTER_NAME]);
        answer
            .lines()
            .nth(1)
            .and_then(|port| port.trim().parse().ok())
            .unwrap_or_else(|| panic!("no master address from the sentinel: {answer:?}"))
    }

    /// The server (master or replica) listening on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|server| server.port() == port)
            .unwrap_or_else(|| panic!("no server of this set on port {port}"))
    }

    /// The current master.
    pub fn master(&self) -> &RedisServer {
        self.server(self.master_port())
    }

    /// The current replica (the server that is not the master).
    pub fn replica(&self) -> &RedisServer {
        let master = self.master_port();
        self.servers
            .iter()
            .find(|server| server.port() != master)
            .expect("two servers")
    }

    /// Forces a failover (`SENTINEL FAILOVER`) and waits until the replica is
    /// the master, every sentinel says so, and the old master replicates from
    /// it. Returns the new master's port.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        let new = self.replica().port();
        let answer = self.sentinel_cli(&["sentinel", "failover", SENTINEL_MASTER_NAME]);
        assert_eq!(answer, "OK", "SENTINEL FAILOVER");
        let done = crate::poll_until(Duration::from_secs(30), Duration::from_millis(50), || {
            let named = self.sentinels.iter().all(|sentinel| {
                let answer = cli(
                    sentinel.port,
                    &["sentinel", "get-master-addr-by-name", SENTINEL_MASTER_NAME],
                );
                answer.lines().nth(1).map(str::trim) == Some(&new.to_string())
            });
            // The failover closes client connections on both servers as it
            // reconfigures them: a refused `ROLE` is "not yet".
            let role_is = |port, role| {
                self.server(port)
                    .try_cli(&["role"])
                    .is_ok_and(|answer| answer.starts_with(role))
            };
            (named && role_is(new, "master") && role_is(old, "slave")).then_some(new)
        });
        done.unwrap_or_else(|| panic!("the failover from {old} to {new} did not complete in 30 s"))
    }

    fn sentinel_cli(&self, args: &[&str]) -> String {
        cli(self.sentinels[0].port, args)
    }

    fn wait_until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let replica_port = self.servers[1].port().to_string();
        loop {
            let in_sync = self.servers[1]
                .cli(&["info", "replication"])
                .lines()
                .any(|line| line.trim() == "master_link_status:up");
            let known = self.sentinels.iter().all(|sentinel| {
                let replicas = cli(
                    sentinel.port,
                    &["sentinel", "replicas", SENTINEL_MASTER_NAME],
                );
                let peers = cli(
                    sentinel.port,
                    &["sentinel", "sentinels", SENTINEL_MASTER_NAME],
                );
                replicas.lines().any(|line| line.trim() == replica_port)
                    && peers.lines().filter(|line| line.trim() == "runid").count() == 2
            });
            if in_sync && known {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not discover the replica and each other within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Sentinel {
    fn spawn(binary: &std::path::Path, master_port: u16) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for a sentinel");
        let port = free_port();
        let file = dir.path().join("sentinel.conf");
        let config = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nloglevel warning\n\
             sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 5000\n\
             sentinel parallel-syncs {name} 1\n",
            dir = dir.path().display(),
            name = SENTINEL_MASTER_NAME,
        );
        std::fs::write(&file, config).expect("write the sentinel config");
        let mut command = Command::new(binary);
        command
            .arg(&file)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = crate::spawn_tied_to_this_process(command).expect("spawn a sentinel");
        wait_for_port(port, &mut child, "redis sentinel", Duration::from_secs(10));
        Sentinel {
            child: Some(child),
            port,
            _dir: dir,
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let output = Command::new(find_binary("redis-cli", "redis-tools"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    assert!(
        output.status.success(),
        "redis-cli -p {port} {args:?} failed: {output:?}"
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}
