//! Real network partitions for tests: one test re-run inside a private
//! network namespace (`unshare -n`), where it may drop packets with nftables
//! without touching the machine's own network.
//!
//! A user-space proxy cannot stand in for this: its kernel still ACKs data
//! and keepalive probes, so neither end ever detects the cut. Dropping the
//! segments of one TCP connection in the kernel is what a partition looks
//! like to both ends.
//!
//! ```no_run
//! #[test]
//! fn partitioned() {
//!     const NAME: &str = "partitioned";
//!     if !test_servers::netns::inside(NAME) {
//!         // Runs this test binary again, `--exact partitioned`, in a new
//!         // network namespace, and checks that it passed there.
//!         return test_servers::netns::rerun_inside(NAME);
//!     }
//!     // Here: loopback is up, nothing else exists; start servers on
//!     // 127.0.0.1, then `test_servers::netns::cut_port(port)`.
//! }
//! ```
//!
//! Needs root (creating a network namespace and loading nftables rules do),
//! `unshare` (util-linux), `ip` (iproute2) and `nft` (nftables); a missing
//! one is a failure that says what to install.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::find_binary;

/// Set, to the test's name, in the re-run inside the namespace.
const SCENARIO_VAR: &str = "TEST_SERVERS_NETNS_SCENARIO";

/// True when this process is the re-run of `test` inside its private network
/// namespace; brings loopback up first. False in the outer run, which should
/// call [`rerun_inside`].
pub fn inside(test: &str) -> bool {
    if std::env::var(SCENARIO_VAR).as_deref() != Ok(test) {
        return false;
    }
    run(
        Command::new(find_binary("ip", "iproute2")).args(["link", "set", "lo", "up"]),
        "ip link set lo up",
    );
    true
}

/// Runs this program again (its own executable with `args`) in a new network
/// namespace, with this process's stdin, stdout and stderr, and returns its
/// exit status; in the re-run, [`inside`]`(name)` is true. For a binary that
/// partitions its own servers and clients (the fault suite), where
/// [`rerun_inside`] serves a test binary.
pub fn reexec_inside(name: &str, args: &[std::ffi::OsString]) -> std::process::ExitStatus {
    require_root(name);
    Command::new(find_binary("unshare", "util-linux"))
        .args(["--net", "--"])
        .arg(std::env::current_exe().expect("the path of this program"))
        .args(args)
        .env(SCENARIO_VAR, name)
        .status()
        .expect("run unshare")
}

fn require_root(what: &str) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "{what} partitions real TCP connections with nftables inside a private network \
         namespace, which needs root: run it as root (CI does)"
    );
    // Checked here, so a missing tool fails before any server starts.
    find_binary("nft", "nftables");
    find_binary("ip", "iproute2");
}

/// Runs test `test` (the name `--exact` matches) of the current test binary
/// again in a new network namespace, relays its output, and panics unless it
/// ran there and passed.
pub fn rerun_inside(test: &str) {
    require_root(test);
    let unshare = find_binary("unshare", "util-linux");
    let exe = std::env::current_exe().expect("the path of this test binary");
    let output = Command::new(unshare)
        .args(["--net", "--"])
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(SCENARIO_VAR, test)
        .output()
        .expect("run unshare");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    eprintln!("--- {test} in a private network namespace ---\n{stdout}{stderr}---");
    assert!(
        output.status.success(),
        "{test} failed in its network namespace ({})",
        output.status
    );
    assert!(
        stdout.contains("1 passed"),
        "{test} did not run in its network namespace (is the name exact?)"
    );
}

/// Drops every TCP segment from or to local port `port`, in both directions
/// (on loopback both ends' segments pass the input hook), from now on: the
/// one connection using that port goes silent, as in a partition. Only
/// inside a namespace made by [`rerun_inside`].
///
/// The port is also reserved (`ip_local_reserved_ports`, per network
/// namespace): once the cut connection's socket is gone, the kernel would
/// otherwise hand the same ephemeral port to a new connection (a test's
/// `psql`), which the rules would silently drop too.
pub fn cut_port(port: u16) {
    assert!(
        std::env::var_os(SCENARIO_VAR).is_some(),
        "cut_port outside a private network namespace would cut the machine's own traffic"
    );
    std::fs::write(
        "/proc/sys/net/ipv4/ip_local_reserved_ports",
        port.to_string(),
    )
    .expect("reserve the cut port in this network namespace");
    let rules = format!(
        "add table inet test_servers_cut\n\
         add chain inet test_servers_cut input {{ type filter hook input priority 0; }}\n\
         add rule inet test_servers_cut input tcp sport {port} drop\n\
         add rule inet test_servers_cut input tcp dport {port} drop\n"
    );
    let mut nft = Command::new(find_binary("nft", "nftables"))
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("run nft");
    nft.stdin
        .take()
        .expect("nft's stdin")
        .write_all(rules.as_bytes())
        .expect("write the nft rules");
    let status = nft.wait().expect("wait for nft");
    assert!(status.success(), "nft -f - failed ({status}):\n{rules}");
}

