//! Who holds a Redlock lock: every node is asked, and the grant (owner
//! token, told apart by its SHA-1) that a majority of nodes hold is the
//! holder (see the module docs, "Inspection").

use std::collections::BTreeMap;
use std::time::Duration;

use crate::inspect::{self, ForceRelease, HeldLock};
use crate::redis::LockView;
use crate::{validate, Error, Result};

use super::quorum::QuorumFailure;
use super::{RedlockLocker, BACKEND};

/// What the nodes' answers say about one key.
enum Majority {
    /// Boxed: a `HeldLock` is large beside the other variants.
    Held(Box<HeldLock>),
    /// No grant can have a majority, even if every failed node held it.
    Free,
    /// Failed nodes hide the answer.
    Unknown,
}

impl RedlockLocker {
    /// [`Locker::inspect`](crate::Locker::inspect): every node's view, at
    /// once, each bounded by the node timeout; the majority's view of them.
    pub(super) async fn inspect_lock(&self, key: &str) -> Result<Option<HeldLock>> {
        validate::key(key)?;
        let answers = self
            .ask_every_node("inspect", |node| node.inspect_view(key))
            .await;
        self.decide("inspect", key, answers)
    }

    /// [`Locker::list`](crate::Locker::list): every node's listing at once,
    /// then the majority's view of each key any node holds.
    pub(super) async fn list_locks(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let listings =
            futures_util::future::join_all(self.inner.nodes.iter().map(|n| n.list_views(prefix)))
                .await;
        let nodes = listings.len();
        let mut listed = vec![true; nodes];
        let mut by_key: BTreeMap<String, Vec<Option<LockView>>> = BTreeMap::new();
        let mut failures = Vec::new();
        for (index, (node, listing)) in self.inner.nodes.iter().zip(listings).enumerate() {
            match listing {
                Ok(views) => {
                    for view in views {
                        let answers = by_key
                            .entry(view.held.key.clone())
                            .or_insert_with(|| vec![None; nodes]);
                        answers[index] = Some(view);
                    }
                }
                Err(error) => {
                    listed[index] = false;
                    failures.push((node.endpoint().to_owned(), error));
                }
            }
        }
        let mut held = Vec::with_capacity(by_key.len());
        let mut unknown = Vec::new();
        for (key, answers) in by_key {
            let answers: Vec<Option<Option<LockView>>> = answers
                .into_iter()
                .zip(&listed)
                .map(|(view, listed)| listed.then_some(view))
                .collect();
            match self.majority(&key, &answers) {
                Majority::Held(lock) => held.push(*lock),
                Majority::Free => {}
                Majority::Unknown => unknown.push(key),
            }
        }
        // A key no node listed is free on every node that answered; it is
        // unknown only if the failed nodes alone are a majority.
        if !unknown.is_empty() || failures.len() >= self.inner.quorum {
            return Err(Error::backend(
                BACKEND,
                "list",
                QuorumFailure::new(
                    format!(
                        "{} of {nodes} nodes could not be listed, so whether a majority ({})                          holds {} is unknown",
                        failures.len(),
                        self.inner.quorum,
                        match unknown.len() {
                            0 => "the locks held on them".to_owned(),
                            _ => format!("{unknown:?}"),
                        }
                    ),
                    failures,
                ),
            ));
        }
        Ok(held)
    }

    /// [`Locker::force_release`](crate::Locker::force_release): deletes the
    /// key on every node whoever holds it there (each node's delete
    /// publishes the release), waiting for every node within the node
    /// timeout, and returns the grant a majority of them held.
    pub(super) async fn force_release_lock(
        &self,
        key: &str,
        how: ForceRelease,
    ) -> Result<Option<HeldLock>> {
        let delete = async {
            let answers = self
                .ask_every_node("force_release", |node| node.delete_lock(key))
                .await;
            self.decide("force_release", key, answers)
        };
        inspect::release_by_deleting(BACKEND, key, how, "a key on each node", delete).await
    }

    /// [`majority`](Self::majority) of every node's answer, an unknown
    /// answer an [`Error::Backend`] naming the failed nodes (never free).
    fn decide(
        &self,
        operation: &'static str,
        key: &str,
        answers: Vec<Result<Option<LockView>>>,
    ) -> Result<Option<HeldLock>> {
        let mut views = Vec::with_capacity(answers.len());
        let mut failures = Vec::new();
        for (node, answer) in self.inner.nodes.iter().zip(answers) {
            match answer {
                Ok(view) => views.push(Some(view)),
                Err(error) => {
                    views.push(None);
                    failures.push((node.endpoint().to_owned(), error));
                }
            }
        }
        match self.majority(key, &views) {
            Majority::Held(held) => Ok(Some(*held)),
            Majority::Free => Ok(None),
            Majority::Unknown => Err(Error::backend(
                BACKEND,
                operation,
                QuorumFailure::new(
                    format!(
                        "{} of {} nodes failed, so whether a majority ({}) holds {key:?} is \
                         unknown",
                        failures.len(),
                        self.inner.nodes.len(),
                        self.inner.quorum
                    ),
                    failures,
                ),
            )),
        }
    }

    /// The lock as a majority of nodes see it, from each node's answer
    /// (`None`: the node failed): held by the grant a majority hold, with
    /// the record of the first of them that has one, `ttl_left` the time
    /// until fewer than a majority still hold it, and no fencing token.
    fn majority(&self, key: &str, answers: &[Option<Option<LockView>>]) -> Majority {
        let quorum = self.inner.quorum;
        let failed = answers.iter().filter(|answer| answer.is_none()).count();
        let mut grants: BTreeMap<&str, Vec<&HeldLock>> = BTreeMap::new();
        for view in answers.iter().flatten().flatten() {
            grants.entry(&view.grant).or_default().push(&view.held);
        }
        if let Some(views) = grants.values().find(|views| views.len() >= quorum) {
            let mut held = views
                .iter()
                .find(|held| held.holder.is_some())
                .map_or_else(|| HeldLock::new(key), |held| (*held).clone());
            held.key = key.to_owned();
            held.fencing_token = None;
            held.ttl_left = majority_ttl_left(views, quorum);
            return Majority::Held(Box::new(held));
        }
        let most = grants.values().map(Vec::len).max().unwrap_or(0);
        match most + failed < quorum {
            true => Majority::Free,
            false => Majority::Unknown,
        }
    }
}

/// How long a majority of `views` still hold the lock: the `quorum`-th
/// longest remaining ttl (a node without expiry counts as the longest).
fn majority_ttl_left(views: &[&HeldLock], quorum: usize) -> Option<Duration> {
    let mut left: Vec<Duration> = views
        .iter()
        .map(|held| held.ttl_left.unwrap_or(Duration::MAX))
        .collect();
    left.sort_unstable_by(|a, b| b.cmp(a));
    left.get(quorum.checked_sub(1)?)
        .copied()
        .filter(|left| *left != Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_holds_the_lock_until_its_quorum_th_longest_ttl() {
        let held = |millis| {
            let mut held = HeldLock::new("k");
            held.ttl_left = Some(Duration::from_millis(millis));
            held
        };
        let (a, b, c) = (held(900), held(500), held(700));
        assert_eq!(
            majority_ttl_left(&[&a, &b, &c], 2),
            Some(Duration::from_millis(700))
        );
        assert_eq!(
            majority_ttl_left(&[&a, &b, &c], 3),
            Some(Duration::from_millis(500))
        );
        assert_eq!(majority_ttl_left(&[&a], 2), None);
    }
}
