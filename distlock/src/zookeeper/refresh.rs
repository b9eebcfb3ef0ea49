//! Refreshes: checking that holder nodes still hold, one `exists` for a
//! single [`Locker::refresh`](crate::Locker::refresh), one multi read per
//! chunk of a [`Locker::refresh_many`](crate::Locker::refresh_many) batch.
//!
//! A lease lives on its session, so a refresh extends nothing: it only
//! finds out whether the holder's node was deleted (force-released) or
//! replaced. Both paths decide what to read with [`ZooKeeperLocker::check_of`]
//! and judge what they read with [`Read::holds`], so they answer alike.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use zookeeper_client::{self as zk, MultiReadResult};

use super::recipe::Token;
use super::session::Session;
use super::{errors, ZooKeeperLocker};
use crate::{validate, RefreshRequest, Result};

/// The most holder nodes one multi read checks. With the default key
/// prefix and keys of about 20 bytes a check is about 100 bytes of request
/// (under 100 KiB for 1,000) and about 230 bytes of answer with the holder
/// record: a request and an answer of a few hundred kilobytes at most, as
/// the keepalive's batches on expiring backends (`MAX_BATCH` in
/// `lease/keepalive/scheduler.rs`, also 1,000), which one ZooKeeper
/// request thread answers in a few milliseconds without holding up the
/// session's other requests for long.
pub(super) const CHECKS_PER_READ: usize = 1000;

/// The most bytes of request one multi read carries. ZooKeeper refuses a
/// request longer than `jute.maxbuffer` (0xfffff, 1 MiB − 1, by default:
/// <https://zookeeper.apache.org/doc/r3.8.0/zookeeperAdmin.html>) by
/// closing the connection ("Len error" in `NIOServerCnxn.readLength`,
/// <https://github.com/apache/zookeeper/blob/release-3.8.0/zookeeper-server/src/main/java/org/apache/zookeeper/server/NIOServerCnxn.java>),
/// which would fail every request on it, so a chunk also ends before this,
/// half of that default: with keys of the maximum length (1,024 bytes,
/// 3,072 escaped) a chunk is about 160 checks.
const READ_BYTES: usize = 512 * 1024;

/// Bytes of a multi read beyond its checks: the length prefix, the request
/// header (xid and op code) and the closing multi header.
const READ_OVERHEAD: usize = 4 + 8 + 9;

/// Bytes of one check beyond its path: its multi header (op code, done
/// flag, error code), the path's length prefix and the watch flag.
const CHECK_OVERHEAD: usize = 9 + 4 + 1;

/// How many full multi reads of one batch are on their way at once,
/// pipelined on the session's connection: enough to keep the server busy
/// between answers, few enough that a batch of 100,000 leases does not
/// queue 10 MB of requests ahead of every other call of the locker.
const READS_IN_FLIGHT: usize = 4;

/// What a refresh of one lease needs to know before asking the server.
pub(super) enum Check {
    /// Answered without a request: `false` for an owner token that is not
    /// ours, or a lease whose session has ended (its node went with it).
    Settled(bool),
    /// Read the holder node.
    Read(Read),
}

/// One holder node to read, and what it must be to still hold.
pub(super) struct Read {
    /// The session to read on: the one the lease was granted on, or the
    /// locker's current one for an owner token from elsewhere.
    pub(super) session: Arc<Session>,
    /// The holder node's path.
    pub(super) path: String,
    /// The node's czxid when granted (the owner token's).
    czxid: i64,
    /// The session that must own the node, when this locker granted it
    /// (CURATOR-696: a node of an earlier session is not ours).
    owner_session: Option<i64>,
}

impl Read {
    /// Whether the node read (`None`: it does not exist) still holds: the
    /// same node (its czxid), owned by the granting session.
    pub(super) fn holds(&self, stat: Option<&zk::Stat>) -> bool {
        stat.is_some_and(|stat| {
            stat.czxid == self.czxid
                && self
                    .owner_session
                    .is_none_or(|session| stat.ephemeral_owner == session)
        })
    }
}

impl ZooKeeperLocker {
    /// What checking `owner`'s hold of `key` takes.
    ///
    /// # Errors
    ///
    /// As opening a session, when this locker did not grant the lease and
    /// has no session yet.
    pub(super) async fn check_of(&self, key: &str, owner: &str) -> Result<Check> {
        let Some(token) = Token::parse(owner) else {
            return Ok(Check::Settled(false));
        };
        let holding = self.inner.registry.session_of(owner);
        let owner_session = holding.as_ref().map(|session| session.id);
        let session = match holding {
            Some(session) if session.is_closed() => return Ok(Check::Settled(false)),
            Some(session) => session,
            None => self.inner.session(key).await?,
        };
        Ok(Check::Read(Read {
            path: self.node_of(key, &token),
            czxid: token.czxid,
            owner_session,
            session,
        }))
    }

