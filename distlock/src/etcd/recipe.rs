//! etcd's mutex recipe, as `concurrency.Mutex` writes it
//! (<https://github.com/etcd-io/etcd/blob/main/client/v3/concurrency/mutex.go>),
//! so that our locks, `etcdctl lock` and Go services order themselves in one
//! queue:
//!
//! - the lock name `P` has one key per contender, `P/<lease id in hex>`,
//!   attached to the contender's lease and written in a transaction only if
//!   absent;
//! - the holder is the key under `P/` with the lowest create revision;
//! - a waiter watches the key just ahead of it (the highest create revision
//!   below its own) until it is deleted, then looks again, until none is
//!   left ahead.
//!
//! Our keys' values start with the secret part of the owner token and a
//! line break, followed by the grant's holder record
//! ([`HolderRecord::encode`]; nothing with recording off). etcd's mutex
//! writes an empty value and never reads it. Release and refresh check the
//! grant's create revision *and* that the value starts with a secret nobody
//! else has (two range compares, [`secret_compares`]: etcd compares whole
//! values only).

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use tokio::time::Instant;

use crate::inspect::HolderRecord;

/// The prefix of every contender's key of lock name `name`: `name/`.
pub(super) fn queue_prefix(name: &str) -> String {
    format!("{name}/")
}

/// The key a contender holding lease `lease` writes for `name`:
/// `name/<lease in lowercase hex>`, as Go's `fmt.Sprintf("%s%x", pfx, lease)`.
pub(super) fn contender_key(name: &str, lease: i64) -> String {
    format!("{name}/{lease:x}")
}

/// The value a contender writes: its secret, a line break, then its holder
/// record (nothing after the line break without one).
pub(super) fn contender_value(secret: &str, record: Option<&HolderRecord>) -> String {
    let record = record.map(HolderRecord::encode).unwrap_or_default();
    format!("{secret}\n{record}")
}

/// The holder record in a contender key's value; `None` for a value
/// without one (`etcdctl lock` and Go's mutex write an empty value, older
/// distlock versions the bare secret, `holder=off` nothing after it).
pub(super) fn record_of(value: &[u8]) -> Option<HolderRecord> {
    let text = std::str::from_utf8(value).ok()?;
    let (_secret, record) = text.split_once('\n')?;
    HolderRecord::decode(record)
}

/// Compares true exactly when `key`'s value starts with `secret` and a line
/// break (see [`contender_value`]): greater than the bare secret and less
/// than the secret followed by the byte after `\n`. A secret is 32 hex
/// digits, so no other grant's value falls in between.
fn secret_compares(key: &str, secret: &str) -> [Compare; 2] {
    [
        Compare::value(key, CompareOp::Greater, secret),
        Compare::value(key, CompareOp::Less, format!("{secret}\u{b}")),
    ]
}

/// What a granted lock's owner token carries: enough to release or check
/// the lock from any process, without the lease value.
///
/// Format: `<lease id, hex>:<create revision, decimal>:<secret, 32 hex>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Token {
    pub(super) lease: i64,
    pub(super) revision: i64,
    pub(super) secret: String,
}

impl Token {
    pub(super) fn encode(&self) -> String {
        format!("{:x}:{}:{}", self.lease, self.revision, self.secret)
    }

    /// `None` for anything not in the format: such a token holds nothing.
    pub(super) fn parse(token: &str) -> Option<Token> {
        let mut parts = token.split(':');
        let lease = i64::from_str_radix(parts.next()?, 16).ok()?;
        let revision = parts.next()?.parse().ok()?;
        let secret = parts.next()?.to_owned();
        let well_formed = parts.next().is_none()
            && lease > 0
            && revision > 0
            && secret.len() == 32
            && secret.bytes().all(|b| b.is_ascii_hexdigit());
        well_formed.then_some(Token {
            lease,
            revision,
            secret,
        })
    }
}

/// The answer to the acquire transaction.
#[derive(Debug)]
pub(super) enum Enqueued {
    /// Our key was written at `revision` (its create revision, the fencing
    /// token if granted); the first key in the queue has create revision
    /// `first`.
    Written { revision: i64, first: i64 },
    /// A key of our lease for this name already existed, created at
    /// `revision`: an orphan of an earlier attempt whose clean-up failed.
    Orphan { revision: i64 },
}

/// One request: the acquire transaction of `mutex.go`'s `tryAcquire`: if
/// our key is absent, write it (with `value`, [`contender_value`], on our
/// lease) and read the queue's first key; otherwise read our key.
pub(super) async fn enqueue(
    mut client: etcd_client::KvClient,
    name: &str,
    lease: i64,
    value: &str,
) -> Result<Enqueued, etcd_client::Error> {
    let key = contender_key(name, lease);
    let first = TxnOp::get(
        queue_prefix(name),
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    );
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            ),
            first,
        ])
        .or_else([TxnOp::get(key, None)]);
    let response = client.txn(txn).await?;
    let revision = response.header().map_or(0, |h| h.revision());
    let responses = response.op_responses();
    let create_revision_of = |index: usize| match responses.get(index) {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    };
    if response.succeeded() {
        // Our own key is in the queue, so the first one exists.
        let first = create_revision_of(1).unwrap_or(revision);
        Ok(Enqueued::Written { revision, first })
    } else {
        Ok(Enqueued::Orphan {
            revision: create_revision_of(0).unwrap_or(0),
        })
    }
}

