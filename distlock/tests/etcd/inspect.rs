//! Inspection and operator release on etcd beyond the conformance checks:
//! a lock `etcdctl lock` holds (an unknown holder, never free), the record
//! in the key's value, listing beside marks and nested names, a forced
//! delete handing the lock to the next waiter, and a revoked lease freeing
//! every lock under it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock::etcd::EtcdLocker;
use distlock::inspect::{with_label, Clock, ForceRelease, HeldLock};
use distlock::{Locker, LostReason};
use test_servers::EtcdServer;

const TTL: Duration = Duration::from_secs(5);

/// Equal but for `ttl_left`, which ticks between two reads.
fn same(a: &HeldLock, b: &HeldLock) -> bool {
    (
        &a.key,
        &a.holder,
        a.granted,
        a.ttl,
        a.fencing_token,
        &a.session,
    ) == (
        &b.key,
        &b.holder,
        b.granted,
        b.ttl,
        b.fencing_token,
        &b.session,
    )
}

async fn connect(server: &EtcdServer, params: &str) -> EtcdLocker {
    EtcdLocker::from_url(&format!("{}{params}", server.url()))
        .await
        .expect("connect to the test etcd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_etcdctl_holds_is_held_by_an_unknown_holder() {
    let server = EtcdServer::start();
    let locker = connect(&server, "").await;
    let mut etcdctl = server
        .etcdctl_command(&["lock", "lock:K", "--", "sleep", "30"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn etcdctl lock");
    let deadline = Instant::now() + Duration::from_secs(10);
    let etcdctl_key = loop {
        let keys = server.etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:K/"]);
        if let Some(key) = keys.lines().find(|l| !l.is_empty()) {
            break key.to_owned();
        }
        assert!(Instant::now() < deadline, "etcdctl never took lock:K");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let held = locker.inspect("K").await.expect("inspect").expect("held");
    assert_eq!(held.key, "K");
    assert_eq!(held.holder, None, "etcdctl writes no record: {held:?}");
    let lease_hex = etcdctl_key.trim_start_matches("lock:K/");
    assert_eq!(held.session, Some(format!("lease {lease_hex}")));
    assert!(held.fencing_token.is_some_and(|t| t > 0));
    // etcdctl's lease has etcd's default ttl of 60 s.
    assert!(
        held.ttl_left
            .is_some_and(|left| left <= Duration::from_secs(60)),
        "{held:?}"
    );
    let listed = locker.list("").await.expect("list");
    assert!(
        listed.len() == 1 && same(&listed[0], &held),
        "listed like inspected: {listed:?}"
    );

    // A forced delete frees it under etcdctl (which never notices).
    let evicted = locker
        .force_release("K", ForceRelease::Lock)
        .await
        .expect("force release")
        .expect("held");
    assert!(same(&evicted, &held), "{evicted:?}");
    assert_eq!(locker.inspect("K").await.expect("inspect"), None);
    let lease = locker
        .try_lock("K", TTL)
        .await
        .expect("try")
        .expect("free now");
    lease.release().await.expect("release");
    etcdctl.kill().expect("kill etcdctl");
    let _ = etcdctl.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_is_the_keys_value_and_list_groups_by_name() {
    let server = EtcdServer::start();
    let (a, b) = (connect(&server, "").await, connect(&server, "").await);
    let label = "job\nwith = signs \\ and ünïcødé";
    let before = std::time::SystemTime::now();
    let mut outer = with_label(label, a.try_lock("jobs/report", TTL))
        .await
        .expect("try")
        .expect("free");
    // A name with a slash of its own, and a mark (whose key has none).
    let nested = a
        .try_lock("jobs/x/daily", TTL)
        .await
        .expect("try")
        .expect("free");
    a.advance_mark("jobs/report", 7).await.expect("mark");
    // A waiter queues behind the holder of jobs/report.
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock("jobs/report", TTL, Duration::from_secs(20)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let held = b
        .inspect("jobs/report")
        .await
        .expect("inspect")
        .expect("held");
    let holder = held
        .holder
        .clone()
        .expect("a distlock grant records its holder");
    assert_eq!(
        (holder.label.as_str(), holder.pid),
        (label, std::process::id())
    );
    let granted = held.granted.expect("granted");
    assert_eq!(granted.clock, Clock::Holder);
    assert!(granted.at >= before - Duration::from_millis(5));
    assert_eq!(held.ttl, Some(TTL));
    assert_eq!(held.fencing_token, outer.fencing_token());
    let raw = server.etcdctl_ok(&["get", "--prefix", "--print-value-only", "lock:jobs/report/"]);
    assert!(
        raw.contains("distlock-holder 1"),
        "the record is in the value: {raw}"
    );

    for prefix in ["jobs/", ""] {
        let listed = b.list(prefix).await.expect("list");
        let keys: Vec<&str> = listed.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(
            keys,
            ["jobs/report", "jobs/x/daily"],
            "one entry per name, its holder (not the waiter), no mark: {listed:?}"
        );
        assert!(same(&listed[0], &held), "{listed:?}");
    }
    assert!(b.list("jobs/report/").await.expect("list").is_empty());

    // A forced delete hands the lock to the waiter, and the evicted lease's
    // refresh says so.
    let mut lost = outer.lost_signal();
    let evicted = b
        .force_release("jobs/report", ForceRelease::Lock)
        .await
        .expect("force release")
        .expect("held");
    assert_eq!(evicted.fencing_token, outer.fencing_token());
    let next = waiting.await.expect("join").expect("the waiter gets it");
    assert!(next.fencing_token() > outer.fencing_token());
    assert!(matches!(
        outer.refresh(TTL).await,
        Err(distlock::Error::NotHeld { .. })
    ));
    let reason = tokio::time::timeout(Duration::from_secs(5), lost.wait())
        .await
        .expect("lost");
    assert_eq!(reason, LostReason::NotHeld);
    drop(outer);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        b.inspect("jobs/report")
            .await
            .expect("inspect")
            .and_then(|h| h.fencing_token),
        next.fencing_token(),
        "the evicted lease's drop deletes nothing"
    );
    next.release().await.expect("release");
    nested.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_holders_lease_frees_every_lock_under_it() {
    let server = EtcdServer::start();
    let (holder, operator) = (connect(&server, "").await, connect(&server, "").await);
    // One ttl class, so one session lease for both.
    let first = holder.try_lock("a", TTL).await.expect("try").expect("free");
    let second = holder.try_lock("b", TTL).await.expect("try").expect("free");
    let (mut lost_a, mut lost_b) = (first.lost_signal(), second.lost_signal());
    let evicted = operator
        .force_release("a", ForceRelease::TerminateSession)
        .await
        .expect("force release")
        .expect("held");
    assert_eq!(
        evicted.session,
        Some(format!("lease {}", holder.session_leases().await[0]))
    );
    for key in ["a", "b"] {
        assert_eq!(operator.inspect(key).await.expect("inspect"), None, "{key}");
    }
    for lost in [&mut lost_a, &mut lost_b] {
        tokio::time::timeout(Duration::from_secs(10), lost.wait())
            .await
            .expect("lost once the keep-alive hears the lease is gone");
    }
    assert_eq!(
        operator
            .force_release("a", ForceRelease::TerminateSession)
            .await
            .expect("free"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_off_leaves_the_holder_unknown() {
    let server = EtcdServer::start();
    let locker = connect(&server, "?holder=off").await;
    let mut lease = locker
        .try_lock("quiet", TTL)
        .await
        .expect("try")
        .expect("free");
    let held = locker
        .inspect("quiet")
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!((held.holder, held.granted, held.ttl), (None, None, None));
    assert_eq!(held.fencing_token, lease.fencing_token());
    // Release and refresh still find their grant by its secret.
    lease.refresh(TTL).await.expect("refresh");
    lease.release().await.expect("release");
    assert_eq!(locker.inspect("quiet").await.expect("inspect"), None);
}

/// More than one answer's worth (gRPC's 4 MiB) under the prefix: 40 names
/// whose keys another program wrote with 128 KiB values, and 520 locks of
/// ours (more than one page of keys). One read of it all failed with
/// "decoded message length too large"; the listing reads it in pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_larger_than_one_grpc_answer_is_read_in_pages() {
    let server = EtcdServer::start();
    let locker = connect(&server, "").await;
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("connect etcd-client");
    let big = "v".repeat(128 * 1024);
    for i in 0..40 {
        raw.put(
            format!("lock:big/n{i:02}/{:x}", 0x1000 + i),
            big.as_str(),
            None,
        )
        .await
        .expect("put a big foreign key");
    }
    let ours: Vec<String> = (0..520).map(|i| format!("many/{i:03}")).collect();
    let mut held = Vec::with_capacity(ours.len());
    for chunk in ours.chunks(40) {
        let granted =
            futures_util::future::join_all(chunk.iter().map(|key| locker.try_lock(key, TTL))).await;
        for lease in granted {
            held.push(lease.expect("try").expect("free"));
        }
    }

    let listed = locker.list("").await.expect("list past 4 MiB");
    let keys: Vec<&str> = listed.iter().map(|h| h.key.as_str()).collect();
    let mut expected: Vec<String> = (0..40).map(|i| format!("big/n{i:02}")).collect();
    expected.extend(ours.iter().cloned());
    assert_eq!(keys, expected);
    assert!(
        listed[..40].iter().all(|h| h.holder.is_none()),
        "foreign keys: no record"
    );
    for (listed, lease) in listed[40..].iter().zip(&held) {
        assert_eq!(
            listed.fencing_token,
            lease.fencing_token(),
            "{}",
            listed.key
        );
    }
    let big_only = locker.list("big/").await.expect("list big/");
    assert_eq!(big_only.len(), 40);
    for lease in held {
        lease.release().await.expect("release");
    }
}