/// Which segments of the cut connections a [`Partition`] drops, seen from
/// the side that owns the ports (the client whose connections are cut).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Segments the owner sends (source port in the set): the server no
    /// longer hears it, it still hears the server.
    Outgoing,
    /// Segments sent to the owner (destination port in the set): it no
    /// longer hears the server, the server still hears it.
    Incoming,
    /// Both: the connections go silent.
    Both,
}

/// Drops the TCP segments of the connections using some local ports, in one
/// direction or both, until [`heal`](Partition::heal)ed or dropped. Each
/// partition is an nftables table of its own, so several can coexist and
/// heal independently. Only inside a namespace made by [`rerun_inside`] or
/// [`reexec_inside`].
#[derive(Debug)]
pub struct Partition {
    table: String,
}

impl Partition {
    /// Starts dropping, from now on, the segments `direction` names of every
    /// TCP connection whose local end is one of `ports` (on loopback both
    /// ends' segments pass the input hook, so this catches them all). The
    /// ports are reserved as in [`cut_port`], so no new connection inherits
    /// them.
    pub fn start(ports: &[u16], direction: Direction) -> Partition {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        assert!(
            std::env::var_os(SCENARIO_VAR).is_some(),
            "a Partition outside a private network namespace would cut the machine's own traffic"
        );
        reserve_ports(ports);
        let table = format!(
            "test_servers_partition_{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let set: Vec<String> = ports.iter().map(u16::to_string).collect();
        let set = format!("{{ {} }}", set.join(", "));
        let mut rules = format!(
            "add table inet {table}\n\
             add chain inet {table} input {{ type filter hook input priority 0; }}\n"
        );
        if matches!(direction, Direction::Outgoing | Direction::Both) {
            rules.push_str(&format!(
                "add rule inet {table} input tcp sport {set} drop\n"
            ));
        }
        if matches!(direction, Direction::Incoming | Direction::Both) {
            rules.push_str(&format!(
                "add rule inet {table} input tcp dport {set} drop\n"
            ));
        }
        nft(&rules);
        Partition { table }
    }

    /// Stops dropping: segments flow again (TCP retransmits what was lost, if
    /// neither end has given up on the connection yet).
    pub fn heal(self) {
        drop(self);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        nft(&format!("delete table inet {}\n", self.table));
    }
}

/// Adds `ports` to this namespace's `ip_local_reserved_ports`, keeping the
/// ports already reserved there.
fn reserve_ports(ports: &[u16]) {
    const PATH: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";
    let mut reserved: Vec<String> = std::fs::read_to_string(PATH)
        .unwrap_or_default()
        .trim()
        .split(',')
        .filter(|entry| !entry.is_empty())
        .map(str::to_owned)
        .collect();
    reserved.extend(ports.iter().map(u16::to_string));
    std::fs::write(PATH, reserved.join(","))
        .expect("reserve the cut ports in this network namespace");
}

fn nft(rules: &str) {
    let mut nft = Command::new(find_binary("nft", "nftables"))
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("run nft");
    nft.stdin
        .take()
        .expect("nft's stdin")
        .write_all(rules.as_bytes())
        .expect("write the nft rules");
    let status = nft.wait().expect("wait for nft");
    assert!(status.success(), "nft -f - failed ({status}):\n{rules}");
}

/// One TCP connection of a process: its local and remote port on loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConnection {
    /// The port of the process's own end.
    pub local_port: u16,
    /// The port of the peer (a server's listening port, for a client).
    pub remote_port: u16,
}

/// The TCP connections (IPv4 and IPv6, in any state but listening) that
/// process `pid` has open now, found by matching the socket inodes of its
/// file descriptors (`/proc/PID/fd`) against `/proc/PID/net/tcp{,6}`
/// (proc(5)). Empty if the process is gone.
pub fn tcp_connections_of(pid: u32) -> Vec<TcpConnection> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let mut connections = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(local), Some(remote), Some(state), Some(inode)) =
                (fields.get(1), fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            const LISTEN: &str = "0A";
            if *state == LISTEN || !inodes.contains(*inode) {
                continue;
            }
            if let (Some(local_port), Some(remote_port)) = (hex_port(local), hex_port(remote)) {
                connections.push(TcpConnection {
                    local_port,
                    remote_port,
                });
            }
        }
    }
    connections
}

/// The port of a `/proc/net/tcp` address (`0100007F:1F90`).
fn hex_port(address: &str) -> Option<u16> {
    u16::from_str_radix(address.rsplit_once(':')?.1, 16).ok()
}

fn run(command: &mut Command, what: &str) {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}
