//! Real servers for tests, spawned from the machine's binaries on free
//! loopback ports in temporary directories, so each test owns its server and
//! can kill, pause or restart it.
//!
//! A missing binary is a test failure whose message says how to install it,
//! never a skipped test.
//!
//! Tests that only need *a* server (they never kill, pause or restart it)
//! share one per test binary through `shared()` (e.g.
//! [`PostgresServer::shared`]); keys unique to each test keep them apart.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{mpsc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

mod etcd;
mod mariadb;
pub mod netns;
mod pgbouncer;
mod postgres;
mod proxy;
mod redis;
mod redis_cluster;
mod redis_sentinel;
mod tls;
mod zookeeper;

pub use etcd::{EtcdCluster, EtcdServer};
pub use mariadb::{MariaDbOptions, MariaDbServer};
pub use pgbouncer::PgBouncer;
pub use postgres::{PostgresOptions, PostgresServer};
pub use proxy::FaultProxy;
pub use redis::{RedisOptions, RedisServer, RedisTls};
pub use redis_cluster::RedisCluster;
pub use redis_sentinel::{RedisSentinelSet, SENTINEL_MASTER_NAME};
pub use tls::TestCertificates;
pub use zookeeper::{
    four_letter_word, ZooKeeperEnsemble, ZooKeeperServer, TICK_MS as ZOOKEEPER_TICK_MS,
};

/// Gives each listed server type a `shared()` accessor: one server of its
/// kind per test binary, started on first use.
macro_rules! shared_servers {
    ($($server:ident),* $(,)?) => {$(
        impl $server {
            #[doc = concat!(
                "The one [`", stringify!($server), "`] of this test binary, started ",
                "(with [`", stringify!($server), "::start`]) by the first caller; ",
                "for tests that never kill, pause or restart it.\n\n",
                "It lives in a `static`, so it is never dropped: ",
                "[`spawn_tied_to_this_process`] makes it die with the test binary, ",
                "under `cargo test` (one process) and `cargo nextest` (one per test).\n\n",
                "# Panics\n\n",
                "As [`", stringify!($server), "::start`] does, saying how to install a missing ",
                "binary. A failed start is not remembered: the next caller tries again ",
                "(and fails the same way)."
            )]
            pub fn shared() -> &'static $server {
                static SHARED: OnceLock<$server> = OnceLock::new();
                SHARED.get_or_init($server::start)
            }
        }
    )*};
}

shared_servers!(
    EtcdServer,
    MariaDbServer,
    PostgresServer,
    RedisCluster,
    RedisSentinelSet,
    RedisServer,
    ZooKeeperServer,
);

/// A TCP port on 127.0.0.1 that was free a moment ago, for a server to
/// listen on.
///
/// Chosen at random below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`, 32768–60999 by default; ip(7)),
/// not by binding port 0: a port from that range can be taken, between this
/// check and the server's own bind, as the local port of any outgoing
/// connection on the machine (the fault suite opens hundreds), and the
/// server then fails to start. Falls back to an ephemeral port if no port
/// below the range is free.
pub fn free_port() -> u16 {
    const LOWEST: u16 = 10_000;
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_start > LOWEST {
        let span = u64::from(ephemeral_start - LOWEST);
        for _ in 0..256 {
            let port = LOWEST + u16::try_from(random_u64() % span).unwrap_or(0);
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("cannot bind an ephemeral loopback port")
}

/// `name` followed by 16 random hex digits: a key no other test uses, so
/// tests may share a server (see `shared()`, e.g. [`PostgresServer::shared`]).
pub fn unique_key(name: &str) -> String {
    format!("{name}-{:016x}", random_u64())
}

/// A random number from the standard library's per-process hash seeds (a
/// fresh `RandomState` each call), so this crate needs no `rand`.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
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

/// Asks `ready` every `interval` until it answers `Some`, for at most
/// `timeout`: that answer, or `None` once the time is up (the caller
/// panics with what it was waiting for).
pub fn poll_until<T>(
    timeout: Duration,
    interval: Duration,
    mut ready: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(answer) = ready() {
            return Some(answer);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(interval);
    }
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

/// Spawns `command` so that the kernel SIGKILLs it when this process exits,
/// however it exits, so no server outlives its tests.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not
/// the whole process (prctl(2)). Each test runs on a thread of its own under
/// `cargo test`, yet a server shared through a `static` must outlive the test
/// that happened to start it; so every spawn is done by one thread that lives
/// as long as the process.
pub fn spawn_tied_to_this_process(mut command: Command) -> std::io::Result<Child> {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("test-servers-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("start the spawner thread");
        Mutex::new(requests)
    });
    let test_process = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only prctl and getppid, which are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The test process may have died before prctl took effect.
            if libc::getppid() as u32 != test_process {
                return Err(std::io::Error::other("the test process is gone"));
            }
            Ok(())
        });
    }
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((command, reply))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread did not answer"))?
}
