//! A server that may evict keys when its memory fills (`maxmemory` with a
//! `maxmemory-policy` other than `noeviction`, the default of managed
//! Redis parameter groups) is refused when the locker is built, naming the
//! setting, unless `allow_eviction=true` accepts it with a warning. Read
//! with `CONFIG GET`, or `INFO` where `CONFIG` is renamed away; on one
//! server, each Redlock node, each master of a cluster, and the master the
//! sentinels name.

use std::time::Duration;

use distlock::redis::{FactsSource, RedisLocker};
use distlock::{Error, Locker};
use test_servers::{RedisCluster, RedisOptions, RedisSentinelSet, RedisServer};

use crate::support::Warnings;

const TTL: Duration = Duration::from_secs(60);
const TEN_MB: u64 = 10 * 1024 * 1024;

fn server_with(args: &[&str]) -> RedisServer {
    RedisServer::start_with(RedisOptions {
        extra_args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..RedisOptions::default()
    })
}

/// The reason of a refusal, which must be the server-configuration kind.
fn refusal(error: Error) -> String {
    match error {
        Error::InvalidInput {
            what: "server configuration",
            reason,
        } => reason,
        other => panic!("not a server-configuration refusal: {other:?}"),
    }
}

#[tokio::test]
async fn a_volatile_lru_server_is_refused_naming_the_setting_and_the_fix() {
    let server = server_with(&["--maxmemory", "10mb", "--maxmemory-policy", "volatile-lru"]);
    let reason = refusal(RedisLocker::from_url(&server.url()).await.unwrap_err());
    for expected in [
        &format!("127.0.0.1:{}", server.port()),
        "maxmemory-policy is volatile-lru with maxmemory 10485760 bytes (read with CONFIG GET)",
        "evicts keys with a ttl first",
        "two holders",
        "CONFIG SET maxmemory-policy noeviction",
        "parameter group",
        "allow_eviction=true",
    ] {
        assert!(reason.contains(expected), "{expected:?} not in: {reason}");
    }
    // Under allkeys-* the fence counter and the marks can go too.
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let reason = refusal(distlock::connect(&server.url()).await.unwrap_err());
    assert!(
        reason.contains("maxmemory-policy is allkeys-lru")
            && reason.contains("fencing tokens restart at 1")
            && reason.contains("finished ticks run again"),
        "{reason}"
    );
}

