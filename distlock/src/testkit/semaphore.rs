//! The semaphore checks of the conformance suite: [`crate::semaphore`]
//! over the backend under test, each holder on a client of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Harness;
use crate::semaphore::Semaphore;
use crate::Error;

const TTL: Duration = Duration::from_secs(30);

async fn semaphore(h: &Harness, name: &str, permits: u32) -> Semaphore {
    Semaphore::new(h.locker().await, name, permits).expect("a valid semaphore")
}

/// Eight contenders, each on its own client, cycling through a semaphore of
/// three permits: never more than three hold at once, and all of them get
/// their turns.
pub async fn semaphore_never_has_more_than_n_holders(h: &Harness) {
    let name = h.key("semaphore-n-holders");
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut contenders = Vec::new();
    for _ in 0..8 {
        let semaphore = semaphore(h, &name, 3).await;
        let (holding, most) = (holding.clone(), most.clone());
        contenders.push(tokio::spawn(async move {
            for _ in 0..3 {
                let permit = semaphore
                    .acquire(TTL, Duration::from_secs(30))
                    .await
                    .expect("a permit within 30 s");
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                holding.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    for contender in contenders {
        contender.await.expect("contender task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} held permits of 3 at once");
    assert!(most >= 2, "eight contenders never held two permits at once");
}

/// A waiter for a full semaphore gets the permit another holder releases,
/// promptly.
pub async fn semaphore_release_wakes_a_waiter(h: &Harness) {
    let name = h.key("semaphore-wakes");
    let holders = semaphore(h, &name, 2).await;
    let first = holders.try_acquire(TTL).await.expect("try").expect("free");
    let second = holders.try_acquire(TTL).await.expect("try").expect("free");
    let waiter = semaphore(h, &name, 2).await;
    let waiting = tokio::spawn(async move {
        let permit = waiter.acquire(TTL, Duration::from_secs(20)).await;
        (permit, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "both permits are held");
    let freed = second.key().to_owned();
    second.release().await.expect("release");
    let released = Instant::now();
    let (permit, granted) = waiting.await.expect("waiter task");
    let permit = permit.expect("the released permit");
    assert_eq!(permit.key(), freed, "the only free permit");
    let woke = granted.saturating_duration_since(released);
    assert!(woke < Duration::from_secs(2), "the waiter took {woke:?}");
    permit.release().await.expect("release");
    first.release().await.expect("release");
}

/// A dropped permit is given back: the semaphore is full again only once
/// another holder takes it.
pub async fn semaphore_dropped_permit_returns(h: &Harness) {
    let name = h.key("semaphore-dropped");
    let holder = semaphore(h, &name, 1).await;
    let other = semaphore(h, &name, 1).await;
    let permit = holder.try_acquire(TTL).await.expect("try").expect("free");
    assert!(other.try_acquire(TTL).await.expect("try").is_none(), "full");
    drop(permit);
    let again = other
        .acquire(TTL, Duration::from_secs(5))
        .await
        .expect("the dropped permit comes back");
    again.release().await.expect("release");
}

/// An acquirer whose limit is smaller than another holder's is told so
/// when its permits are full, on backends that can inspect; elsewhere it
/// finds the semaphore full.
pub async fn semaphore_refuses_a_larger_limit_in_use(h: &Harness) {
    let name = h.key("semaphore-limits");
    let small = semaphore(h, &name, 1).await;
    let large = semaphore(h, &name, 2).await;
    let mut held = vec![small.try_acquire(TTL).await.expect("try").expect("free")];
    // The larger limit takes the other permit (its attempt may try either
    // first).
    while held.len() < 2 {
        held.push(
            large
                .try_acquire(TTL)
                .await
                .expect("try")
                .expect("one free"),
        );
    }
    let answer = small.try_acquire(TTL).await;
    match h.locker().await.capabilities().inspect {
        true => {
            let refused = answer.expect_err("a larger limit is in use");
            assert!(
                matches!(
                    refused,
                    Error::InvalidInput {
                        what: "permits",
                        ..
                    }
                ),
                "{refused:?}"
            );
        }
        false => assert!(answer.expect("try").is_none(), "full"),
    }
    for permit in held {
        permit.release().await.expect("release");
    }
}

/// [`Locker::try_lock_any`](crate::Locker::try_lock_any), the semaphore's
/// attempt, whether the backend tries the keys one at a time or all in one
/// request: it takes exactly the first free key in the order given, with a
/// fencing token like `try_lock`'s; keys held by `try_lock` (another client)
/// are skipped, all held is `None`; and the granted key is an ordinary lock
/// that `try_lock` then finds held, and that is free again once released.
pub async fn try_lock_any_takes_the_first_free_key_in_order(h: &Harness) {
    let keys: Vec<String> = (0..4)
        .map(|i| h.key(&format!("try-lock-any#{i}")))
        .collect();
    let (one, other) = (h.locker().await, h.locker().await);
    let held_second = other
        .try_lock(&keys[1], TTL)
        .await
        .expect("try")
        .expect("free");
    let held_first = other
        .try_lock(&keys[0], TTL)
        .await
        .expect("try")
        .expect("free");
    // Starts at the second key, as a semaphore's random start would.
    let order = [&keys[1..], &keys[..1]].concat();
    let granted = one
        .try_lock_any(&order, TTL)
        .await
        .expect("try_lock_any")
        .expect("keys 2 and 3 are free");
    assert_eq!(
        granted.key(),
        keys[2],
        "the first free key in the order given"
    );
    if one.capabilities().fencing {
        assert!(granted.fencing_token().is_some(), "a grant is fenced");
    }
    assert!(
        other.try_lock(&keys[2], TTL).await.expect("try").is_none(),
        "the granted key is an ordinary lock"
    );
    let next = one
        .try_lock_any(&order, TTL)
        .await
        .expect("try_lock_any")
        .expect("key 3 is free");
    assert_eq!(
        next.key(),
        keys[3],
        "one key per attempt, the next free one"
    );
    assert!(
        other.try_lock(&keys[3], TTL).await.expect("try").is_none(),
        "the second grant is held too"
    );
    assert!(
        one.try_lock_any(&order, TTL).await.expect("try").is_none(),
        "every key held"
    );
    granted.release().await.expect("release");
    let again = other
        .try_lock(&keys[2], TTL)
        .await
        .expect("try")
        .expect("released, free again");
    for lease in [again, next, held_first, held_second] {
        lease.release().await.expect("release");
    }
    let refused = one.try_lock_any(&[], TTL).await.expect_err("no keys");
    assert!(
        matches!(refused, Error::InvalidInput { what: "keys", .. }),
        "{refused:?}"
    );
}
