//! Inspection and operator release on MariaDB beyond the conformance
//! checks: plain `GET_LOCK` holders (an unknown holder, never free), stale
//! records, the native wait's record, recording and fencing turned off,
//! the upgrade of a table created before holder records, and `KILL` of the
//! holding connection ending every lock it holds.

use std::time::Duration;

use distlock::inspect::{with_label, Clock, ForceRelease};
use distlock::mysql::MysqlLocker;
use distlock::{Error, Locker, LostReason};
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
async fn the_native_wait_records_its_holder_whatever_its_label() {
    let (holder, waiter) = (connect("").await, connect("").await);
    let key = unique_key("Wait Record ünï");
    let first = holder
        .try_lock(&key, TTL)
        .await
        .expect("try")
        .expect("free");
    let label = "it's a \\ label'); DROP TABLE distlock_fencing; -- ünïcødé\n2nd line";
    let wait = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        with_label(label, async move {
            waiter
                .lock(&key, Duration::from_secs(7), Duration::from_secs(20))
                .await
        })
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.release().await.expect("release");
    let lease = wait.await.expect("join").expect("the waiter wins");
    let held = holder.inspect(&key).await.expect("inspect").expect("held");
    let recorded = held.holder.expect("recorded");
    assert_eq!(recorded.label, label);
    assert_eq!(recorded.pid, std::process::id());
    assert_eq!(held.ttl, Some(Duration::from_secs(7)));
    assert_eq!(held.fencing_token, lease.fencing_token());
    assert_eq!(held.granted.expect("granted").clock, Clock::Server);
    let listed = holder.list("Wait Record ü").await.expect("list");
    assert_eq!(listed.len(), 1, "a non-ASCII prefix matches: {listed:?}");
    assert!(
        holder.list("wait record").await.expect("list").is_empty(),
        "case matters"
    );
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_off_clears_the_holder_and_fencing_off_leaves_no_name() {
    let (on, off) = (connect("").await, connect("&holder=off").await);
    let key = unique_key("holder-off");
    on.try_lock(&key, TTL)
        .await
        .expect("try")
        .expect("free")
        .release()
        .await
        .expect("release");
    let lease = off.try_lock(&key, TTL).await.expect("try").expect("free");
    let held = on.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(
        held.holder, None,
        "the earlier holder's columns are cleared"
    );
    assert_eq!(held.fencing_token, lease.fencing_token());
    assert!(held.granted.is_some() && held.ttl == Some(TTL), "{held:?}");
    lease.release().await.expect("release");

    let bare = connect("&fencing=off").await;
    assert!(!bare.capabilities().list);
    let key = unique_key("fencing-off");
    let lease = bare.try_lock(&key, TTL).await.expect("try").expect("free");
    let held = bare.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!((held.holder, held.fencing_token), (None, None));
    assert!(held.session.expect("session").starts_with("connection "));
    match bare.list("").await {
        Err(Error::Unsupported { reason, .. }) => assert!(reason.contains("fencing"), "{reason}"),
        other => panic!("list without fencing: {other:?}"),
    }
    lease.release().await.expect("release");
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
    let lease = with_label("after the upgrade", locker.try_lock(&key, TTL))
        .await
        .expect("try")
        .expect("free");
    assert_eq!(lease.fencing_token(), Some(42), "the counter goes on");
    let held = locker.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(held.holder.expect("recorded").label, "after the upgrade");
    lease.release().await.expect("release");
    // A second client finds the columns there and alters nothing.
    connect(&format!("&fencing_table={table}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_connection_frees_every_lock_it_holds() {
    // One shared session: both locks live on it.
    let holder = connect("&sessions=1").await;
    let operator = connect("").await;
    let (first, second) = (unique_key("kill-a"), unique_key("kill-b"));
    let lease_a = holder
        .try_lock(&first, TTL)
        .await
        .expect("try")
        .expect("free");
    let lease_b = holder
        .try_lock(&second, TTL)
        .await
        .expect("try")
        .expect("free");
    let (mut lost_a, mut lost_b) = (lease_a.lost_signal(), lease_b.lost_signal());

    match operator.force_release(&first, ForceRelease::Lock).await {
        Err(Error::Unsupported { reason, .. }) => {
            assert!(
                reason.contains("TerminateSession") && reason.contains("EVERY"),
                "{reason}"
            )
        }
        other => panic!("ForceRelease::Lock on MySQL: {other:?}"),
    }
    match holder
        .force_release(&first, ForceRelease::TerminateSession)
        .await
    {
        Err(Error::Unsupported { reason, .. }) => {
            assert!(reason.contains("own connection"), "{reason}")
        }
        other => panic!("killing its own connection: {other:?}"),
    }
    assert!(operator.inspect(&first).await.expect("inspect").is_some());

    let evicted = operator
        .force_release(&first, ForceRelease::TerminateSession)
        .await
        .expect("force release")
        .expect("held");
    assert_eq!(evicted.fencing_token, lease_a.fencing_token());
    for key in [&first, &second] {
        assert_eq!(
            operator.inspect(key).await.expect("inspect"),
            None,
            "{key}: every lock of the connection is free once the call returns"
        );
    }
    for lost in [&mut lost_a, &mut lost_b] {
        let reason = tokio::time::timeout(Duration::from_secs(5), lost.wait())
            .await
            .expect("lost signal");
        assert_eq!(reason, LostReason::ConnectionLost);
    }

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
    let key = unique_key("weak");
    let lease = holder
        .try_lock(&key, TTL)
        .await
        .expect("try")
        .expect("free");
    match weak
        .force_release(&key, ForceRelease::TerminateSession)
        .await
    {
        Err(Error::Backend { source, .. }) => {
            let text = source.to_string();
            assert!(
                text.contains("1095") && text.contains("CONNECTION_ADMIN"),
                "{text}"
            );
        }
        other => panic!("force release without the privilege: {other:?}"),
    }
    assert!(
        holder.refresh(&key, lease.owner(), TTL).await.is_ok(),
        "still held"
    );
    lease.release().await.expect("release");
}

/// SQL text cannot hold a zero byte (Postgres refuses it): such a key is
/// still locked and inspected (not listed: no name is stored), and such a
/// label is recorded with U+FFFD in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_byte_in_a_key_or_label_does_not_break_the_grant() {
    let (locker, waiter) = (connect("").await, connect("").await);
    let base = unique_key("zero");
    let key = format!("{base}\0byte");
    let lease = with_label("a\0b", locker.try_lock(&key, TTL))
        .await
        .expect("try")
        .expect("free");
    let held = locker.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(held.holder.expect("recorded").label, "a\u{fffd}b");
    assert!(locker.list(&base).await.expect("list").is_empty());
    // The native wait's statement too.
    let wait = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        with_label("c\0d", async move {
            waiter.lock(&key, TTL, Duration::from_secs(20)).await
        })
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    lease.release().await.expect("release");
    let next = wait.await.expect("join").expect("the waiter wins");
    let held = locker.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(held.holder.expect("recorded").label, "c\u{fffd}d");
    next.release().await.expect("release");
}
