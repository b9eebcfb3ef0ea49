//! Election keys on etcd: a candidate's key holds what it proclaims (what
//! `etcdctl elect -l` prints), its secret and holder record its owner key
//! `lock:NAME:owner:<lease hex>`. Ownership stays as sound as a lock's: a
//! forged or stale owner token releases and refreshes nothing, inspection
//! and listing still name the leader, and every way a key goes takes its
//! owner key with it.

use std::sync::Arc;
use std::time::Duration;

use distlock::elect::Election;
use distlock::etcd::EtcdLocker;
use distlock::inspect::ForceRelease;
use distlock::{Error, Locker, RefreshRequest};
use test_servers::EtcdServer;

const WAIT: Option<Duration> = Some(Duration::from_secs(10));
const TTL: Duration = Duration::from_secs(5);

async fn connect(server: &EtcdServer, params: &str) -> EtcdLocker {
    EtcdLocker::from_url(&format!("{}{params}", server.url()))
        .await
        .expect("connect to the test etcd")
}

fn election(locker: &EtcdLocker, name: &str, proclaim: &str) -> Election {
    Election::new(Arc::new(locker.clone()), name)
        .ttl(TTL)
        .proclaim(proclaim)
}

/// Every key etcd has under `prefix`, in key order.
fn keys(server: &EtcdServer, prefix: &str) -> Vec<String> {
    server
        .etcdctl_ok(&["get", "--prefix", "--keys-only", prefix])
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The value of `key` (trimmed).
fn value(server: &EtcdServer, key: &str) -> String {
    server.etcdctl_ok(&["get", "--print-value-only", key])
}

/// The secret in an owner token: its third part.
fn secret_of(owner: &str) -> &str {
    owner.split(':').nth(2).expect("a secret")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_holds_the_proclamation_and_the_owner_key_the_secret_and_record() {
    let server = EtcdServer::start();
    let locker = connect(&server, "").await;
    let term = election(&locker, "E", "node-a")
        .campaign(WAIT)
        .await
        .expect("elected");
    let lease = locker.session_leases().await.pop().expect("one session");
    let owner = term.lease().owner().to_owned();
    assert!(owner.ends_with(":owner"), "an election candidate's token");

    assert_eq!(
        keys(&server, "lock:E"),
        [format!("lock:E/{lease}"), format!("lock:E:owner:{lease}")],
    );
    assert_eq!(
        value(&server, &format!("lock:E/{lease}")),
        "node-a",
        "the key holds exactly the proclamation"
    );
    let record = value(&server, &format!("lock:E:owner:{lease}"));
    assert!(
        record.starts_with(&format!("{}\ndistlock-holder 1\n", secret_of(&owner))),
        "the owner key starts with the secret, then the record: {record}"
    );
    assert!(record.contains("\nlabel=node-a"), "{record}");

    let held = locker.inspect("E").await.expect("inspect").expect("held");
    let holder = held.holder.as_ref().expect("the record is found");
    assert_eq!(holder.label, "node-a");
    assert_eq!(holder.pid, std::process::id());
    assert_eq!(held.value.as_deref(), Some("node-a"));
    assert_eq!(held.fencing_token, term.fencing_token());
    assert_eq!(held.session, Some(format!("lease {lease}")));

    let listed = locker.list("").await.expect("list");
    assert_eq!(listed.len(), 1, "the owner key is no lock: {listed:?}");
    assert_eq!(listed[0].key, "E");
    assert_eq!(listed[0].holder, held.holder);
    assert_eq!(listed[0].value.as_deref(), Some("node-a"));

    term.resign().await.expect("resign");
    assert_eq!(
        keys(&server, "lock:E"),
        Vec::<String>::new(),
        "both keys go"
    );
}

/// With holder records off, the key still holds what the candidate
/// proclaimed (it publishes that on purpose), the owner key only the
/// secret; the observer reads the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_holder_records_off_the_proclamation_is_still_published() {
    let server = EtcdServer::start();
    let locker = connect(&server, "?holder_record=off").await;
    let election = election(&locker, "E", "node-a");
    let term = election.campaign(WAIT).await.expect("elected");
    let lease = locker.session_leases().await.pop().expect("one session");
    assert_eq!(value(&server, &format!("lock:E/{lease}")), "node-a");
    assert_eq!(
        value(&server, &format!("lock:E:owner:{lease}")),
        secret_of(term.lease().owner()),
        "the secret, no record"
    );
    let leader = election
        .observe()
        .leader()
        .await
        .expect("observe")
        .expect("a leader");
    assert_eq!(leader.holder, None);
    assert_eq!(leader.proclaimed.as_deref(), Some("node-a"));
    assert_eq!(leader.term, term.fencing_token());
    term.resign().await.expect("resign");
}

/// A token with the right lease and revision but another secret, or the
/// right secret but claiming it is in the key's value, releases and
/// refreshes nothing; a term's token is stale once the next term of the
/// same locker (same lease, so the same key name) began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_stale_tokens_never_release_an_election_key() {
    let server = EtcdServer::start();
    let locker = connect(&server, "").await;
    let candidate = election(&locker, "E", "node-a");
    let term = candidate.campaign(WAIT).await.expect("elected");
    let owner = term.lease().owner().to_owned();
    let secret = secret_of(&owner);
    let forged = owner.replace(secret, &"0".repeat(32));
    let in_value = owner.trim_end_matches(":owner").to_owned();
    for token in [&forged, &in_value] {
        let refused = locker.unlock("E", token).await.expect_err("not ours");
        assert!(matches!(refused, Error::NotHeld { .. }), "{refused:?}");
        let refused = locker.refresh("E", token, TTL).await.expect_err("not ours");
        assert!(matches!(refused, Error::NotHeld { .. }), "{refused:?}");
    }
    locker.refresh("E", &owner, TTL).await.expect("still held");
    assert_eq!(keys(&server, "lock:E").len(), 2, "nothing was deleted");

    term.resign().await.expect("resign");
    let next = candidate.campaign(WAIT).await.expect("elected again");
    assert!(next.fencing_token() > Some(0));
    let stale = locker.unlock("E", &owner).await.expect_err("stale");
    assert!(matches!(stale, Error::NotHeld { .. }), "{stale:?}");
    let refused = locker.refresh("E", &owner, TTL).await.expect_err("stale");
    assert!(matches!(refused, Error::NotHeld { .. }), "{refused:?}");
    locker
        .refresh("E", next.lease().owner(), TTL)
        .await
        .expect("the newer term is untouched");
    next.resign().await.expect("resign");
    assert_eq!(keys(&server, "lock:E"), Vec::<String>::new());
}

