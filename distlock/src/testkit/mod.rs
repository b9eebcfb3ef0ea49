//! The conformance suite every backend runs against a real server, and
//! [`FaultyLocker`], a locker that fails on demand for testing code that
//! uses one (feature `testkit`).
//!
//! Each check is a public async function taking a [`Harness`]; the
//! [`conformance_suite!`](crate::conformance_suite) macro expands to one
//! `#[tokio::test]` per check, so each shows up (and fails) on its own:
//!
//! ```no_run
//! // tests/my_backend.rs
//! // Every call: a new client of the same lock space (here, one directory).
//! distlock::conformance_suite!(|| async {
//!     distlock::connect("file:///tmp/my-backend-suite").await.unwrap()
//! });
//! # fn main() {}
//! ```
//!
//! The factory is called whenever a check needs a locker; each call must
//! return a *new client* of the *same* lock space (a new connection to the same
//! server, a new [`crate::file::FileLocker`] on the same directory, a clone of
//! the same [`crate::memory::MemoryLocker`]). Keys are unique per check, so
//! checks can run in parallel against one server.
//!
//! Checks that depend on a capability (ttl expiry, refresh, release by owner,
//! release wake-up) assert the backend's documented behaviour either way: a
//! file lock must *not* expire, a backend without refresh must say
//! [`Error::Unsupported`].
//!
//! # Stability, for third-party backends
//!
//! Stable within a minor version: [`Harness`] and its methods, and the
//! `conformance_suite!(factory)` macro form; run it and your backend is
//! checked against the contract as this version of distlock defines it.
//! Not stable: the set of checks (new versions add checks as the contract is
//! sharpened, and a check may change when the contract does, as
//! `max_hold_ends_renewal` did when max hold stopped releasing), their
//! names, and the individual check functions' signatures. Pin distlock's
//! version if your CI must not see new checks unannounced.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::inspect::{with_label, ForceRelease, HeldLock};
use crate::{with_lock, Error, KeepAlive, Locker, LostReason};

mod election;
mod faulty;
mod semaphore;
mod shared;
pub use election::*;
pub use faulty::{Faults, FaultyLocker};
pub use semaphore::*;
pub use shared::*;

type Factory = dyn Fn() -> BoxFuture<'static, Arc<dyn Locker>> + Send + Sync;

/// Makes lockers and unique keys for the checks.
pub struct Harness {
    factory: Box<Factory>,
    run_id: u64,
}

impl Harness {
    /// A harness whose lockers come from `factory` (see the module docs).
    pub fn new<F, Fut>(factory: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Arc<dyn Locker>> + Send + 'static,
    {
        Harness {
            factory: Box::new(move || Box::pin(factory())),
            run_id: rand::random(),
        }
    }

    /// A new client of the lock space under test.
    pub async fn locker(&self) -> Arc<dyn Locker> {
        (self.factory)().await
    }

    /// A key unique to this run and check.
    pub fn key(&self, check: &str) -> String {
        format!("conformance-{check}-{:016x}", self.run_id)
    }
}

const LONG_TTL: Duration = Duration::from_secs(30);
const SHORT_TTL: Duration = Duration::from_millis(400);

async fn acquire(locker: &dyn Locker, key: &str, ttl: Duration) -> crate::Lease {
    match locker.try_lock(key, ttl).await {
        Ok(Some(lease)) => lease,
        Ok(None) => panic!(
            "{key:?} should be free, but {} says it is held",
            locker.backend()
        ),
        Err(e) => panic!("acquiring {key:?} failed: {e}"),
    }
}

/// Asserts `key` is free on `locker`: it is granted at once and released
/// (`why` names the release that should succeed).
async fn assert_free(locker: &dyn Locker, key: &str, why: &str) {
    acquire(locker, key, LONG_TTL)
        .await
        .release()
        .await
        .expect(why);
}

async fn assert_held_elsewhere(locker: &dyn Locker, key: &str, why: &str) {
    match locker.try_lock(key, LONG_TTL).await {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{key:?} was acquired but should still be held: {why}"),
        Err(e) => panic!("try_lock({key:?}) failed instead of reporting contention: {e}"),
    }
}

/// What `locker` says of `key`, which must be held.
async fn inspect_held(locker: &dyn Locker, key: &str) -> HeldLock {
    locker
        .inspect(key)
        .await
        .expect("inspect")
        .unwrap_or_else(|| panic!("{key:?} must be held"))
}

/// Why `lost` fired, which it must within `within`.
async fn lost_within(lost: &mut crate::LostSignal, within: Duration) -> LostReason {
    tokio::time::timeout(within, lost.wait())
        .await
        .unwrap_or_else(|_| panic!("the lost signal fires within {within:?}"))
}

/// `locker.lock(key)` (ttl [`LONG_TTL`], 10 s timeout) on a task of its own,
/// which answers with the instant it returned.
fn spawn_waiter(
    locker: &Arc<dyn Locker>,
    key: &str,
) -> tokio::task::JoinHandle<(crate::Result<crate::Lease>, Instant)> {
    let (locker, key) = (locker.clone(), key.to_owned());
    tokio::spawn(async move {
        let lease = locker.lock(&key, LONG_TTL, Duration::from_secs(10)).await;
        (lease, Instant::now())
    })
}

/// Drops `lease`, which lost its lock to another holder, and asserts that
/// its key is still held (`by` names that holder's lock) once the drop's
/// background release has had time to run.
async fn assert_drop_frees_nothing(lease: crate::Lease, locker: &dyn Locker, by: &str) {
    let key = lease.key().to_owned();
    drop(lease);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let why = format!("dropping a lost lease must not free {by}");
    assert_held_elsewhere(locker, &key, &why).await;
}

/// A second `try_lock` of a held key is contention (`Ok(None)`), from the same
/// locker and from another client; neither is an error.
pub async fn try_twice_second_is_contention(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("try-twice");
    let lease = acquire(&*a, &key, LONG_TTL).await;
    assert_held_elsewhere(&*a, &key, "same locker").await;
    assert_held_elsewhere(&*b, &key, "another client").await;
    lease.release().await.expect("release by the holder");
}

/// After release, the key can be taken again at once, by anybody.
pub async fn release_then_reacquire(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("reacquire");
    assert_free(&*a, &key, "release").await;
    let again = acquire(&*b, &key, LONG_TTL).await;
    assert_eq!(again.key(), key);
    again.release().await.expect("second release");
    assert_free(&*a, &key, "third release").await;
}

/// Unlock with a wrong owner token is `NotHeld` and deletes nothing.
pub async fn wrong_owner_gets_not_held_and_deletes_nothing(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("wrong-owner");
    let lease = acquire(&*a, &key, LONG_TTL).await;
    let forged = crate::new_owner_token();
    for locker in [&a, &b] {
        match locker.unlock(&key, &forged).await {
            Err(Error::NotHeld { key: named }) => assert_eq!(named, key),
            other => panic!("unlock with a wrong owner must be NotHeld, got {other:?}"),
        }
    }
    assert_held_elsewhere(&*b, &key, "a wrong-owner unlock must delete nothing").await;
    lease
        .release()
        .await
        .expect("the real owner can still release");
}

/// Releasing twice: the second is `NotHeld`.
pub async fn double_release_is_not_held(h: &Harness) {
    let a = h.locker().await;
    let key = h.key("double-release");
    let lease = acquire(&*a, &key, LONG_TTL).await;
    let owner = lease.owner().to_owned();
    lease.release().await.expect("first release");
    let second = a.unlock(&key, &owner).await;
    assert!(
        matches!(second, Err(Error::NotHeld { .. })),
        "the second release: {second:?}"
    );
}

/// Where locks expire, one not refreshed within its ttl is free for others;
/// where they do not (file, Postgres), it stays held past its ttl until
/// released.
pub async fn ttl_semantics(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("ttl");
    let lease = acquire(&*a, &key, SHORT_TTL).await;
    assert_held_elsewhere(&*b, &key, "within its ttl").await;
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(300)).await;
    if a.capabilities().expires {
        let next = acquire(&*b, &key, LONG_TTL).await;
        assert!(lease.is_lost(), "the expired lease must report itself lost");
        assert!(
            matches!(lease.release().await, Err(Error::NotHeld { .. })),
            "releasing an expired, retaken lock must be NotHeld"
        );
        next.release().await.expect("release by the new holder");
    } else {
        assert_held_elsewhere(&*b, &key, "this backend does not expire locks").await;
        assert!(!lease.is_lost());
        lease.release().await.expect("release past the ttl");
    }
}

