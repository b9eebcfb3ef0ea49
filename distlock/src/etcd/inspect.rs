//! Who holds a lock: the first contender key of its queue (lowest create
//! revision, as the acquire transaction sees it), the holder record in its
//! value, and its lease's time to live; operator release by deleting that
//! key (compared on its create revision) or revoking its lease.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp};

use super::recipe;
use super::{errors, EtcdLocker, BACKEND};
use crate::inspect::{self, ForceRelease, HeldLock};
use crate::{Error, Result};

/// How often a force release looks again when the holder changed between
/// its read and its delete.
const ATTEMPTS: usize = 3;

/// The holder's key as found: enough to describe and to delete it.
struct Found {
    key: Vec<u8>,
    create_revision: i64,
    lease: i64,
    held: HeldLock,
}

impl EtcdLocker {
    /// The first contender of `name`'s queue, described as `key`: the same
    /// direct members the acquire transaction orders ([`recipe::first_of`]),
    /// never a nested name's holder.
    async fn holder_of(&self, key: &str, operation: &'static str) -> Result<Option<Found>> {
        let name = self.backend_key(key);
        let (first, _) = self
            .inner
            .request(operation, false, || {
                recipe::first_of(self.inner.kv(), &name, false)
            })
            .await?;
        let Some(first) = first else {
            return Ok(None);
        };
        let mut ttls = HashMap::new();
        Ok(Some(
            self.describe(key, &first, operation, &mut ttls).await?,
        ))
    }

    /// What a contender key says of its grant, with its lease's remaining
    /// ttl (asked once per lease in `ttls`).
    async fn describe(
        &self,
        key: &str,
        kv: &KeyValue,
        operation: &'static str,
        ttls: &mut HashMap<i64, Option<Duration>>,
    ) -> Result<Found> {
        let mut held = HeldLock::new(key);
        held.fencing_token = u64::try_from(kv.create_revision()).ok();
        if let Some(record) = recipe::record_of(kv.value()) {
            record.fill(&mut held);
        }
        let lease = kv.lease();
        if lease != 0 {
            held.session = Some(format!("lease {lease:x}"));
            held.ttl_left = match ttls.get(&lease) {
                Some(left) => *left,
                None => {
                    let left = self.ttl_left(lease, operation).await?;
                    ttls.insert(lease, left);
                    left
                }
            };
        }
        Ok(Found {
            key: kv.key().to_vec(),
            create_revision: kv.create_revision(),
            lease,
            held,
        })
    }

    /// How long lease `lease` lives without a keep-alive (`None` once it is
    /// gone): etcd's `LeaseTimeToLive`, in whole seconds.
    async fn ttl_left(&self, lease: i64, operation: &'static str) -> Result<Option<Duration>> {
        let response = self
            .inner
            .request(operation, false, || {
                let mut leases = self.inner.client.lease_client();
                async move { leases.time_to_live(lease, None).await }
            })
            .await?;
        Ok(u64::try_from(response.ttl()).ok().map(Duration::from_secs))
    }

    pub(super) async fn inspect_key(&self, key: &str) -> Result<Option<HeldLock>> {
        Ok(self
            .holder_of(key, "inspect")
            .await?
            .map(|found| found.held))
    }

    /// One range read over every key under `<key prefix><prefix>`, grouped
    /// by lock name (the key up to its last `/`; marks keys, which have
    /// none, are skipped), the lowest create revision of each being its
    /// holder.
    pub(super) async fn list_keys(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let start = format!("{}{prefix}", self.inner.prefix);
        let response = self
            .inner
            .request("list", false, || {
                let mut kv = self.inner.kv();
                let start = start.clone();
                async move {
                    let options = GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend);
                    kv.get(start, Some(options)).await
                }
            })
            .await?;
        // Sorted by create revision: the first key seen of a name holds it.
        let mut holders: HashMap<String, &KeyValue> = HashMap::new();
        for kv in response.kvs() {
            let Ok(full) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            let Some(name) = full.strip_prefix(self.inner.prefix.as_str()) else {
                continue;
            };
            let Some((lock, lease_hex)) = name.rsplit_once('/') else {
                continue; // a mark, or another program's key
            };
            let is_contender =
                !lease_hex.is_empty() && lease_hex.bytes().all(|b| b.is_ascii_hexdigit());
            if is_contender && lock.starts_with(prefix) {
                holders.entry(lock.to_owned()).or_insert(kv);
            }
        }
        let mut ttls = HashMap::new();
        let mut listed = Vec::with_capacity(holders.len());
        for (lock, kv) in holders {
            listed.push(self.describe(&lock, kv, "list", &mut ttls).await?.held);
        }
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    pub(super) async fn force_release_key(
        &self,
        key: &str,
        how: ForceRelease,
    ) -> Result<Option<HeldLock>> {
        for _ in 0..ATTEMPTS {
            let Some(found) = self.holder_of(key, "force_release").await? else {
                return Ok(None);
            };
            let freed = match how {
                ForceRelease::Lock => self.delete_holder(&found).await?,
                ForceRelease::TerminateSession => self.revoke_holder(key, &found).await?,
            };
            if freed {
                inspect::log_forced_release(BACKEND, key, how, Some(&found.held));
                return Ok(Some(found.held));
            }
            // A new holder since the read: look again.
        }
        Err(errors::plain(
            "force_release",
            format!("{key:?} changed hands {ATTEMPTS} times while being force-released; inspect it again"),
        ))
    }

    /// Deletes the holder's key if it still has the create revision read,
    /// so a newer holder's key is never deleted; the next waiter in the
    /// queue, watching it, takes the lock.
    async fn delete_holder(&self, found: &Found) -> Result<bool> {
        let response = self
            .inner
            .request("force_release", true, || {
                let mut kv = self.inner.kv();
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        found.key.clone(),
                        CompareOp::Equal,
                        found.create_revision,
                    )])
                    .and_then([TxnOp::delete(found.key.clone(), None)]);
                async move { kv.txn(txn).await }
            })
            .await?;
        Ok(response.succeeded())
    }

    /// Revokes the holder's lease, which deletes every key attached to it:
    /// every lock of that session.
    async fn revoke_holder(&self, key: &str, found: &Found) -> Result<bool> {
        if found.lease == 0 {
            return Err(Error::Unsupported {
                backend: BACKEND,
                operation: "force_release",
                reason: format!(
                    "{key:?}'s holder key has no lease to revoke; use ForceRelease::Lock"
                ),
            });
        }
        let lease = found.lease;
        let revoked = self
            .inner
            .request("force_release", true, || {
                let mut leases = self.inner.client.lease_client();
                async move { leases.revoke(lease).await }
            })
            .await;
        match revoked {
            Ok(_) => Ok(true),
            // Expired or revoked since the read: its keys are gone already.
            Err(Error::Backend { .. }) if !self.lease_alive(lease).await? => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn lease_alive(&self, lease: i64) -> Result<bool> {
        Ok(self.ttl_left(lease, "force_release").await?.is_some())
    }
}
