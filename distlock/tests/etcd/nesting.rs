//! Names that nest: `K` and `K/x` are two locks. Their etcd queues are
//! the prefixes `lock:K/` and `lock:K/x/`, and the first contains the
//! second, so every read of `K`'s queue keeps only its direct members
//! (`lock:K/<lease hex>`): acquiring, waiting for the key ahead, inspecting,
//! listing, forgetting and force-releasing `K` never see `K/x`'s holder.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use distlock::etcd::EtcdLocker;
use distlock::inspect::ForceRelease;
use distlock::Locker;
use test_servers::EtcdServer;

const TTL: Duration = Duration::from_secs(10);

/// A child process killed and reaped if the test ends (or fails) before
/// it was taken back: a waiting `etcdctl lock` outlives its server.
struct Reaped(Option<Child>);

impl Reaped {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("the child was taken")
    }

    fn take(mut self) -> Child {
        self.0.take().expect("the child was taken")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn connect(server: &EtcdServer) -> EtcdLocker {
    EtcdLocker::from_url(&server.url())
        .await
        .expect("connect to the test etcd")
}

/// The keys etcd has under `prefix`, as `etcdctl get --prefix --keys-only`
/// lists them.
fn keys_under(server: &EtcdServer, prefix: &str) -> Vec<String> {
    server
        .etcdctl_ok(&["get", "--prefix", "--keys-only", prefix])
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_and_the_names_under_it_are_distinct_locks() {
    let server = EtcdServer::start();
    let (a, b) = (connect(&server).await, connect(&server).await);

    // jobs/nightly first: its key is the oldest under `lock:jobs/`.
    let nightly = a
        .try_lock("jobs/nightly", TTL)
        .await
        .expect("try")
        .expect("free");
    assert_eq!(b.inspect("jobs").await.expect("inspect"), None);
    b.forget("jobs")
        .await
        .expect("nobody holds or waits for jobs");
    let jobs = b
        .try_lock("jobs", TTL)
        .await
        .expect("try")
        .expect("jobs is free while jobs/nightly is held");
    assert!(jobs.fencing_token() > nightly.fencing_token());
    // And the other way round: jobs/daily is free while jobs is held.
    let daily = a
        .try_lock("jobs/daily", TTL)
        .await
        .expect("try")
        .expect("jobs/daily is free while jobs is held");
    // jobs itself is held by b, for everyone.
    assert!(a.try_lock("jobs", TTL).await.expect("try").is_none());
    assert_eq!(
        a.inspect("jobs")
            .await
            .expect("inspect")
            .and_then(|held| held.fencing_token),
        jobs.fencing_token()
    );
    assert_eq!(
        b.inspect("jobs/nightly")
            .await
            .expect("inspect")
            .and_then(|held| held.fencing_token),
        nightly.fencing_token()
    );

    let listed = b.list("").await.expect("list");
    let listed: Vec<(&str, Option<u64>)> = listed
        .iter()
        .map(|held| (held.key.as_str(), held.fencing_token))
        .collect();
    assert_eq!(
        listed,
        [
            ("jobs", jobs.fencing_token()),
            ("jobs/daily", daily.fencing_token()),
            ("jobs/nightly", nightly.fencing_token()),
        ]
    );

    // Forcing jobs out deletes jobs's key only.
    let evicted = a
        .force_release("jobs", ForceRelease::Lock)
        .await
        .expect("force release")
        .expect("jobs was held");
    assert_eq!(evicted.fencing_token, jobs.fencing_token());
    assert_eq!(a.inspect("jobs").await.expect("inspect"), None);
    for (key, lease) in [("jobs/nightly", &nightly), ("jobs/daily", &daily)] {
        a.refresh(key, lease.owner(), TTL)
            .await
            .unwrap_or_else(|e| panic!("{key} is still held: {e}"));
    }
    // With jobs free, forcing it again frees nothing, and the nested keys
    // stay.
    assert_eq!(
        a.force_release("jobs", ForceRelease::Lock)
            .await
            .expect("force release"),
        None
    );
    assert_eq!(keys_under(&server, "lock:jobs/").len(), 2);
    nightly.release().await.expect("release");
    daily.release().await.expect("release");
}

/// `lock` waits for the direct member just ahead of it, skipping the keys of
/// nested names created in between (each older than the waiter's key), and
/// is granted the lock when that holder releases, while they stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_waits_for_its_own_names_holder_not_for_nested_ones() {
    let server = EtcdServer::start();
    let (a, b, c) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let x = a.try_lock("k/x", TTL).await.expect("try").expect("free");
    let holder = b.try_lock("k", TTL).await.expect("try").expect("free");
    let y = a.try_lock("k/y", TTL).await.expect("try").expect("free");
    let waiting = tokio::spawn({
        let c = c.clone();
        async move { c.lock("k", TTL, Duration::from_secs(20)).await }
    });
    // The waiter's key is in the queue: 3 nested keys and 2 of k's.
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys_under(&server, "lock:k/").len() < 4 {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "granted while k was held");
    let released = Instant::now();
    holder.release().await.expect("release");
    let granted = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter is woken by k's release, not by k/x or k/y")
        .expect("join")
        .expect("granted");
    eprintln!("granted {:?} after k's release", released.elapsed());
    assert!(granted.fencing_token() > y.fencing_token());
    for (key, lease) in [("k/x", &x), ("k/y", &y)] {
        a.refresh(key, lease.owner(), TTL)
            .await
            .unwrap_or_else(|e| panic!("{key} still held: {e}"));
    }
    // And a lock of k with k's holder gone but nested keys older than the
    // waiter's: no wait at all.
    granted.release().await.expect("release");
    let again = c
        .lock("k", TTL, Duration::from_secs(5))
        .await
        .expect("free: only nested names are held");
    again.release().await.expect("release");
    x.release().await.expect("release");
    y.release().await.expect("release");
}

/// `etcdctl lock` shares a nested name with us (its keys are the direct
/// members of `lock:a/b/`), and its hold of `a/b` does not block our `a`.
/// The other way round, Go's recipe ranges over the whole prefix: `etcdctl
/// lock lock:a` waits while anyone holds `lock:a/b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_interoperates_on_nested_names() {
    let server = EtcdServer::start();
    let locker = connect(&server).await;

    // We hold a/b: `etcdctl lock lock:a/b` waits until we release.
    let ab = locker
        .try_lock("a/b", TTL)
        .await
        .expect("try")
        .expect("free");
    let mut etcdctl = Reaped(Some(
        server
            .etcdctl_command(&["lock", "lock:a/b", "--", "echo", "got-it"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn etcdctl lock"),
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        etcdctl.child().try_wait().expect("try_wait").is_none(),
        "etcdctl got lock:a/b while we held a/b"
    );
    ab.release().await.expect("release");
    let etcdctl = etcdctl.take();
    let output = tokio::task::spawn_blocking(move || etcdctl.wait_with_output())
        .await
        .expect("join")
        .expect("etcdctl");
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "got-it");

    // etcdctl holds a/b: our a is free, our a/b is not.
    let etcdctl = Reaped(Some(
        server
            .etcdctl_command(&["lock", "lock:a/b", "--", "sleep", "30"])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn etcdctl lock"),
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys_under(&server, "lock:a/b/").is_empty() {
        assert!(Instant::now() < deadline, "etcdctl never took lock:a/b");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(locker.try_lock("a/b", TTL).await.expect("try").is_none());
    let a = locker
        .try_lock("a", TTL)
        .await
        .expect("try")
        .expect("a is free while etcdctl holds lock:a/b");
    let held = locker.inspect("a").await.expect("inspect").expect("held");
    assert_eq!(held.fencing_token, a.fencing_token());
    a.release().await.expect("release");

    // Go's recipe: `etcdctl lock lock:a` waits behind the holder of
    // lock:a/b, though nobody holds a.
    let mut behind = Reaped(Some(
        server
            .etcdctl_command(&["lock", "lock:a", "--", "echo", "got-a"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn etcdctl lock"),
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        behind.child().try_wait().expect("try_wait").is_none(),
        "etcdctl lock lock:a no longer waits behind lock:a/b: update the module docs"
    );
    drop(etcdctl); // killed and reaped
                   // Its key lives on a 60 s lease: delete it; the waiter then runs.
    for key in keys_under(&server, "lock:a/b/") {
        server.etcdctl_ok(&["del", &key]);
    }
    let behind = behind.take();
    let output = tokio::task::spawn_blocking(move || behind.wait_with_output())
        .await
        .expect("join")
        .expect("etcdctl");
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "got-a");
}

/// More nested keys, all older than ours, than one page of a queue scan
/// (512): the scan goes past each nested name's subtree and still finds
/// the direct members, which sort after them (lease ids in hex never
/// start with `0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_behind_more_nested_keys_than_one_page_is_still_found() {
    let server = EtcdServer::start();
    let (a, b) = (connect(&server).await, connect(&server).await);
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("connect etcd-client");
    for i in 0..300 {
        // Two keys per nested name, so a page ends inside a subtree.
        for lease in ["1", "2"] {
            raw.put(format!("lock:k/0n{i:03}/{lease}"), "", None)
                .await
                .expect("put a nested key");
        }
    }
    let held = a
        .try_lock("k", TTL)
        .await
        .expect("try")
        .expect("k is free: only nested names are held");
    assert!(b.try_lock("k", TTL).await.expect("try").is_none());
    assert_eq!(
        b.inspect("k")
            .await
            .expect("inspect")
            .and_then(|h| h.fencing_token),
        held.fencing_token()
    );
    assert!(matches!(
        b.forget("k").await,
        Err(distlock::Error::NotAcquired { .. })
    ));
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock("k", TTL, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.expect("release");
    let next = waiting.await.expect("join").expect("granted after release");
    next.release().await.expect("release");
    assert_eq!(b.inspect("k").await.expect("inspect"), None);
    b.forget("k").await.expect("nobody holds or waits for k");
}
