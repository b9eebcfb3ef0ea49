//! The shared-lock checks of the conformance suite
//! ([`Locker::try_lock_shared`], [`Locker::lock_shared`]), each client a
//! locker of its own.
//!
//! Every check first asks the backend's [`Capabilities::shared`](crate::Capabilities::shared):
//! where it is false, the check asserts that both methods answer
//! [`Error::Unsupported`] (with a reason) and nothing else; where it is true,
//! it checks the behaviour.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{assert_held_elsewhere, lost_within, Harness, LONG_TTL, SHORT_TTL};
use crate::{Error, KeepAlive, Lease, Locker, LostReason};

/// How long a release may take to reach a waiter that polls (the file
/// backend across lockers: its largest backoff is 200 ms).
const WAKE_WITHIN: Duration = Duration::from_secs(3);

/// Whether `locker` has shared locks; if it has not, asserts that it says
/// so from both methods, as [`Error::Unsupported`].
async fn has_shared_locks(locker: &dyn Locker, key: &str) -> bool {
    if locker.capabilities().shared {
        return true;
    }
    match locker.try_lock_shared(key, LONG_TTL).await {
        Err(Error::Unsupported { reason, .. }) => assert!(!reason.is_empty(), "a reason"),
        other => panic!(
            "{} has no shared locks: try_lock_shared must be Unsupported, got {other:?}",
            locker.backend()
        ),
    }
    match locker
        .lock_shared(key, LONG_TTL, Duration::from_millis(200))
        .await
    {
        Err(Error::Unsupported { .. }) => {}
        other => panic!(
            "{} has no shared locks: lock_shared must be Unsupported, got {other:?}",
            locker.backend()
        ),
    }
    false
}

async fn acquire_shared(locker: &dyn Locker, key: &str, ttl: Duration) -> Lease {
    match locker.try_lock_shared(key, ttl).await {
        Ok(Some(lease)) => lease,
        Ok(None) => panic!(
            "a shared lease on {key:?} should be granted, but {} reports contention",
            locker.backend()
        ),
        Err(e) => panic!("try_lock_shared({key:?}) failed: {e}"),
    }
}

async fn assert_shared_contended(locker: &dyn Locker, key: &str, why: &str) {
    match locker.try_lock_shared(key, LONG_TTL).await {
        Ok(None) => {}
        Ok(Some(_)) => panic!("a shared lease on {key:?} was granted: {why}"),
        Err(e) => panic!("try_lock_shared({key:?}) failed instead of reporting contention: {e}"),
    }
}

/// `locker.lock(key)` (exclusive, 10 s) on a task of its own.
fn spawn_writer(
    locker: &Arc<dyn Locker>,
    key: &str,
) -> tokio::task::JoinHandle<(crate::Result<Lease>, Instant)> {
    super::spawn_waiter(locker, key)
}

/// Two shared holders on two clients (and a third on one of them) hold
/// the key at once; each is a lease like any other: its own owner token,
/// released by [`Lease::release`].
pub async fn shared_holders_coexist(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("shared-coexist");
    if !has_shared_locks(&*a, &key).await {
        return;
    }
    let first = acquire_shared(&*a, &key, LONG_TTL).await;
    let second = acquire_shared(&*b, &key, LONG_TTL).await;
    let third = acquire_shared(&*a, &key, LONG_TTL).await;
    assert_eq!(second.key(), key);
    assert_ne!(
        first.owner(),
        second.owner(),
        "each reader has its own owner token"
    );
    assert_ne!(
        first.owner(),
        third.owner(),
        "each reader has its own owner token"
    );
    for lease in [first, second, third] {
        lease.release().await.expect("each reader releases");
    }
    super::assert_free(&*b, &key, "free once every reader released").await;
}

/// While a shared lease is held, an exclusive `try_lock` is contention
/// from every client (the reader's own included), and `lock` with a zero
/// timeout is `NotAcquired`; inspection reports the key held, shared.
pub async fn exclusive_is_contention_while_shared_held(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("shared-excludes-writer");
    if !has_shared_locks(&*a, &key).await {
        return;
    }
    let reader = acquire_shared(&*a, &key, LONG_TTL).await;
    assert_held_elsewhere(&*a, &key, "a reader holds it (same client)").await;
    assert_held_elsewhere(&*b, &key, "a reader holds it (another client)").await;
    match b.lock(&key, LONG_TTL, Duration::ZERO).await {
        Err(Error::NotAcquired { .. }) => {}
        other => panic!("lock with zero timeout while a reader holds: {other:?}"),
    }
    if b.capabilities().inspect {
        let held = super::inspect_held(&*b, &key).await;
        assert!(
            held.shared,
            "inspection says the key is held shared: {held:?}"
        );
    }
    reader.release().await.expect("release the reader");
}

