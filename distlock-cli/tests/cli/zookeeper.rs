//! `distlock run --url zookeeper://...` end to end against a real
//! ZooKeeper: the command runs under the lock (0), conflict (75), release
//! by owner token from another process, and a holder whose node is
//! force-released from outside stops its command (76).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use distlock::inspect::ForceRelease;
use distlock::Locker;
use test_servers::{unique_key, ZooKeeperServer};

use crate::support::{stderr, wait_for_exit, BIN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_takes_the_zookeeper_lock_and_exits_75_while_another_client_holds_it() {
    let server = ZooKeeperServer::shared();
    let key = unique_key("busy");
    let output = Command::new(BIN)
        .args(["run", "--url", &server.url(), "--key", &key, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let locker = distlock::connect(&server.url()).await.unwrap();
    let lease = locker
        .try_lock(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let output = Command::new(BIN)
        .args(["run", "--url", &server.url(), "--key", &key, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    // The token names the node and its czxid: release from another process.
    let output = Command::new(BIN)
        .args([
            "release",
            "--url",
            &server.url(),
            "--key",
            &key,
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
        .args(["run", "--url", &server.url(), "--key", &key, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_76_when_its_node_is_force_released() {
    let server = ZooKeeperServer::shared();
    let key = unique_key("evicted");
    let mut holder = Command::new(BIN)
        .args([
            "run",
            "--url",
            &server.url(),
            "--key",
            &key,
            "--ttl",
            "3s",
            "--",
            "sleep",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn distlock run");
    let locker = distlock::connect(&server.url()).await.unwrap();
    // Held once its node is there (probing with try_lock could take the
    // lock first and make `distlock run` exit 75).
    let deadline = Instant::now() + Duration::from_secs(20);
    while locker.inspect(&key).await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "distlock run never took {key}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let evicted = locker
        .force_release(&key, ForceRelease::Lock)
        .await
        .unwrap()
        .expect("the holder's node");
    assert!(evicted.holder.is_some(), "distlock run records its holder");
    let forced_at = Instant::now();
    let code = tokio::task::block_in_place(|| wait_for_exit(&mut holder, Duration::from_secs(10)));
    eprintln!(
        "distlock run exited {code} {:?} after its node was force-released",
        forced_at.elapsed()
    );
    assert_eq!(code, 76);
}

/// `distlock run --shared` on ZooKeeper: readers overlap, an exclusive run
/// never overlaps them, and a writer waiting for them holds a new reader
/// back (readers and writers queue in sequence order). Under a key prefix
/// of its own, since the helper's key is fixed and the server is shared.
#[test]
fn shared_runs_overlap_and_exclude_an_exclusive_run() {
    let server = ZooKeeperServer::shared();
    let url = format!("{}?key_prefix=/{}/", server.url(), unique_key("cli-shared"));
    crate::shared::shared_runs_overlap_and_exclude_an_exclusive_run(&url, true);
}
