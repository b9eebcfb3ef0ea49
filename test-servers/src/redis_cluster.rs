//! A three-master Redis Cluster (no replicas) on free loopback ports, and the
//! operations the tests need on it: kill a master, migrate a slot.
//!
//! Each node is `redis-server --cluster-enabled yes` with its own bus port
//! (`--cluster-port`, so the default `port + 10000` need not be free), joined
//! with `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`.
//! `cluster-require-full-coverage no`: with a master dead, the slots of the
//! others keep working, so a test can tell "its slots fail" from "all fail".

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{find_binary, free_port, wait_for_port};

/// How long a node may go unanswered before the others mark it failed.
const NODE_TIMEOUT_MS: u32 = 1000;

/// Three Redis Cluster masters, each owning a third of the slots; killed
/// when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
}

#[derive(Debug)]
struct ClusterNode {
    child: Option<Child>,
    port: u16,
    _dir: TempDir,
}

impl RedisCluster {
    /// Starts three nodes, joins them and waits for `cluster_state:ok` on all.
    pub fn start() -> Self {
        let binary = find_binary("redis-server", "redis-server");
        let nodes: Vec<ClusterNode> = (0..3).map(|_| ClusterNode::spawn(&binary)).collect();
        let cluster = RedisCluster { nodes };
        let mut create = Command::new(find_binary("redis-cli", "redis-tools"));
        create.arg("--cluster").arg("create");
        for port in cluster.ports() {
            create.arg(format!("127.0.0.1:{port}"));
        }
        let output = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait_until_ok(&cluster.ports());
        cluster
    }

    /// The ports of the nodes (127.0.0.1), including killed ones.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|node| node.port).collect()
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports()
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// Runs `redis-cli` against the node on `port`; its trimmed stdout.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
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

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let port = self.live_port();
        self.cli(port, &["cluster", "keyslot", key])
            .parse()
            .expect("CLUSTER KEYSLOT answers a number")
    }

    /// The port of the master that serves `slot`, as a live node sees it.
    pub fn owner_of(&self, slot: u16) -> u16 {
        let port = self.live_port();
        let nodes = self.cli(port, &["cluster", "nodes"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let owns = fields.iter().skip(8).any(|range| {
                let mut bounds = range.split('-');
                let (Some(low), high) = (bounds.next(), bounds.next()) else {
                    return false;
                };
                let (Ok(low), Ok(high)) = (low.parse::<u16>(), high.unwrap_or(low).parse::<u16>())
                else {
                    return false; // an "[slot->-id]" migration marker
                };
                (low..=high).contains(&slot)
            });
            if owns {
                return address_port(fields[1]);
            }
        }
        panic!("no node serves slot {slot}: {nodes}");
    }

    /// Moves `slot` and its keys from the node on `from` to the node on `to`
    /// the way `redis-cli --cluster reshard` does: `SETSLOT IMPORTING` and
    /// `MIGRATING`, `MIGRATE` of every key, then `SETSLOT NODE` on every
    /// node.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16) {
        let slot_text = slot.to_string();
        let from_id = self.cli(from, &["cluster", "myid"]);
        let to_id = self.cli(to, &["cluster", "myid"]);
        self.expect_ok(
            to,
            &["cluster", "setslot", &slot_text, "importing", &from_id],
        );
        self.expect_ok(
            from,
            &["cluster", "setslot", &slot_text, "migrating", &to_id],
        );
        loop {
            let keys = self.cli(from, &["cluster", "getkeysinslot", &slot_text, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let to_port = to.to_string();
            let mut args = vec!["migrate", "127.0.0.1", &to_port, "", "0", "5000", "keys"];
            args.extend(keys);
            self.expect_ok(from, &args);
        }
        for port in [to, from] {
            self.expect_ok(port, &["cluster", "setslot", &slot_text, "node", &to_id]);
        }
        for port in self.live_ports() {
            if port != to && port != from {
                self.expect_ok(port, &["cluster", "setslot", &slot_text, "node", &to_id]);
            }
        }
    }

    /// Kills the master on `port` with SIGKILL (its slots have no replica to
    /// take over) and waits until the other nodes mark it failed.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.port == port)
            .expect("a node of this cluster");
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for other in self.live_ports() {
            loop {
                let nodes = self.cli(other, &["cluster", "nodes"]);
                let failed = nodes.lines().any(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.len() > 2
                        && address_port(fields[1]) == port
                        && fields[2].split(',').any(|flag| flag == "fail")
                });
                if failed {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {other} did not mark {port} failed: {nodes}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|node| node.child.is_some())
            .map(|node| node.port)
            .collect()
    }

    fn live_port(&self) -> u16 {
        *self.live_ports().first().expect("a live node")
    }

    fn expect_ok(&self, port: u16, args: &[&str]) {
        let answer = self.cli(port, args);
        assert!(
            answer == "OK" || answer == "NOKEY",
            "{args:?} on {port}: {answer}"
        );
    }

    fn wait_until_ok(&self, ports: &[u16]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for &port in ports {
            loop {
                let info = self.cli(port, &["cluster", "info"]);
                if info.lines().any(|line| line.trim() == "cluster_state:ok") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {port} did not reach cluster_state:ok: {info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl ClusterNode {
    fn spawn(binary: &PathBuf) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for a cluster node");
        let port = free_port();
        let bus_port = loop {
            let candidate = free_port();
            if candidate != port {
                break candidate;
            }
        };
        let mut command = Command::new(binary);
        command
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-port", &bus_port.to_string()])
            .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
            .args(["--cluster-require-full-coverage", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child =
            crate::spawn_tied_to_this_process(command).expect("spawn a redis cluster node");
        wait_for_port(
            port,
            &mut child,
            "redis-server (cluster node)",
            Duration::from_secs(10),
        );
        ClusterNode {
            child: Some(child),
            port,
            _dir: dir,
        }
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The client port of a `CLUSTER NODES` address (`ip:port@cport`).
fn address_port(address: &str) -> u16 {
    address
        .split('@')
        .next()
        .and_then(|a| a.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("not a CLUSTER NODES address: {address}"))
}