    /// Whether `owner`'s node of `key` still holds: one `exists` (see
    /// [`Read::holds`]).
    pub(super) async fn still_held(&self, key: &str, owner: &str) -> Result<bool> {
        match self.check_of(key, owner).await? {
            Check::Settled(held) => Ok(held),
            Check::Read(read) => self.exists_holds(&read).await,
        }
    }

    /// One `exists` of `read`'s node.
    async fn exists_holds(&self, read: &Read) -> Result<bool> {
        let Some(client) = read.session.client() else {
            return Ok(false);
        };
        let stat = self
            .inner
            .request("refresh", false, client.check_stat(&read.path))
            .await?;
        Ok(read.holds(stat.as_ref()))
    }

    /// [`still_held`](Self::still_held) of every request (its key and ttl
    /// validated first), in order, reading the nodes in multi reads of up
    /// to [`CHECKS_PER_READ`] (fewer when their paths pass [`READ_BYTES`]),
    /// one per session the leases live on. A multi read that fails is that
    /// error for each of its leases; a check within it that fails other
    /// than with `NoNode` is done again on its own, as an `exists` (which
    /// needs no read permission on the node, as `getData` does).
    ///
    /// The keepalive's batches of locks that do not expire have no size
    /// limit (all of 100,000 leases can fall due together), so the requests
    /// are taken a window of [`READS_IN_FLIGHT`] full reads at a time: the
    /// paths built for them are a window's, not the batch's.
    pub(super) async fn held_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<bool>> {
        let mut answers: Vec<Result<bool>> = Vec::with_capacity(requests.len());
        for window in requests.chunks(CHECKS_PER_READ * READS_IN_FLIGHT) {
            answers.extend(self.held_window(window).await);
        }
        answers
    }