/// Refresh extends the ttl (or, where locks do not expire, confirms the hold)
/// and is `NotHeld` once the lock is gone; unsupported where not offered.
pub async fn refresh_semantics(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("refresh");
    let caps = a.capabilities();
    let mut lease = acquire(&*a, &key, SHORT_TTL).await;
    if !caps.refresh {
        assert_unsupported(lease.refresh(SHORT_TTL).await, "refresh");
        lease.release().await.expect("release");
        return;
    }
    lease
        .refresh(Duration::from_secs(2))
        .await
        .expect("refresh by the holder");
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(300)).await;
    assert_held_elsewhere(&*b, &key, "the refresh extended it past the original ttl").await;
    lease
        .refresh(SHORT_TTL)
        .await
        .expect("refresh to a short ttl");
    if caps.expires {
        tokio::time::sleep(SHORT_TTL + Duration::from_millis(300)).await;
        let thief = acquire(&*b, &key, LONG_TTL).await;
        match lease.refresh(LONG_TTL).await {
            Err(Error::NotHeld { .. }) => {}
            other => panic!("refresh after expiry must be NotHeld, got {other:?}"),
        }
        assert_eq!(lease.lost_signal().reason(), Some(LostReason::NotHeld));
        thief.release().await.expect("the new holder is untouched");
    } else {
        let owner = lease.owner().to_owned();
        lease.release().await.expect("release");
        assert!(matches!(
            a.refresh(&key, &owner, LONG_TTL).await,
            Err(Error::NotHeld { .. })
        ));
    }
}

/// A keepalive batch answers each lease as `refresh` would, in order, across
/// more leases than one request of any backend carries (etcd reads 128 keys
/// per transaction): a held lease is refreshed (on a backend whose locks
/// expire, to the batch's ttl), a released one and a wrong owner are
/// `NotHeld`, an invalid request is `InvalidInput`, without failing the
/// rest.
pub async fn refresh_many_answers_each_lease(h: &Harness) {
    const LEASES: usize = 150;
    let (a, b) = (h.locker().await, h.locker().await);
    let caps = a.capabilities();
    let keys: Vec<String> = (0..LEASES)
        .map(|i| h.key(&format!("refresh-many-{i}")))
        .collect();
    let mut leases = Vec::with_capacity(LEASES);
    for key in &keys {
        leases.push(acquire(&*a, key, LONG_TTL).await);
    }
    let released = leases.remove(3);
    let released_owner = released.owner().to_owned();
    released.release().await.expect("release");
    let wrong_owner = crate::new_owner_token();
    // Index i < LEASES - 1 of `leases` is key i, or i + 1 from key 3 on.
    let mut requests: Vec<crate::RefreshRequest<'_>> = leases
        .iter()
        .map(|lease| crate::RefreshRequest {
            key: lease.key(),
            owner: lease.owner(),
            ttl: SHORT_TTL,
        })
        .collect();
    let extra = [
        (keys[3].as_str(), released_owner.as_str()),
        (keys[5].as_str(), wrong_owner.as_str()),
        ("", leases[0].owner()),
    ];
    for (key, owner) in extra {
        requests.push(crate::RefreshRequest {
            key,
            owner,
            ttl: SHORT_TTL,
        });
    }
    let results = a.refresh_many(&requests).await;
    assert_eq!(results.len(), requests.len(), "one result per request");
    let held = LEASES - 1;
    for (index, result) in results.iter().enumerate() {
        let key = requests[index].key;
        match (caps.refresh, index.checked_sub(held)) {
            (false, _) => assert!(
                matches!(result, Err(Error::Unsupported { .. })),
                "{key:?}: {result:?}"
            ),
            (true, None) => assert!(result.is_ok(), "held {key:?}: {result:?}"),
            (true, Some(0 | 1)) => assert!(
                matches!(result, Err(Error::NotHeld { key: k }) if k == key),
                "{key:?}: {result:?}"
            ),
            (true, Some(_)) => assert!(
                matches!(result, Err(Error::InvalidInput { .. })),
                "the empty key: {result:?}"
            ),
        }
    }
    assert_held_elsewhere(&*b, &keys[5], "a wrong owner's refresh touches nothing").await;
    if caps.refresh && caps.expires {
        // The batch set every held lock's ttl to the short one.
        tokio::time::sleep(SHORT_TTL + Duration::from_millis(300)).await;
        for key in [&keys[0], &keys[LEASES / 2], &keys[LEASES - 1]] {
            let thief = acquire(&*b, key, LONG_TTL).await;
            thief.release().await.expect("release");
        }
        return;
    }
    for lease in leases {
        lease.release().await.expect("release");
    }
}

/// Refresh with a wrong owner token is `NotHeld` and does not extend.
pub async fn refresh_by_wrong_owner_is_not_held(h: &Harness) {
    let a = h.locker().await;
    let key = h.key("refresh-wrong-owner");
    let lease = acquire(&*a, &key, LONG_TTL).await;
    let result = a.refresh(&key, &crate::new_owner_token(), LONG_TTL).await;
    if a.capabilities().refresh {
        assert!(
            matches!(result, Err(Error::NotHeld { .. })),
            "got {result:?}"
        );
    } else {
        assert_unsupported(result, "refresh");
    }
    lease.release().await.expect("release");
}

/// `lock` with a timeout acquires once the holder releases within it.
pub async fn lock_waits_for_release(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("lock-waits");
    let lease = acquire(&*a, &key, LONG_TTL).await;
    let started = Instant::now();
    let waiter = spawn_waiter(&b, &key);
    tokio::time::sleep(Duration::from_millis(300)).await;
    lease.release().await.expect("release");
    let (lease, acquired_at) = waiter.await.expect("waiter task");
    let waited = acquired_at - started;
    let lease = lease.expect("the waiter gets the lock after the release");
    assert!(
        waited >= Duration::from_millis(250),
        "acquired after {waited:?}, before the release"
    );
    assert!(
        waited < Duration::from_secs(5),
        "took {waited:?} after a release at 300ms"
    );
    lease.release().await.expect("release by the waiter");
}

