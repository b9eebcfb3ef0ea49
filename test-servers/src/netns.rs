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

/// Runs test `test` (the name `--exact` matches) of the current test binary
/// again in a new network namespace, relays its output, and panics unless it
/// ran there and passed.
pub fn rerun_inside(test: &str) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "{test} partitions a real TCP connection with nftables inside a private network \
         namespace, which needs root: run it as root (CI does)"
    );
    let unshare = find_binary("unshare", "util-linux");
    // Checked here, so a missing tool fails before any server starts.
    find_binary("nft", "nftables");
    find_binary("ip", "iproute2");
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

fn run(command: &mut Command, what: &str) {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}
