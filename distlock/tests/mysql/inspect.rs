//! Inspection and operator release on MariaDB beyond the conformance
//! checks (which include the native wait's record and zero bytes in keys
//! and labels): plain `GET_LOCK` holders (an unknown holder, never free),
//! stale records, recording and fencing turned off, the upgrade of a table
//! created before holder records, and `KILL` of the holding connection
//! ending every lock it holds.

use distlock::inspect::{with_label, Clock, ForceRelease};
use distlock::mysql::MysqlLocker;
use distlock::{testkit, Locker};
use mysql_async::prelude::Queryable;
use test_servers::{unique_key, MariaDbServer};

use crate::support::{connect, name_of, TTL};

/// A plain client (no distlock), with its connection id.
async fn plain_client() -> (mysql_async::Conn, u64) {
    let url = MariaDbServer::shared()
        .url()
        .replace("?ssl-mode=DISABLED", "");
    let mut conn = mysql_async::Conn::from_url(url)
        .await
        .expect("connect a plain client");
    let id: u64 = conn
        .query_first("SELECT CONNECTION_ID()")
        .await
        .expect("CONNECTION_ID")
        .expect("a row");
    (conn, id)
}

async fn plain_lock(conn: &mut mysql_async::Conn, key: &str) {
    let got: Option<i64> = conn
        .query_first(format!("SELECT GET_LOCK('{}', 0)", name_of(key)))
        .await
        .expect("GET_LOCK");
    assert_eq!(got, Some(1), "{key} is free");
}

async fn plain_unlock(conn: &mut mysql_async::Conn, key: &str) {
    conn.query_drop(format!("DO RELEASE_LOCK('{}')", name_of(key)))
        .await
        .expect("RELEASE_LOCK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_get_lock_is_held_by_an_unknown_holder() {
    let locker = connect("").await;
    let key = unique_key("plain");
    let (mut plain, id) = plain_client().await;

    plain_lock(&mut plain, &key).await;
    let held = locker.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(held.key, key);
    assert_eq!(held.holder, None, "{held:?}");
    assert_eq!(
        held.session.as_deref(),
        Some(format!("connection {id}").as_str())
    );
    assert_eq!(
        (held.fencing_token, held.granted, held.ttl),
        (None, None, None)
    );
    assert!(
        locker.list(&key).await.expect("list").is_empty(),
        "no row names it"
    );
    plain_unlock(&mut plain, &key).await;
    assert_eq!(locker.inspect(&key).await.expect("inspect"), None);

    // A row left by an earlier distlock grant describes nobody now.
    with_label("earlier holder", locker.try_lock(&key, TTL))
        .await
        .expect("try_lock")
        .expect("free")
        .release()
        .await
        .expect("release");
    plain_lock(&mut plain, &key).await;
    let held = locker.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(
        (held.holder.clone(), held.fencing_token),
        (None, None),
        "{held:?}"
    );
    let listed = locker.list(&key).await.expect("list");
    assert_eq!(listed.len(), 1, "its row names it: {listed:?}");
    assert_eq!(
        (listed[0].key.as_str(), &listed[0].holder),
        (key.as_str(), &None)
    );
    plain_unlock(&mut plain, &key).await;
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
        "connection ",
    )
    .await;
    assert_eq!(held.granted.expect("granted").clock, Clock::Server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_table_from_before_holder_records_is_upgraded() {
    let table = format!("fence_{:08x}", rand::random::<u32>());
    let key = unique_key("upgrade");
    MariaDbServer::shared().sql(&format!(
        "CREATE TABLE distlock.{table} (\
            lock_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY, \
            token BIGINT NOT NULL, owner_digest CHAR(32) CHARACTER SET ascii NOT NULL, \
            granted_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB; \
         INSERT INTO distlock.{table} (lock_name, token, owner_digest) VALUES ('{}', 41, 'old')",
        name_of(&key)
    ));
    let locker = connect(&format!("&fencing_table={table}")).await;
    let columns = MariaDbServer::shared().sql(&format!(
        "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'distlock' \
         AND TABLE_NAME = '{table}'"
    ));
    assert_eq!(columns, "10", "the six record columns were added");
    testkit::an_upgraded_fencing_table_continues_its_counter(&locker, &key).await;
    // A second client finds the columns there and alters nothing.
    connect(&format!("&fencing_table={table}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_connection_frees_every_lock_it_holds() {
    // One shared session: both locks live on it.
    let holder = connect("&sessions=1").await;
    let operator = connect("").await;
    testkit::terminating_a_session_frees_every_lock_it_holds(
        (&holder, &operator),
        (&unique_key("kill-a"), &unique_key("kill-b")),
        "own connection",
    )
    .await;

    // A plain GET_LOCK's connection is killed too.
    let (mut plain, _) = plain_client().await;
    let key = unique_key("kill-plain");
    plain_lock(&mut plain, &key).await;
    let evicted = operator
        .force_release(&key, ForceRelease::TerminateSession)
        .await
        .expect("force release")
        .expect("held");
    assert_eq!(evicted.holder, None);
    assert!(
        plain.query_drop("DO 1").await.is_err(),
        "its connection is gone"
    );
    assert_eq!(operator.inspect(&key).await.expect("inspect"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_right_to_kill_gets_the_servers_reason() {
    let user = format!("weak{:08x}", rand::random::<u32>());
    MariaDbServer::shared().create_user(&user, "pw-weak");
    let weak = MysqlLocker::from_url(&MariaDbServer::shared().url_as(&user, "pw-weak"))
        .await
        .expect("connect as the weak user");
    let holder = connect("").await;
    testkit::a_refused_termination_keeps_the_lock(
        (&weak, &holder),
        &unique_key("weak"),
        &["1095", "CONNECTION_ADMIN"],
    )
    .await;
}
