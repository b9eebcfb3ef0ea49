//! Release and refresh: the transactions that delete or confirm a grant
//! only while its key still has the grant's create revision and the value
//! where its secret is still starts with it ([`secret_compares`]), one by
//! one or in read-only batches.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::{holds_secret, secret_compares};
use crate::etcd::owner::SecretAt;

/// Deletes `key` (and its owner key, if `at` is one) if it still has create
/// revision `revision` (when given) and the value where the secret is
/// (`at`) starts with `secret`; says whether it did. Never deletes a newer
/// grant's keys: that has another create revision and another secret.
///
/// Without a revision (an acquire whose answer was lost) the secret alone
/// decides: a contender key with an owner key holding our secret was
/// written by our transaction, and no other grant of this locker can have
/// rewritten it (the attempt still holds its name in the registry).
pub(in crate::etcd) async fn delete_if_ours(
    client: etcd_client::KvClient,
    key: &str,
    revision: Option<i64>,
    secret: &str,
    at: &SecretAt,
) -> Result<bool, etcd_client::Error> {
    let mut compares = secret_compares(at.key(key), secret).to_vec();
    if let Some(revision) = revision {
        compares.push(Compare::create_revision(key, CompareOp::Equal, revision));
    }
    delete_when(client, compares, at.deletes(key)).await
}

/// Deletes `key` if its create revision is `revision` (an orphan of ours
/// whose secret is lost), and with it `owner`, the owner key an election
/// candidate's key of the same name and lease would have: no grant owns
/// either (the attempt holds the name in the registry).
pub(in crate::etcd) async fn delete_orphan(
    client: etcd_client::KvClient,
    key: &str,
    revision: i64,
    owner: Option<&str>,
) -> Result<bool, etcd_client::Error> {
    let created = Compare::create_revision(key, CompareOp::Equal, revision);
    let at = match owner {
        Some(owner) => SecretAt::OwnerKey(owner.to_owned()),
        None => SecretAt::Value,
    };
    delete_when(client, vec![created], at.deletes(key)).await
}

/// Runs `deletes` in one transaction if every one of `compares` holds; says
/// whether it did.
async fn delete_when(
    mut client: etcd_client::KvClient,
    compares: Vec<Compare>,
    deletes: Vec<TxnOp>,
) -> Result<bool, etcd_client::Error> {
    let txn = Txn::new().when(compares).and_then(deletes);
    Ok(client.txn(txn).await?.succeeded())
}

/// Whether `key` still holds the grant `revision` with `secret` (the value
/// where the secret is, `at`, starts with it): a compare-only transaction,
/// one linearizable round trip.
pub(in crate::etcd) async fn still_ours(
    mut client: etcd_client::KvClient,
    key: &str,
    revision: i64,
    secret: &str,
    at: &SecretAt,
) -> Result<bool, etcd_client::Error> {
    let [above, below] = secret_compares(at.key(key), secret);
    let txn = Txn::new().when([
        Compare::create_revision(key, CompareOp::Equal, revision),
        above,
        below,
    ]);
    Ok(client.txn(txn).await?.succeeded())
}

/// The most operations etcd accepts in one transaction unless its
/// `--max-txn-ops` says otherwise (128 by default:
/// <https://etcd.io/docs/v3.5/op-guide/configuration/>): the most reads of
/// one [`still_ours_many`] transaction.
pub(in crate::etcd) const MAX_TXN_OPS: usize = 128;

/// One grant to check with [`still_ours_many`]: its contender key, create
/// revision and secret, and where the secret is.
pub(in crate::etcd) struct Grant<'a> {
    pub(in crate::etcd) key: &'a str,
    pub(in crate::etcd) revision: i64,
    pub(in crate::etcd) secret: &'a str,
    pub(in crate::etcd) at: &'a SecretAt,
}

impl Grant<'_> {
    /// The keys a check of this grant reads: its contender key, and its
    /// owner key if the secret is there.
    fn reads(&self) -> usize {
        match self.at {
            SecretAt::Value => 1,
            SecretAt::OwnerKey(_) => 2,
        }
    }
}

/// For each grant, whether its key still holds it, as [`still_ours`]
/// answers for one: read-only transactions of up to [`MAX_TXN_OPS`] key
/// reads each (one linearizable round trip, and no write for the cluster
/// to replicate, where a compare transaction per key is a round trip
/// each), compared here as [`secret_compares`] compares on the server. An
/// election candidate's grant costs two reads (its owner key too), so a
/// batch of them takes two transactions, one after the other.
pub(in crate::etcd) async fn still_ours_many(
    client: etcd_client::KvClient,
    grants: &[Grant<'_>],
) -> Result<Vec<bool>, etcd_client::Error> {
    let mut ours = Vec::with_capacity(grants.len());
    let mut rest = grants;
    while !rest.is_empty() {
        let mut reads = 0;
        let fit = rest
            .iter()
            .take_while(|grant| {
                reads += grant.reads();
                reads <= MAX_TXN_OPS
            })
            .count()
            .max(1);
        let (batch, after) = rest.split_at(fit.min(rest.len()));
        ours.extend(still_ours_batch(client.clone(), batch).await?);
        rest = after;
    }
    Ok(ours)
}

/// [`still_ours_many`] of grants whose reads fit one transaction.
async fn still_ours_batch(
    mut client: etcd_client::KvClient,
    grants: &[Grant<'_>],
) -> Result<Vec<bool>, etcd_client::Error> {
    let reads: Vec<TxnOp> = grants
        .iter()
        .flat_map(|grant| {
            let owner = match grant.at {
                SecretAt::Value => None,
                SecretAt::OwnerKey(owner) => Some(TxnOp::get(owner.as_str(), None)),
            };
            std::iter::once(TxnOp::get(grant.key, None)).chain(owner)
        })
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
                    still_ours(
                        client.clone(),
                        grant.key,
                        grant.revision,
                        grant.secret,
                        grant.at,
                    )
                    .await?,
                );
            }
            return Ok(ours);
        }
        Err(error) => return Err(error),
    };
    let mut answers = response
        .op_responses()
        .into_iter()
        .map(|answer| match answer {
            TxnOpResponse::Get(get) => get.kvs().first().cloned(),
            _ => None,
        });
    Ok(grants
        .iter()
        .map(|grant| {
            let contender = answers.next().flatten();
            let holder_of_secret = match grant.at {
                SecretAt::Value => contender.clone(),
                SecretAt::OwnerKey(_) => answers.next().flatten(),
            };
            contender.is_some_and(|kv| kv.create_revision() == grant.revision)
                && holder_of_secret.is_some_and(|kv| holds_secret(kv.value(), grant.secret))
        })
        .collect())
}
