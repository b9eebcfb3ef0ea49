//! The acquire recipe in steps: create this attempt's contender node (a
//! writer's or a reader's), await the turn (a writer: no contender ahead,
//! watching only the one just ahead; a reader: no writer ahead, watching
//! only the closest writer ahead), grant.
//! Every step that may leave a node behind is undone by the [`Attempt`]
//! guard, at once or in the background.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{self as zk, Acls, CreateMode};

use super::recipe::{self, Kind, Token, Turn};
use super::session::{Held, Session};
use super::{errors, Inner, ZooKeeperLocker, BACKEND};
use crate::inspect::HolderRecord;
use crate::wait::{Acquire, Queue};
use crate::{Error, Lease, LeaseParts, Result};

/// The first and the largest pause between tries of a background clean-up.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(1);
/// How often a create may find the lock path gone (a container node the
/// server deleted when it emptied) before giving up.
const CREATE_ROUNDS: usize = 4;

impl Queue for ZooKeeperLocker {
    type Kind = Kind;

    /// The recipe in steps: [create the contender](Self::create_contender),
    /// [await the turn](Self::await_turn), [grant](Self::grant).
    async fn acquire(&self, request: Acquire<'_, Kind>) -> Result<Option<Lease>> {
        let (key, ttl, wait, kind) = (request.key, request.ttl, request.wait, request.kind);
        let path = self.backend_key(key);
        let session = self.inner.session(key).await?;
        let client = session
            .client()
            .ok_or_else(|| session_gone("acquire", &session))?;
        // Read on the caller's task, where its label scope is.
        let data = match self.inner.holder_record {
            true => HolderRecord::now(ttl).encode(),
            false => String::new(),
        };
        let mut attempt = Attempt {
            inner: self.inner.clone(),
            client,
            session,
            path,
            prefix: recipe::contender_prefix(kind),
            kind,
            node: None,
            armed: false,
        };
        let czxid = self.create_contender(&mut attempt, data.as_bytes()).await?;
        let Some(fencing) = self.await_turn(&mut attempt, wait, czxid).await? else {
            return Ok(None);
        };
        self.grant(key, ttl, czxid, fencing, attempt).map(Some)
    }

    fn attempt_bound(&self) -> Duration {
        self.operation_bound()
    }
}

impl ZooKeeperLocker {
    /// Step 1: creates the attempt's ephemeral sequential node
    /// `<lock path>/_c_<uuid>-lock-<sequence>` (a reader's:
    /// `_c_<uuid>-__READ__<sequence>`), creating the lock path
    /// first if it is missing, and returns its czxid (the owner token's,
    /// and a writer's fencing token).
    /// A create whose connection was lost may have been applied: the node
    /// is then looked for by its protection prefix (after a `sync`, so the
    /// server read from has caught up with the leader), as Curator's
    /// protected mode and kazoo's lock do.
    async fn create_contender(&self, attempt: &mut Attempt, data: &[u8]) -> Result<i64> {
        let create_path = format!("{}/{}", attempt.path, attempt.prefix);
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        for _ in 0..CREATE_ROUNDS {
            // From here on the node may exist: armed.
            attempt.armed = true;
            let created = self
                .inner
                .call(attempt.client.create(&create_path, data, &options))
                .await;
            match created {
                Some(Ok((stat, sequence))) => {
                    attempt.node = Some(format!("{}{sequence}", attempt.prefix));
                    return Ok(stat.czxid);
                }
                Some(Err(zk::Error::NoNode)) => {
                    attempt.armed = false;
                    self.inner
                        .ensure_lock_path(&attempt.client, &attempt.path)
                        .await?;
                }
                Some(Err(zk::Error::ConnectionLoss)) => {
                    if let Some((node, czxid)) = self.find_own(attempt).await? {
                        attempt.node = Some(node);
                        return Ok(czxid);
                    }
                    // Not applied: create again.
                }
                Some(Err(error)) => {
                    if errors::certainly_not_applied(&error) {
                        attempt.armed = false;
                    } else {
                        attempt.undo_now().await;
                    }
                    if errors::session_ended(&error) {
                        attempt.session.lost(
                            &self.inner.registry,
                            "ZooKeeper expired the session",
                            Duration::ZERO,
                        );
                    }
                    return Err(errors::backend(
                        &self.inner.ensemble,
                        "acquire",
                        error,
                        false,
                    ));
                }
                None => {
                    attempt.undo_now().await;
                    return Err(errors::deadline("acquire", self.inner.request_timeout));
                }
            }
        }
        Err(errors::plain(
            "acquire",
            format!(
                "{} kept disappearing while a contender was created in it (another client deletes it?)",
                attempt.path
            ),
        ))
    }