/// While an exclusive lease is held, a shared `try_lock_shared` is
/// contention from every client, and `lock_shared` with a zero timeout is
/// `NotAcquired`.
pub async fn shared_is_contention_while_exclusive_held(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("writer-excludes-shared");
    if !has_shared_locks(&*a, &key).await {
        return;
    }
    let writer = super::acquire(&*a, &key, LONG_TTL).await;
    assert_shared_contended(&*a, &key, "a writer holds it (same client)").await;
    assert_shared_contended(&*b, &key, "a writer holds it (another client)").await;
    match b.lock_shared(&key, LONG_TTL, Duration::ZERO).await {
        Err(Error::NotAcquired { .. }) => {}
        other => panic!("lock_shared with zero timeout while a writer holds: {other:?}"),
    }
    if b.capabilities().inspect {
        let held = super::inspect_held(&*b, &key).await;
        assert!(!held.shared, "held by the writer, not shared: {held:?}");
    }
    writer.release().await.expect("release the writer");
}

/// A writer waiting in `lock` gets the key once the last reader releases
/// it, and not before: releasing one of two readers leaves it waiting.
pub async fn last_shared_release_lets_the_writer_in(h: &Harness) {
    let (a, b, w) = (h.locker().await, h.locker().await, h.locker().await);
    let key = h.key("shared-last-release");
    if !has_shared_locks(&*a, &key).await {
        return;
    }
    let first = acquire_shared(&*a, &key, LONG_TTL).await;
    let second = acquire_shared(&*b, &key, LONG_TTL).await;
    let writer = spawn_writer(&w, &key);
    first.release().await.expect("release the first reader");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !writer.is_finished(),
        "the writer must wait while a reader still holds the key"
    );
    let released = Instant::now();
    second.release().await.expect("release the last reader");
    let (lease, at) = writer.await.expect("writer task");
    let lease = lease.expect("the writer gets the key after the last reader left");
    assert!(
        at.saturating_duration_since(released) < WAKE_WITHIN,
        "the writer got in {:?} after the last release",
        at.saturating_duration_since(released)
    );
    assert_shared_contended(&*a, &key, "the writer holds it now").await;
    lease.release().await.expect("release the writer");
}

/// A reader waiting in `lock_shared` gets the key once the writer releases
/// it.
pub async fn lock_shared_waits_for_the_writer(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("shared-waits");
    if !has_shared_locks(&*a, &key).await {
        return;
    }
    let writer = super::acquire(&*a, &key, LONG_TTL).await;
    let waiting = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.lock_shared(&key, LONG_TTL, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the reader waits while the writer holds"
    );
    writer.release().await.expect("release the writer");
    let reader = tokio::time::timeout(WAKE_WITHIN, waiting)
        .await
        .expect("the reader gets in soon after the release")
        .expect("reader task")
        .expect("lock_shared succeeds");
    match b
        .lock_shared(&key, LONG_TTL, Duration::from_millis(100))
        .await
    {
        Ok(second) => second.release().await.expect("release the second reader"),
        Err(e) => panic!("a second reader waits for nothing: {e}"),
    }
    reader.release().await.expect("release the reader");
}

/// A writer waiting in `lock`, and readers that come after it, as
/// [`Capabilities::writer_priority`](crate::Capabilities::writer_priority)
/// says.
///
/// - Without writer priority (memory, file, Redis): another client's
///   `try_lock_shared` is granted at once while the writer waits, and the
///   writer gets in once both readers are gone.
/// - With it (Postgres, etcd, ZooKeeper): a later reader is contention from every client
///   (the first reader's own included), a later `lock_shared` waits behind
///   the writer, and the writer gets in as soon as the first reader leaves,
///   before that waiting reader.
pub async fn a_waiting_writer_and_later_readers(h: &Harness) {
    let (a, b, w) = (h.locker().await, h.locker().await, h.locker().await);
    let key = h.key("shared-writer-waits");
    if !has_shared_locks(&*a, &key).await {
        return;
    }
    let first = acquire_shared(&*a, &key, LONG_TTL).await;
    let writer = spawn_writer(&w, &key);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "the writer waits for the reader");
    if !a.capabilities().writer_priority {
        let late = acquire_shared(&*b, &key, LONG_TTL).await;
        first.release().await.expect("release the first reader");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!writer.is_finished(), "the late reader still holds the key");
        late.release().await.expect("release the late reader");
        let (lease, _) = writer.await.expect("writer task");
        lease
            .expect("the writer gets the key once both readers left")
            .release()
            .await
            .expect("release the writer");
        return;
    }
    let queued = "a writer waits: later readers queue behind it";
    assert_shared_contended(&*b, &key, queued).await;
    assert_shared_contended(&*a, &key, queued).await;
    let late = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let lease = b.lock_shared(&key, LONG_TTL, Duration::from_secs(10)).await;
            (lease, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !late.is_finished(),
        "a later lock_shared waits behind the writer"
    );
    let released = Instant::now();
    first.release().await.expect("release the first reader");
    let (lease, at) = writer.await.expect("writer task");
    let lease = lease.expect("the writer gets the key when the first reader leaves");
    assert!(
        at.saturating_duration_since(released) < WAKE_WITHIN,
        "the writer got in {:?} after the reader left",
        at.saturating_duration_since(released)
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!late.is_finished(), "the later reader waits for the writer");
    let writer_left = Instant::now();
    lease.release().await.expect("release the writer");
    let (reader, at) = late.await.expect("reader task");
    let reader = reader.expect("the later reader gets the key after the writer");
    assert!(
        at.saturating_duration_since(writer_left) < WAKE_WITHIN,
        "the later reader got in {:?} after the writer left",
        at.saturating_duration_since(writer_left)
    );
    reader.release().await.expect("release the later reader");
}