/// Deletes `key` if it still has create revision `revision` (when given)
/// and its value starts with `secret`; says whether it did. Never deletes a newer grant's
/// key: that has another create revision and another secret.
pub(super) async fn delete_if_ours(
    mut client: etcd_client::KvClient,
    key: &str,
    revision: Option<i64>,
    secret: &str,
) -> Result<bool, etcd_client::Error> {
    let mut compares = secret_compares(key, secret).to_vec();
    if let Some(revision) = revision {
        compares.push(Compare::create_revision(key, CompareOp::Equal, revision));
    }
    let txn = Txn::new()
        .when(compares)
        .and_then([TxnOp::delete(key, None)]);
    Ok(client.txn(txn).await?.succeeded())
}

/// Deletes `key` if its create revision is `revision` (an orphan of ours
/// whose secret is lost).
pub(super) async fn delete_orphan(
    mut client: etcd_client::KvClient,
    key: &str,
    revision: i64,
) -> Result<bool, etcd_client::Error> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, revision)])
        .and_then([TxnOp::delete(key, None)]);
    Ok(client.txn(txn).await?.succeeded())
}

/// Whether `key` still holds the grant `revision` with `secret` (its
/// value starts with it): a
/// compare-only transaction, one linearizable round trip.
pub(super) async fn still_ours(
    mut client: etcd_client::KvClient,
    key: &str,
    revision: i64,
    secret: &str,
) -> Result<bool, etcd_client::Error> {
    let [above, below] = secret_compares(key, secret);
    let txn = Txn::new().when([
        Compare::create_revision(key, CompareOp::Equal, revision),
        above,
        below,
    ]);
    Ok(client.txn(txn).await?.succeeded())
}

/// The most operations etcd accepts in one transaction unless its
/// `--max-txn-ops` says otherwise (128 by default:
/// <https://etcd.io/docs/v3.5/op-guide/configuration/>): the size of one
/// [`still_ours_many`] read.
pub(super) const MAX_TXN_OPS: usize = 128;

/// One grant to check with [`still_ours_many`]: its contender key, create
/// revision and secret.
pub(super) struct Grant<'a> {
    pub(super) key: &'a str,
    pub(super) revision: i64,
    pub(super) secret: &'a str,
}

