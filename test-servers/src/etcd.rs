//! Debian's `etcd` (3.4) as one node ([`EtcdServer`]) or a three-node
//! cluster ([`EtcdCluster`]) on free loopback ports, each member in a
//! temporary data directory, and `etcdctl` against them.
//!
//! Raft timing is tightened (heartbeat 100 ms, election timeout 600 ms) so
//! a killed leader is replaced within about a second, and so the smallest
//! lease the server grants is 1 s: etcd raises a lease's ttl to
//! `1.5 × election timeout`, rounded up to whole seconds (`minTTL` in
//! etcd's `server/etcdserver/server.go`).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{find_binary, free_port, signal, wait_for_port};

const HEARTBEAT_MS: &str = "100";
const ELECTION_MS: &str = "600";

/// One member of a cluster.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    child: Option<Child>,
}

impl Member {
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// A cluster of `etcd` members owned by one test; every member is killed
/// when it is dropped (and when the test process dies).
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    binary: PathBuf,
    /// Flags every member starts with, after ours.
    extra_args: Vec<String>,
    /// Holds every member's data directory.
    _dir: TempDir,
}

impl EtcdCluster {
    /// Starts `size` members that form one cluster, and waits until it has
    /// a leader and every member answers.
    pub fn start(size: usize) -> Self {
        Self::start_with_args(size, &[])
    }