/// `lock` returns `Timeout` (not contention, not an error) when the holder
/// keeps the lock past the timeout, after about that long.
pub async fn lock_times_out_when_held(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("lock-timeout");
    let lease = acquire(&*a, &key, LONG_TTL).await;
    let started = Instant::now();
    let timeout = Duration::from_millis(500);
    match b.lock(&key, LONG_TTL, timeout).await {
        Err(Error::Timeout { key: named, waited }) => {
            assert_eq!(named, key);
            assert!(waited >= timeout, "reported {waited:?}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "took {took:?}"
    );
    lease.release().await.expect("release");
}

/// `lock` with a zero timeout makes one attempt and reports `NotAcquired`.
pub async fn zero_timeout_is_one_attempt(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("zero-timeout");
    let lease = a
        .lock(&key, LONG_TTL, Duration::ZERO)
        .await
        .expect("free key, one attempt");
    let started = Instant::now();
    match b.lock(&key, LONG_TTL, Duration::ZERO).await {
        Err(Error::NotAcquired { key: named }) => assert_eq!(named, key),
        other => panic!("expected NotAcquired, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "one attempt must not wait"
    );
    lease.release().await.expect("release");
}

/// Fencing tokens strictly increase across grants of one key, whichever
/// client gets them.
pub async fn fencing_tokens_strictly_increase(h: &Harness) {
    let lockers = [h.locker().await, h.locker().await];
    let key = h.key("fencing");
    let fencing = lockers[0].capabilities().fencing;
    let mut last = None;
    for round in 0..10 {
        let lease = acquire(&*lockers[round % 2], &key, LONG_TTL).await;
        let token = lease.fencing_token();
        assert_eq!(
            token.is_some(),
            fencing,
            "fencing capability and lease disagree"
        );
        if let (Some(previous), Some(token)) = (last, token) {
            assert!(
                token > previous,
                "round {round}: token {token} after {previous}"
            );
        }
        last = token;
        lease.release().await.expect("release");
    }
}

/// The backends of this crate, which all document [`Locker::forget`]: a
/// wrapper around one of them that answers `Unsupported` did not forward it.
const FORGETTING_BACKENDS: [&str; 7] = [
    "memory", "file", "redis", "redlock", "postgres", "etcd", "mysql",
];

/// [`Locker::forget`] of a held key is contention and leaves the holder's
/// lock intact; of a released key it succeeds (twice, too), after which the
/// key can be locked again, and where the backend keeps a fencing counter
/// per key that counter was really removed: the next token is 1 again.
/// Where the counter is shared by all keys (memory), tokens keep
/// increasing. `Unsupported` is accepted, consistently, only from backends
/// outside this crate.
pub async fn forget_removes_a_free_key_and_refuses_a_held_one(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("forget");
    let held = acquire(&*a, &key, LONG_TTL).await;
    let first = held.fencing_token();
    for (who, locker) in [("the holder's locker", &a), ("another client", &b)] {
        match locker.forget(&key).await {
            Err(Error::NotAcquired { key: named }) => assert_eq!(named, key),
            Err(Error::Unsupported { .. }) if !FORGETTING_BACKENDS.contains(&a.backend()) => {
                held.release().await.expect("release");
                let free = b.forget(&key).await;
                assert!(
                    matches!(free, Err(Error::Unsupported { .. })),
                    "forget is unsupported for a held key but gave {free:?} for a free one"
                );
                return;
            }
            other => panic!("forget of a held key by {who} must be NotAcquired, got {other:?}"),
        }
    }
    assert_held_elsewhere(&*b, &key, "a refused forget must leave the lock").await;
    held.release()
        .await
        .expect("the holder still holds its lock after the refused forgets");
    let second = acquire(&*b, &key, LONG_TTL).await;
    let before = second.fencing_token();
    second.release().await.expect("release");
    // A fresh key tells a per-key counter (it starts at 1) from a shared one.
    let probe = acquire(&*a, &h.key("forget-probe"), LONG_TTL).await;
    let per_key = first == Some(1) && probe.fencing_token() == Some(1);
    probe.release().await.expect("release the probe");
    b.forget(&key).await.expect("forget of a released key");
    a.forget(&key).await.expect("forget of a forgotten key");
    let again = acquire(&*a, &key, LONG_TTL).await;
    match (before, again.fencing_token()) {
        (Some(_), Some(after)) if per_key => {
            assert_eq!(
                after, 1,
                "the key's fencing counter must be gone after forget"
            )
        }
        (Some(before), Some(after)) => assert!(
            after > before,
            "a shared fencing counter must keep increasing: {after} after {before}"
        ),
        (None, None) => {}
        other => panic!("fencing tokens appeared or vanished across forget: {other:?}"),
    }
    again.release().await.expect("release after forget");
    b.forget(&key).await.expect("clean up");
}

/// [`Locker::advance_mark`] only raises a mark, across clients: a lower or
/// equal value is refused with the stored mark, a higher one moves it; a
/// mark and a lock may share a name; a backend without marks says
/// [`Error::Unsupported`] for every call.
pub async fn marks_only_advance(h: &Harness) {
    use crate::MarkAdvance::{Advanced, AlreadyAt};
    let (a, b) = (h.locker().await, h.locker().await);
    let name = h.key("mark");
    if !a.capabilities().marks {
        let refused = a.advance_mark(&name, 1).await;
        assert!(
            matches!(refused, Err(Error::Unsupported { .. })),
            "{} declares no marks, so advance_mark must be Unsupported, got {refused:?}",
            a.backend()
        );
        return;
    }
    // A lock of the same name neither blocks nor changes the mark.
    let lease = acquire(&*a, &name, LONG_TTL).await;
    let first = a.advance_mark(&name, 1_000).await;
    assert_eq!(first.ok(), Some(Advanced { previous: None }));
    lease.release().await.expect("release");
    for (value, who) in [
        (1_000, "the same value"),
        (999, "a lower value"),
        (-5, "a negative value"),
    ] {
        let again = b.advance_mark(&name, value).await;
        assert_eq!(
            again.ok(),
            Some(AlreadyAt { current: 1_000 }),
            "{who} from another client"
        );
    }
    let later = b.advance_mark(&name, 2_000).await;
    assert_eq!(
        later.ok(),
        Some(Advanced {
            previous: Some(1_000)
        })
    );
    let seen = a.advance_mark(&name, 1_500).await;
    assert_eq!(
        seen.ok(),
        Some(AlreadyAt { current: 2_000 }),
        "the first client sees the second's mark"
    );
    // Extremes are stored exactly.
    let extreme = h.key("mark-extreme");
    assert_eq!(
        a.advance_mark(&extreme, i64::MIN).await.ok(),
        Some(Advanced { previous: None })
    );
    assert_eq!(
        b.advance_mark(&extreme, i64::MAX).await.ok(),
        Some(Advanced {
            previous: Some(i64::MIN)
        })
    );
    assert_eq!(
        a.advance_mark(&extreme, i64::MAX).await.ok(),
        Some(AlreadyAt { current: i64::MAX })
    );
    // Bad names are rejected like bad keys.
    for bad in [String::new(), "x".repeat(crate::validate::MAX_KEY_LEN + 1)] {
        let refused = a.advance_mark(&bad, 1).await;
        assert!(
            matches!(refused, Err(Error::InvalidInput { .. })),
            "a {}-byte mark name must be InvalidInput, got {refused:?}",
            bad.len()
        );
    }
}

/// Concurrent advances of one mark to one value, from several clients:
/// exactly one is told it advanced the mark (the scheduler's "exactly one
/// replica runs this tick").
pub async fn one_of_concurrent_advances_wins(h: &Harness) {
    const CLIENTS: usize = 4;
    const ROUNDS: i64 = 10;
    let name = h.key("mark-race");
    let probe = h.locker().await;
    if !probe.capabilities().marks {
        return; // `marks_only_advance` checks the refusal.
    }
    let mut lockers = Vec::new();
    for _ in 0..CLIENTS {
        lockers.push(h.locker().await);
    }
    for round in 1..=ROUNDS {
        let mut tasks = Vec::new();
        for locker in &lockers {
            let (locker, name) = (locker.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                locker.advance_mark(&name, round).await
            }));
        }
        let mut winners = 0;
        for task in tasks {
            match task.await.expect("advance task panicked") {
                Ok(crate::MarkAdvance::Advanced { previous }) => {
                    winners += 1;
                    let expected = (round > 1).then_some(round - 1);
                    assert_eq!(
                        previous, expected,
                        "round {round}: the winner saw the last round"
                    );
                }
                Ok(crate::MarkAdvance::AlreadyAt { current }) => {
                    assert_eq!(
                        current, round,
                        "round {round}: a loser saw the winner's mark"
                    );
                }
                Err(e) => panic!("round {round}: advance_mark failed: {e}"),
            }
        }
        assert_eq!(
            winners, 1,
            "round {round}: exactly one client advances the mark"
        );
    }
}

/// Many tasks on several clients contending for one key never overlap: a
/// read-sleep-write increment of a shared counter loses no update.
pub async fn contending_tasks_never_overlap(h: &Harness) {
    const CLIENTS: usize = 4;
    const TASKS_PER_CLIENT: usize = 2;
    const ROUNDS: u64 = 8;
    let key = h.key("overlap");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let locker = h.locker().await;
        for _ in 0..TASKS_PER_CLIENT {
            let (locker, key, counter, inside) =
                (locker.clone(), key.clone(), counter.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lease = locker
                        .lock(&key, LONG_TTL, Duration::from_secs(60))
                        .await
                        .expect("lock within 60s");
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    // Deliberately not atomic: overlapping holders lose updates.
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    lease.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("contender panicked");
    }
    let expected = (CLIENTS * TASKS_PER_CLIENT) as u64 * ROUNDS;
    assert_eq!(counter.load(Ordering::SeqCst), expected);
}

/// Cancelling `with_lock` while its work runs still releases the lock
/// promptly: another client gets it long before the ttl.
pub async fn with_lock_cancellation_releases_promptly(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("cancel");
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let holder = {
        let key = key.clone();
        tokio::spawn(async move {
            with_lock(&*a, &key, LONG_TTL, Duration::ZERO, || async move {
                let _ = started_tx.send(());
                std::future::pending::<()>().await
            })
            .await
        })
    };
    started_rx.await.expect("the guarded work started");
    holder.abort();
    let _ = holder.await;
    let started = Instant::now();
    let lease = b
        .lock(&key, LONG_TTL, Duration::from_secs(5))
        .await
        .expect("the cancelled holder released within 5s (ttl 30s)");
    assert!(started.elapsed() < Duration::from_secs(5));
    lease.release().await.expect("release");
}

/// A lease dropped without `release` is released in the background.
pub async fn dropped_lease_is_released(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("drop");
    drop(acquire(&*a, &key, LONG_TTL).await);
    let lease = b
        .lock(&key, LONG_TTL, Duration::from_secs(5))
        .await
        .expect("the dropped lease was released within 5s (ttl 30s)");
    lease.release().await.expect("release");
}

/// `with_lock` runs the work once and releases; on contention it does not run
/// it and reports `NotAcquired`.
pub async fn with_lock_runs_and_releases(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("with-lock");
    let value = with_lock(&*a, &key, LONG_TTL, Duration::ZERO, || async { 7 })
        .await
        .expect("with_lock on a free key");
    assert_eq!(value, 7);
    let lease = acquire(&*b, &key, LONG_TTL).await;
    let ran = AtomicBool::new(false);
    let result = with_lock(&*a, &key, LONG_TTL, Duration::ZERO, || async {
        ran.store(true, Ordering::SeqCst)
    })
    .await;
    assert!(
        matches!(result, Err(Error::NotAcquired { .. })),
        "got {result:?}"
    );
    assert!(
        !ran.load(Ordering::SeqCst),
        "work must not run without the lock"
    );
    lease.release().await.expect("release");
}

/// Empty and oversized keys and a zero ttl are `InvalidInput` naming the
/// problem, from every operation.
pub async fn invalid_inputs_are_rejected(h: &Harness) {
    let a = h.locker().await;
    let long = "k".repeat(crate::validate::MAX_KEY_LEN + 1);
    let ttl = LONG_TTL;
    let expect = |what: &str, result: crate::Result<()>| match result {
        Err(Error::InvalidInput { what: named, .. }) => assert_eq!(named, what),
        other => panic!("expected invalid {what}, got {other:?}"),
    };
    expect("key", a.try_lock("", ttl).await.map(drop));
    expect("key", a.try_lock(&long, ttl).await.map(drop));
    expect("ttl", a.try_lock("k", Duration::ZERO).await.map(drop));
    expect(
        "key",
        a.lock("", ttl, Duration::from_secs(1)).await.map(drop),
    );
    expect(
        "ttl",
        a.lock("k", Duration::ZERO, Duration::from_secs(1))
            .await
            .map(drop),
    );
    expect("key", a.unlock("", "owner").await);
    expect("key", a.unlock(&long, "owner").await);
    if a.capabilities().refresh {
        expect("key", a.refresh("", "owner", ttl).await);
        expect("ttl", a.refresh("k", "owner", Duration::ZERO).await);
    }
}

/// A lease reports its key, ttl and a non-empty owner; its `Debug` never
/// shows the owner token.
pub async fn lease_reports_its_facts(h: &Harness) {
    let a = h.locker().await;
    let key = h.key("facts");
    let lease = acquire(&*a, &key, LONG_TTL).await;
    assert_eq!(lease.key(), key);
    assert_eq!(lease.ttl(), LONG_TTL);
    assert!(
        lease.owner().len() >= 16,
        "owner token too short to be unguessable"
    );
    assert!(!lease.is_lost());
    assert_eq!(lease.valid_until().is_some(), a.capabilities().expires);
    let debug = format!("{lease:?}");
    assert!(
        !debug.contains(lease.owner()),
        "Debug leaks the owner token: {debug}"
    );
    let mut lost = lease.lost_signal();
    lease.release().await.expect("release");
    assert_eq!(lost.wait().await, LostReason::Released);
}

/// Unlock by owner token from another client works where the backend says it
/// does, and is `Unsupported` (not a silent success) where it does not.
pub async fn unlock_by_owner_token(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("unlock-by-owner");
    let lease = acquire(&*a, &key, LONG_TTL).await;
    let owner = lease.owner().to_owned();
    let result = b.unlock(&key, &owner).await;
    if a.capabilities().unlock_by_owner {
        result.expect("unlock by owner token from another client");
        assert_free(&*b, &key, "release").await;
        assert!(matches!(lease.release().await, Err(Error::NotHeld { .. })));
    } else {
        assert_unsupported(result, "unlock_by_owner");
        a.unlock(&key, &owner)
            .await
            .expect("unlock by owner token on the holding client");
        drop(lease);
    }
}

/// With keepalive, a lease outlives several ttls and stays held.
pub async fn keepalive_holds_past_ttl(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("keepalive");
    let mut lease = acquire(&*a, &key, SHORT_TTL).await;
    lease
        .keep_alive(KeepAlive::default())
        .expect("keepalive starts");
    tokio::time::sleep(SHORT_TTL * 4).await;
    assert_held_elsewhere(&*b, &key, "keepalive renews it").await;
    assert_eq!(lease.lost_signal().reason(), None);
    lease.release().await.expect("release");
    assert_free(&*b, &key, "free after release").await;
}

/// When the lock is taken from a kept-alive lease (released by owner token,
/// then acquired by another client), the lost signal fires with `NotHeld`.
pub async fn keepalive_fires_lost_when_stolen(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("stolen");
    let mut lease = acquire(&*a, &key, SHORT_TTL).await;
    lease
        .keep_alive(KeepAlive::default())
        .expect("keepalive starts");
    let mut lost = lease.lost_signal();
    a.unlock(&key, lease.owner())
        .await
        .expect("release behind the lease's back");
    let thief = acquire(&*b, &key, LONG_TTL).await;
    let reason = lost_within(&mut lost, Duration::from_secs(3)).await;
    assert_eq!(reason, LostReason::NotHeld);
    assert_drop_frees_nothing(lease, &*a, "the thief's lock").await;
    thief.release().await.expect("release by the new holder");
}

/// `max_hold` stops renewal: the lost signal fires with `MaxHoldExceeded`
/// about then, but the lock is never freed under the holder's feet: it stays
/// held until released (or, where locks expire, until its last ttl runs out,
/// with no refresh after the max hold).
pub async fn max_hold_ends_renewal(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("max-hold");
    let max_hold = Duration::from_millis(900);
    // Refreshed every second: none is due before the max hold, so an expiring
    // lock lapses one ttl after the grant if renewal really stopped.
    let ttl = Duration::from_secs(3);
    let mut lease = acquire(&*a, &key, ttl).await;
    lease
        .keep_alive(KeepAlive::default().max_hold(max_hold))
        .expect("keepalive starts");
    let mut lost = lease.lost_signal();
    let reason = lost_within(&mut lost, Duration::from_secs(5)).await;
    assert_eq!(reason, LostReason::MaxHoldExceeded);
    assert!(lease.acquired_at().elapsed() >= max_hold - Duration::from_millis(50));
    assert_held_elsewhere(
        &*b,
        &key,
        "max_hold must not free the lock while the holder may still be working",
    )
    .await;
    if a.capabilities().expires {
        let next = b
            .lock(&key, LONG_TTL, Duration::from_secs(5))
            .await
            .expect("free once the last ttl ran out");
        assert!(
            lease.acquired_at().elapsed() >= ttl - Duration::from_millis(100),
            "freed {:?} after the grant, before its ttl: renewal or a release at max hold freed it",
            lease.acquired_at().elapsed()
        );
        next.release().await.expect("release");
        drop(lease);
    } else {
        lease.release().await.expect("release after max hold");
        assert_free(&*b, &key, "free after the release").await;
    }
}

/// `with_lock` around work longer than its ttl finishes on every backend:
/// the lease is kept alive by default, so the same code means the same
/// thing on a backend whose locks expire and on one whose locks live on a
/// session; and the key is held throughout.
pub async fn with_lock_outlasting_its_ttl_finishes(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("with-lock-long");
    // 1 s: every backend's smallest ttl that refreshes comfortably under
    // load (etcd rounds leases up to whole seconds anyway).
    let ttl = Duration::from_secs(1);
    let work = Duration::from_millis(2200);
    let value = with_lock(&*a, &key, ttl, Duration::ZERO, || {
        let (b, key) = (b.clone(), key.clone());
        async move {
            tokio::time::sleep(work / 2).await;
            assert_held_elsewhere(&*b, &key, "halfway through work longer than the ttl").await;
            tokio::time::sleep(work / 2).await;
            11
        }
    })
    .await
    .expect("work longer than its ttl finishes under with_lock");
    assert_eq!(value, 11);
    assert_free(&*b, &key, "released after the work").await;
}

/// `with_lock`-style work outliving its lease is stopped (dropped) before
/// the lock is released, and the caller is told the lock was lost: here the
/// lease's `max_hold` passes while the work would run for ever.
pub async fn with_lock_stops_work_when_the_lease_ends(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("with-lock-lost");
    let stopped = Arc::new(AtomicBool::new(false));
    /// Sets its flag when dropped: the work has stopped.
    struct Stopped(Arc<AtomicBool>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let started = Instant::now();
    let result = crate::WithLock::default()
        .keep_alive(KeepAlive::default().max_hold(Duration::from_millis(500)))
        .run(&*a, &key, LONG_TTL, Duration::ZERO, |_| {
            let guard = Stopped(stopped.clone());
            async move {
                let _guard = guard;
                std::future::pending::<()>().await
            }
        })
        .await;
    match result {
        Err(Error::Lost {
            key: named,
            reason: LostReason::MaxHoldExceeded,
        }) => assert_eq!(named, key),
        other => panic!("expected Lost(MaxHoldExceeded), got {other:?}"),
    }
    assert!(stopped.load(Ordering::SeqCst), "the work was stopped");
    assert!(started.elapsed() >= Duration::from_millis(450));
    assert_free(&*b, &key, "released once the work stopped").await;
}

/// Where the backend notifies releases, a waiter acquires within a few
/// milliseconds of the release, not by polling luck (polling at the default
/// policy is 100–200 ms apart by then): at most one round of five over
/// 60 ms (a loaded test machine can delay one wake-up; a polling waiter
/// lands under 60 ms in about two rounds of five), and none over the
/// polling bound. Elsewhere, waiters acquire within the polling interval
/// every round.
pub async fn waiter_wakes_promptly_on_release(h: &Harness) {
    const ROUNDS: usize = 5;
    let polling_bound = Duration::from_millis(600);
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("wakeup");
    let native = a.capabilities().release_wakeup;
    let (bound, slow_rounds_allowed) = if native {
        (Duration::from_millis(60), 1)
    } else {
        (polling_bound, 0)
    };
    let mut latencies = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let lease = acquire(&*a, &key, LONG_TTL).await;
        let waiter = spawn_waiter(&b, &key);
        // Long enough for a polling waiter to reach its largest delay.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let released_at = Instant::now();
        lease.release().await.expect("release");
        let (lease, acquired_at) = waiter.await.expect("waiter task");
        let lease = lease.expect("the waiter acquires");
        let latency = acquired_at - released_at;
        eprintln!(
            "{}: round {round}: waiter acquired {latency:?} after the release",
            a.backend()
        );
        latencies.push(latency);
        lease.release().await.expect("release");
    }
    let slow = latencies
        .iter()
        .filter(|&&latency| latency >= bound)
        .count();
    assert!(
        slow <= slow_rounds_allowed && latencies.iter().all(|&latency| latency < polling_bound),
        "{slow} of {ROUNDS} waiters acquired {bound:?} or more after the release \
         (allowed: {slow_rounds_allowed}, none over {polling_bound:?}; native wake-up: \
         {native}): {latencies:?}"
    );
}

/// Asserts that `held` describes `lease`, granted between `before` and
/// `after` by this process under `label`, as far as `caps` say the backend
/// can tell.
fn assert_describes(
    held: &HeldLock,
    lease: &crate::Lease,
    label: &str,
    caps: crate::Capabilities,
    (before, after): (SystemTime, SystemTime),
) {
    let key = lease.key();
    assert_eq!(held.key, key, "inspect names the caller's key");
    let holder = held
        .holder
        .as_ref()
        .unwrap_or_else(|| panic!("{key:?}: a distlock grant records its holder: {held:?}"));
    assert_eq!(holder.pid, std::process::id(), "holder pid: {held:?}");
    assert_eq!(
        holder.host,
        crate::inspect::host_name(),
        "holder host: {held:?}"
    );
    assert_eq!(holder.label, label, "holder label: {held:?}");
    let granted = held
        .granted
        .unwrap_or_else(|| panic!("{key:?}: the grant time is recorded: {held:?}"));
    // A server clock on this machine agrees with ours within a second or two.
    let slack = match granted.clock {
        crate::inspect::Clock::Holder => Duration::from_millis(5),
        crate::inspect::Clock::Server => Duration::from_secs(2),
    };
    let (earliest, latest) = (before - slack, after + slack);
    assert!(
        granted.at >= earliest && granted.at <= latest,
        "{key:?}: granted at {:?}, outside [{earliest:?}, {latest:?}]",
        granted.at
    );
    assert_eq!(held.ttl, Some(lease.ttl()), "the granted ttl: {held:?}");
    match caps.expires {
        true => {
            let left = held
                .ttl_left
                .unwrap_or_else(|| panic!("{key:?}: an expiring lock has a ttl left: {held:?}"));
            assert!(
                left <= lease.ttl(),
                "{key:?}: {left:?} left of {:?}",
                lease.ttl()
            );
        }
        // A lock that does not expire while its holder lives may still say
        // how long it would outlive a holder that stopped renewing now
        // (etcd: the session lease's time to live, in whole seconds, of a
        // lease of the ttl rounded up): never more than that.
        false => {
            if let Some(left) = held.ttl_left {
                let whole_seconds = Duration::from_secs(lease.ttl().as_secs_f64().ceil() as u64);
                assert!(
                    left <= whole_seconds,
                    "{key:?}: {left:?} left of {:?}",
                    lease.ttl()
                );
            }
        }
    }
    match caps.fencing {
        true => assert_eq!(
            held.fencing_token,
            lease.fencing_token(),
            "fencing token: {held:?}"
        ),
        false => assert_eq!(
            held.fencing_token, None,
            "no fencing on this backend: {held:?}"
        ),
    }
}

fn assert_unsupported<T: std::fmt::Debug>(result: Result<T, Error>, operation: &str) {
    match result {
        Err(Error::Unsupported { .. }) => {}
        other => {
            panic!("{operation} is not in the capabilities, so it must be Unsupported: {other:?}")
        }
    }
}

/// `inspect` says nobody holds a free key; describes a held one in every
/// field the backend can tell (holder host, pid and label, grant time, ttl,
/// ttl left, fencing token), from another client too; and says free again
/// after release and, where locks expire, after expiry.
pub async fn inspect_reports_the_holder_then_free(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("inspect");
    let caps = a.capabilities();
    if !caps.inspect {
        assert_unsupported(b.inspect(&key).await, "inspect");
        return;
    }
    assert_eq!(b.inspect(&key).await.expect("inspect a free key"), None);
    let before = SystemTime::now();
    let lease = with_label("conformance inspect", acquire(&*a, &key, LONG_TTL)).await;
    let after = SystemTime::now();
    for (who, locker) in [("the holder's locker", &a), ("another client", &b)] {
        let held = locker
            .inspect(&key)
            .await
            .unwrap_or_else(|e| panic!("inspect from {who}: {e}"))
            .unwrap_or_else(|| panic!("{who} must see {key:?} held"));
        assert_describes(&held, &lease, "conformance inspect", caps, (before, after));
    }
    lease.release().await.expect("release");
    assert_eq!(b.inspect(&key).await.expect("inspect after release"), None);
    assert!(matches!(
        b.inspect("").await,
        Err(Error::InvalidInput { what: "key", .. })
    ));

    if caps.expires {
        let lease = acquire(&*a, &key, SHORT_TTL).await;
        tokio::time::sleep(SHORT_TTL + Duration::from_millis(300)).await;
        assert_eq!(
            b.inspect(&key).await.expect("inspect after expiry"),
            None,
            "an expired lock is free"
        );
        drop(lease);
    }
}

/// `list(prefix)` reports exactly the locks held under the prefix, sorted
/// by key and described as `inspect` would, and nothing released.
pub async fn list_reports_held_locks_under_a_prefix(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let base = h.key("list");
    let caps = a.capabilities();
    if !caps.list {
        assert_unsupported(b.list(&base).await, "list");
        return;
    }
    let prefix = format!("{base}/");
    let (first, second, released) = (
        format!("{prefix}a"),
        format!("{prefix}b"),
        format!("{prefix}c"),
    );
    let outside = format!("{base}-outside");
    let before = SystemTime::now();
    let leases = with_label("conformance list", async {
        let mut leases = Vec::new();
        // Taken out of order: the listing sorts.
        for key in [&second, &outside, &first, &released] {
            leases.push(acquire(&*a, key, LONG_TTL).await);
        }
        leases
    })
    .await;
    let after = SystemTime::now();
    let mut leases = leases.into_iter();
    let (second_lease, outside_lease, first_lease, released_lease) = (
        leases.next().expect("four leases"),
        leases.next().expect("four leases"),
        leases.next().expect("four leases"),
        leases.next().expect("four leases"),
    );
    released_lease.release().await.expect("release");

    let listed = b.list(&prefix).await.expect("list");
    let keys: Vec<&str> = listed.iter().map(|held| held.key.as_str()).collect();
    assert_eq!(
        keys,
        [first.as_str(), second.as_str()],
        "listed: {listed:?}"
    );
    for (held, lease) in listed.iter().zip([&first_lease, &second_lease]) {
        assert_describes(held, lease, "conformance list", caps, (before, after));
    }
    for lease in [first_lease, second_lease, outside_lease] {
        lease.release().await.expect("release");
    }
    let listed = b.list(&prefix).await.expect("list after release");
    assert!(listed.is_empty(), "nothing is held any more: {listed:?}");
}

/// `force_release` frees a held lock whoever holds it and returns the
/// evicted holder; the old holder's refresh then fails and its lost signal
/// fires; the next grant's token is higher; the old lease's drop frees
/// nothing; a free key is `Ok(None)`. Backends that can only end the
/// holder's session are asked for that by name; backends without it say
/// `Unsupported`.
pub async fn force_release_evicts_the_holder(h: &Harness) {
    let (a, b) = (h.locker().await, h.locker().await);
    let key = h.key("force-release");
    let caps = a.capabilities();
    let mut lease = with_label("to be evicted", acquire(&*a, &key, LONG_TTL)).await;
    if !caps.force_release {
        for how in [ForceRelease::Lock, ForceRelease::TerminateSession] {
            assert_unsupported(b.force_release(&key, how).await, "force_release");
        }
        assert_held_elsewhere(&*b, &key, "an unsupported force release frees nothing").await;
        lease.release().await.expect("release");
        return;
    }
    let mut lost = lease.lost_signal();
    let (how, evicted) = match b.force_release(&key, ForceRelease::Lock).await {
        Err(Error::Unsupported { .. }) => {
            let how = ForceRelease::TerminateSession;
            (how, b.force_release(&key, how).await)
        }
        other => (ForceRelease::Lock, other),
    };
    let evicted = evicted
        .unwrap_or_else(|e| panic!("force release ({how:?}): {e}"))
        .expect("a held key's force release returns the evicted holder");
    assert_eq!(evicted.key, key);
    assert_eq!(evicted.fencing_token, lease.fencing_token());
    let holder = evicted.holder.expect("the evicted holder's record");
    assert_eq!(
        (holder.pid, holder.label.as_str()),
        (std::process::id(), "to be evicted")
    );

    // Free for the next holder (a terminated session's locks are freed once
    // the server has ended it).
    let deadline = Instant::now() + Duration::from_secs(10);
    let next = loop {
        match b.try_lock(&key, LONG_TTL).await {
            Ok(Some(next)) => break next,
            Ok(None) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("{key:?} must be free after a force release ({how:?}): {other:?}"),
        }
    };
    if caps.fencing {
        assert!(
            next.fencing_token() > lease.fencing_token(),
            "the next grant's token is higher"
        );
    }

    // The evicted holder learns it at its next refresh (or, its session
    // ended, when its connection dies).
    if caps.refresh {
        match (how, lease.refresh(LONG_TTL).await) {
            (_, Err(Error::NotHeld { .. })) => {}
            (ForceRelease::TerminateSession, Err(Error::Lost { .. } | Error::Backend { .. })) => {}
            (_, other) => panic!("the evicted holder's refresh must fail ({how:?}): {other:?}"),
        }
        let reason = lost_within(&mut lost, Duration::from_secs(5)).await;
        if how == ForceRelease::Lock {
            assert_eq!(reason, LostReason::NotHeld);
        }
    }
    assert_drop_frees_nothing(lease, &*a, "the next holder's lock").await;
    next.release().await.expect("release by the next holder");
    assert_eq!(
        b.force_release(&key, how)
            .await
            .expect("force release of a free key"),
        None
    );
}

/// A waiter's grant (through [`Locker::lock`], the backend's native wait
/// where it has one) records its holder as a `try_lock` grant does, whatever
/// its label holds (quotes, a backslash, SQL, non-ASCII text, a line
/// break); where the backend lists, a non-ASCII prefix of the key finds it
/// and a prefix differing only in case does not.
pub async fn a_waiters_grant_records_its_holder_whatever_its_label(h: &Harness) {
    let (holder, waiter) = (h.locker().await, h.locker().await);
    let caps = holder.capabilities();
    if !caps.inspect {
        // `inspect_reports_the_holder_then_free` checks it is Unsupported.
        return;
    }
    let base = h.key("wait-record");
    let key = format!("{base}-Wait Record ünï");
    let first = acquire(&*holder, &key, LONG_TTL).await;
    let label = "it's a \\ label'); DROP TABLE distlock_fencing; -- ünïcødé\n2nd line";
    let ttl = Duration::from_secs(7);
    let before = SystemTime::now();
    let wait = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        with_label(label, async move {
            waiter.lock(&key, ttl, Duration::from_secs(20)).await
        })
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.release().await.expect("release");
    let lease = wait
        .await
        .expect("the waiter's task")
        .expect("the waiter wins");
    let after = SystemTime::now();
    let held = inspect_held(&*holder, &key).await;
    assert_describes(&held, &lease, label, caps, (before, after));
    if caps.list {
        let listed = holder
            .list(&format!("{base}-Wait Record ü"))
            .await
            .expect("list");
        assert_eq!(listed.len(), 1, "a non-ASCII prefix matches: {listed:?}");
        assert!(
            holder
                .list(&format!("{base}-wait record"))
                .await
                .expect("list")
                .is_empty(),
            "case matters"
        );
    }
    lease.release().await.expect("release");
}

/// For backends that store names and labels in SQL text columns, which
/// cannot hold a zero byte (Postgres refuses it): a key with one is still
/// locked, waited for and inspected (not listed: no name is stored), and a
/// label's zero byte is recorded as U+FFFD. Not part of
/// [`conformance_suite!`](crate::conformance_suite): run it with
/// `conformance_suite!(@checks factory; a_zero_byte_in_a_key_or_label_does_not_break_the_grant)`.
pub async fn a_zero_byte_in_a_key_or_label_does_not_break_the_grant(h: &Harness) {
    let (locker, waiter) = (h.locker().await, h.locker().await);
    let base = h.key("zero");
    let key = format!("{base}\0byte");
    let lease = with_label("a\0b", acquire(&*locker, &key, LONG_TTL)).await;
    let held = inspect_held(&*locker, &key).await;
    assert_eq!(held.holder.expect("recorded").label, "a\u{fffd}b");
    assert!(locker.list(&base).await.expect("list").is_empty());
    // The native wait's statement too.
    let wait = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        with_label("c\0d", async move {
            waiter.lock(&key, LONG_TTL, Duration::from_secs(20)).await
        })
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    lease.release().await.expect("release");
    let next = wait.await.expect("join").expect("the waiter wins");
    let held = inspect_held(&*locker, &key).await;
    assert_eq!(held.holder.expect("recorded").label, "c\u{fffd}d");
    next.release().await.expect("release");
}

/// For session backends whose holder recording and fencing can be turned
/// off (`on` records, `off` does not, `bare` has no fencing table), on
/// `key` and `bare_key`: a grant without recording clears the previous
/// holder's record but keeps the token, grant time and ttl; without fencing
/// a lock is inspected by its session (whose description starts with
/// `session_prefix`) with neither holder nor token, and `list` is
/// `Unsupported` naming fencing. Returns what `on` saw of the unrecorded
/// grant, for the backend's own checks.
///
/// Not a [`Harness`] check: it needs lockers configured three ways.
pub async fn recording_off_clears_the_holder_and_fencing_off_leaves_no_name(
    (on, off, bare): (&dyn Locker, &dyn Locker, &dyn Locker),
    (key, bare_key): (&str, &str),
    session_prefix: &str,
) -> HeldLock {
    acquire(on, key, LONG_TTL)
        .await
        .release()
        .await
        .expect("release");
    let lease = acquire(off, key, LONG_TTL).await;
    let held = inspect_held(on, key).await;
    assert_eq!(
        held.holder, None,
        "the earlier holder's columns are cleared"
    );
    assert_eq!(held.fencing_token, lease.fencing_token());
    assert!(
        held.granted.is_some() && held.ttl == Some(LONG_TTL),
        "{held:?}"
    );
    lease.release().await.expect("release");

    assert!(!bare.capabilities().list);
    let lease = acquire(bare, bare_key, LONG_TTL).await;
    let bare_held = inspect_held(bare, bare_key).await;
    assert_eq!((bare_held.holder, bare_held.fencing_token), (None, None));
    assert!(bare_held
        .session
        .expect("session")
        .starts_with(session_prefix));
    match bare.list("").await {
        Err(Error::Unsupported { reason, .. }) => assert!(reason.contains("fencing"), "{reason}"),
        other => panic!("list without fencing: {other:?}"),
    }
    lease.release().await.expect("release");
    held
}

/// For session backends (locks live on server sessions, freed only by
/// ending one): `holder` keeps both `keys` on one session. Then
/// [`ForceRelease::Lock`] is `Unsupported` naming `TerminateSession` and
/// that it frees EVERY lock of the session; the holder cannot end its own
/// session (`Unsupported` containing `own_session`); another locker's
/// [`ForceRelease::TerminateSession`] returns the evicted holder, and by the
/// time it returns both locks are free and both leases are lost as
/// [`LostReason::ConnectionLost`].
///
/// Not a [`Harness`] check: it needs a locker configured to one session.
pub async fn terminating_a_session_frees_every_lock_it_holds(
    (holder, operator): (&dyn Locker, &dyn Locker),
    (first, second): (&str, &str),
    own_session: &str,
) {
    let lease_a = acquire(holder, first, LONG_TTL).await;
    let lease_b = acquire(holder, second, LONG_TTL).await;
    let (mut lost_a, mut lost_b) = (lease_a.lost_signal(), lease_b.lost_signal());

    match operator.force_release(first, ForceRelease::Lock).await {
        Err(Error::Unsupported { reason, .. }) => {
            assert!(
                reason.contains("TerminateSession") && reason.contains("EVERY"),
                "{reason}"
            )
        }
        other => panic!("ForceRelease::Lock on {}: {other:?}", operator.backend()),
    }
    match holder
        .force_release(first, ForceRelease::TerminateSession)
        .await
    {
        Err(Error::Unsupported { reason, .. }) => {
            assert!(reason.contains(own_session), "{reason}")
        }
        other => panic!("terminating its {own_session}: {other:?}"),
    }
    assert!(operator.inspect(first).await.expect("inspect").is_some());

    let evicted = operator
        .force_release(first, ForceRelease::TerminateSession)
        .await
        .expect("force release")
        .expect("held");
    assert_eq!(evicted.fencing_token, lease_a.fencing_token());
    for key in [first, second] {
        assert_eq!(
            operator.inspect(key).await.expect("inspect"),
            None,
            "{key}: every lock of the session is free once the call returns"
        );
    }
    for lost in [&mut lost_a, &mut lost_b] {
        let reason = lost_within(lost, Duration::from_secs(5)).await;
        assert_eq!(reason, LostReason::ConnectionLost);
    }
}

/// For SQL backends, after `locker` upgraded a fencing table created before
/// holder records, whose row for `key` held token 41: the next grant
/// continues the counter at 42 and records its holder.
///
/// Not a [`Harness`] check: it needs a table made with the server's SQL.
pub async fn an_upgraded_fencing_table_continues_its_counter(locker: &dyn Locker, key: &str) {
    let lease = with_label("after the upgrade", acquire(locker, key, LONG_TTL)).await;
    assert_eq!(lease.fencing_token(), Some(42), "the counter goes on");
    let held = inspect_held(locker, key).await;
    assert_eq!(held.holder.expect("recorded").label, "after the upgrade");
    lease.release().await.expect("release");
}

/// For session backends: `weak`, a locker whose server account may not end
/// other sessions, asks to end the session `holder` holds `key` on. The
/// server's refusal comes back as [`Error::Backend`] whose source contains
/// every one of `reasons` (say, its error code and the missing privilege),
/// and the lock stays held.
///
/// Not a [`Harness`] check: it needs a locker with a weaker account.
pub async fn a_refused_termination_keeps_the_lock(
    (weak, holder): (&dyn Locker, &dyn Locker),
    key: &str,
    reasons: &[&str],
) {
    let lease = acquire(holder, key, LONG_TTL).await;
    match weak
        .force_release(key, ForceRelease::TerminateSession)
        .await
    {
        Err(Error::Backend { source, .. }) => {
            let text = source.to_string();
            assert!(reasons.iter().all(|reason| text.contains(reason)), "{text}");
        }
        other => panic!("force release without the privilege: {other:?}"),
    }
    assert!(
        holder.refresh(key, lease.owner(), LONG_TTL).await.is_ok(),
        "still held"
    );
    lease.release().await.expect("release");
}

/// Expands to one `#[tokio::test]` per conformance check, each building its
/// [`Harness`](crate::testkit::Harness) from `$factory` (see the
/// [`testkit`](crate::testkit) docs). Needs `tokio` with the `macros` and
/// `rt-multi-thread` features in the calling crate's dev-dependencies.
///
/// `conformance_suite!(@checks factory; check, ...)` runs only the named
/// checks, e.g. ones outside the suite that hold for some backends only
/// ([`a_zero_byte_in_a_key_or_label_does_not_break_the_grant`](crate::testkit::a_zero_byte_in_a_key_or_label_does_not_break_the_grant)).
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::conformance_suite!(@checks $factory;
            try_twice_second_is_contention,
            release_then_reacquire,
            wrong_owner_gets_not_held_and_deletes_nothing,
            double_release_is_not_held,
            ttl_semantics,
            refresh_semantics,
            refresh_by_wrong_owner_is_not_held,
            refresh_many_answers_each_lease,
            lock_waits_for_release,
            lock_times_out_when_held,
            zero_timeout_is_one_attempt,
            fencing_tokens_strictly_increase,
            contending_tasks_never_overlap,
            with_lock_cancellation_releases_promptly,
            dropped_lease_is_released,
            with_lock_runs_and_releases,
            invalid_inputs_are_rejected,
            lease_reports_its_facts,
            unlock_by_owner_token,
            keepalive_holds_past_ttl,
            keepalive_fires_lost_when_stolen,
            max_hold_ends_renewal,
            with_lock_stops_work_when_the_lease_ends,
            with_lock_outlasting_its_ttl_finishes,
            waiter_wakes_promptly_on_release,
            forget_removes_a_free_key_and_refuses_a_held_one,
            marks_only_advance,
            one_of_concurrent_advances_wins,
            inspect_reports_the_holder_then_free,
            list_reports_held_locks_under_a_prefix,
            force_release_evicts_the_holder,
            a_waiters_grant_records_its_holder_whatever_its_label,
            election_has_one_leader_at_a_time,
            election_resign_hands_over,
            election_ended_term_stops_work_before_the_next_begins,
            election_observer_sees_each_term_in_order,
            semaphore_never_has_more_than_n_holders,
            semaphore_release_wakes_a_waiter,
            semaphore_dropped_permit_returns,
            semaphore_refuses_a_larger_limit_in_use,
            try_lock_any_takes_the_first_free_key_in_order,
            shared_holders_coexist,
            exclusive_is_contention_while_shared_held,
            shared_is_contention_while_exclusive_held,
            last_shared_release_lets_the_writer_in,
            lock_shared_waits_for_the_writer,
            a_waiting_writer_and_later_readers,
            dropped_shared_lease_is_released,
            shared_lease_answers_to_its_owner_token,
            shared_fencing_tokens_sit_between_writers,
            shared_keepalive_holds_and_reports_loss,
        );
    };
    (@checks $factory:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let harness = $crate::testkit::Harness::new($factory);
                $crate::testkit::$check(&harness).await;
            }
        )*
    };
}