/// A shared lease dropped without `release` is released: a writer waiting
/// for it gets the key well within the lease's ttl.
pub async fn dropped_shared_lease_is_released(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("shared-drop");
    if !has_shared_locks(&*a, &key).await {
        return;
    }
    drop(acquire_shared(&*a, &key, LONG_TTL).await);
    let lease = b
        .lock(&key, LONG_TTL, Duration::from_secs(5))
        .await
        .expect("the dropped shared lease was released within 5s (ttl 30s)");
    lease.release().await.expect("release");
}

/// A shared hold answers to its owner token like an exclusive one:
/// `refresh` works (where the backend has refresh), `unlock` with a wrong
/// token is `NotHeld` and frees nothing, `unlock` with the right one frees
/// it, and a second `unlock` is `NotHeld`.
pub async fn shared_lease_answers_to_its_owner_token(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("shared-owner");
    if !has_shared_locks(&*a, &key).await {
        return;
    }
    let reader = acquire_shared(&*a, &key, LONG_TTL).await;
    if a.capabilities().refresh {
        a.refresh(&key, reader.owner(), LONG_TTL)
            .await
            .expect("refresh of a shared hold by its owner");
    }
    let forged = crate::new_owner_token();
    match a.unlock(&key, &forged).await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("unlock with a wrong owner must be NotHeld, got {other:?}"),
    }
    assert_held_elsewhere(&*b, &key, "a wrong-owner unlock frees no reader").await;
    a.unlock(&key, reader.owner())
        .await
        .expect("unlock of a shared hold by its owner token");
    match a.unlock(&key, reader.owner()).await {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("a second unlock must be NotHeld, got {other:?}"),
    }
    super::assert_free(&*b, &key, "free after the reader's unlock").await;
    drop(reader);
}

/// Where locks carry fencing tokens, a shared lease's is the latest
/// writer's, not advanced: at least every earlier writer's and below every
/// later writer's, and two coexisting readers get the same one.
pub async fn shared_fencing_tokens_sit_between_writers(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("shared-fencing");
    if !has_shared_locks(&*a, &key).await || !a.capabilities().fencing {
        return;
    }
    let writer = super::acquire(&*a, &key, LONG_TTL).await;
    let before = writer.fencing_token().expect("a writer's token");
    writer.release().await.expect("release the first writer");
    let first = acquire_shared(&*a, &key, LONG_TTL).await;
    let second = acquire_shared(&*b, &key, LONG_TTL).await;
    let read = first.fencing_token().expect("a reader's token");
    assert!(read >= before, "reader {read} after writer {before}");
    assert_eq!(
        second.fencing_token(),
        Some(read),
        "readers with no writer between them share a token"
    );
    first.release().await.expect("release");
    second.release().await.expect("release");
    let next = super::acquire(&*b, &key, LONG_TTL).await;
    let after = next.fencing_token().expect("a writer's token");
    assert!(after > read, "writer {after} after reader {read}");
    next.release().await.expect("release the second writer");
}

/// A kept-alive shared lease holds past its ttl where locks expire, and
/// its lost signal fires with `NotHeld` when its hold is released behind
/// its back.
pub async fn shared_keepalive_holds_and_reports_loss(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("shared-keepalive");
    if !has_shared_locks(&*a, &key).await {
        return;
    }
    let mut reader = acquire_shared(&*a, &key, SHORT_TTL).await;
    reader
        .keep_alive(KeepAlive::default())
        .expect("keepalive starts");
    tokio::time::sleep(SHORT_TTL * 4).await;
    assert_held_elsewhere(&*b, &key, "the keepalive renews the reader").await;
    assert_eq!(reader.lost_signal().reason(), None);
    let mut lost = reader.lost_signal();
    a.unlock(&key, reader.owner())
        .await
        .expect("release behind the lease's back");
    if a.capabilities().refresh {
        let reason = lost_within(&mut lost, Duration::from_secs(3)).await;
        assert_eq!(reason, LostReason::NotHeld);
    }
    drop(reader);
}