    /// [`EtcdCluster::start`] with more `etcd` flags for every member (for
    /// example `--max-txn-ops=16`).
    pub fn start_with_args(size: usize, extra_args: &[&str]) -> Self {
        let binary = find_binary("etcd", "etcd-server");
        // etcdctl is needed by every caller that inspects the cluster:
        // fail early with the install hint.
        find_binary("etcdctl", "etcd-client");
        // Every etcd write is a raft commit with an fsync; on a disk shared
        // with parallel builds and tests one fsync took over half a second
        // and made wake-up latencies measure the disk. Tests need no
        // durability across a machine crash: keep the data in memory
        // (tmpfs) where the machine has it.
        let in_memory = std::path::Path::new("/dev/shm");
        let dir = if in_memory.is_dir() {
            tempfile::tempdir_in(in_memory)
        } else {
            tempfile::tempdir()
        }
        .expect("temp dir for etcd");
        let members = (0..size)
            .map(|index| Member {
                name: format!("m{index}"),
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.path().join(format!("m{index}")),
                child: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            members,
            binary,
            extra_args: extra_args.iter().map(|arg| arg.to_string()).collect(),
            _dir: dir,
        };
        for index in 0..size {
            cluster.spawn(index, "new");
        }
        for index in 0..size {
            cluster.wait_healthy(index, Duration::from_secs(30));
        }
        cluster
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, index: usize, state: &str) {
        let initial_cluster = self.initial_cluster();
        let member = &self.members[index];
        let mut command = Command::new(&self.binary);
        command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &member.client_url()])
            .args(["--advertise-client-urls", &member.client_url()])
            .args(["--listen-peer-urls", &member.peer_url()])
            .args(["--initial-advertise-peer-urls", &member.peer_url()])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "distlock-tests"])
            .args(["--heartbeat-interval", HEARTBEAT_MS])
            .args(["--election-timeout", ELECTION_MS])
            .args(["--logger", "zap", "--log-level", "error"])
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = crate::spawn_tied_to_this_process(command).expect("spawn etcd");
        wait_for_port(
            member.client_port,
            &mut child,
            "etcd",
            Duration::from_secs(20),
        );
        self.members[index].child = Some(child);
    }

    /// Waits until member `index` reports itself healthy (it has a leader
    /// and serves a quorum read), or panics.
    pub fn wait_healthy(&self, index: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let endpoint = self.members[index].client_url();
        loop {
            let output = self.etcdctl_at(&endpoint, &["endpoint", "health"]);
            if output.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd member {index} not healthy within {timeout:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// How many members the cluster has (running or not).
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The client endpoints, `127.0.0.1:port`, comma-separated.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `etcd://127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints())
    }

    /// The client port of member `index`.
    pub fn client_port(&self, index: usize) -> u16 {
        self.members[index].client_port
    }

    /// How many calls of the gRPC method `method` (`"Txn"`, `"Range"`, ...)
    /// member `index` has answered, whatever their status: read off its
    /// Prometheus metrics (`grpc_server_handled_total`) at `/metrics` on
    /// its client port.
    pub fn grpc_calls(&self, index: usize, method: &str) -> u64 {
        use std::io::{Read, Write};
        let port = self.members[index].client_port;
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to etcd's /metrics");
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("ask for etcd's metrics");
        let mut page = String::new();
        stream
            .read_to_string(&mut page)
            .expect("read etcd's metrics");
        let series = format!("grpc_method=\"{method}\"");
        page.lines()
            .filter(|line| line.starts_with("grpc_server_handled_total{") && line.contains(&series))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Whether member `index` is running.
    pub fn is_running(&self, index: usize) -> bool {
        self.members[index].child.is_some()
    }

    /// Kills member `index` with SIGKILL and waits for it to exit.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `index` again on its ports and data directory (it
    /// rejoins the cluster); does not wait for it to be healthy.
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index, "existing");
    }

    /// Freezes member `index` (SIGSTOP).
    pub fn pause(&self, index: usize) {
        signal(self.pid(index), libc::SIGSTOP);
    }

    /// Thaws member `index` (SIGCONT).
    pub fn resume(&self, index: usize) {
        signal(self.pid(index), libc::SIGCONT);
    }

    /// The process id of member `index`.
    pub fn pid(&self, index: usize) -> u32 {
        self.members[index]
            .child
            .as_ref()
            .expect("the member is running")
            .id()
    }

    /// The index of the current leader, asked of the running members
    /// (`etcdctl endpoint status`), or `None` if none of them knows one.
    pub fn leader(&self) -> Option<usize> {
        for member in self.members.iter().filter(|m| m.child.is_some()) {
            let output = self.etcdctl_at(
                &member.client_url(),
                &["endpoint", "status", "-w", "fields"],
            );
            if !output.status.success() {
                continue;
            }
            let text = String::from_utf8_lossy(&output.stdout);
            let field = |name: &str| {
                text.lines()
                    .find_map(|line| line.strip_prefix(&format!("\"{name}\" : ")))
                    .map(|value| value.trim().to_owned())
            };
            let (Some(member_id), Some(leader)) = (field("MemberID"), field("Leader")) else {
                continue;
            };
            if leader == "0" {
                continue;
            }
            if member_id == leader {
                return self.members.iter().position(|m| m.name == member.name);
            }
            // Another member leads: find which by asking each for its id.
            for (index, other) in self.members.iter().enumerate() {
                if other.child.is_none() {
                    continue;
                }
                let out =
                    self.etcdctl_at(&other.client_url(), &["endpoint", "status", "-w", "fields"]);
                let text = String::from_utf8_lossy(&out.stdout);
                if text
                    .lines()
                    .any(|line| line.trim() == format!("\"MemberID\" : {leader}"))
                {
                    return Some(index);
                }
            }
        }
        None
    }

    /// Hands leadership to member `to` (`etcdctl move-leader`, sent to the
    /// current leader) and waits until `to` leads: a leader change without
    /// a member going down. Panics if it does not happen within 10 s.
    pub fn move_leader(&self, to: usize) {
        let status = self.etcdctl_at(
            &self.members[to].client_url(),
            &["endpoint", "status", "-w", "fields"],
        );
        let text = String::from_utf8_lossy(&status.stdout);
        let id: u64 = text
            .lines()
            .find_map(|line| line.strip_prefix("\"MemberID\" : "))
            .and_then(|id| id.trim().parse().ok())
            .unwrap_or_else(|| panic!("no member id in: {text}"));
        let leader = self.wait_for_leader(Duration::from_secs(10));
        if leader == to {
            return;
        }
        let output = self.etcdctl_at(
            &self.members[leader].client_url(),
            &["move-leader", &format!("{id:x}")],
        );
        assert!(
            output.status.success(),
            "etcdctl move-leader failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let led = crate::poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
            (self.leader() == Some(to)).then_some(())
        });
        assert!(led.is_some(), "member {to} never took the lead");
    }

    /// Waits until some running member reports a leader, or panics.
    pub fn wait_for_leader(&self, timeout: Duration) -> usize {
        crate::poll_until(timeout, Duration::from_millis(100), || self.leader())
            .unwrap_or_else(|| panic!("no etcd leader within {timeout:?}"))
    }

    /// Runs `etcdctl` (API v3) against every running member and returns
    /// its output, whatever its exit status.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let endpoints = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(Member::client_url)
            .collect::<Vec<_>>()
            .join(",");
        self.etcdctl_at(&endpoints, args)
    }

    /// `etcdctl` with `args` against every running member, as a command
    /// to spawn (for `etcdctl lock NAME -- CMD` held in the background).
    pub fn etcdctl_command(&self, args: &[&str]) -> Command {
        let endpoints = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(Member::client_url)
            .collect::<Vec<_>>()
            .join(",");
        let mut command = Command::new(find_binary("etcdctl", "etcd-client"));
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(["--dial-timeout=2s", "--command-timeout=5s"])
            .args(args);
        command
    }

    fn etcdctl_at(&self, endpoints: &str, args: &[&str]) -> Output {
        Command::new(find_binary("etcdctl", "etcd-client"))
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(["--dial-timeout=1s", "--command-timeout=2s"])
            .args(args)
            .output()
            .expect("run etcdctl")
    }

    /// Runs `etcdctl` with `args`, asserts it succeeded, and returns its
    /// trimmed stdout.
    pub fn etcdctl_ok(&self, args: &[&str]) -> String {
        let output = self.etcdctl(args);
        assert!(
            output.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }
}

/// One `etcd` node owned by one test; killed when dropped.
#[derive(Debug)]
pub struct EtcdServer {
    cluster: EtcdCluster,
}

impl EtcdServer {
    /// Starts a single-node cluster and waits until it serves.
    pub fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// A single-node cluster started with more `etcd` flags.
    pub fn start_with_args(extra_args: &[&str]) -> Self {
        EtcdServer {
            cluster: EtcdCluster::start_with_args(1, extra_args),
        }
    }

    /// `etcd://127.0.0.1:port`.
    pub fn url(&self) -> String {
        self.cluster.url()
    }

    /// See [`EtcdCluster::grpc_calls`].
    pub fn grpc_calls(&self, method: &str) -> u64 {
        self.cluster.grpc_calls(0, method)
    }

    /// `127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        self.cluster.endpoints()
    }

    /// The port it serves clients on.
    pub fn port(&self) -> u16 {
        self.cluster.client_port(0)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.cluster.pid(0)
    }

    /// Kills the server (SIGKILL).
    pub fn kill(&mut self) {
        self.cluster.kill(0);
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.cluster.pause(0);
    }

    /// Thaws the server (SIGCONT).
    pub fn resume(&self) {
        self.cluster.resume(0);
    }

    /// Starts it again on the same port and data (locks and leases kept, as
    /// etcd persists them), and waits until it serves.
    pub fn restart(&mut self) {
        self.cluster.restart(0);
        self.cluster.wait_healthy(0, Duration::from_secs(20));
    }

    /// See [`EtcdCluster::etcdctl`].
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        self.cluster.etcdctl(args)
    }

    /// See [`EtcdCluster::etcdctl_ok`].
    pub fn etcdctl_ok(&self, args: &[&str]) -> String {
        self.cluster.etcdctl_ok(args)
    }

    /// See [`EtcdCluster::etcdctl_command`].
    pub fn etcdctl_command(&self, args: &[&str]) -> Command {
        self.cluster.etcdctl_command(args)
    }
}
