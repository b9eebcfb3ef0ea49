//! `try_lock_any`, a semaphore's attempt: the first key as `try_lock` tries
//! it, then, if it is held, one statement over the rest. It takes exactly
//! one key (checked in `pg_locks` and the fencing table), never a key its
//! own session already holds, leaves nothing behind when abandoned, and is
//! one statement on the server when the first key is free and two at any
//! other occupancy (counted in the server's statement log).

use std::time::Duration;

use distlock::postgres::PostgresLocker;
use distlock::Locker;
use futures_util::FutureExt;
use test_servers::{unique_key, PostgresOptions, PostgresServer};
use tokio::time::Instant;

use crate::common::eventually;
use crate::support::{connect, connect_to, holders, TTL};

/// `n` fresh keys named after `name`, as a semaphore names its permits.
fn permit_keys(name: &str, n: usize) -> Vec<String> {
    let name = unique_key(name);
    (0..n).map(|i| format!("{name}#{i}")).collect()
}

/// The server processes holding each of `keys` (taken by `locker`).
fn holders_of(locker: &PostgresLocker, keys: &[String]) -> Vec<Vec<i32>> {
    keys.iter()
        .map(|key| holders(PostgresServer::shared(), locker.advisory_key(key)))
        .collect()
}

/// With the first key held elsewhere, the statement over the other,
/// free, keys takes exactly one, the first of them, and writes exactly one
/// fencing row, with fencing on and off (two different statements).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_over_free_keys_takes_exactly_the_first() {
    for params in ["", "&fencing=off"] {
        let (locker, other) = (connect(params).await, connect(params).await);
        let all = permit_keys("any-free", 6);
        let first = other.try_lock(&all[0], TTL).await.unwrap().unwrap();
        let keys = &all[1..];
        let lease = locker
            .try_lock_any(&all, TTL)
            .await
            .unwrap()
            .expect("every key but the first is free");
        assert_eq!(lease.key(), keys[0], "{params}: the first free key");
        let held = holders_of(&locker, keys);
        let pid = *held[0].first().expect("the first free key is held");
        assert_eq!(held[0], [pid], "{params}: held once, by one session");
        assert!(
            held[1..].iter().all(Vec::is_empty),
            "{params}: exactly one key taken: {held:?}"
        );
        first.release().await.unwrap();
        if params.is_empty() {
            assert!(lease.fencing_token().is_some());
            let ids: Vec<String> = keys
                .iter()
                .map(|key| locker.advisory_key(key).to_string())
                .collect();
            let rows = PostgresServer::shared().psql(&format!(
                "SELECT lock_key, key_name, session_pid, holder_pid FROM distlock_fencing \
                 WHERE lock_key IN ({})",
                ids.join(", ")
            ));
            assert_eq!(
                rows,
                format!("{}|{}|{pid}|{}", ids[0], keys[0], std::process::id()),
                "one row, the taken key's, with its grant's record"
            );
        } else {
            assert_eq!(lease.fencing_token(), None);
        }
        lease.release().await.unwrap();
        assert!(holders_of(&locker, keys).iter().all(Vec::is_empty));
    }
}

/// Advisory locks are re-entrant per session: a key this locker already
/// holds on its one session (exclusively, or shared) must not be granted
/// again by the statement, which would leave it held after that lease's
/// release. It is skipped as contention, as `try_lock` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_the_locker_holds_are_never_granted_again_on_its_session() {
    let (locker, other) = (connect("&sessions=1").await, connect("").await);
    let keys = permit_keys("any-own", 4);
    let exclusive = locker.try_lock(&keys[0], TTL).await.unwrap().unwrap();
    let shared = locker
        .try_lock_shared(&keys[1], TTL)
        .await
        .unwrap()
        .unwrap();
    let granted = locker
        .try_lock_any(&keys[..3], TTL)
        .await
        .unwrap()
        .expect("the third key is free");
    assert_eq!(granted.key(), keys[2]);
    // The same key named twice is tried once.
    let twice = [keys[3].clone(), keys[3].clone()];
    let fourth = locker.try_lock_any(&twice, TTL).await.unwrap().unwrap();
    assert!(locker.try_lock_any(&twice, TTL).await.unwrap().is_none());
    assert!(
        locker.try_lock_any(&keys, TTL).await.unwrap().is_none(),
        "all held by this locker"
    );
    exclusive.release().await.unwrap();
    shared.release().await.unwrap();
    for key in &keys[..2] {
        let lease = other.try_lock(key, TTL).await.unwrap();
        assert!(
            lease.is_some(),
            "{key} is free once its one lease is released"
        );
    }
    granted.release().await.unwrap();
    fourth.release().await.unwrap();
}