    /// [`held_many`](Self::held_many) of one window, its reads on their
    /// way together.
    async fn held_window(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<bool>> {
        let mut answers: Vec<Option<Result<bool>>> = Vec::with_capacity(requests.len());
        let mut reads: Vec<(usize, Read)> = Vec::new();
        for (index, request) in requests.iter().enumerate() {
            let check = match validate::acquire(request.key, request.ttl) {
                Ok(()) => self.check_of(request.key, request.owner).await,
                Err(error) => Err(error),
            };
            answers.push(match check {
                Ok(Check::Settled(held)) => Some(Ok(held)),
                Ok(Check::Read(read)) => {
                    reads.push((index, read));
                    None
                }
                Err(error) => Some(Err(error)),
            });
        }
        // One session per multi read; the sort is stable, so each chunk
        // keeps the batch's order.
        reads.sort_by_key(|(_, read)| read.session.id);
        let read = futures_util::future::join_all(
            self.chunks(reads)
                .into_iter()
                .map(|chunk| self.read_chunk(chunk)),
        )
        .await;
        for (index, answer) in read.into_iter().flatten() {
            if let Some(slot) = answers.get_mut(index) {
                *slot = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(errors::plain(
                        "refresh",
                        "a refresh of the batch got no answer (a bug)".to_owned(),
                    ))
                })
            })
            .collect()
    }

    /// One `exists` for each of `reads`, all on their way at once (a
    /// chunk: at most [`CHECKS_PER_READ`]).
    async fn exists_each(&self, reads: Vec<(usize, Read)>) -> Vec<(usize, Result<bool>)> {
        futures_util::future::join_all(
            reads
                .iter()
                .map(|(index, read)| async move { (*index, self.exists_holds(read).await) }),
        )
        .await
    }

    /// `reads` (sorted by session) cut into chunks of one session, at most
    /// [`CHECKS_PER_READ`] checks and [`READ_BYTES`] of request each.
    fn chunks(&self, reads: Vec<(usize, Read)>) -> Vec<Vec<(usize, Read)>> {
        let chroot = self.inner.chroot.as_deref().map_or(0, str::len);
        let mut chunks: Vec<Vec<(usize, Read)>> = Vec::new();
        let mut bytes = 0;
        for (index, read) in reads {
            let size = CHECK_OVERHEAD + chroot + read.path.len();
            let fits = chunks.last().is_some_and(|chunk| {
                chunk.len() < CHECKS_PER_READ
                    && bytes + size <= READ_BYTES
                    && chunk
                        .first()
                        .is_some_and(|(_, first)| first.session.id == read.session.id)
            });
            if !fits {
                chunks.push(Vec::new());
                bytes = READ_OVERHEAD;
            }
            bytes += size;
            if let Some(chunk) = chunks.last_mut() {
                chunk.push((index, read));
            }
        }
        chunks
    }

    /// One multi read of `chunk`'s nodes (`getData`: the only read a multi
    /// read has that answers a node's stat; zookeeper-client 0.11's
    /// `MultiReader::add_get_data`, which reports a missing node as its
    /// `MultiReadResult::Error`, not the whole request's error), each judged
    /// by [`Read::holds`].
    async fn read_chunk(&self, chunk: Vec<(usize, Read)>) -> Vec<(usize, Result<bool>)> {
        let Some(client) = chunk.first().and_then(|(_, read)| read.session.client()) else {
            // The session ended: so did its nodes.
            return chunk
                .into_iter()
                .map(|(index, _)| (index, Ok(false)))
                .collect();
        };
        if self.inner.no_multi_read.load(Ordering::Relaxed) {
            return self.exists_each(chunk).await;
        }
        let mut reader = client.new_multi_reader();
        let mut answers = Vec::with_capacity(chunk.len());
        let mut sent = Vec::with_capacity(chunk.len());
        for (index, read) in chunk {
            match reader.add_get_data(&read.path) {
                Ok(()) => sent.push((index, read)),
                // A path the client refuses: as `exists` would be.
                Err(error) => answers.push((
                    index,
                    Err(errors::backend(
                        &self.inner.ensemble,
                        "refresh",
                        error,
                        false,
                    )),
                )),
            }
        }
        if sent.is_empty() {
            return answers;
        }
        let answer = self.inner.call(reader.commit()).await;
        if matches!(answer, Some(Err(zk::Error::Unimplemented))) {
            // ZooKeeper 3.5 has no multi read (it came in 3.6): its
            // `UnimplementedRequestProcessor` answers `Unimplemented` and
            // closes the connection (the session lives on). Check these
            // and every later batch one `exists` per lease.
            self.inner.no_multi_read.store(true, Ordering::Relaxed);
            tracing::info!(
                component = "distlock",
                backend = super::BACKEND,
                ensemble = self.inner.ensemble,
                "the ZooKeeper ensemble has no multi read (before 3.6); refreshes are one request per lease"
            );
            answers.extend(self.exists_each(sent).await);
            return answers;
        }
        let results = match self.inner.answered("refresh", false, answer) {
            Ok(results) if results.len() == sent.len() => results,
            Ok(results) => {
                let error = errors::plain(
                    "refresh",
                    format!(
                        "a multi read of {} nodes got {} answers",
                        sent.len(),
                        results.len()
                    ),
                );
                answers.extend(sent.into_iter().map(|(i, _)| (i, Err(error.duplicate()))));
                return answers;
            }
            Err(error) => {
                answers.extend(sent.into_iter().map(|(i, _)| (i, Err(error.duplicate()))));
                return answers;
            }
        };
        for ((index, read), result) in sent.into_iter().zip(results) {
            let held = match result {
                MultiReadResult::Data { stat, .. } => Ok(read.holds(Some(&stat))),
                MultiReadResult::Error {
                    err: zk::Error::NoNode,
                } => Ok(read.holds(None)),
                // Refused (`NoAuth`: `getData` needs read permission,
                // `exists` does not) or unexpected: ask as a single
                // refresh does.
                _ => self.exists_holds(&read).await,
            };
            answers.push((index, held));
        }
        answers
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use test_servers::ZooKeeperServer;

    use crate::inspect::ForceRelease;
    use crate::zookeeper::ZooKeeperLocker;
    use crate::{Error, Locker, RefreshRequest};

    const TTL: Duration = Duration::from_secs(30);

    /// Without multi reads (an ensemble before 3.6), a batch is one
    /// `exists` per lease with the same answers: the force-released lease
    /// NotHeld, the others held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_multi_reads_a_batch_is_one_exists_per_lease_with_the_same_answers() {
        let server = ZooKeeperServer::start();
        let locker = ZooKeeperLocker::from_url(&format!("{}?session_timeout=60s", server.url()))
            .await
            .unwrap();
        locker.inner.no_multi_read.store(true, Ordering::Relaxed);
        let mut leases = Vec::new();
        for i in 0..5 {
            let key = format!("old-{i}");
            leases.push(locker.try_lock(&key, TTL).await.unwrap().expect("free"));
        }
        locker
            .force_release(leases[3].key(), ForceRelease::Lock)
            .await
            .unwrap()
            .expect("held");
        let batch: Vec<RefreshRequest<'_>> = leases
            .iter()
            .map(|lease| RefreshRequest {
                key: lease.key(),
                owner: lease.owner(),
                ttl: TTL,
            })
            .collect();
        let packets = || {
            server
                .mntr("zk_packets_received")
                .expect("zk_packets_received")
        };
        let before = packets();
        let results = locker.refresh_many(&batch).await;
        // Less the `mntr`'s own packet.
        let sent = packets() - before - 1;
        assert!(
            (5..=6).contains(&sent),
            "one exists per lease (a ping may join): {sent}"
        );
        for (i, result) in results.iter().enumerate() {
            match (i, result) {
                (3, Err(Error::NotHeld { .. })) | (0..=2 | 4, Ok(())) => {}
                other => panic!("lease {i}: {other:?}"),
            }
        }
        locker.close().await;
    }
}
