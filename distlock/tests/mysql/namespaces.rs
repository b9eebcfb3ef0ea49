//! Lock names are server-wide while fencing rows and marks live in a
//! database: each locker's namespace (by default its database) keeps two
//! services on one server apart, and one chosen namespace joins them.

use distlock::inspect::ForceRelease;
use distlock::mysql::{lock_name, lock_name_in, MysqlLocker};
use distlock::{Locker, MarkAdvance, RefreshRequest};
use test_servers::{unique_key, MariaDbServer};

use crate::support::TTL;

/// A database of its own on the shared server, usable by the test account.
fn database(name: &str) -> String {
    let name = unique_key(name).replace('-', "_");
    MariaDbServer::shared().sql(&format!(
        "CREATE DATABASE {name}; GRANT ALL ON {name}.* TO '{}'@'%'",
        MariaDbServer::USER
    ));
    name
}

/// The test server's URL for `database`, with `params` (`&…`) appended.
fn url_of(database: &str, params: &str) -> String {
    let url = MariaDbServer::shared().url();
    let url = url.replacen(
        &format!("/{}?", MariaDbServer::DATABASE),
        &format!("/{database}?"),
        1,
    );
    format!("{url}{params}")
}

async fn locker(database: &str, params: &str) -> MysqlLocker {
    MysqlLocker::from_url(&url_of(database, params))
        .await
        .expect("connect to the test server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_on_one_server_hold_the_same_key_at_once() {
    let (db_a, db_b) = (database("svc_a"), database("svc_b"));
    let (a, b) = (locker(&db_a, "").await, locker(&db_b, "").await);
    let key = "cleanup";
    let mut lease_a = a.try_lock(key, TTL).await.unwrap().expect("free in svc_a");
    let lease_b = b
        .try_lock(key, TTL)
        .await
        .unwrap()
        .expect("svc_b's cleanup is not svc_a's");
    assert_eq!(
        (a.namespace(), b.namespace()),
        (db_a.as_str(), db_b.as_str())
    );
    assert_eq!(a.backend_key(key), lock_name_in(&db_a, key));
    assert_eq!(b.backend_key(key), lock_name_in(&db_b, key));
    // Each is really held, under its namespaced name, by its own locker.
    assert!(a.try_lock(key, TTL).await.unwrap().is_none());
    assert!(b.try_lock(key, TTL).await.unwrap().is_none());
    assert!(MariaDbServer::shared()
        .lock_holder(&a.backend_key(key))
        .is_some());
    assert_eq!(MariaDbServer::shared().lock_holder(&lock_name(key)), None);
    // Fencing rows, inspection, listing and the keepalive name the same lock.
    assert_eq!(lease_a.fencing_token(), Some(1));
    assert_eq!(lease_b.fencing_token(), Some(1));
    let seen = a.inspect(key).await.unwrap().expect("held");
    assert_eq!(seen.fencing_token, Some(1));
    assert!(seen.holder.is_some(), "{seen:?}");
    let listed = a.list("clean").await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|held| held.key.as_str())
            .collect::<Vec<_>>(),
        ["cleanup"]
    );
    lease_a.refresh(TTL).await.unwrap();
    let batch = a
        .refresh_many(&[RefreshRequest {
            key,
            owner: lease_a.owner(),
            ttl: TTL,
        }])
        .await;
    assert!(matches!(batch.as_slice(), [Ok(())]), "{batch:?}");
    // Marks too: each service's first tick is its own.
    assert_eq!(
        a.advance_mark(key, 7).await.unwrap(),
        MarkAdvance::Advanced { previous: None }
    );
    assert_eq!(
        b.advance_mark(key, 7).await.unwrap(),
        MarkAdvance::Advanced { previous: None }
    );
    lease_a.release().await.unwrap();
    lease_b.release().await.unwrap();
    assert_eq!(
        MariaDbServer::shared().lock_holder(&a.backend_key(key)),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_chosen_prefix_makes_two_databases_exclude_each_other() {
    let (db_a, db_b) = (database("svc_a"), database("svc_b"));
    // One namespace and one fencing table, as the module docs advise.
    let shared = format!("&prefix=shared&fencing_table={db_a}.distlock_fencing");
    let (a, b) = (locker(&db_a, &shared).await, locker(&db_b, &shared).await);
    assert_eq!(a.backend_key("cleanup"), lock_name_in("shared", "cleanup"));
    let key = unique_key("cleanup");
    let lease = a.try_lock(&key, TTL).await.unwrap().expect("free");
    assert!(b.try_lock(&key, TTL).await.unwrap().is_none(), "held by a");
    let seen = b.inspect(&key).await.unwrap().expect("b sees a's lock");
    assert_eq!(seen.fencing_token, lease.fencing_token());
    // The operator's eviction from b frees a's lock.
    b.force_release(&key, ForceRelease::TerminateSession)
        .await
        .unwrap()
        .expect("held");
    let taken = b.try_lock(&key, TTL).await.unwrap().expect("freed");
    assert_eq!(
        taken.fencing_token(),
        lease.fencing_token().map(|token| token + 1)
    );
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_prefix_takes_the_bare_name_other_get_lock_users_take() {
    let db = database("plain");
    let locker = locker(&db, "&prefix=").await;
    let key = unique_key("by-hand");
    assert_eq!(locker.namespace(), "");
    assert_eq!(locker.backend_key(&key), lock_name(&key));
    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("free");
    let by_hand =
        MariaDbServer::shared().sql(&format!("SELECT GET_LOCK('{}', 0)", lock_name(&key)));
    assert_eq!(by_hand, "0", "held under the bare name");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_fencing_table_lists_only_this_namespace() {
    let (db_a, db_b) = (database("svc_a"), database("svc_b"));
    let table = format!("&fencing_table={db_a}.distlock_fencing");
    let (a, b) = (locker(&db_a, &table).await, locker(&db_b, &table).await);
    let key = unique_key("report");
    let lease_a = a.try_lock(&key, TTL).await.unwrap().expect("free in svc_a");
    let lease_b = b.try_lock(&key, TTL).await.unwrap().expect("free in svc_b");
    for (locker, lease) in [(&a, &lease_a), (&b, &lease_b)] {
        let listed = locker.list(&key).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].fencing_token, lease.fencing_token());
    }
    lease_a.release().await.unwrap();
    lease_b.release().await.unwrap();
}