/// An attempt dropped with its answer in flight may have taken a key: the
/// cleanup releases it on the session (which stays up for the other leases
/// on it), and meanwhile the keys are "being cleaned up", never granted to
/// another caller of the locker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_attempts_over_several_keys_never_strand_a_key() {
    let (locker, checker) = (connect("&sessions=1").await, connect("").await);
    let survivor = locker
        .try_lock(&unique_key("any-survivor"), TTL)
        .await
        .unwrap()
        .unwrap();
    let keys = permit_keys("any-abandoned", 3);
    let mut abandoned_in_flight = 0;
    for round in 0..200 {
        if abandoned_in_flight == 10 {
            break;
        }
        match locker.try_lock_any(&keys, TTL).now_or_never() {
            None => abandoned_in_flight += 1,
            Some(Err(e)) if e.to_string().contains("still being cleaned up") => {}
            Some(Ok(Some(lease))) => lease.release().await.unwrap(),
            Some(Ok(None)) => panic!("round {round}: every key was free"),
            Some(Err(e)) => panic!("round {round}: {e}"),
        }
        let started = Instant::now();
        for key in &keys {
            let lease = loop {
                if let Some(lease) = checker.try_lock(key, TTL).await.unwrap() {
                    break lease;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "round {round}: {key} stranded by an abandoned attempt"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            lease.release().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        abandoned_in_flight, 10,
        "too few attempts abandoned in flight"
    );
    eventually(Duration::from_secs(2), "nothing stays held", || {
        holders_of(&locker, &keys).iter().all(Vec::is_empty)
    })
    .await;
    assert_eq!(locker.held_count(), 1, "only the survivor");
    assert!(
        !survivor.is_lost(),
        "the cleanup unlocked; it did not close the session"
    );
    survivor.release().await.unwrap();
}

/// Statements the server ran for sessions named `application_name`, from
/// its log (`log_statement = all`, each line prefixed with the name):
/// extended-protocol executions and simple-protocol statements, pings (an
/// empty query) aside.
fn statements_logged(server: &PostgresServer, application_name: &str) -> Vec<String> {
    let log = std::fs::read_to_string(server.log_path()).expect("read the server log");
    let prefix = format!("{application_name}|");
    log.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter(|line| line.starts_with("LOG:  execute ") || line.starts_with("LOG:  statement: "))
        .filter(|line| !line.trim_end().ends_with("statement:"))
        .map(str::to_owned)
        .collect()
}

/// The measure: one attempt over N keys is one statement on the
/// server (one round trip) when the first key is free, and two (the first
/// key, then the rest in one statement) when every key is held, where one
/// `try_lock` per key would be N.
/// Counted on the server, in its statement log, for the locker's sessions
/// alone (its own `application_name`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_attempt_is_one_statement_at_any_occupancy() {
    let server = PostgresServer::start_with(PostgresOptions {
        settings: vec![
            ("log_statement".into(), "all".into()),
            ("log_line_prefix".into(), "%a|".into()),
        ],
        ..PostgresOptions::default()
    });
    let name = "distlock-any-counted";
    for params in ["", "&fencing=off"] {
        let locker = connect_to(&server, &format!("&application_name={name}{params}")).await;
        let other = connect_to(&server, params).await;
        for n in [1, 10, 100] {
            let keys = permit_keys("any-counted", n);
            // Every session of the locker opened (and its statements
            // prepared) before counting.
            let warm = locker.try_lock_any(&keys, TTL).await.unwrap().unwrap();
            warm.release().await.unwrap();
            if n > 1 {
                // And the session the statement over the rest runs on.
                let first = other.try_lock(&keys[0], TTL).await.unwrap().unwrap();
                let warm = locker.try_lock_any(&keys, TTL).await.unwrap().unwrap();
                warm.release().await.unwrap();
                first.release().await.unwrap();
            }

            let before = statements_logged(&server, name).len();
            let lease = locker
                .try_lock_any(&keys, TTL)
                .await
                .unwrap()
                .expect("every key is free");
            let free = statements_logged(&server, name)[before..].to_vec();
            assert_eq!(free.len(), 1, "{params} N={n}, all free: {free:#?}");
            assert!(free[0].contains("pg_try_advisory_lock"), "{free:?}");
            lease.release().await.unwrap();

            let mut held = Vec::new();
            for key in &keys {
                held.push(other.try_lock(key, TTL).await.unwrap().unwrap());
            }
            let before = statements_logged(&server, name).len();
            assert!(locker.try_lock_any(&keys, TTL).await.unwrap().is_none());
            let full = statements_logged(&server, name)[before..].to_vec();
            let expected = if n == 1 { 1 } else { 2 };
            assert_eq!(full.len(), expected, "{params} N={n}, all held: {full:#?}");
            for lease in held {
                lease.release().await.unwrap();
            }
        }
        assert_eq!(locker.held_count(), 0);
    }
}

/// Callers of one locker trying the same keys at once: each attempt
/// reserves every key it sends, so the others must not read those keys as
/// held. With more keys than callers there is always a free one, so an
/// attempt never answers `None` (the semaphore's "full").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_of_one_locker_never_see_free_keys_as_held() {
    let locker = connect("").await;
    let keys = permit_keys("any-concurrent", 32);
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let (locker, keys) = (locker.clone(), keys.clone());
            tokio::spawn(async move {
                for round in 0..20 {
                    // A different start per task and round, as a semaphore's.
                    let start = (task * 7 + round * 3) % keys.len();
                    let order = [&keys[start..], &keys[..start]].concat();
                    let lease = locker.try_lock_any(&order, TTL).await.unwrap();
                    let lease = lease.unwrap_or_else(|| {
                        panic!("task {task} round {round}: 16 callers, 32 keys, and none free?")
                    });
                    lease.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(locker.held_count(), 0);
}
