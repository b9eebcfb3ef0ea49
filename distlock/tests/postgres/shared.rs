//! Shared (reader) locks on Postgres beyond the conformance checks: what
//! the server holds for readers of one locker (one shared hold per session,
//! released by the last of them), an exclusive attempt of the same locker
//! refused beside its readers, a waiting writer holding every later reader
//! back (the server's queue, and this locker's own readers), readers losing
//! their leases with their session, the native shared wait on a connection
//! of its own, abandoned shared attempts, inspection, listing and force
//! release of a key held shared, readers leaving the fencing table alone,
//! and the transaction-scoped shared functions.

use std::time::Duration;

use distlock::inspect::ForceRelease;
use distlock::postgres::{advisory_key, lock_shared_xact, try_lock_shared_xact, try_lock_xact};
use distlock::{Error, Locker, LostReason, RefreshRequest};
use futures_util::FutureExt;
use test_servers::{unique_key, PostgresServer};
use tokio::time::Instant;

use crate::common::eventually;
use crate::support::{connect, TTL};

/// The holds of advisory key `id` in `pg_locks`, as `(pid, mode, granted)`.
fn holds(id: i64) -> Vec<(i32, String, bool)> {
    let rows = PostgresServer::shared().psql(&format!(
        "SELECT pid, mode, granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
         AND ((classid::int8 << 32) | objid::int8) = {id} ORDER BY granted DESC, pid"
    ));
    rows.lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let mut parts = line.split('|');
            let pid = parts.next().expect("pid").parse().expect("pid");
            let mode = parts.next().expect("mode").to_owned();
            let granted = parts.next().expect("granted") == "t";
            (pid, mode, granted)
        })
        .collect()
}

/// Granted shared holds of `id`, by pid.
fn readers(id: i64) -> Vec<i32> {
    holds(id)
        .into_iter()
        .filter(|(_, mode, granted)| *granted && mode == "ShareLock")
        .map(|(pid, _, _)| pid)
        .collect()
}

