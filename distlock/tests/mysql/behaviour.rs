//! What the MySQL backend promises beyond the shared contract, checked on a
//! real MariaDB server: lock names, killed holders and waiters, abandoned
//! waits, the connection bound, fencing, TLS and clear errors.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use distlock::mysql::{lock_name, lock_name_in, MysqlLocker, DEFAULT_SESSIONS};
use distlock::{Error, Locker, LostReason};
use test_servers::{unique_key, MariaDbOptions, MariaDbServer};
use tokio::time::Instant;

use crate::common::eventually;
use crate::support::{connect, name_of, waiting_for, TTL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_names_match_the_documented_sql() {
    let long = format!("{}-end", "Long Key ".repeat(100));
    for key in [
        "nightly-report",
        "Job",
        "Billing Run",
        "clé/ключ/日本",
        "with'quote",
        long.as_str(),
    ] {
        let name = lock_name(key);
        let quoted = key.replace('\'', "''");
        let expected = if name == key {
            key.to_owned()
        } else {
            MariaDbServer::shared().sql(&format!(
                "SELECT CONCAT(LOWER(REGEXP_REPLACE(LEFT('{quoted}', 24), '[^A-Za-z0-9_.:/-]', '_')), \
                 '~', LEFT(SHA2('{quoted}', 256), 32))"
            ))
        };
        assert_eq!(name, expected, "{key:?}");
        assert!(name.len() <= 64, "{key:?}: {name}");
        for namespace in ["distlock", "svc_a", "Billing DB: 2026"] {
            let name = lock_name_in(namespace, key);
            let expected = MariaDbServer::shared().sql(&format!(
                "SELECT CONCAT(LOWER(REGEXP_REPLACE(LEFT('{namespace}', 12), '[^A-Za-z0-9_.:/-]', '_')), '~', \
                 LOWER(REGEXP_REPLACE(LEFT('{quoted}', 18), '[^A-Za-z0-9_.:/-]', '_')), '~', \
                 LEFT(SHA2(CONCAT('{namespace}', CHAR(0), '{quoted}'), 256), 32))"
            ));
            assert_eq!(name, expected, "{namespace:?} {key:?}");
            assert!(name.len() <= 64, "{namespace:?} {key:?}: {name}");
        }
    }
    // The name a locker takes is the one a person would lock by hand.
    let locker = connect("").await;
    let key = unique_key("By Hand");
    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("free");
    assert_eq!(locker.backend_key(&key), name_of(&key));
    assert!(MariaDbServer::shared()
        .lock_holder(&name_of(&key))
        .is_some());
    let by_hand = MariaDbServer::shared().sql(&format!("SELECT GET_LOCK('{}', 0)", name_of(&key)));
    assert_eq!(by_hand, "0", "held by the locker's session");
    lease.release().await.unwrap();
    assert_eq!(MariaDbServer::shared().lock_holder(&name_of(&key)), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_differing_in_case_length_or_non_ascii_bytes_are_distinct_locks() {
    let (a, b) = (connect("").await, connect("").await);
    let base = unique_key("case");
    let long = "x".repeat(900);
    let pairs = [
        (base.clone(), base.to_uppercase()),
        (format!("{base}-job"), format!("{base}-Job")),
        (format!("{long}{base}-1"), format!("{long}{base}-2")),
        (format!("{base}-clé"), format!("{base}-cle")),
        (format!("{base}-é"), format!("{base}-è")),
        (format!("{base}-日本"), format!("{base}-中国")),
    ];
    for (first, second) in &pairs {
        let one = a
            .try_lock(first, TTL)
            .await
            .unwrap()
            .expect("first is free");
        let two = b
            .try_lock(second, TTL)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{second:?} must not be the lock {first:?}"));
        // And each is really held: the other client cannot take it.
        assert!(b.try_lock(first, TTL).await.unwrap().is_none(), "{first:?}");
        assert!(
            a.try_lock(second, TTL).await.unwrap().is_none(),
            "{second:?}"
        );
        assert_ne!(name_of(first), name_of(second));
        one.release().await.unwrap();
        two.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_session_fires_lost_and_frees_the_lock_at_once() {
    let (holder, other) = (connect("").await, connect("").await);
    let key = unique_key("kill");
    let lease = holder.try_lock(&key, TTL).await.unwrap().expect("free");
    let mut lost = lease.lost_signal();
    let connection = MariaDbServer::shared()
        .lock_holder(&name_of(&key))
        .expect("the holder's session holds it");
    MariaDbServer::shared().sql(&format!("KILL {connection}"));
    let killed = Instant::now();
    // The server freed it with the session: another client gets it now.
    let taken = other
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .expect("free once the holder's session is killed");
    // The holder learns it at its next ping (every second when idle).
    let reason = tokio::time::timeout(Duration::from_secs(5), lost.wait())
        .await
        .expect("the lost signal fires within 5 s");
    eprintln!("lost signal {:?} after the KILL", killed.elapsed());
    assert_eq!(reason, LostReason::ConnectionLost);
    assert!(lease
        .valid_until()
        .is_some_and(|until| until <= Instant::now()));
    assert_eq!(holder.held_count(), 0);
    assert!(matches!(
        lease.release().await,
        Err(Error::NotHeld { .. }) | Ok(())
    ));
    // The holder's locker opens a new session and goes on working.
    assert!(
        holder.try_lock(&key, TTL).await.unwrap().is_none(),
        "held by `other`"
    );
    taken.release().await.unwrap();
    holder
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .expect("free again")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_query_of_a_waiter_is_an_error_not_contention() {
    let (holder, waiter) = (connect("").await, connect("").await);
    let key = unique_key("kill-query");
    let name = name_of(&key);
    let held = holder.try_lock(&key, TTL).await.unwrap().expect("free");
    let wait = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.lock(&key, TTL, Duration::from_secs(30)).await })
    };
    eventually(
        Duration::from_secs(5),
        "the wait reaches the server",
        || waiting_for(MariaDbServer::shared(), &name).len() == 1,
    )
    .await;
    let id = waiting_for(MariaDbServer::shared(), &name)[0];
    MariaDbServer::shared().sql(&format!("KILL QUERY {id}"));
    let err = tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("the wait ends")
        .unwrap()
        .expect_err("a killed wait is no grant");
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    assert!(err.is_outage() && !err.is_contention(), "{err}");
    assert!(err.to_string().contains("NULL"), "{err}");
    held.release().await.unwrap();
    // Nothing was left granted to the waiter.
    holder
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_wait_is_killed_on_the_server_and_granted_to_nobody() {
    let (holder, waiter) = (connect("").await, connect("").await);
    let key = unique_key("abandoned");
    let name = name_of(&key);
    let held = holder.try_lock(&key, TTL).await.unwrap().expect("free");
    let wait = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.lock(&key, TTL, Duration::from_secs(60)).await })
    };
    eventually(
        Duration::from_secs(5),
        "the wait reaches the server",
        || waiting_for(MariaDbServer::shared(), &name).len() == 1,
    )
    .await;
    wait.abort();
    assert!(wait.await.unwrap_err().is_cancelled());
    let gone = eventually(Duration::from_secs(5), "KILL QUERY ends the wait", || {
        waiting_for(MariaDbServer::shared(), &name).is_empty()
    })
    .await;
    eprintln!("the abandoned wait left the server {gone:?} after the cancellation");
    held.release().await.unwrap();
    // Had the wait still been on the server, it would now hold the lock.
    let next = holder.try_lock(&key, TTL).await.unwrap();
    assert!(
        next.is_some(),
        "the lock went to a waiter nobody listens to"
    );
    assert_eq!(waiter.held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_held_locks_use_the_documented_connections() {
    let user = "thousand";
    MariaDbServer::shared().create_user(user, "pw-1000");
    let locker = MysqlLocker::from_url(&MariaDbServer::shared().url_as(user, "pw-1000"))
        .await
        .unwrap();
    let base = unique_key("thousand");
    let started = Instant::now();
    let mut leases = Vec::new();
    for i in 0..1000 {
        let key = format!("{base}-{i}");
        leases.push(locker.try_lock(&key, TTL).await.unwrap().expect("free"));
    }
    eprintln!("1,000 acquires in {:?}", started.elapsed());
    assert_eq!(locker.held_count(), 1000);
    let connections = MariaDbServer::shared().connections_of(user);
    eprintln!("1,000 held locks: {} connections", connections.len());
    assert_eq!(connections.len(), DEFAULT_SESSIONS, "{connections:?}");
    // Every one is really held on the server.
    let names: Vec<String> = (0..1000)
        .map(|i| format!("SELECT '{}' AS n", name_of(&format!("{base}-{i}"))))
        .collect();
    let held = MariaDbServer::shared().sql(&format!(
        "SELECT SUM(IS_USED_LOCK(n) IS NOT NULL) FROM ({}) AS names",
        names.join(" UNION ALL ")
    ));
    assert_eq!(held, "1000");
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert_eq!(locker.held_count(), 0);
}

/// A keepalive batch asks each session about up to 256 of its locks per
/// statement: 600 leases on 4 sessions are a handful of `SELECT`s, not 600;
/// the locks of a killed session answer `NotHeld`, the others are held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_batch_asks_each_session_once_per_256_locks() {
    // A server of its own: its statement count is this test's alone.
    let server = MariaDbServer::start();
    let locker = MysqlLocker::from_url(&server.url()).await.unwrap();
    let mut leases = Vec::new();
    for i in 0..600 {
        let key = format!("batch-{i}");
        leases.push(locker.try_lock(&key, TTL).await.unwrap().expect("free"));
    }
    let requests: Vec<distlock::RefreshRequest<'_>> = leases
        .iter()
        .map(|lease| distlock::RefreshRequest {
            key: lease.key(),
            owner: lease.owner(),
            ttl: TTL,
        })
        .collect();
    let selects = || -> u64 {
        let status = server.sql("SHOW GLOBAL STATUS LIKE 'Com_select'");
        status.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let before = selects();
    let results = locker.refresh_many(&requests).await;
    // One per session holding at most 256 of them, 3 for one holding all
    // (ceil(600 / 256)): at most 12 on 4 sessions.
    let statements = selects() - before;
    eprintln!("600 leases refreshed in {statements} statements");
    assert!(
        (1..=12).contains(&statements),
        "{statements} statements for 600 leases"
    );
    assert!(results.iter().all(Result::is_ok), "{results:?}");

    let connections = server.connections_of(MariaDbServer::USER);
    server.sql(&format!("KILL {}", connections[0]));
    // The locker finds the killed session at its next ping.
    eventually(
        Duration::from_secs(5),
        "the killed session is noticed",
        || locker.held_count() < 600,
    )
    .await;
    let results = locker.refresh_many(&requests).await;
    let lost = results
        .iter()
        .filter(|result| matches!(result, Err(Error::NotHeld { .. })))
        .count();
    assert_eq!(
        lost,
        600 - locker.held_count(),
        "the killed session's leases"
    );
    assert!(lost < 600, "{lost} of 600 lost with one of 4 sessions");
    assert_eq!(
        results.iter().filter(|result| result.is_ok()).count(),
        600 - lost,
        "every other lease is still held: {results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_row_locked_elsewhere_fails_one_attempt_and_leaves_the_lock_free() {
    // A table of its own: the blocked upsert's lock request also holds up
    // inserts of new names just below this one, which would fail other
    // tests' attempts.
    let locker = connect("&fencing_table=rowlock_fencing").await;
    let key = unique_key("row-locked");
    let name = name_of(&key);
    // Create the row, then hold its row lock from another session.
    locker
        .try_lock(&key, TTL)
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
    let mut blocker = MariaDbServer::shared()
        .client_command()
        .arg(MariaDbServer::DATABASE)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = blocker.stdin.take().unwrap();
    writeln!(
        stdin,
        "BEGIN; SELECT token FROM rowlock_fencing WHERE lock_name = '{name}' FOR UPDATE; SELECT SLEEP(20);"
    )
    .unwrap();
    eventually(Duration::from_secs(5), "the row lock is taken", || {
        MariaDbServer::shared().sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(20)%'") == "1"
    })
    .await;
    let started = Instant::now();
    let err = locker.try_lock(&key, TTL).await.unwrap_err();
    eprintln!("failed after {:?}: {err}", started.elapsed());
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    assert!(
        err.to_string().contains("1205"),
        "a lock wait timeout: {err}"
    );
    // The GET_LOCK that preceded the failed bump was released.
    assert_eq!(MariaDbServer::shared().lock_holder(&name), None);
    let _ = blocker.kill();
    let _ = blocker.wait();
    eventually(Duration::from_secs(5), "the blocker's session ends", || {
        MariaDbServer::shared().sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(20)%'") == "0"
    })
    .await;
    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("free");
    assert_eq!(lease.fencing_token(), Some(2));
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_off_uses_no_table_and_gives_no_token() {
    let locker = connect("&fencing=off").await;
    assert!(!locker.capabilities().fencing);
    let lease = locker
        .try_lock(&unique_key("no-fence"), TTL)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(lease.fencing_token(), None);
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error_that_never_shows_it() {
    let url = MariaDbServer::shared()
        .url()
        .replace(MariaDbServer::PASSWORD, "hunter2-wrong");
    let err = MysqlLocker::from_url(&url).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Backend { .. }), "{text}");
    assert!(text.contains("Access denied"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    let via_connect = distlock::connect(&url).await.unwrap_err().to_string();
    assert!(!via_connect.contains("hunter2"), "{via_connect}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_and_mariadb_urls_connect() {
    for scheme in ["mysql", "mariadb"] {
        let url = MariaDbServer::shared().url().replacen("mysql", scheme, 1);
        let locker = distlock::connect(&url).await.unwrap();
        assert_eq!(locker.backend(), "mysql");
        let lease = locker
            .try_lock(&unique_key(scheme), TTL)
            .await
            .unwrap()
            .expect("free");
        lease.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_modes_encrypt_and_check_what_they_say() {
    let tls = MariaDbServer::start_with(MariaDbOptions {
        tls: true,
        ..MariaDbOptions::default()
    });
    // This account cannot log in without TLS.
    tls.sql("CREATE USER 'tlsonly'@'%' IDENTIFIED BY 'pw' REQUIRE SSL; GRANT ALL ON distlock.* TO 'tlsonly'@'%'");
    let ca = tls.ca_cert().display().to_string();
    let base = |host: &str, mode: &str| {
        format!(
            "mysql://tlsonly:pw@{host}:{}/distlock?ssl-mode={mode}&ssl-ca={ca}",
            tls.port()
        )
    };
    for (host, mode) in [
        ("127.0.0.1", "REQUIRED"),
        ("127.0.0.1", "PREFERRED"),
        ("localhost", "VERIFY_IDENTITY"),
    ] {
        let locker = MysqlLocker::from_url(&base(host, mode))
            .await
            .unwrap_or_else(|e| panic!("{mode} to {host}: {e}"));
        let lease = locker
            .try_lock(&unique_key("tls"), TTL)
            .await
            .unwrap()
            .expect("free");
        lease.release().await.unwrap();
    }
    // The certificate names localhost, not 127.0.0.1.
    let err = MysqlLocker::from_url(&base("127.0.0.1", "VERIFY_IDENTITY"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    // Without TLS the account is refused: the modes above did encrypt.
    let err = MysqlLocker::from_url(&base("127.0.0.1", "DISABLED"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Access denied"), "{err}");
}

/// A client on the path can strip TLS from one connection (answer without
/// the SSL capability); under PREFERRED that must cost that connection only,
/// never every later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_tries_tls_again_on_every_connection_after_a_server_without_it() {
    let mut server = MariaDbServer::start();
    let url = server
        .url()
        .replace("ssl-mode=DISABLED", "ssl-mode=PREFERRED");
    // The server offers no TLS: the locker connects without it.
    let locker = MysqlLocker::from_url(&url).await.unwrap();
    let lease = locker
        .try_lock(&unique_key("plain"), TTL)
        .await
        .unwrap()
        .expect("free");
    lease.release().await.unwrap();
    server.restart_with_tls();
    // From now on the account can log in over TLS only.
    server.sql(&format!(
        "ALTER USER '{}'@'%' REQUIRE SSL",
        MariaDbServer::USER
    ));
    // The locker's session died with the restart; the next one it opens
    // must try TLS again, and so get in.
    let key = unique_key("tls-again");
    let deadline = Instant::now() + Duration::from_secs(10);
    let lease = loop {
        match locker.try_lock(&key, TTL).await {
            Ok(lease) => break lease.expect("free"),
            // The dead session is noticed first.
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no session over TLS after the server gained it: {e}"),
        }
    };
    assert!(server.lock_holder(&name_of(&key)).is_some());
    lease.release().await.unwrap();
}
