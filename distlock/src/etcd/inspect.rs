//! Who holds a lock: the first contender key of its queue (lowest create
//! revision, as the acquire transaction sees it), the holder record in its
//! value (an election candidate's: in its owner key, its value being what
//! it proclaims), and its lease's time to live; operator release by
//! deleting that key (compared on its create revision; an owner key goes
//! with it) or revoking its lease. A first key that is a reader's means the
//! lock is held shared, by every reader older than the oldest writer: a
//! forced release evicts them all.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp};

use super::owner;
use super::recipe;
use super::{EtcdLocker, BACKEND};
use crate::inspect::{self, ForceRelease, HeldLock};
use crate::{Error, Result};

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
        held.shared = is_reader_key(kv.key());
        // The first key's revision: the holder's token, or for readers the
        // token a reader granted now gets (`recipe::fencing_token`).
        held.fencing_token = u64::try_from(kv.create_revision()).ok();
        let lease = kv.lease();
        match recipe::record_of(kv.value()) {
            Some(record) => record.fill(&mut held),
            None => match self.owned_record(key, kv, lease, operation).await? {
                // A distlock election candidate's key: its value is what it
                // proclaims, its record is in its owner key.
                Some(record) => {
                    if let Some(record) = record {
                        record.fill(&mut held);
                    }
                    held.value = Some(String::from_utf8_lossy(kv.value()).into_owned())
                        .filter(|value| !value.is_empty());
                }
                None => held.value = recipe::foreign_value(kv.value()),
            },
        }
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

    /// The holder record in the owner key of `kv`, a writer's contender key
    /// of `key` on lease `lease` whose value holds no record, if `kv` is a
    /// distlock election candidate's ([`owner::owned_record`]): one read.
    /// `None` for every other key (`etcdctl lock`'s, `etcdctl elect`'s).
    async fn owned_record(
        &self,
        key: &str,
        kv: &KeyValue,
        lease: i64,
        operation: &'static str,
    ) -> Result<Option<Option<crate::inspect::HolderRecord>>> {
        if lease == 0 || is_reader_key(kv.key()) {
            return Ok(None);
        }
        let owner_key = owner::owner_key(&self.inner.prefix, key, lease);
        let mut response = self
            .inner
            .request(operation, false, || {
                let mut client = self.inner.kv();
                let owner_key = owner_key.clone();
                async move { client.get(owner_key, None).await }
            })
            .await?;
        Ok(response
            .take_kvs()
            .first()
            .and_then(|owner| owner::owned_record(owner, kv)))
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

    /// Every key under `<key prefix><prefix>`, read in pages of
    /// [`recipe::PAGE`] keys (each under the request timeout, all at the
    /// revision of the first: one snapshot), grouped by lock name (the key
    /// up to its last `/`; marks keys, which have none, are skipped), the
    /// lowest create revision of each being its holder.
    pub(super) async fn list_keys(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let start = format!("{}{prefix}", self.inner.prefix).into_bytes();
        let end = recipe::prefix_end(&start);
        // The holder (lowest create revision) of each name seen so far.
        let mut holders: HashMap<String, KeyValue> = HashMap::new();
        let mut from = start;
        let mut at = 0;
        let mut limit = recipe::PAGE;
        loop {
            let page = self
                .inner
                .request("list", false, || {
                    let mut kv = self.inner.kv();
                    let (from, end) = (from.clone(), end.clone());
                    let mut page_limit = limit;
                    async move {
                        let page =
                            recipe::page(&mut kv, &from, &end, at, false, &mut page_limit).await?;
                        Ok((page, page_limit))
                    }
                })
                .await?;
            let (page, page_limit) = page;
            limit = page_limit;
            at = page.at;
            let next = page.kvs.last().map(|kv| [kv.key(), b"\0"].concat());
            for kv in page.kvs {
                if let Some(lock) = self.lock_of(&kv, prefix) {
                    let older = holders
                        .get(&lock)
                        .is_some_and(|held| held.create_revision() <= kv.create_revision());
                    if !older {
                        holders.insert(lock, kv);
                    }
                }
            }
            match next.and_then(|next| recipe::continue_after(next, &end)) {
                Some(next) if page.more => from = next,
                _ => break,
            }
        }
        let mut ttls = HashMap::new();
        let mut listed = Vec::with_capacity(holders.len());
        for (lock, kv) in holders {
            listed.push(self.describe(&lock, &kv, "list", &mut ttls).await?.held);
        }
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    /// The lock name (distlock key) whose contender `kv` is, if it is one
    /// under `prefix`: its key is `<key prefix><name>/<lease hex>`, or a
    /// reader's `<key prefix><name>/read-<lease hex>-<n>`.
    fn lock_of(&self, kv: &KeyValue, prefix: &str) -> Option<String> {
        let full = std::str::from_utf8(kv.key()).ok()?;
        let name = full.strip_prefix(self.inner.prefix.as_str())?;
        // No `/`: a mark, or another program's key.
        let (lock, segment) = name.rsplit_once('/')?;
        let is_contender = recipe::is_reader_segment(segment.as_bytes())
            || (!segment.is_empty() && segment.bytes().all(|b| b.is_ascii_hexdigit()));
        (is_contender && lock.starts_with(prefix)).then(|| lock.to_owned())
    }

    pub(super) async fn force_release_key(
        &self,
        key: &str,
        how: ForceRelease,
    ) -> Result<Option<HeldLock>> {
        let find = || self.holder_of(key, "force_release");
        let evict = |found: Found| async move {
            let freed = if found.held.shared {
                self.evict_readers(key, how).await?
            } else {
                match how {
                    ForceRelease::Lock => self.delete_holder(key, &found).await?,
                    ForceRelease::TerminateSession => self.revoke_holder(key, &found).await?,
                }
            };
            // Not freed: a new holder since the read.
            Ok(freed.then_some(found.held))
        };
        inspect::release_holder(BACKEND, key, how, find, evict).await
    }

    /// Evicts every reader holding `key` (those older than its oldest
    /// writer), each as [`delete_holder`](Self::delete_holder) or
    /// [`revoke_holder`](Self::revoke_holder) evicts one holder (a lease
    /// once however many of its readers hold); true if any was evicted.
    async fn evict_readers(&self, key: &str, how: ForceRelease) -> Result<bool> {
        let name = self.backend_key(key);
        let readers = self
            .inner
            .request("force_release", false, || {
                recipe::holding_readers(self.inner.kv(), &name)
            })
            .await?;
        let mut evicted = false;
        let mut revoked = Vec::new();
        for kv in readers {
            let reader = Found {
                key: kv.key().to_vec(),
                create_revision: kv.create_revision(),
                lease: kv.lease(),
                held: HeldLock::new(key),
            };
            evicted |= match how {
                ForceRelease::Lock => self.delete_holder(key, &reader).await?,
                ForceRelease::TerminateSession if revoked.contains(&reader.lease) => continue,
                ForceRelease::TerminateSession => {
                    revoked.push(reader.lease);
                    self.revoke_holder(key, &reader).await?
                }
            };
        }
        Ok(evicted)
    }

    /// Deletes the holder's key if it still has the create revision read,
    /// so a newer holder's key is never deleted; the next waiter in the
    /// queue, watching it, takes the lock. A writer's owner key (an
    /// election candidate's, [`owner::owner_key`]) goes with it: it belongs
    /// to the grant of that key, or is a leftover of an earlier one of the
    /// same lease.
    async fn delete_holder(&self, key: &str, found: &Found) -> Result<bool> {
        let mut deletes = vec![TxnOp::delete(found.key.clone(), None)];
        if found.lease != 0 && !is_reader_key(&found.key) {
            let owner_key = owner::owner_key(&self.inner.prefix, key, found.lease);
            deletes.push(TxnOp::delete(owner_key, None));
        }
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
                    .and_then(deletes.clone());
                async move { kv.txn(txn).await }
            })
            .await?;
        Ok(response.succeeded())
    }

    /// Revokes the holder's lease, which deletes every key attached to it:
    /// every lock of that session.
    async fn revoke_holder(&self, key: &str, found: &Found) -> Result<bool> {
        if found.lease == 0 {
            return Err(Error::unsupported(
                BACKEND,
                "force_release",
                format!("{key:?}'s holder key has no lease to revoke; use ForceRelease::Lock"),
            ));
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

/// Whether a contender key is a reader's: its last segment is
/// ([`recipe::is_reader_segment`]).
fn is_reader_key(key: &[u8]) -> bool {
    let segment = key
        .iter()
        .rposition(|&byte| byte == b'/')
        .and_then(|slash| key.get(slash + 1..))
        .unwrap_or(key);
    recipe::is_reader_segment(segment)
}
