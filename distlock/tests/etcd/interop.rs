//! Our locks and `etcdctl lock` (etcd's `concurrency.Mutex`) exclude each
//! other on the same name: the distlock key `K` is the etcd name `lock:K`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock::Locker;
use test_servers::EtcdServer;

const TTL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_etcdctl_holds_the_lock_try_lock_is_contention() {
    let server = EtcdServer::start();
    let locker = distlock::connect(&server.url()).await.unwrap();
    let mut etcdctl = server
        .etcdctl_command(&["lock", "lock:K", "--", "sleep", "3"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn etcdctl lock");
    // Wait until etcdctl's key is there.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server
        .etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:K/"])
        .is_empty()
    {
        assert!(Instant::now() < deadline, "etcdctl never took lock:K");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        locker.try_lock("K", TTL).await.unwrap().is_none(),
        "etcdctl holds lock:K"
    );
    // Our waiter queues behind etcdctl and gets it when `sleep 3` ends.
    let started = Instant::now();
    let lease = locker
        .lock("K", TTL, Duration::from_secs(10))
        .await
        .expect("granted once etcdctl released");
    eprintln!("granted {:?} after etcdctl's hold", started.elapsed());
    assert!(
        etcdctl.try_wait().unwrap().is_some() || {
            // etcdctl deletes its key before exiting.
            let _ = etcdctl.wait();
            true
        }
    );
    let keys = server.etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:K/"]);
    assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 1, "{keys}");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_we_hold_the_lock_etcdctl_waits_until_we_release() {
    let server = EtcdServer::start();
    let locker = distlock::connect(&server.url()).await.unwrap();
    let lease = locker.try_lock("K", TTL).await.unwrap().unwrap();
    let mut etcdctl = server
        .etcdctl_command(&["lock", "lock:K", "--", "echo", "got-it"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn etcdctl lock");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        etcdctl.try_wait().unwrap().is_none(),
        "etcdctl got lock:K while we held it"
    );
    let released_at = Instant::now();
    lease.release().await.unwrap();
    let output = tokio::task::spawn_blocking(move || etcdctl.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "etcdctl ran its command {:?} after our release",
        released_at.elapsed()
    );
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "got-it");
}
