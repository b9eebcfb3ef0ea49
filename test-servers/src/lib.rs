//! Real servers for tests, spawned from the machine's binaries on free
//! loopback ports in temporary directories, so each test owns its server and
//! can kill, pause or restart it.
//!
//! A missing binary is a test failure whose message says how to install it,
//! never a skipped test.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

mod redis;

pub use redis::{RedisOptions, RedisServer};

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("cannot bind an ephemeral loopback port")
}

/// Finds `name` on `PATH` or in the usual Debian locations, or panics saying
/// which package to install.
pub fn find_binary(name: &str, debian_package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"];
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed; install it with `apt-get install -y {debian_package}` \
                 (scripts/test.sh does this for you)"
            )
        })
}

/// Waits until something accepts TCP connections on `port`, or panics.
pub fn wait_for_port(port: u16, child: &mut Child, what: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited with {status} before accepting connections on port {port}");
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not accept connections on port {port} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` to process `pid`.
pub fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {signal}) failed: {}",
        std::io::Error::last_os_error()
    );
}
