//! Who holds a lock: the first contender of its lock path (lowest sequence
//! number, as acquire orders them), the holder record in its data, and its
//! stat; operator release by deleting that node. A first contender that is
//! a reader means the lock is held shared, by every reader ahead of the
//! first writer: a forced release deletes them all.

use zookeeper_client as zk;

use super::recipe::{self, Kind, MARK_SUFFIX};
use super::{errors, ZooKeeperLocker, BACKEND};
use crate::inspect::{self, Clock, ForceRelease, GrantTime, HeldLock, HolderRecord};
use crate::{Error, Result};

/// How often inspect looks again when the first contender vanished between
/// the listing and the read (it was released meanwhile).
const ATTEMPTS: usize = 3;

/// The holders' nodes as found: enough to describe and to delete them.
struct Found {
    /// Every holder's node (one writer's, or every holding reader's),
    /// first first.
    nodes: Vec<String>,
    held: HeldLock,
}

impl ZooKeeperLocker {
    /// The first contender of `key`'s lock path, described as `key`.
    async fn holder_of(
        &self,
        client: &zk::Client,
        key: &str,
        operation: &'static str,
    ) -> Result<Option<Found>> {
        let path = self.backend_key(key);
        for _ in 0..ATTEMPTS {
            let children = match self.inner.call(client.list_children(&path)).await {
                Some(Err(zk::Error::NoNode)) => return Ok(None),
                answer => self.inner.answered(operation, false, answer)?,
            };
            let queue = recipe::queue(&children);
            let nodes: Vec<String> = recipe::holders(&queue)
                .iter()
                .map(|holder| format!("{path}/{}", holder.name))
                .collect();
            let Some((first, shared)) = queue.first().map(|c| (&nodes[0], c.kind == Kind::Read))
            else {
                return Ok(None);
            };
            let (data, stat) = match self.inner.call(client.get_data(first)).await {
                // Released since the listing: look again.
                Some(Err(zk::Error::NoNode)) => continue,
                answer => self.inner.answered(operation, false, answer)?,
            };
            let mut held = describe(key, &data, &stat);
            held.shared = shared;
            return Ok(Some(Found { held, nodes }));
        }
        Err(errors::plain(
            operation,
            format!("{key:?} changed hands {ATTEMPTS} times while being inspected; try again"),
        ))
    }

    /// The client of `key`'s session (`None`: of any session).
    async fn client(&self, operation: &'static str, key: Option<&str>) -> Result<zk::Client> {
        let session = match key {
            Some(key) => self.inner.session(key).await?,
            None => self.inner.any_session().await?,
        };
        session
            .client()
            .ok_or_else(|| super::acquire::session_gone(operation, &session))
    }

    pub(super) async fn inspect_key(&self, key: &str) -> Result<Option<HeldLock>> {
        let client = self.client("inspect", Some(key)).await?;
        Ok(self
            .holder_of(&client, key, "inspect")
            .await?
            .map(|found| found.held))
    }

    /// The children of the lock paths' parent whose key starts with
    /// `prefix` (marks skipped), each inspected; all requests sent at once.
    pub(super) async fn list_keys(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let client = self.client("list", None).await?;
        let parent = match self.inner.parent.as_str() {
            "" => "/",
            parent => parent,
        };
        // The part of the key prefix after the parent: every lock node's
        // name starts with it.
        let name_prefix = &self.inner.prefix[self.inner.parent.len() + 1..];
        let children = match self.inner.call(client.list_children(parent)).await {
            Some(Err(zk::Error::NoNode)) => return Ok(Vec::new()),
            answer => self.inner.answered("list", false, answer)?,
        };
        let keys: Vec<String> = children
            .iter()
            .filter(|name| !name.ends_with(MARK_SUFFIX))
            .filter_map(|name| recipe::unescape(name.strip_prefix(name_prefix)?))
            .filter(|key| key.starts_with(prefix) && crate::validate::key(key).is_ok())
            .collect();
        let found = futures_util::future::join_all(
            keys.iter().map(|key| self.holder_of(&client, key, "list")),
        )
        .await;
        let mut listed = Vec::with_capacity(keys.len());
        for found in found {
            if let Some(found) = found? {
                listed.push(found.held);
            }
        }
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    pub(super) async fn force_release_key(
        &self,
        key: &str,
        how: ForceRelease,
    ) -> Result<Option<HeldLock>> {
        if how != ForceRelease::Lock {
            return Err(Error::unsupported(
                BACKEND,
                "force_release",
                format!(
                    "{how:?}: a ZooKeeper client cannot end another client's session (it would \
                     need the session's password); use ForceRelease::Lock, which deletes the \
                     holder's node"
                ),
            ));
        }
        let client = &self.client("force_release", Some(key)).await?;
        let find = || self.holder_of(client, key, "force_release");
        let evict = |found: Found| async move {
            // By name: a node name is never reused, so a newer holder's node
            // cannot be deleted by this. Every holding reader, all at once.
            let deleted = futures_util::future::join_all(
                found
                    .nodes
                    .iter()
                    .map(|node| self.inner.call(client.delete(node, None))),
            )
            .await;
            let mut evicted = false;
            for outcome in deleted {
                match outcome {
                    Some(Ok(())) => evicted = true,
                    // Released meanwhile.
                    Some(Err(zk::Error::NoNode)) => {}
                    answer => self.inner.answered("force_release", true, answer)?,
                }
            }
            // None evicted: every one was released meanwhile.
            Ok(evicted.then_some(found.held))
        };
        inspect::release_holder(BACKEND, key, how, find, evict).await
    }
}

/// What a contender node says of its grant.
fn describe(key: &str, data: &[u8], stat: &zk::Stat) -> HeldLock {
    let mut held = HeldLock::new(key);
    held.fencing_token = u64::try_from(stat.czxid).ok();
    held.session = Some(format!("session {:#x}", stat.ephemeral_owner));
    let text = std::str::from_utf8(data).ok();
    match text.and_then(HolderRecord::decode) {
        Some(record) => record.fill(&mut held),
        None => held.value = text.filter(|t| !t.is_empty()).map(str::to_owned),
    }
    // The node's creation time, on the server's clock: one clock for every
    // holder of the lock.
    if let Ok(millis) = u64::try_from(stat.ctime) {
        held.granted = Some(GrantTime {
            at: inspect::from_unix_millis(millis),
            clock: Clock::Server,
        });
    }
    held
}