/// For each grant, whether its key still holds it, as [`still_ours`]
/// answers for one: up to [`MAX_TXN_OPS`] keys read by one read-only
/// transaction (one linearizable round trip, and no write for the cluster
/// to replicate, where a compare transaction per key is a round trip
/// each), compared here as [`secret_compares`] compares on the server.
pub(super) async fn still_ours_many(
    mut client: etcd_client::KvClient,
    grants: &[Grant<'_>],
) -> Result<Vec<bool>, etcd_client::Error> {
    let reads: Vec<TxnOp> = grants
        .iter()
        .map(|grant| TxnOp::get(grant.key, None))
        .collect();
    let response = match client.txn(Txn::new().and_then(reads)).await {
        Ok(response) => response,
        // A cluster started with a `--max-txn-ops` below ours: one compare
        // transaction per grant, as `still_ours` checks one.
        Err(etcd_client::Error::GRpcStatus(status))
            if status
                .message()
                .contains("too many operations in txn request") =>
        {
            let mut ours = Vec::with_capacity(grants.len());
            for grant in grants {
                ours.push(
                    still_ours(client.clone(), grant.key, grant.revision, grant.secret).await?,
                );
            }
            return Ok(ours);
        }
        Err(error) => return Err(error),
    };
    let responses = response.op_responses();
    Ok(grants
        .iter()
        .enumerate()
        .map(|(index, grant)| match responses.get(index) {
            Some(TxnOpResponse::Get(get)) => get.kvs().first().is_some_and(|kv| {
                kv.create_revision() == grant.revision && holds_secret(kv.value(), grant.secret)
            }),
            _ => false,
        })
        .collect())
}

/// What the two [`secret_compares`] answer for `value`: it is greater than
/// `secret` and less than `secret` followed by `\x0b`, so it is `secret`
/// followed by at least one byte below `\x0b` (our line break).
fn holds_secret(value: &[u8], secret: &str) -> bool {
    value.starts_with(secret.as_bytes()) && value.get(secret.len()).is_some_and(|&byte| byte < 0x0b)
}

/// How many contenders `name`'s queue has (holder included).
pub(super) async fn queue_length(
    mut client: etcd_client::KvClient,
    name: &str,
) -> Result<i64, etcd_client::Error> {
    let response = client
        .get(
            queue_prefix(name),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await?;
    Ok(response.count())
}

/// The key just ahead of the contender with create revision `revision`
/// (`mutex.go`'s `waitDeletes`: the last-created key below it), and the
/// revision the read was made at; `None` once nothing is ahead.
pub(super) async fn ahead_of(
    mut client: etcd_client::KvClient,
    name: &str,
    revision: i64,
) -> Result<Option<(Vec<u8>, i64)>, etcd_client::Error> {
    let response = client
        .get(
            queue_prefix(name),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_max_create_revision(revision.saturating_sub(1))
                    .with_limit(1),
            ),
        )
        .await?;
    let read_at = response.header().map_or(0, |h| h.revision());
    Ok(response
        .kvs()
        .first()
        .map(|kv| (kv.key().to_vec(), read_at)))
}

/// How a watch for a deletion ended.
pub(super) enum Watched {
    /// The key was deleted (released, or its lease expired).
    Deleted,
    /// `deadline` passed first.
    TimedOut,
}

/// Watches `key` from revision `after + 1` until it is deleted or
/// `deadline` passes. `request_timeout` bounds opening the watch.
pub(super) async fn wait_deleted(
    watch: &mut etcd_client::WatchClient,
    key: Vec<u8>,
    after: i64,
    deadline: Option<Instant>,
    request_timeout: Duration,
) -> Result<Watched, WatchFailure> {
    let options = WatchOptions::new().with_start_revision(after.saturating_add(1));
    let mut stream =
        match tokio::time::timeout(request_timeout, watch.watch(key, Some(options))).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Err(WatchFailure::Etcd(error)),
            Err(_) => return Err(WatchFailure::TimedOut),
        };
    let wait = async {
        loop {
            match stream.message().await {
                Ok(Some(response)) => {
                    if response
                        .events()
                        .iter()
                        .any(|event| event.event_type() == EventType::Delete)
                    {
                        return Ok(Watched::Deleted);
                    }
                    if response.canceled() {
                        // Compacted past our start, or the member lost its
                        // leader (`require_leader`): look at the queue again.
                        return Err(WatchFailure::Canceled(response.cancel_reason().to_owned()));
                    }
                }
                Ok(None) => return Err(WatchFailure::Canceled("the watch stream ended".into())),
                Err(error) => return Err(WatchFailure::Etcd(error)),
            }
        }
    };
    tokio::select! {
        ended = wait => ended,
        () = crate::deadline::sleep_until(deadline) => Ok(Watched::TimedOut),
    }
}

/// Why a watch ended without an answer.
#[derive(Debug)]
pub(super) enum WatchFailure {
    Etcd(etcd_client::Error),
    Canceled(String),
    TimedOut,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_those_of_etcds_mutex() {
        assert_eq!(
            contender_key("lock:k", 0x694d_77a1_b2c3),
            "lock:k/694d77a1b2c3"
        );
        assert_eq!(queue_prefix("lock:k"), "lock:k/");
    }

    /// The batch's client-side check answers what the server's two range
    /// compares answer for one key, whatever the value.
    #[test]
    fn holds_secret_is_the_secret_compares() {
        let secret = "0123456789abcdef0123456789abcdef";
        let upper = format!("{secret}\u{b}");
        let by_compares = |value: &[u8]| value > secret.as_bytes() && value < upper.as_bytes();
        let values: Vec<Vec<u8>> = [
            String::new(),
            secret.to_owned(),
            secret[..31].to_owned(),
            format!("{secret}\n"),
            format!("{secret}\nhost\n1\nlabel"),
            format!("{secret}\u{0}"),
            format!("{secret}\u{b}"),
            format!("{secret}\u{b}x"),
            format!("{secret}\u{c}"),
            format!("{secret}0\n"),
            format!("1{}\n", &secret[1..]),
            format!("/{}\n", &secret[1..]),
        ]
        .into_iter()
        .map(String::into_bytes)
        .collect();
        for value in &values {
            assert_eq!(
                holds_secret(value, secret),
                by_compares(value),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        assert!(holds_secret(format!("{secret}\n").as_bytes(), secret));
        assert!(!holds_secret(secret.as_bytes(), secret));
    }

    #[test]
    fn tokens_round_trip_and_reject_anything_else() {
        let token = Token {
            lease: 0x7587_8a1e_40b1_2c03,
            revision: 42,
            secret: "0123456789abcdef0123456789abcdef".into(),
        };
        let text = token.encode();
        assert_eq!(text, "75878a1e40b12c03:42:0123456789abcdef0123456789abcdef");
        assert_eq!(Token::parse(&text), Some(token));
        for bad in [
            "",
            "0123456789abcdef0123456789abcdef",
            "zz:1:0123456789abcdef0123456789abcdef",
            "1:0:0123456789abcdef0123456789abcdef",
            "1:2:short",
            "1:2:0123456789abcdef0123456789abcdef:extra",
        ] {
            assert_eq!(Token::parse(bad), None, "{bad:?}");
        }
    }
}