/// True while some session waits on the server for `id` in `mode`.
fn waiting(id: i64, mode: &str) -> bool {
    holds(id)
        .iter()
        .any(|(_, m, granted)| !granted && m == mode)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_one_locker_share_one_server_hold_released_by_the_last() {
    let (locker, other) = (connect("").await, connect("").await);
    let key = unique_key("shared-one-locker");
    let id = locker.advisory_key(&key);

    let first = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("free");
    let second = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("a second reader");
    assert_ne!(first.owner(), second.owner());
    assert_eq!(first.fencing_token(), second.fencing_token());
    assert_eq!(locker.held_count(), 2);
    assert_eq!(
        readers(id).len(),
        1,
        "one server hold for both: {:?}",
        holds(id)
    );

    // The server would grant the reader's own session an exclusive lock on
    // top of its shared one: the locker refuses it itself.
    assert!(locker.try_lock(&key, TTL).await.unwrap().is_none());
    assert!(matches!(
        locker.lock(&key, TTL, Duration::ZERO).await,
        Err(Error::NotAcquired { .. })
    ));
    assert!(locker
        .raw_keys()
        .try_lock(&id.to_string(), TTL)
        .await
        .unwrap()
        .is_none());
    assert!(other.try_lock(&key, TTL).await.unwrap().is_none());
    // Forget needs a free key.
    assert!(matches!(
        locker.forget(&key).await,
        Err(Error::NotAcquired { .. })
    ));

    // Both confirmed in one keepalive batch, though the server holds the
    // key once for them.
    let batch = [
        RefreshRequest {
            key: &key,
            owner: first.owner(),
            ttl: TTL,
        },
        RefreshRequest {
            key: &key,
            owner: second.owner(),
            ttl: TTL,
        },
    ];
    for answer in locker.refresh_many(&batch).await {
        answer.expect("each reader confirmed");
    }
    assert!(!first.is_lost() && !second.is_lost());

    // Each is refreshed (asking the server) and released on its own; the
    // server's hold goes with the last.
    locker
        .refresh(&key, first.owner(), TTL)
        .await
        .expect("refresh a reader");
    first.release().await.expect("release the first reader");
    assert_eq!(readers(id).len(), 1, "the second reader still holds it");
    assert!(other.try_lock(&key, TTL).await.unwrap().is_none());
    locker
        .refresh(&key, second.owner(), TTL)
        .await
        .expect("refresh the other");
    second.release().await.expect("release the second reader");
    assert!(
        holds(id).is_empty(),
        "the last reader released the server's hold"
    );
    assert_eq!(locker.held_count(), 0);
    other
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_of_one_locker_are_all_granted() {
    let locker = connect("").await;
    let key = unique_key("shared-concurrent");
    let id = locker.advisory_key(&key);
    // Each waits for an attempt in flight, then joins its hold, rather
    // than report contention that is not there.
    let attempts = (0..16).map(|_| locker.try_lock_shared(&key, TTL));
    let leases: Vec<_> = futures_util::future::join_all(attempts)
        .await
        .into_iter()
        .map(|tried| tried.expect("no error").expect("every reader granted"))
        .collect();
    assert_eq!(locker.held_count(), 16);
    assert_eq!(readers(id).len(), 1);
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert!(holds(id).is_empty());
}

/// What the server does with a waiting writer (observed on Postgres 15):
/// a later `pg_try_advisory_lock_shared` from another session is refused
/// and a later `pg_advisory_lock_shared` queues behind it; only the
/// session already holding the key shared would be granted past the
/// queue, and the locker refuses that join itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_holds_back_later_readers_of_every_locker() {
    let (readers_locker, writer, late) = (connect("").await, connect("").await, connect("").await);
    let key = unique_key("shared-writer-queued");
    let id = readers_locker.advisory_key(&key);
    let first = readers_locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("free");
    // With no writer waiting, readers come in beside it.
    let second = late
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("a reader beside it");
    second.release().await.unwrap();

    let waiting_writer = {
        let (writer, key) = (writer.clone(), key.clone());
        tokio::spawn(async move { writer.lock(&key, TTL, Duration::from_secs(20)).await })
    };
    eventually(
        Duration::from_secs(5),
        "the writer waits on the server",
        || waiting(id, "ExclusiveLock"),
    )
    .await;
    assert!(
        late.try_lock_shared(&key, TTL).await.unwrap().is_none(),
        "another client"
    );
    assert!(
        readers_locker
            .try_lock_shared(&key, TTL)
            .await
            .unwrap()
            .is_none(),
        "a join of the reader's own locker"
    );
    // Plain SQL from another session: the server's own answer.
    let refused =
        PostgresServer::shared().psql(&format!("SELECT pg_try_advisory_lock_shared({id})"));
    assert_eq!(refused, "f");
    let queued = {
        let (late, key) = (late.clone(), key.clone());
        tokio::spawn(async move { late.lock_shared(&key, TTL, Duration::from_secs(20)).await })
    };
    eventually(Duration::from_secs(5), "the later reader queues", || {
        waiting(id, "ShareLock")
    })
    .await;

    first.release().await.unwrap();
    let written = waiting_writer
        .await
        .unwrap()
        .expect("the writer goes first");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!queued.is_finished(), "the reader queued behind the writer");
    written.release().await.unwrap();
    let reader = queued.await.unwrap().expect("then the reader");
    reader.release().await.unwrap();
    eventually(Duration::from_secs(5), "nothing held", || {
        holds(id).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_lose_their_leases_with_their_session() {
    let (locker, other) = (connect("&sessions=1").await, connect("").await);
    let key = unique_key("shared-session-dies");
    let id = locker.advisory_key(&key);
    let first = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("free");
    let second = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("joins");
    let pids = readers(id);
    assert_eq!(pids.len(), 1);
    PostgresServer::shared().psql(&format!("SELECT pg_terminate_backend({}, 5000)", pids[0]));
    for lease in [&first, &second] {
        let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost_signal().wait())
            .await
            .expect("told within 5 s");
        assert_eq!(reason, LostReason::ConnectionLost);
    }
    assert_eq!(locker.held_count(), 0);
    assert!(matches!(
        locker.refresh(&key, first.owner(), TTL).await,
        Err(Error::NotHeld { .. })
    ));
    other
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
    // A new reader takes it on a fresh session.
    let again = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("free again");
    assert_eq!(readers(id).len(), 1);
    again.release().await.unwrap();
    drop((first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_shared_wait_holds_the_key_on_its_own_connection() {
    let (locker, writer) = (connect("").await, connect("").await);
    let key = unique_key("shared-native-wait");
    let id = locker.advisory_key(&key);
    let held = writer.try_lock(&key, TTL).await.unwrap().expect("free");
    let token = held.fencing_token().expect("a token");

    // Cancelled while waiting: nothing waits or is granted afterwards.
    let cancelled = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.lock_shared(&key, TTL, Duration::from_secs(20)).await })
    };
    eventually(
        Duration::from_secs(5),
        "the wait reaches the server",
        || waiting(id, "ShareLock"),
    )
    .await;
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    eventually(Duration::from_secs(5), "the cancelled wait is gone", || {
        !waiting(id, "ShareLock")
    })
    .await;

    let wait = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.lock_shared(&key, TTL, Duration::from_secs(20)).await })
    };
    eventually(
        Duration::from_secs(5),
        "the wait reaches the server",
        || waiting(id, "ShareLock"),
    )
    .await;
    let released = Instant::now();
    held.release().await.unwrap();
    let waited = wait.await.unwrap().expect("granted at the release");
    assert!(released.elapsed() < Duration::from_secs(2));
    assert_eq!(
        waited.fencing_token(),
        Some(token),
        "the writer's token, read after the grant"
    );

    // A second reader of the locker takes it on the key's shared session:
    // two server holds, released one by one.
    let second = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("a second reader");
    assert_eq!(readers(id).len(), 2, "{:?}", holds(id));
    locker
        .refresh(&key, waited.owner(), TTL)
        .await
        .expect("refresh the waiter's hold");
    waited.release().await.unwrap();
    assert_eq!(readers(id).len(), 1);
    second.release().await.unwrap();
    assert!(holds(id).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_shared_attempts_never_strand_their_hold() {
    let (locker, checker) = (connect("").await, connect("").await);
    let key = unique_key("shared-abandoned");
    let id = locker.advisory_key(&key);
    // Warm the key's session, so one poll gets as far as sending.
    locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut abandoned_in_flight = 0;
    for round in 0..200 {
        if abandoned_in_flight == 10 {
            break;
        }
        match locker.try_lock_shared(&key, TTL).now_or_never() {
            None => abandoned_in_flight += 1,
            Some(Err(e)) if e.to_string().contains("still being cleaned up") => {}
            Some(Ok(None)) => {}
            Some(Ok(Some(lease))) => lease.release().await.unwrap(),
            Some(Err(e)) => panic!("round {round}: {e}"),
        }
        let started = Instant::now();
        let lease = loop {
            if let Some(lease) = checker.try_lock(&key, TTL).await.unwrap() {
                break lease;
            }
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "round {round}: stranded by an abandoned shared attempt"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        lease.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        abandoned_in_flight, 10,
        "too few attempts were abandoned in flight"
    );
    assert_eq!(locker.held_count(), 0);
    eventually(Duration::from_secs(2), "nothing stays held", || {
        holds(id).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_write_nothing_and_inspection_lists_the_key_held_shared() {
    let (a, b, operator) = (connect("").await, connect("").await, connect("").await);
    let prefix = unique_key("shared-inspect");
    let key = format!("{prefix}/catalog");
    let id = a.advisory_key(&key);
    // A writer first: its grant names the key in the fencing row.
    let writer = a.try_lock(&key, TTL).await.unwrap().expect("free");
    let token = writer.fencing_token().expect("a token");
    writer.release().await.unwrap();
    let row = || {
        PostgresServer::shared().psql(&format!(
            "SELECT token, owner_digest, granted_at, session_pid FROM distlock_fencing \
             WHERE lock_key = {id}"
        ))
    };
    let before = row();

    let first = a.try_lock_shared(&key, TTL).await.unwrap().expect("free");
    let second = b
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("beside it");
    assert_eq!(first.fencing_token(), Some(token));
    assert_eq!(second.fencing_token(), Some(token));
    assert_eq!(row(), before, "readers leave the fencing row alone");

    let held = operator.inspect(&key).await.unwrap().expect("held");
    assert!(held.shared, "{held:?}");
    assert_eq!(held.holder, None, "readers record no holder");
    assert_eq!(held.fencing_token, Some(token));
    assert!(held.session.is_some());
    let listed = operator.list(&prefix).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].shared && listed[0].key == key, "{listed:?}");

    // Release by owner from another client: NotHeld (readers record no
    // owner), and nothing is freed.
    assert!(matches!(
        operator.unlock(&key, first.owner()).await,
        Err(Error::NotHeld { .. })
    ));
    // A reader's own locker cannot end its session.
    assert!(matches!(
        a.force_release(&key, ForceRelease::TerminateSession).await,
        Err(Error::Unsupported { .. })
    ));
    assert_eq!(readers(id).len(), 2);
    // Ending the holders ends every reader's session: the key is free.
    let evicted = operator
        .force_release(&key, ForceRelease::TerminateSession)
        .await
        .expect("force release")
        .expect("held");
    assert!(evicted.shared);
    for lease in [&first, &second] {
        let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost_signal().wait())
            .await
            .expect("every reader told");
        assert_eq!(reason, LostReason::ConnectionLost);
    }
    assert_eq!(operator.inspect(&key).await.unwrap(), None);
    assert!(holds(id).is_empty());
    drop((first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_never_locked_exclusively_gives_readers_token_zero() {
    let (a, b) = (connect("").await, connect("&fencing=off").await);
    let key = unique_key("shared-token-zero");
    let reader = a.try_lock_shared(&key, TTL).await.unwrap().expect("free");
    assert_eq!(reader.fencing_token(), Some(0));
    let unfenced = b
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("beside it");
    assert_eq!(unfenced.fencing_token(), None, "no fencing, no token");
    reader.release().await.unwrap();
    unfenced.release().await.unwrap();
    assert_eq!(
        PostgresServer::shared().psql(&format!(
            "SELECT count(*) FROM distlock_fencing WHERE lock_key = {}",
            a.advisory_key(&key)
        )),
        "0",
        "no row written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_shared_locks_coexist_with_shared_leases_and_exclude_writers() {
    let locker = connect("").await;
    let key = unique_key("shared-xact");
    let id = advisory_key("", &key);
    let url = PostgresServer::shared().url();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect a plain client");
        tokio::spawn(connection);
        clients.push(client);
    }
    let (first, rest) = clients.split_first_mut().expect("two clients");
    let second = &mut rest[0];
    let reading = first.transaction().await.unwrap();
    assert!(try_lock_shared_xact(&reading, id).await.unwrap());
    lock_shared_xact(&reading, id).await.unwrap();
    let lease = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("beside it");
    assert!(locker.try_lock(&key, TTL).await.unwrap().is_none());
    let writing = second.transaction().await.unwrap();
    assert!(!try_lock_xact(&writing, id).await.unwrap());
    writing.rollback().await.unwrap();
    reading.commit().await.unwrap();
    lease.release().await.unwrap();
    locker
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
}
