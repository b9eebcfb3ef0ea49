//! Inspection and operator release on Postgres beyond the conformance
//! checks (which include the native wait's record and zero bytes in keys
//! and labels): locks taken with plain SQL (held by an unknown holder,
//! never free), stale records, recording and fencing turned off, the
//! upgrade of a table created before holder records, and
//! `pg_terminate_backend` ending every lock of the holding session.

use distlock::inspect::{with_label, Clock, ForceRelease};
use distlock::postgres::{advisory_key, PostgresLocker};
use distlock::{testkit, Locker};
use test_servers::{unique_key, PostgresServer};

use crate::support::{connect, TTL};

/// A plain client (no distlock), with its server process id.
async fn plain_client() -> (tokio_postgres::Client, i32) {
    let (client, connection) =
        tokio_postgres::connect(&PostgresServer::shared().url(), tokio_postgres::NoTls)
            .await
            .expect("connect a plain client");
    tokio::spawn(connection);
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid")
        .get(0);
    (client, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_with_plain_sql_is_held_by_an_unknown_holder() {
    let locker = connect("").await;
    let key = unique_key("plain-sql");
    let id = advisory_key("", &key);
    let (plain, pid) = plain_client().await;

    // No fencing row at all.
    plain
        .execute("SELECT pg_advisory_lock($1)", &[&id])
        .await
        .expect("plain lock");
    let held = locker.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(held.key, key);
    assert_eq!(held.holder, None, "{held:?}");
    assert_eq!(held.session.as_deref(), Some(format!("pid {pid}").as_str()));
    assert_eq!(
        (held.fencing_token, held.granted, held.ttl),
        (None, None, None)
    );
    plain
        .execute("SELECT pg_advisory_unlock($1)", &[&id])
        .await
        .expect("plain unlock");
    assert_eq!(locker.inspect(&key).await.expect("inspect"), None);

    // A fencing row left by an earlier distlock grant describes nobody now.
    let lease = with_label("earlier holder", locker.try_lock(&key, TTL))
        .await
        .expect("try_lock")
        .expect("free");
    lease.release().await.expect("release");
    plain
        .execute("SELECT pg_advisory_lock($1)", &[&id])
        .await
        .expect("plain lock");
    let held = locker.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(
        held.holder, None,
        "a stale record is not the holder: {held:?}"
    );
    assert_eq!(held.fencing_token, None, "{held:?}");
    let listed = locker.list(&key).await.expect("list");
    assert_eq!(listed.len(), 1, "its row names it: {listed:?}");
    assert_eq!(
        (listed[0].key.as_str(), &listed[0].holder),
        (key.as_str(), &None)
    );
    plain
        .execute("SELECT pg_advisory_unlock($1)", &[&id])
        .await
        .expect("plain unlock");

    // A transaction-scoped lock shows in pg_locks like a session lock.
    plain.execute("BEGIN", &[]).await.expect("begin");
    plain
        .execute("SELECT pg_advisory_xact_lock($1)", &[&id])
        .await
        .expect("xact lock");
    let held = locker.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(held.holder, None);
    assert_eq!(held.session.as_deref(), Some(format!("pid {pid}").as_str()));
    plain.execute("COMMIT", &[]).await.expect("commit");
    assert_eq!(locker.inspect(&key).await.expect("inspect"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_off_clears_the_holder_and_fencing_off_leaves_no_name() {
    let (on, off, bare) = (
        connect("").await,
        connect("&holder=off").await,
        connect("&fencing=off").await,
    );
    let held = testkit::recording_off_clears_the_holder_and_fencing_off_leaves_no_name(
        (&on, &off, &bare),
        (&unique_key("holder-off"), &unique_key("fencing-off")),
        "pid ",
    )
    .await;
    assert_eq!(held.granted.expect("granted").clock, Clock::Server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_table_from_before_holder_records_is_upgraded() {
    let table = format!("fence_{:08x}", rand::random::<u32>());
    PostgresServer::shared().psql(&format!(
        "CREATE TABLE {table} (lock_key bigint PRIMARY KEY, token bigint NOT NULL, \
         owner_digest text NOT NULL, granted_at timestamptz NOT NULL DEFAULT now())"
    ));
    let key = unique_key("upgrade");
    PostgresServer::shared().psql(&format!(
        "INSERT INTO {table} VALUES ({}, 41, 'old')",
        advisory_key("", &key)
    ));
    let locker = connect(&format!("&fencing_table={table}")).await;
    let columns = PostgresServer::shared().psql(&format!(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = '{table}'"
    ));
    assert_eq!(columns, "10", "the six record columns were added");
    testkit::an_upgraded_fencing_table_continues_its_counter(&locker, &key).await;
    // A second client finds the columns there and alters nothing.
    connect(&format!("&fencing_table={table}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_the_session_frees_every_lock_it_holds() {
    // One shared session: both locks live on it.
    let holder = connect("&sessions=1").await;
    let operator = connect("").await;
    testkit::terminating_a_session_frees_every_lock_it_holds(
        (&holder, &operator),
        (&unique_key("terminate-a"), &unique_key("terminate-b")),
        "own session",
    )
    .await;

    // A lock held with plain SQL: its session is ended too.
    let (plain, _) = plain_client().await;
    let key = unique_key("terminate-plain");
    plain
        .execute("SELECT pg_advisory_lock($1)", &[&advisory_key("", &key)])
        .await
        .expect("plain lock");
    let evicted = operator
        .force_release(&key, ForceRelease::TerminateSession)
        .await
        .expect("force release")
        .expect("held");
    assert_eq!(evicted.holder, None);
    assert!(
        plain.execute("SELECT 1", &[]).await.is_err(),
        "its session is gone"
    );
    assert_eq!(operator.inspect(&key).await.expect("inspect"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_the_right_to_terminate_gets_the_servers_reason() {
    let role = format!("weak_{:08x}", rand::random::<u32>());
    PostgresServer::shared().psql(&format!("CREATE ROLE {role} LOGIN"));
    let url = PostgresServer::shared()
        .url()
        .replace("postgres://postgres", &format!("postgres://{role}"));
    let weak = PostgresLocker::from_url(&format!("{url}&fencing=off"))
        .await
        .expect("connect as the weak role");
    let holder = connect("").await;
    testkit::a_refused_termination_keeps_the_lock(
        (&weak, &holder),
        &unique_key("weak"),
        &["42501", "pg_signal_backend"],
    )
    .await;
}
