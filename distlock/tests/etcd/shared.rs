//! Shared (reader) locks on etcd beyond the conformance checks: the key
//! layout (`lock:K/read-<lease hex>-<n>`, in the mutex's queue), no key
//! left behind by a contended, timed-out or cancelled attempt, fencing
//! tokens that never go back when a waiting writer gives up, one locker in
//! both modes, nested names, and inspection and operator release of a
//! lock held shared.

use std::time::{Duration, Instant};

use distlock::etcd::EtcdLocker;
use distlock::inspect::{with_label, ForceRelease};
use distlock::{Error, Locker, LostReason};
use test_servers::EtcdServer;

const TTL: Duration = Duration::from_secs(10);

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

/// Polls until etcd has exactly `count` keys under `prefix`, or panics.
async fn until_keys(server: &EtcdServer, prefix: &str, count: usize, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let keys = keys_under(server, prefix);
        if keys.len() == count {
            return;
        }
        assert!(Instant::now() < deadline, "{why}: {keys:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_keys_are_named_apart_in_the_queue_and_leave_nothing_behind() {
    let server = EtcdServer::start();
    let (a, b) = (connect(&server).await, connect(&server).await);
    let first = a.try_lock_shared("K", TTL).await.unwrap().unwrap();
    let second = a.try_lock_shared("K", TTL).await.unwrap().unwrap();
    let lease = a.session_leases().await.pop().expect("a session");
    let mut keys = keys_under(&server, "lock:K/");
    keys.sort();
    assert_eq!(
        keys,
        [
            format!("lock:K/read-{lease}-0"),
            format!("lock:K/read-{lease}-1")
        ],
        "one key per reader, on the locker's session lease"
    );
    assert!(first.owner().starts_with(&format!("read-{lease}-0:")));

    // Another process releases a reader by its owner token.
    b.unlock("K", first.owner()).await.expect("unlock by token");
    assert!(matches!(first.release().await, Err(Error::NotHeld { .. })));
    until_keys(&server, "lock:K/", 1, "the first reader's key is gone").await;
    second.release().await.unwrap();

    // A contended attempt, a timed-out wait and a cancelled wait leave no
    // reader's key.
    let writer = b.try_lock("K", TTL).await.unwrap().unwrap();
    assert!(a.try_lock_shared("K", TTL).await.unwrap().is_none());
    assert_eq!(keys_under(&server, "lock:K/").len(), 1, "the writer's only");
    match a.lock_shared("K", TTL, Duration::from_millis(300)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("a reader's wait behind a writer times out: {other:?}"),
    }
    assert_eq!(keys_under(&server, "lock:K/").len(), 1, "the writer's only");
    let waiting = tokio::spawn({
        let a = a.clone();
        async move { a.lock_shared("K", TTL, Duration::from_secs(30)).await }
    });
    until_keys(&server, "lock:K/", 2, "the waiting reader queued").await;
    waiting.abort();
    until_keys(
        &server,
        "lock:K/",
        1,
        "the cancelled reader's key is deleted",
    )
    .await;
    writer.release().await.unwrap();
    assert!(keys_under(&server, "lock:K/").is_empty());
}

/// A writer that waited for a reader and gave up leaves the readers'
/// tokens in order: the reader queued behind it is granted with the token
/// of the reader still first, a later reader too, and the next writer's
/// token is above all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_never_go_back_when_a_waiting_writer_gives_up() {
    let server = EtcdServer::start();
    let (a, b, w) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let writer = w.try_lock("K", TTL).await.unwrap().unwrap();
    let written = writer.fencing_token().unwrap();
    writer.release().await.unwrap();

    let first = a.try_lock_shared("K", TTL).await.unwrap().unwrap();
    let first_token = first.fencing_token().unwrap();
    assert!(
        first_token > written,
        "{first_token} after writer {written}"
    );
    let giving_up = tokio::spawn({
        let w = w.clone();
        async move { w.lock("K", TTL, Duration::from_millis(1500)).await }
    });
    until_keys(&server, "lock:K/", 2, "the writer queued").await;
    let behind = tokio::spawn({
        let b = b.clone();
        async move { b.lock_shared("K", TTL, Duration::from_secs(10)).await }
    });
    until_keys(&server, "lock:K/", 3, "a reader queued behind the writer").await;
    assert!(
        matches!(giving_up.await.unwrap(), Err(Error::Timeout { .. })),
        "the writer gives up while the first reader holds"
    );
    let behind = behind.await.unwrap().expect("granted once the writer left");
    let late = a.try_lock_shared("K", TTL).await.unwrap().unwrap();
    assert_eq!(
        (behind.fencing_token(), late.fencing_token()),
        (Some(first_token), Some(first_token)),
        "readers granted while the first reader holds share its token"
    );
    first.release().await.unwrap();
    let after_first = b.try_lock_shared("K", TTL).await.unwrap().unwrap();
    let token = after_first.fencing_token().unwrap();
    assert!(token > first_token, "the first key moved on: {token}");
    for lease in [behind, late, after_first] {
        lease.release().await.unwrap();
    }
    let next = w.try_lock("K", TTL).await.unwrap().unwrap();
    assert!(next.fencing_token().unwrap() > token);
    next.release().await.unwrap();
}

