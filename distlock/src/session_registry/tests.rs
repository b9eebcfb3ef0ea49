//! The registry's own checks, without a server: reservations, grants and
//! shared holds, with fake sessions.

use std::sync::atomic::AtomicBool;

use crate::memory::MemoryLocker;
use crate::{Lease, LeaseParts, Locker, LostReason};

use super::*;

/// A session that is only an id and a liveness flag.
#[derive(Debug, Default)]
struct FakeSession {
    id: u64,
    closed: AtomicBool,
}

impl HoldingSession for FakeSession {
    fn id(&self) -> u64 {
        self.id
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

fn lease() -> Lease {
    Lease::new(
        LeaseParts {
            key: "k".into(),
            owner: "waiter".into(),
            fencing_token: None,
            ttl: Duration::from_secs(1),
            valid_until: None,
        },
        Arc::new(MemoryLocker::new()) as Arc<dyn Locker>,
    )
}

fn held(lease: &Lease, session: &Arc<FakeSession>) -> Held<FakeSession> {
    Held {
        owner: "waiter".into(),
        session: session.clone(),
        lost: lease.lost_notifier(),
    }
}

/// The sequence that once let two attempts of one key share a session: an
/// attempt is in flight when a native wait is granted the key and
/// releases it. The attempt's reservation must survive both.
#[test]
fn a_grant_and_release_by_a_waiter_keep_an_attempts_reservation() {
    let waiter_session = Arc::new(FakeSession {
        id: 3,
        ..FakeSession::default()
    });
    let registry = Registry::<i64, FakeSession>::new("test");

    let attempt = registry.reserve(7).expect("free key");
    let first = lease();
    registry.grant(7, held(&first, &waiter_session)).unwrap();
    assert_eq!(registry.reserve(7), Err(Busy::Contended), "held");
    assert!(registry.take(&7, "waiter").is_some());
    assert_eq!(
        registry.reserve(7),
        Err(Busy::Contended),
        "the first attempt is still in flight"
    );
    // Abandoned: its cleanup keeps the reservation, and says so.
    registry.cleaning_up(attempt);
    assert_eq!(registry.state(&7), Some(Busy::CleaningUp));
    assert_eq!(registry.reserve(7), Err(Busy::CleaningUp));
    registry.release(attempt);
    assert_eq!(registry.state(&7), None, "an empty entry is dropped");
    assert!(registry.reserve(7).is_ok());

    // A session's death loses its leases and forgets them.
    let second = lease();
    registry.grant(8, held(&second, &waiter_session)).unwrap();
    registry.session_closed(waiter_session.id, "test", Duration::ZERO);
    assert_eq!(
        second.lost_signal().reason(),
        Some(LostReason::ConnectionLost)
    );
    assert_eq!(registry.held_count(), 0);

    // A grant on a session that died meanwhile is refused: nothing would
    // ever tell its lease.
    waiter_session.closed.store(true, Ordering::SeqCst);
    let third = lease();
    assert!(registry.grant(9, held(&third, &waiter_session)).is_err());
}

fn reader(lease: &Lease, owner: &str, session: &Arc<FakeSession>) -> Reader<FakeSession> {
    Reader {
        held: Held {
            owner: owner.into(),
            session: session.clone(),
            lost: lease.lost_notifier(),
        },
        fencing_token: Some(5),
    }
}

/// Readers of one key: the first on a session attempts, later ones join
/// its hold, only the last to leave a session releases it there, an
/// exclusive attempt is refused beside them, a reader beside an
/// exclusive hold, and a reader waits for an attempt in flight.
#[test]
fn readers_join_one_hold_per_session_and_the_last_releases_it() {
    let (shared, waiter) = (
        Arc::new(FakeSession {
            id: 1,
            ..FakeSession::default()
        }),
        Arc::new(FakeSession {
            id: 2,
            ..FakeSession::default()
        }),
    );
    let registry = Registry::<i64, FakeSession>::new("test");
    let ForReader::Attempt(ticket) = registry.reserve_shared(7, shared.id).unwrap() else {
        panic!("nobody holds it: an attempt");
    };
    assert_eq!(
        registry.reserve_shared(7, shared.id),
        Ok(ForReader::Settling)
    );
    let (a, b, c) = (lease(), lease(), lease());
    registry.grant_shared(7, reader(&a, "a", &shared)).unwrap();
    registry.release(ticket);
    assert_eq!(
        registry.reserve_shared(7, shared.id),
        Ok(ForReader::Join {
            fencing_token: Some(5)
        })
    );
    assert!(registry.join(&7, reader(&b, "b", &shared)));
    // A native wait's reader, on a connection of its own.
    registry.grant_shared(7, reader(&c, "c", &waiter)).unwrap();
    assert_eq!(registry.held_count(), 3);
    assert_eq!(
        registry.reserve(7),
        Err(Busy::Contended),
        "no writer beside readers"
    );
    assert_eq!(registry.session_of(&7, "c").map(|s| s.id), Some(2));

    let (_, hold) = registry.take_hold(&7, "a").unwrap();
    assert_eq!(
        hold,
        Hold::Shared {
            last_on_session: false
        },
        "b is still on it"
    );
    let (_, hold) = registry.take_hold(&7, "c").unwrap();
    assert_eq!(
        hold,
        Hold::Shared {
            last_on_session: true
        },
        "alone on its session"
    );
    // The shared session's death loses the reader left on it.
    registry.session_closed(shared.id, "test", Duration::ZERO);
    assert_eq!(b.lost_signal().reason(), Some(LostReason::ConnectionLost));
    assert_eq!(registry.held_count(), 0);
    assert!(
        !registry.join(&7, reader(&lease(), "d", &shared)),
        "no hold to join"
    );

    // An exclusive hold refuses readers; a shared grant displaces it as
    // stale (the server granted the key shared, so it is gone).
    let writer = lease();
    let ticket = registry.reserve(8).unwrap();
    registry.grant(8, held(&writer, &shared)).unwrap();
    registry.release(ticket);
    assert_eq!(registry.reserve_shared(8, shared.id), Err(Busy::Contended));
    registry
        .grant_shared(8, reader(&lease(), "e", &waiter))
        .unwrap();
    assert_eq!(
        writer.lost_signal().reason(),
        Some(LostReason::ConnectionLost)
    );
}
