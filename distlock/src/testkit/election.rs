//! The election checks of the conformance suite: [`crate::elect`] over the
//! backend under test, each candidate and observer on a client of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::Harness;
use crate::elect::{Election, Leader};
use crate::{Error, KeepAlive, LostReason};

/// The ttl of every term here: long enough that no term lapses by accident
/// on a loaded machine.
const TERM_TTL: Duration = Duration::from_secs(10);
/// How long a candidate waits to lead before the check fails.
const CAMPAIGN: Option<Duration> = Some(Duration::from_secs(20));

async fn election(h: &Harness, name: &str, proclaim: &str) -> Election {
    Election::new(h.locker().await, name)
        .ttl(TERM_TTL)
        .proclaim(proclaim)
}

/// Three candidates campaigning at once each lead once, one at a time, and
/// the terms' fencing tokens strictly increase in the order they led.
pub async fn election_has_one_leader_at_a_time(h: &Harness) {
    let name = h.key("election-one-leader");
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut candidates = Vec::new();
    for candidate in ["a", "b", "c"] {
        let election = election(h, &name, candidate).await;
        let (leading, terms) = (leading.clone(), terms.clone());
        candidates.push(tokio::spawn(async move {
            election
                .lead(CAMPAIGN, |term| async move {
                    let others = leading.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(others, 0, "{candidate} leads while another leads");
                    terms
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((candidate, term.fencing_token));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    leading.fetch_sub(1, Ordering::SeqCst);
                })
                .await
        }));
    }
    for candidate in candidates {
        let done = candidate
            .await
            .expect("candidate task")
            .expect("each candidate is elected in turn");
        done.release.expect("each term resigns");
    }
    let terms = terms.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut led: Vec<&str> = terms.iter().map(|(candidate, _)| *candidate).collect();
    led.sort_unstable();
    assert_eq!(led, ["a", "b", "c"], "every candidate leads exactly once");
    assert_terms_increase(&terms);
}

/// A leader's resignation elects the waiting candidate, in a later term.
pub async fn election_resign_hands_over(h: &Harness) {
    let name = h.key("election-resign");
    let first = election(h, &name, "first").await;
    let second = election(h, &name, "second").await;
    let term = first.campaign(CAMPAIGN).await.expect("first is elected");
    let waiting = tokio::spawn(async move { second.campaign(CAMPAIGN).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "second must wait while first leads");
    let first_term = term.fencing_token();
    let resigned = Instant::now();
    term.resign().await.expect("first resigns");
    let next = waiting
        .await
        .expect("candidate task")
        .expect("second is elected after the resignation");
    let handover = resigned.elapsed();
    assert!(
        handover < Duration::from_secs(5),
        "handover took {handover:?}: a waiting candidate must not sit out a ttl"
    );
    assert_eq!(next.leader().label, "second");
    assert_terms_increase(&[("first", first_term), ("second", next.fencing_token())]);
    next.resign().await.expect("second resigns");
}

/// A term that ends (here at its keepalive's `max_hold`) stops the leader's
/// work before the next candidate's term begins, and [`Election::lead`]
/// reports the loss.
pub async fn election_ended_term_stops_work_before_the_next_begins(h: &Harness) {
    let name = h.key("election-ended-term");
    let first = election(h, &name, "first")
        .await
        .keep_alive(KeepAlive::default().max_hold(Duration::from_millis(300)));
    let second = election(h, &name, "second").await;
    let stopped: Arc<Mutex<Option<Instant>>> = Arc::default();
    let record_stop = StopRecorder(stopped.clone());
    let (elected, is_elected) = tokio::sync::oneshot::channel();
    let leading = tokio::spawn(async move {
        first
            .lead(CAMPAIGN, |_term| async move {
                let _stops_when_dropped = record_stop;
                let _ = elected.send(());
                std::future::pending::<()>().await
            })
            .await
    });
    // The first candidate leads before the second campaigns.
    is_elected.await.expect("the first candidate is elected");
    let next = second.campaign(CAMPAIGN).await.expect("second is elected");
    let began = Instant::now();
    let lost = leading
        .await
        .expect("leader task")
        .expect_err("the first term ended while its work ran");
    assert!(
        matches!(
            lost,
            Error::Lost {
                reason: LostReason::MaxHoldExceeded,
                ..
            }
        ),
        "{lost:?}"
    );
    let stopped = stopped
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .expect("the first leader's work was dropped");
    assert!(
        stopped <= began,
        "the first leader's work stopped {:?} after the next term began",
        stopped - began
    );
    next.resign().await.expect("second resigns");
}

/// An observer that does not campaign sees each term, in order, once; on a
/// backend that cannot inspect its locks it says so instead.
pub async fn election_observer_sees_each_term_in_order(h: &Harness) {
    let name = h.key("election-observer");
    let locker = h.locker().await;
    let mut observer = Election::new(locker.clone(), &name)
        .observe()
        .poll_interval(Duration::from_millis(20));
    if !locker.capabilities().inspect {
        let refused = observer.changed().await.expect_err("cannot inspect");
        assert!(matches!(refused, Error::Unsupported { .. }), "{refused:?}");
        return;
    }
    let first = observer.changed().await.expect("observe");
    let seen: Arc<Mutex<Vec<Option<Leader>>>> = Arc::new(Mutex::new(vec![first]));
    let watching = {
        let seen = seen.clone();
        tokio::spawn(async move {
            loop {
                let change = observer.changed().await.expect("observe");
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(change);
            }
        })
    };
    let mut led = Vec::new();
    for candidate in ["a", "b", "c"] {
        let term = election(h, &name, candidate)
            .await
            .campaign(CAMPAIGN)
            .await
            .expect("elected");
        led.push((candidate, term.fencing_token()));
        // Long enough for a 20 ms poll on a loaded machine.
        tokio::time::sleep(Duration::from_millis(300)).await;
        term.resign().await.expect("resign");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    watching.abort();
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let leaders: Vec<(String, Option<u64>)> = seen
        .iter()
        .flatten()
        .map(|leader| (leader.proclaimed.clone().unwrap_or_default(), leader.term))
        .collect();
    let expected: Vec<(String, Option<u64>)> = led
        .iter()
        .map(|(candidate, term)| ((*candidate).to_owned(), *term))
        .collect();
    assert_eq!(leaders, expected, "each term once, in order: {seen:?}");
    let gaps = seen.iter().filter(|change| change.is_none()).count();
    assert_eq!(
        gaps, 4,
        "no leader before, between and after the terms: {seen:?}"
    );
}

/// Sets the instant it was dropped: the moment the leader's work stopped.
struct StopRecorder(Arc<Mutex<Option<Instant>>>);

impl Drop for StopRecorder {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
}

/// The terms' fencing tokens strictly increase in the order given, where
/// the backend has fencing (all or none of them are `Some`).
fn assert_terms_increase(terms: &[(&str, Option<u64>)]) {
    let tokens: Vec<u64> = terms.iter().filter_map(|(_, token)| *token).collect();
    if tokens.is_empty() {
        return;
    }
    assert_eq!(
        tokens.len(),
        terms.len(),
        "some terms have fencing tokens and some not: {terms:?}"
    );
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "terms must strictly increase in the order they led: {terms:?}"
    );
}