#[tokio::test]
async fn noeviction_or_no_limit_is_accepted() {
    let server = server_with(&["--maxmemory", "10mb", "--maxmemory-policy", "noeviction"]);
    let locker = RedisLocker::from_url(&server.url())
        .await
        .expect("accepted");
    let [facts] = locker.server_facts() else {
        panic!("one server, one set of facts: {:?}", locker.server_facts());
    };
    assert_eq!(facts.source, FactsSource::ConfigGet);
    assert_eq!(facts.maxmemory, Some(TEN_MB));
    assert_eq!(facts.maxmemory_policy.as_deref(), Some("noeviction"));
    assert_eq!(facts.appendonly, Some(false));
    assert_eq!(facts.save.as_deref(), Some(""));
    assert_eq!(facts.connected_replicas, Some(0));
    // maxmemory 0 is no limit: nothing is ever evicted, whatever the policy.
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let locker = RedisLocker::from_url(&server.url())
        .await
        .expect("accepted");
    assert_eq!(locker.server_facts()[0].maxmemory, Some(0));
    let lease = locker.try_lock("k", TTL).await.unwrap().expect("free");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_renamed_config_command_is_read_through_info() {
    let server = server_with(&[
        "--maxmemory",
        "10mb",
        "--maxmemory-policy",
        "volatile-lru",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let reason = refusal(RedisLocker::from_url(&server.url()).await.unwrap_err());
    assert!(
        reason.contains("maxmemory-policy is volatile-lru with maxmemory 10485760 bytes")
            && reason.contains("read with INFO memory (CONFIG GET is refused here)"),
        "{reason}"
    );
    // The same server made safe: accepted, its facts from INFO.
    let safe = server_with(&[
        "--maxmemory",
        "10mb",
        "--maxmemory-policy",
        "noeviction",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let locker = RedisLocker::from_url(&safe.url()).await.expect("accepted");
    let facts = &locker.server_facts()[0];
    assert_eq!(facts.source, FactsSource::Info);
    assert_eq!(
        (facts.maxmemory, facts.maxmemory_policy.as_deref()),
        (Some(TEN_MB), Some("noeviction"))
    );
    assert_eq!(facts.appendonly, Some(false));
    assert_eq!(facts.appendfsync, None, "INFO does not report it");
}

#[tokio::test]
async fn unreadable_settings_warn_once_and_the_locker_works() {
    let server = RedisServer::start();
    // A user who may lock but neither CONFIG GET nor INFO.
    server.cli(&[
        "ACL", "SETUSER", "locks", "on", ">pw", "~*", "&*", "+@all", "-config", "-info",
    ]);
    let url = format!("redis://locks:pw@127.0.0.1:{}", server.port());
    let (warnings, _guard) = Warnings::capture();
    let locker = RedisLocker::from_url(&url).await.expect("accepted");
    let unread = warnings.containing("cannot read the server's maxmemory-policy and appendonly");
    assert_eq!(unread.len(), 1, "{:?}", warnings.all());
    assert!(
        unread[0].contains("no permissions to run the 'config|get' command")
            && unread[0].contains("no permissions to run the 'info' command"),
        "{}",
        unread[0]
    );
    assert!(locker.server_facts().is_empty());
    let lease = locker.try_lock("k", TTL).await.unwrap().expect("free");
    lease.release().await.unwrap();
    // require_appendonly wants proof, and there is none.
    let strict = format!("{url}?require_appendonly=true");
    let reason = refusal(RedisLocker::from_url(&strict).await.unwrap_err());
    assert!(reason.contains("cannot be read"), "{reason}");
}

/// The opt-out, and why it is opt-in: a `volatile-lru` server that fills up
/// evicts the held lock's key (the only key with a ttl), and a second caller
/// takes the lock while the first still believes it holds it.
#[tokio::test]
async fn the_opt_out_warns_and_a_full_volatile_lru_server_evicts_a_held_lock() {
    let server = server_with(&[
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        "volatile-lru",
        "--enable-debug-command",
        "yes",
    ]);
    let url = format!("{}?allow_eviction=true", server.url());
    let (warnings, _guard) = Warnings::capture();
    let first = RedisLocker::from_url(&url).await.expect("accepted");
    let accepted = warnings.containing("maxmemory-policy is volatile-lru");
    assert_eq!(accepted.len(), 1, "{:?}", warnings.all());
    assert!(accepted[0].contains("accepted: allow_eviction is set"));
    let second = RedisLocker::from_url(&url).await.expect("accepted");

    let mut lease = first.try_lock("k", TTL).await.unwrap().expect("free");
    assert!(second.try_lock("k", TTL).await.unwrap().is_none(), "held");
    // 5 MB of keys without a ttl: over the limit, Redis evicts the keys
    // with a ttl, here the lock.
    server.cli(&["DEBUG", "POPULATE", "5000", "filler", "1000"]);
    assert_eq!(server.cli(&["EXISTS", &first.backend_key("k")]), "0");
    // Memory frees up again (other keys expire or are deleted): writes are
    // accepted, and the lock is free.
    server.cli(&["CONFIG", "SET", "maxmemory", "64mb"]);
    let taken = second
        .try_lock("k", TTL)
        .await
        .unwrap()
        .expect("the evicted lock is free for a second holder");
    assert!(
        matches!(lease.refresh(TTL).await, Err(Error::NotHeld { .. })),
        "the first holder learns it only at its refresh"
    );
    // The fence counter has no ttl: volatile-lru keeps it.
    assert_eq!(
        taken.fencing_token(),
        Some(lease.fencing_token().unwrap() + 1)
    );
}

#[cfg(feature = "redlock")]
#[tokio::test]
async fn every_redlock_node_is_checked() {
    use distlock::redlock::RedlockLocker;

    let safe = [RedisServer::start(), RedisServer::start()];
    let evicting = server_with(&["--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lfu"]);
    let url = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        safe[0].port(),
        evicting.port(),
        safe[1].port()
    );
    let reason = refusal(RedlockLocker::from_url(&url).await.unwrap_err());
    assert!(
        reason.contains(&format!("127.0.0.1:{}", evicting.port()))
            && reason.contains("maxmemory-policy is allkeys-lfu"),
        "{reason}"
    );
    let accepted = RedlockLocker::from_url(&format!("{url}?allow_eviction=true")).await;
    assert!(accepted.is_ok(), "{accepted:?}");
}

#[tokio::test]
async fn every_cluster_master_is_checked() {
    let cluster = RedisCluster::start();
    let ports = cluster.ports();
    let locker = RedisLocker::from_url(&cluster.url()).await.expect("safe");
    assert_eq!(
        locker.server_facts().len(),
        3,
        "{:?}",
        locker.server_facts()
    );
    let last = ports[2];
    cluster.cli(last, &["CONFIG", "SET", "maxmemory", "10mb"]);
    cluster.cli(last, &["CONFIG", "SET", "maxmemory-policy", "volatile-ttl"]);
    let reason = refusal(RedisLocker::from_url(&cluster.url()).await.unwrap_err());
    assert!(
        reason.contains(&format!(
            "127.0.0.1:{last}: maxmemory-policy is volatile-ttl"
        )),
        "{reason}"
    );
}

#[tokio::test]
async fn the_master_the_sentinels_name_is_checked() {
    let set = RedisSentinelSet::start();
    let master = set.master();
    master.cli(&["CONFIG", "SET", "maxmemory", "10mb"]);
    master.cli(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
    let reason = refusal(RedisLocker::from_url(&set.url()).await.unwrap_err());
    assert!(
        reason.contains("maxmemory-policy is volatile-lru"),
        "{reason}"
    );
    master.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let locker = RedisLocker::from_url(&set.url()).await.expect("safe");
    assert_eq!(locker.server_facts()[0].connected_replicas, Some(1));
}