    /// The node this attempt created under its protection prefix, with its
    /// czxid, if the server has it, and if it belongs to this attempt's
    /// session (CURATOR-696: a node is ours only if its `ephemeralOwner` is
    /// our session id).
    async fn find_own(&self, attempt: &Attempt) -> Result<Option<(String, i64)>> {
        let client = &attempt.client;
        self.inner
            .request("acquire", false, client.sync(&attempt.path))
            .await?;
        let children = self
            .inner
            .request("acquire", false, client.list_children(&attempt.path))
            .await?;
        for child in children.iter().filter(|c| c.starts_with(&attempt.prefix)) {
            let stat = self
                .inner
                .request(
                    "acquire",
                    false,
                    client.check_stat(&format!("{}/{child}", attempt.path)),
                )
                .await?;
            if let Some(stat) = stat.filter(|s| s.ephemeral_owner == attempt.session.id) {
                return Ok(Some((child.clone(), stat.czxid)));
            }
        }
        Ok(None)
    }

    /// Step 2: the grant's fencing token once nothing that excludes ours is
    /// ahead of it (a writer: any contender; a reader: a writer). A single
    /// attempt that must wait deletes its node (contention, `None`); a
    /// waiting one watches the one node it waits for ([`recipe::turn`])
    /// until that one is deleted, then looks again, until `wait`'s deadline
    /// (`None`, its node deleted). A failure still current at the deadline
    /// is reported as that error, not as a timeout: an outage is not
    /// contention.
    ///
    /// The token is the czxid of the queue's first contender when the turn
    /// came: `czxid` (our node's) for a writer, which is first; for a
    /// reader, the oldest reader ahead of it, or its own when it is first
    /// (why: the [module docs](super#shared-locks)).
    async fn await_turn(
        &self,
        attempt: &mut Attempt,
        wait: Option<Option<Instant>>,
        czxid: i64,
    ) -> Result<Option<i64>> {
        let node = attempt.node.clone().unwrap_or_default();
        let mut last_error: Option<Error> = None;
        loop {
            let deadline = wait.flatten();
            if wait.is_some() && deadline.is_some_and(|d| Instant::now() >= d) {
                attempt.undo_now().await;
                return match last_error {
                    Some(error) => Err(error),
                    None => Ok(None),
                };
            }
            let step = match self.look(attempt, &node).await {
                Ok(Look::AfterReaders(first)) => self.first_czxid(attempt, first).await,
                other => other,
            };
            let ahead = match step {
                Ok(Look::First) => return Ok(Some(czxid)),
                Ok(Look::Token(token)) => return Ok(Some(token)),
                // The first reader left between the listing and its read:
                // look again.
                Ok(Look::AfterReaders(_)) => continue,
                Ok(Look::Behind(ahead)) => ahead,
                Ok(Look::Gone) => {
                    attempt.armed = false;
                    return Err(errors::plain(
                        "acquire",
                        format!(
                            "{}/{node} vanished while waiting: the session expired or the node was force-released",
                            attempt.path
                        ),
                    ));
                }
                Err(error) if wait.is_none() || attempt.session.is_closed() => return Err(error),
                Err(error) => {
                    last_error = Some(error);
                    pause(deadline).await;
                    continue;
                }
            };
            let Some(deadline) = wait else {
                // Must wait: leave the queue and report contention.
                attempt.undo_now().await;
                return Ok(None);
            };
            // Watch only the one node we wait for (no herd).
            let ahead_path = format!("{}/{ahead}", attempt.path);
            let watched = self
                .inner
                .request(
                    "acquire",
                    false,
                    attempt.client.check_and_watch_stat(&ahead_path),
                )
                .await;
            let watcher = match watched {
                Ok((Some(_), watcher)) => watcher,
                // Gone already: look again.
                Ok((None, _)) => continue,
                Err(error) => {
                    last_error = Some(error);
                    pause(deadline).await;
                    continue;
                }
            };
            last_error = None;
            tokio::select! {
                _ = watcher.changed() => {}
                () = attempt.session.ended() => {
                    attempt.armed = false;
                    return Err(session_gone("acquire", &attempt.session));
                }
                () = crate::deadline::sleep_until(deadline) => {}
            }
        }
    }

