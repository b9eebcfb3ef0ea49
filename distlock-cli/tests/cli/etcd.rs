//! `distlock run --url etcd://...` end to end against real etcd processes:
//! conflict (75), a lease revoked from outside (76), how long a SIGKILLed
//! holder keeps the lock (the orphan bound), on one node and across a
//! leader kill, `run --shared`, and an `elect` leader's proclaimed value
//! as its etcd key's value.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock::Locker;
use test_servers::{EtcdCluster, EtcdServer};

use crate::support::{code, stderr, wait_for_exit, BIN};

/// Waits until `etcdctl` shows a key under `name/`, or panics.
fn wait_for_holder(show: impl Fn() -> String, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let keys = show();
        if let Some(key) = keys
            .lines()
            .find(|line| line.starts_with(&format!("{name}/")))
        {
            return key.to_owned();
        }
        assert!(Instant::now() < deadline, "no holder of {name} appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_holder(url: &str, key: &str, ttl: &str) -> Child {
    Command::new(BIN)
        .args([
            "run", "--url", url, "--key", key, "--ttl", ttl, "--", "sleep", "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn distlock run")
}

#[tokio::test]
async fn run_exits_75_while_another_client_holds_the_etcd_lock() {
    let server = EtcdServer::start();
    let locker = distlock::connect(&server.url()).await.unwrap();
    let lease = locker
        .try_lock("busy", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let output = Command::new(BIN)
        .args(["run", "--url", &server.url(), "--key", "busy", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    // The token carries the lease and revision: release from another process.
    let output = Command::new(BIN)
        .args([
            "release",
            "--url",
            &server.url(),
            "--key",
            "busy",
            "--owner",
            lease.owner(),
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(matches!(
        lease.release().await,
        Err(distlock::Error::NotHeld { .. })
    ));
    let output = Command::new(BIN)
        .args(["run", "--url", &server.url(), "--key", "busy", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn run_exits_76_when_its_lease_is_revoked_from_outside() {
    let server = EtcdServer::start();
    let mut holder = spawn_holder(&server.url(), "revoked", "3s");
    let key = wait_for_holder(
        || server.etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:revoked/"]),
        "lock:revoked",
    );
    let lease = key.rsplit('/').next().unwrap().to_owned();
    let revoked_at = Instant::now();
    server.etcdctl_ok(&["lease", "revoke", &lease]);
    let code = wait_for_exit(&mut holder, Duration::from_secs(10));
    eprintln!(
        "distlock run exited {code} {:?} after `etcdctl lease revoke`",
        revoked_at.elapsed()
    );
    assert_eq!(code, 76);
}

/// SIGKILLs a `distlock run` holder of `key` and measures how long until
/// another client gets the lock; `between` runs right after the kill.
async fn orphan_bound(
    url: &str,
    key: &str,
    ttl_secs: u64,
    keys: impl Fn() -> String,
    between: impl FnOnce(),
) -> Duration {
    let ttl = format!("{ttl_secs}s");
    let mut holder = spawn_holder(url, key, &ttl);
    let locker = distlock::connect(url).await.unwrap();
    // Held once its key is in etcd (probing with try_lock could take the
    // lock first and make `distlock run` exit 75).
    wait_for_holder(keys, &format!("lock:{key}"));
    holder.kill().expect("SIGKILL the holder");
    let killed_at = Instant::now();
    let _ = holder.wait();
    between();
    let lease = loop {
        match locker
            .lock(key, Duration::from_secs(5), Duration::from_secs(30))
            .await
        {
            Ok(lease) => break lease,
            // Errors while a leader is elected: try again.
            Err(error) if error.is_outage() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("{error}"),
        }
    };
    let freed_after = killed_at.elapsed();
    lease.release().await.unwrap();
    freed_after
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_holder_frees_the_lock_within_one_lease_ttl() {
    let server = EtcdServer::start();
    let ttl = 2;
    let freed = orphan_bound(
        &server.url(),
        "orphan",
        ttl,
        || server.etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:orphan/"]),
        || {},
    )
    .await;
    eprintln!("orphan bound, one node, ttl {ttl}s: lock free {freed:?} after SIGKILL");
    // etcd checks for expired leases every 500 ms: one ttl plus that, and
    // slack for a loaded machine.
    assert!(
        freed >= Duration::from_millis(ttl * 1000 - 700),
        "{freed:?}"
    );
    assert!(freed < Duration::from_secs(ttl + 3), "{freed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_holder_across_a_leader_kill_frees_the_lock_within_two_ttls() {
    let mut cluster = EtcdCluster::start(3);
    let url = cluster.url();
    let leader = cluster.wait_for_leader(Duration::from_secs(10));
    let ttl = 2;
    let keys_of = |cluster: &EtcdCluster| {
        let output = cluster.etcdctl(&["get", "--prefix", "--keys-only", "lock:orphan-failover/"]);
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let snapshot = std::sync::Mutex::new(&mut cluster);
    let freed = orphan_bound(
        &url,
        "orphan-failover",
        ttl,
        || keys_of(&snapshot.lock().unwrap()),
        || {
            // A leader change resets the remaining ttl of every lease.
            std::thread::sleep(Duration::from_millis(1200));
            snapshot.lock().unwrap().kill(leader);
        },
    )
    .await;
    eprintln!(
        "orphan bound, three nodes, ttl {ttl}s, leader killed 1.2s after the holder: \
         lock free {freed:?} after SIGKILL"
    );
    assert!(
        freed >= Duration::from_millis(ttl * 1000 - 700),
        "{freed:?}"
    );
    assert!(freed < Duration::from_secs(2 * ttl + 5), "{freed:?}");
    cluster.restart(leader);
}

/// The scenario with real processes: while `distlock run` holds
/// `jobs/nightly`, the name `jobs` is free for `status`, `run` and
/// `release --force`, and `release --force --key jobs` leaves the
/// `jobs/nightly` holder's key (and its command) alone.
#[test]
fn a_nested_name_held_by_distlock_run_leaves_its_parent_name_free() {
    let server = EtcdServer::start();
    let url = server.url();
    let mut holder = spawn_holder(&url, "jobs/nightly", "3s");
    let show = || server.etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:jobs/"]);
    let nightly_key = wait_for_holder(show, "lock:jobs/nightly");
    let distlock = |args: &[&str]| Command::new(BIN).args(args).output().unwrap();

    let output = distlock(&["status", "--url", &url, "--key", "jobs"]);
    assert_eq!(code(&output), 1, "jobs is free: {}", stderr(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "\"jobs\" is free\n"
    );
    let output = distlock(&["status", "--url", &url, "--key", "jobs/nightly"]);
    assert_eq!(
        code(&output),
        0,
        "jobs/nightly is held: {}",
        stderr(&output)
    );

    let output = distlock(&["run", "--url", &url, "--key", "jobs", "--", "true"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));

    let output = distlock(&["release", "--url", &url, "--key", "jobs", "--force"]);
    assert_eq!(code(&output), 1, "nothing held: {}", stderr(&output));
    assert_eq!(
        show().lines().filter(|l| !l.is_empty()).collect::<Vec<_>>(),
        [nightly_key.as_str()],
        "jobs/nightly's key is untouched"
    );
    // Two refreshes later (every ttl/3) the holder still runs its command.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        holder.try_wait().unwrap().is_none(),
        "the jobs/nightly holder lost its lock: {}",
        holder
            .try_wait()
            .map(|s| format!("{s:?}"))
            .unwrap_or_default()
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn three_etcd_cron_replicas_run_every_second_exactly_once_through_a_kill_9() {
    let server = EtcdServer::start();
    let tally = crate::cron::three_replicas(&server.url(), "etcd");
    crate::cron::assert_exactly_once(&tally);
}

/// Three `distlock elect` replicas on etcd: the SIGKILLed leader's lease
/// (2 s, whole seconds on etcd) lapses and another replica leads.
/// `distlock elect --proclaim node-a` on etcd: the leader's key holds
/// exactly `node-a`, the value `etcdctl elect -l lock:E` prints (Go's
/// `Election.Observe` reads the lowest-create-revision key's value), and
/// `distlock status` still shows the leader, its record read from the
/// owner key beside it.
#[test]
fn an_elect_leaders_key_holds_its_proclaimed_value_and_status_shows_it() {
    let server = EtcdServer::start();
    let url = server.url();
    let mut leader = Command::new(BIN)
        .args([
            "elect",
            "--url",
            &url,
            "--key",
            "E",
            "--ttl",
            "5s",
            "--proclaim",
            "node-a",
            "--",
            "sleep",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn distlock elect");
    let key = wait_for_holder(
        || server.etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:E/"]),
        "lock:E",
    );
    assert_eq!(
        server.etcdctl_ok(&["get", "--print-value-only", &key]),
        "node-a"
    );
    let status = Command::new(BIN)
        .args(["status", "--url", &url, "--key", "E"])
        .output()
        .expect("run distlock status");
    let shown = String::from_utf8_lossy(&status.stdout);
    assert_eq!(code(&status), 0, "{shown}{}", stderr(&status));
    for row in ["label     node-a", "value     node-a", "token     "] {
        assert!(shown.contains(row), "{row:?} in {shown}");
    }
    let pid = i32::try_from(leader.id()).expect("pid");
    crate::elect::signal(pid, libc::SIGTERM);
    // CMD's status: `sleep` ended by the forwarded SIGTERM.
    assert_eq!(wait_for_exit(&mut leader, Duration::from_secs(10)), 143);
    assert_eq!(
        server.etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:E"]),
        "",
        "the key and its owner key are gone"
    );
}

#[test]
fn elect_fails_over_after_kill_9_within_the_lease_without_overlap() {
    let server = EtcdServer::start();
    let why = "past the 2 s lease and a leader change's second";
    crate::elect::failover_after_kill_9(&server.url(), "leader", "2s", Duration::from_secs(5), why);
}

/// `distlock run --limit 3` on etcd: eight contending loops, never more than
/// three commands at once; a SIGKILLed holder's permit returns when its
/// lease (2 s) lapses.
#[test]
fn limit_never_runs_more_than_three_and_a_killed_permit_returns_at_its_lease() {
    let server = EtcdServer::start();
    crate::limit::eight_loops_and_a_killed_holder(&server.url(), "2s", Duration::from_secs(5));
}

/// `distlock run --shared` on etcd: readers overlap, an exclusive run never
/// overlaps them, and a writer waiting for them holds a new reader back
/// (etcd queues readers and writers in revision order).
#[test]
fn shared_runs_overlap_and_exclude_an_exclusive_run() {
    let server = EtcdServer::start();
    crate::shared::shared_runs_overlap_and_exclude_an_exclusive_run(&server.url(), true);
}