/// A reader waiting behind a granted writer gets a token above the
/// writer's once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_a_writer_gets_a_token_above_its() {
    let server = EtcdServer::start();
    let (a, b) = (connect(&server).await, connect(&server).await);
    let writer = a.try_lock("K", TTL).await.unwrap().unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock_shared("K", TTL, Duration::from_secs(10)).await }
    });
    until_keys(&server, "lock:K/", 2, "the reader queued").await;
    let written = writer.fencing_token().unwrap();
    writer.release().await.unwrap();
    let reader = waiting.await.unwrap().expect("granted after the writer");
    assert!(reader.fencing_token().unwrap() > written);
    reader.release().await.unwrap();
}

/// One locker in both modes: its reader keeps its own `try_lock` out and
/// its `lock` waits (in etcd) until the reader is released; its writer
/// keeps its own readers out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_locker_excludes_itself_across_modes() {
    let server = EtcdServer::start();
    let a = connect(&server).await;
    let reader = a.try_lock_shared("K", TTL).await.unwrap().unwrap();
    assert!(a.try_lock("K", TTL).await.unwrap().is_none());
    let writing = tokio::spawn({
        let a = a.clone();
        async move { a.lock("K", TTL, Duration::from_secs(10)).await }
    });
    until_keys(&server, "lock:K/", 2, "the writer queued behind its reader").await;
    assert!(!writing.is_finished());
    reader.release().await.unwrap();
    let writer = writing.await.unwrap().expect("granted after the reader");
    assert!(a.try_lock_shared("K", TTL).await.unwrap().is_none());
    writer.release().await.unwrap();
}

/// A reader of `K/x` is not in `K`'s queue, nor `K`'s in `K/x`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_nested_names_are_other_locks() {
    let server = EtcdServer::start();
    let (a, b) = (connect(&server).await, connect(&server).await);
    let nested = a.try_lock_shared("K/x", TTL).await.unwrap().unwrap();
    // K/x's key is the oldest under `lock:K/` and among the writer ranges'
    // answers: K's reader looks past it at K's own members.
    let reader = b
        .try_lock_shared("K", TTL)
        .await
        .unwrap()
        .expect("K is free for readers while K/x is read");
    assert!(
        reader.fencing_token() > nested.fencing_token(),
        "its own key is K's first"
    );
    reader.release().await.unwrap();
    let outer = b
        .try_lock("K", TTL)
        .await
        .unwrap()
        .expect("K is free while K/x is read");
    // K's writer is first under `lock:K/`, but not in K/x's queue; K/x's
    // reader is older than it, but not in K's.
    let again = b
        .try_lock_shared("K/x", TTL)
        .await
        .unwrap()
        .expect("K/x readers ignore K's writer");
    assert!(a.try_lock_shared("K", TTL).await.unwrap().is_none());
    let held = b.inspect("K").await.unwrap().expect("held");
    assert!(!held.shared, "K is held by its writer: {held:?}");
    let held = b.inspect("K/x").await.unwrap().expect("held");
    assert!(held.shared, "K/x is held by readers: {held:?}");
    for lease in [nested, outer, again] {
        lease.release().await.unwrap();
    }
}

/// A lock held by readers is inspected and listed as held shared, with the
/// oldest reader's record, session and revision; a forced release evicts
/// every reader (deleting their keys, or revoking their leases), and a
/// writer waiting behind them gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_shared_is_inspected_and_force_released_as_one() {
    let server = EtcdServer::start();
    let (a, b, w) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let first = with_label("first reader", a.try_lock_shared("K", TTL))
        .await
        .unwrap()
        .unwrap();
    let second = with_label("second reader", b.try_lock_shared("K", TTL))
        .await
        .unwrap()
        .unwrap();
    let held = w.inspect("K").await.unwrap().expect("held");
    assert!(held.shared, "{held:?}");
    assert_eq!(
        held.holder.as_ref().map(|h| h.label.as_str()),
        Some("first reader")
    );
    let lease = a.session_leases().await.pop().unwrap();
    assert_eq!(held.session, Some(format!("lease {lease}")));
    assert_eq!(held.fencing_token, first.fencing_token());
    assert_eq!(second.fencing_token(), first.fencing_token());
    let listed = w.list("").await.unwrap();
    assert!(
        listed.len() == 1 && listed[0].shared && listed[0].key == "K",
        "{listed:?}"
    );

    let waiting = tokio::spawn({
        let w = w.clone();
        async move { w.lock("K", TTL, Duration::from_secs(10)).await }
    });
    until_keys(
        &server,
        "lock:K/",
        3,
        "the writer queued behind the readers",
    )
    .await;
    let evicted = w
        .force_release("K", ForceRelease::Lock)
        .await
        .unwrap()
        .expect("evicted");
    assert!(evicted.shared, "{evicted:?}");
    let writer = waiting.await.unwrap().expect("granted after the eviction");
    for reader in [&first, &second] {
        assert!(matches!(
            a.refresh("K", reader.owner(), TTL).await,
            Err(Error::NotHeld { .. })
        ));
    }
    writer.release().await.unwrap();
    drop((first, second));

    // Revoking: every reader's session lease goes, and every lock under it.
    let first = a.try_lock_shared("K", TTL).await.unwrap().unwrap();
    let second = b.try_lock_shared("K", TTL).await.unwrap().unwrap();
    let other = b.try_lock("other", TTL).await.unwrap().unwrap();
    w.force_release("K", ForceRelease::TerminateSession)
        .await
        .unwrap()
        .expect("evicted");
    for lease in [&first, &second, &other] {
        let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost_signal().wait())
            .await
            .expect("lost within a keep-alive interval");
        assert_eq!(reason, LostReason::ConnectionLost);
    }
    assert!(w.inspect("K").await.unwrap().is_none());
    assert!(w.inspect("other").await.unwrap().is_none());
}