    /// Where this attempt's node stands in the queue now.
    async fn look(&self, attempt: &Attempt, node: &str) -> Result<Look> {
        let children = self
            .inner
            .request(
                "acquire",
                false,
                attempt.client.list_children(&attempt.path),
            )
            .await?;
        let queue = recipe::queue(&children);
        Ok(match recipe::turn(&queue, node, attempt.kind) {
            Ok(Turn::Holds { first }) if first == node => Look::First,
            Ok(Turn::Holds { first }) => Look::AfterReaders(first.to_owned()),
            Ok(Turn::Behind(ahead)) => Look::Behind(ahead.to_owned()),
            Err(()) => Look::Gone,
        })
    }

    /// A holding reader's token: the czxid of `first`, the oldest reader
    /// ahead of it; `AfterReaders` again if that one has gone since the
    /// listing.
    async fn first_czxid(&self, attempt: &Attempt, first: String) -> Result<Look> {
        let stat = self
            .inner
            .request(
                "acquire",
                false,
                attempt
                    .client
                    .check_stat(&format!("{}/{first}", attempt.path)),
            )
            .await?;
        Ok(match stat {
            Some(stat) => Look::Token(stat.czxid),
            None => Look::AfterReaders(first),
        })
    }

    /// Step 3: our turn came, so the lock is ours. The owner token names
    /// the node and its czxid (a writer's fencing token too; a reader's is
    /// `fencing`, from [`await_turn`](Self::await_turn)); the registry
    /// records the grant, which fails if the session died meanwhile (it
    /// took the node with it).
    fn grant(
        &self,
        key: &str,
        ttl: Duration,
        czxid: i64,
        fencing: i64,
        mut attempt: Attempt,
    ) -> Result<Lease> {
        let node = attempt.node.clone().unwrap_or_default();
        let owner = Token { czxid, node }.encode();
        let parts = LeaseParts::unexpiring(key, owner.clone(), u64::try_from(fencing).ok(), ttl);
        let lease = Lease::new(
            parts,
            self.inner
                .leases
                .get_or_init(|| Arc::new(self.clone()) as Arc<dyn crate::Locker>),
        );
        let held = Held {
            session: attempt.session.clone(),
            lost: lease.lost_notifier(),
        };
        if self.inner.registry.grant(owner, held).is_err() {
            attempt.armed = false;
            return Err(session_gone("acquire", &attempt.session));
        }
        attempt.armed = false;
        Ok(lease)
    }
}

/// Where an attempt's node stands.
enum Look {
    /// Its turn, first in the queue: its own czxid is the fencing token.
    First,
    /// Its turn, a reader behind these readers: the fencing token is the
    /// czxid of the first of them, still to be read.
    AfterReaders(String),
    /// Its turn, with the fencing token read from the first reader.
    Token(i64),
    /// It waits for this node to go.
    Behind(String),
    /// Not among the children: the session expired, or someone deleted it.
    Gone,
}