/// A keepalive batch of more election grants than one transaction's 128
/// reads (each reads its key and its owner key) answers each grant in its
/// place, plain locks and a forged token among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_batch_checks_each_election_grant_in_its_place() {
    let server = EtcdServer::start();
    let locker = connect(&server, "").await;
    let mut terms = Vec::new();
    for n in 0..70 {
        let name = format!("E{n}");
        terms.push(
            election(&locker, &name, "node-a")
                .campaign(WAIT)
                .await
                .expect("elected"),
        );
    }
    let plain = locker
        .try_lock("plain", TTL)
        .await
        .expect("try_lock")
        .expect("free");
    let forged = terms[40]
        .lease()
        .owner()
        .replace(secret_of(terms[40].lease().owner()), &"0".repeat(32));
    let mut requests: Vec<RefreshRequest<'_>> = terms
        .iter()
        .map(|term| RefreshRequest {
            key: term.election(),
            owner: term.lease().owner(),
            ttl: TTL,
        })
        .collect();
    requests.insert(
        41,
        RefreshRequest {
            key: terms[40].election(),
            owner: &forged,
            ttl: TTL,
        },
    );
    requests.push(RefreshRequest {
        key: "plain",
        owner: plain.owner(),
        ttl: TTL,
    });
    let answers = locker.refresh_many(&requests).await;
    assert_eq!(answers.len(), requests.len());
    for (index, answer) in answers.iter().enumerate() {
        match index {
            41 => assert!(matches!(answer, Err(Error::NotHeld { .. })), "{answer:?}"),
            _ => assert!(answer.is_ok(), "request {index}: {answer:?}"),
        }
    }
    for term in terms {
        term.resign().await.expect("resign");
    }
    plain.release().await.expect("release");
    assert_eq!(keys(&server, "lock:"), Vec::<String>::new());
}

/// An operator's forced release deletes the leader's key and its owner key
/// (compared on the key's create revision), electing the next candidate;
/// the evicted leader's next refresh is `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_deletes_the_owner_key_too() {
    let server = EtcdServer::start();
    let (a, b) = (connect(&server, "").await, connect(&server, "").await);
    let term = election(&a, "E", "node-a")
        .campaign(WAIT)
        .await
        .expect("elected");
    let owner = term.lease().owner().to_owned();
    let waiting = tokio::spawn({
        let next = election(&b, "E", "node-b");
        async move { next.campaign(WAIT).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while keys(&server, "lock:E/").len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node-b never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let evicted = b
        .force_release("E", ForceRelease::Lock)
        .await
        .expect("force release")
        .expect("held");
    assert_eq!(
        evicted.holder.map(|holder| holder.label).as_deref(),
        Some("node-a")
    );
    let next = waiting.await.expect("task").expect("node-b is elected");
    let refused = a.refresh("E", &owner, TTL).await.expect_err("evicted");
    assert!(matches!(refused, Error::NotHeld { .. }), "{refused:?}");
    let b_lease = b.session_leases().await.pop().expect("b's session");
    assert_eq!(
        keys(&server, "lock:E"),
        [
            format!("lock:E/{b_lease}"),
            format!("lock:E:owner:{b_lease}")
        ],
        "node-a's owner key went with its key"
    );
    drop(term);
    next.resign().await.expect("resign");
}
