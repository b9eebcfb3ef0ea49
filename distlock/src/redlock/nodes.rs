//! Calling every node at once: [`RedlockLocker::on_nodes`] for the calls
//! decided by a majority (acquire, release, refresh, forget), which stop
//! waiting once the answers settle the question, and
//! [`RedlockLocker::ask_every_node`] for the reads whose answers are all
//! weighed together (inspection, release notifications), and the error of
//! a call that did not reach a quorum.

use std::future::Future;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::quorum::{QuorumFailure, Tally};
use super::{RedlockLocker, BACKEND};
use crate::deadline::bounded;
use crate::redis::RedisLocker;
use crate::{Error, Result};

impl RedlockLocker {
    /// Runs `call` on every node at once, each bounded by `bound`, and
    /// counts the answers until `decided` says they settle the question.
    /// Calls still running then finish in the background (still bounded):
    /// a slow or silent minority never delays the caller, and the operation
    /// still reaches every node that answers in time. (Dropped instead, a
    /// request not yet written would never be sent.)
    pub(super) async fn on_nodes<F, Fut>(
        &self,
        operation: &'static str,
        bound: Duration,
        call: F,
        decided: impl Fn(&Tally) -> bool,
    ) -> Tally
    where
        F: Fn(RedisLocker) -> Fut,
        Fut: Future<Output = Result<bool>> + Send + 'static,
    {
        let mut calls: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let call = bounded(BACKEND, operation, bound, call(node.clone()));
                async move { (index, call.await) }
            })
            .collect();
        let mut tally = Tally::default();
        while let Some((index, answer)) = calls.next().await {
            let endpoint = self.inner.nodes.get(index).map_or("?", |n| n.endpoint());
            tally.count(endpoint, answer);
            if decided(&tally) {
                break;
            }
        }
        if !calls.is_empty() {
            tokio::spawn(async move { while calls.next().await.is_some() {} });
        }
        tally
    }

    /// Runs `call` on every node at once, each bounded by the node timeout
    /// (a node that overruns answers [`Error::DeadlineExceeded`] for
    /// `operation`), and waits for every answer: for reads whose answers are
    /// all weighed together, unlike [`on_nodes`](Self::on_nodes).
    pub(super) async fn ask_every_node<'a, T, Fut>(
        &'a self,
        operation: &'static str,
        call: impl Fn(&'a RedisLocker) -> Fut,
    ) -> Vec<Result<T>>
    where
        Fut: Future<Output = Result<T>>,
    {
        let bound = self.inner.node_timeout;
        futures_util::future::join_all(
            self.inner
                .nodes
                .iter()
                .map(|node| bounded(BACKEND, operation, bound, call(node))),
        )
        .await
    }

    /// The [`Error::Backend`] of a call that did not reach a quorum.
    pub(super) fn quorum_error(
        &self,
        operation: &'static str,
        summary: String,
        tally: Tally,
    ) -> Error {
        let unknown = tally.outcome_unknown();
        let error = Error::backend(
            BACKEND,
            operation,
            QuorumFailure::new(summary, tally.failures),
        );
        if unknown {
            error.with_outcome_unknown()
        } else {
            error
        }
    }
}