/// A short pause between tries of a wait step, never past `deadline`.
async fn pause(deadline: Option<Instant>) {
    let until = crate::deadline::saturating_deadline(Instant::now(), FIRST_RETRY);
    let until = deadline.map_or(until, |d| d.min(until));
    tokio::time::sleep_until(until).await;
}

/// The error of an operation whose session ended under it.
pub(super) fn session_gone(operation: &'static str, session: &Session) -> Error {
    errors::plain(
        operation,
        format!(
            "the ZooKeeper session {:#x} ended (expired, or given up after no server answered within its timeout); its locks are gone, and the next call opens a new session",
            session.id
        ),
    )
}

/// One attempt's node, which may exist once `armed`: dropped while armed
/// (a cancelled future, an error), it deletes that node in the background.
struct Attempt {
    inner: Arc<Inner>,
    client: zk::Client,
    session: Arc<Session>,
    /// The lock path.
    path: String,
    /// The protection prefix of the node's name.
    prefix: String,
    /// A writer's or a reader's.
    kind: Kind,
    /// The node's name, once the create's answer gave it.
    node: Option<String>,
    armed: bool,
}

impl Attempt {
    /// Deletes the node this attempt may have created, once, bounded by
    /// the request timeout; on failure the drop retries in the background.
    async fn undo_now(&mut self) {
        if !self.armed {
            return;
        }
        let target = Target {
            path: self.path.clone(),
            prefix: self.prefix.clone(),
            node: self.node.clone(),
        };
        let done =
            tokio::time::timeout(self.inner.request_timeout, target.delete(&self.client)).await;
        if matches!(done, Ok(Ok(()))) {
            self.armed = false;
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let target = Target {
            path: std::mem::take(&mut self.path),
            prefix: std::mem::take(&mut self.prefix),
            node: self.node.take(),
        };
        delete_in_background(
            self.client.clone(),
            self.session.clone(),
            target,
            "an abandoned attempt's",
        );
    }
}

/// A contender node to delete: by name when known, else every child of
/// the lock path with the attempt's protection prefix.
pub(super) struct Target {
    pub(super) path: String,
    pub(super) prefix: String,
    pub(super) node: Option<String>,
}

impl Target {
    /// One try. Requests of one client reach the server in the order they
    /// were made, so a listing made after a create that may still be on its
    /// way sees it if it was applied.
    async fn delete(&self, client: &zk::Client) -> std::result::Result<(), zk::Error> {
        let names = match &self.node {
            Some(node) => vec![node.clone()],
            None => match client.list_children(&self.path).await {
                Ok(children) => children
                    .into_iter()
                    .filter(|c| c.starts_with(&self.prefix))
                    .collect(),
                Err(zk::Error::NoNode) => Vec::new(),
                Err(error) => return Err(error),
            },
        };
        for name in names {
            match client.delete(&format!("{}/{name}", self.path), None).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

/// Deletes `target` in the background, retrying with backoff until that is
/// answered or the session ends (it takes its ephemeral nodes with it).
/// `whose` names the node in the log. Without a runtime nothing can retry:
/// the node lives until its session ends.
pub(super) fn delete_in_background(
    client: zk::Client,
    session: Arc<Session>,
    target: Target,
    whose: &'static str,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(component = "distlock", backend = BACKEND, path = target.path, whose,
            "a ZooKeeper lock node cannot be deleted without a runtime; it lives until its session ends");
        return;
    };
    runtime.spawn(async move {
        let mut delay = FIRST_RETRY;
        loop {
            match tokio::time::timeout(MAX_RETRY * 4, target.delete(&client)).await {
                Ok(Ok(())) => return,
                Ok(Err(error)) if errors::session_ended(&error) => return,
                _ if session.is_closed() => return,
                outcome => {
                    tracing::debug!(
                        component = "distlock",
                        backend = BACKEND,
                        path = target.path,
                        whose,
                        ?outcome,
                        "deleting a ZooKeeper lock node failed; retrying"
                    );
                    tokio::time::sleep(delay).await;
                    delay = delay.saturating_mul(2).min(MAX_RETRY);
                }
            }
        }
    });
}
