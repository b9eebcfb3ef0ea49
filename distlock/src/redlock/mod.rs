//! Locks held by a majority of independent Redis nodes: Redlock
//! (`redlock://h1:port,h2:port,h3:port`; feature `redlock`).
//!
//! The algorithm is antirez's
//! (<https://redis.io/docs/latest/develop/use/patterns/distributed-locks/>):
//! N Redis servers that know nothing of each other (not replicas, not a
//! cluster), each holding the Redis backend's lock key
//! (`<prefix>{<key>}`, see [`crate::redis`]) with the holder's owner token
//! and the ttl.
//!
//! - **acquire** sends the Redis backend's acquire script (`SET NX PX` for
//!   one owner token) to every node at once, each call bounded by
//!   [`Config::node_timeout`] (and by the ttl). It succeeds once a majority
//!   (`N/2 + 1`) said yes *and* the validity left at that moment, `ttl -
//!   elapsed - drift` with `drift = ttl × drift_factor + 2 ms`, is above
//!   [`Config::min_validity`]. The lease's
//!   [`valid_until`](crate::Lease::valid_until) is that drift-adjusted
//!   validity: `sent + ttl - drift`, counted from before the first request
//!   left (as redsync, `mutex.go` in <https://github.com/go-redsync/redsync>,
//!   and node-redlock, `src/index.ts` in
//!   <https://github.com/mike-marcacci/node-redlock>, compute it). Nodes that
//!   have not answered when the majority is reached are not waited for:
//!   their calls finish in the background (within the node timeout), and
//!   the release and refresh reach every node anyway. A release by the
//!   token (the lease's, or the undo of a failed attempt) waits on each such
//!   node until its acquire has ended, so it cannot overtake it and leave
//!   the key held there until its ttl (see `landing.rs`).
//! - **a failed acquire** (no majority, or too little validity left) is
//!   released on every node by its owner token, in the background, and
//!   reported as contention (`Ok(None)`) only when enough nodes *answered*
//!   that the key is held elsewhere that no majority was possible. When
//!   nodes failed or did not answer and a majority was therefore out of
//!   reach, it is [`Error::Backend`] naming each failed node: an outage,
//!   which a [`BreakerLocker`](crate::BreakerLocker) turns into
//!   [`Error::Unavailable`] while it lasts. Never contention.
//! - **release** runs the release script (compare-and-delete by owner
//!   token) on every node. It succeeds once a majority deleted the key
//!   (held it for this owner); [`Error::NotHeld`] once so many did not
//!   hold it that no majority can have (this owner's keys on a minority,
//!   left by a partial expiry, are deleted all the same). Like every call
//!   here it returns as soon as a
//!   majority has decided it; the other nodes' calls finish in the
//!   background, each bounded by the node timeout.
//! - **refresh** runs the refresh script (compare-and-`PEXPIRE`) on every
//!   node; while a majority still holds the key, a node that does not hold
//!   it any more *and where it is free* (it restarted without persistence,
//!   or the key expired there) is locked again with the same token. It
//!   succeeds with a majority; [`Error::NotHeld`] (the lease's lost signal
//!   fires) once so many nodes do not hold the key for this owner
//!   (released, force-released, expired, or held by someone else) that no
//!   majority is left: a released lock is never re-taken; otherwise an
//!   outage error, and the lease keeps its earlier validity (the keepalive
//!   retries until it lapses, then the signal fires with
//!   [`LostReason::Expired`](crate::LostReason::Expired)). A refresh's
//!   validity is drift-adjusted too.
//! - **waiting**: [`Locker::lock`] polls with backoff and is woken by the
//!   release script's `PUBLISH` on any node: a waiter subscribes on every
//!   node (each node's subscriber connection is shared by its waiters, as
//!   in [`crate::redis`]), so waking costs one subscriber connection per
//!   node and locker. A node that cannot be subscribed is left out; if none
//!   can, waiters poll. A lock freed by expiry publishes nothing.
//! - **semaphore permits** ([`Locker::try_lock_any`]) are tried one key at
//!   a time (the default, [`crate::try_lock_in_turn`]): each key is a
//!   quorum of its own, and one script per node over all the keys could
//!   grant different keys on different nodes, with no majority for any.
//! - **Connections**: each node has its own reconnecting connection (the
//!   Redis backend's, one per node), opened on first use, so a locker can
//!   be built while a minority of nodes is down. [`RedlockLocker::from_config`]
//!   fails only if fewer than a majority answer a `PING`.
//!
//! ```no_run
//! use std::time::Duration;
//! use distlock::Locker;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = distlock::connect("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").await?;
//! if let Some(lease) = locker.try_lock("nightly", Duration::from_secs(30)).await? {
//!     assert_eq!(lease.fencing_token(), None); // Redlock has none: see below
//!     // ... work that stops on lease.lost_signal() ...
//!     lease.release().await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # When Redlock is safe, and when it is not
//!
//! Redlock's exclusivity rests on timing assumptions, not on consensus.
//! Martin Kleppmann's critique
//! (<https://martin.kleppmann.com/2016/02/08/how-to-do-distributed-locking.html>)
//! and antirez's reply (<http://antirez.com/news/101>) agree on the facts
//! below and disagree on how often they bite:
//!
//! - **Process pauses.** A holder paused (GC, `SIGSTOP`, a swapped-out
//!   page, a VM migration) past its validity keeps working on a lock that
//!   expired and was granted to someone else. No lock with a ttl can
//!   prevent that; [`crate::Lease::run_while_held`], the lost signal and
//!   `distlock run` stop the work before the *known* validity ends, which
//!   covers pauses of the watching thread, not of the whole process.
//! - **Clock jumps.** Each node expires the key on its own clock. A node
//!   whose clock jumps forward (an operator, an NTP step) frees the key
//!   early; two such nodes in a three-node Redlock can grant the lock to a
//!   second holder while the first is within its validity. The drift
//!   allowance covers clocks that *run* at slightly different rates, not
//!   jumps: run the nodes with slewing time synchronisation.
//! - **Restarts without persistence.** A node that restarts empty forgets
//!   every lock it held; with one more node of the same majority failing or
//!   expiring early, a second holder gets a majority. antirez's remedy is
//!   to keep a restarted node out for at least the longest ttl (delayed
//!   restarts), or `appendonly yes` with `appendfsync always`. distlock
//!   does not delay restarts: operate the nodes so.
//! - **Eviction.** A node with `maxmemory` and a `maxmemory-policy` other
//!   than `noeviction` can evict a held lock's key, which counts like a
//!   restart. Each node that answers when the locker is built is checked as
//!   the Redis backend checks its server (see `distlock::redis`, "What the
//!   server must be configured with"): such a node is refused
//!   ([`Error::InvalidInput`]) unless `allow_eviction=true`; a node that did
//!   not answer then is not checked.
//! - **Network delays** longer than the validity make a grant's replies
//!   arrive after its keys expired: the validity check refuses such grants,
//!   but a reply delayed *after* the check is the pause case again.
//!
//! Within those assumptions (bounded pauses, bounded clock drift, nodes
//! that keep their data or stay away for a ttl) a majority grant is
//! exclusive, and it tolerates the crash or partition of a minority of
//! nodes, which a single Redis node or a failover pair does not.
//!
//! **Where two holders would be a correctness failure, not merely wasted
//! work, do not use Redlock: use the Postgres backend (or etcd, when it
//! lands), whose leases carry fencing tokens that the protected resource
//! can check.**
//!
//! # Fencing: none
//!
//! Leases carry no fencing token ([`Capabilities::fencing`] is false). The
//! acquire script bumps a counter on each node (`<prefix>{<key>}:fence`,
//! deleted by [`Locker::forget`]), but no combination of per-node counters
//! is a sound token: the counter moves on a node even for attempts that
//! failed to reach a majority elsewhere, so the largest counter of one
//! majority can exceed the largest of a later majority (two majorities
//! share a node, not their maxima), and a node restarted without
//! persistence starts again from zero. A monotonic token needs agreement
//! among the nodes, which is what Redlock does not have (Kleppmann, above).
//! distlock would rather expose no token than one that can go backwards.
//!
//! # Marks: none
//!
//! [`Locker::advance_mark`] is [`Error::Unsupported`]
//! ([`Capabilities::marks`] false): a "mark raised on a majority" can be
//! read back lower from a different majority after a restart, and two
//! concurrent advances can each win on a different majority, so it would
//! not be the linearizable high-water mark the scheduler relies on. Use a
//! single-node backend's marks (Redis, Postgres, file) beside a Redlock.
//!
//! # Shared locks: none
//!
//! [`Locker::try_lock_shared`] and [`Locker::lock_shared`] are
//! [`Error::Unsupported`] ([`Capabilities::shared`] false). The single-node
//! Redis backend's reader set and marker could be taken on each node, but a
//! reader would then need them on a majority within the drift-adjusted
//! validity, and a writer's majority would have to intersect every
//! reader's: that recipe, and its failure analysis, is not written. The
//! nodes' scripts are the Redis backend's, so a key that readers of a
//! single-node Redis locker hold on a node (the same server and prefix)
//! is contention there for a Redlock writer, never a second holder.
//!
//! # Inspection
//!
//! Every grant records its holder on each node that takes it, as the Redis
//! backend does (in the lock key's value, after the owner token;
//! `?holder=false` turns it off).
//! [`Locker::inspect`] asks every node at once (each bounded by the node
//! timeout) and reports **the majority's view**: the key is held if a
//! majority of nodes hold it for one grant (the same owner token, told
//! apart by its SHA-1, never by the token itself), with the holder record,
//! the grant time (the first such node's clock) and ttl of the first of
//! them that has a record; `ttl_left` is how long a majority still hold it
//! (the majority-th longest node `PTTL`); `fencing_token` is `None`
//! (above). A key held on a minority only is free (the next acquire can
//! get a majority); when failed nodes hide the answer (a grant on fewer
//! than a majority of the answering nodes, which the failed ones could
//! complete), inspect is [`Error::Backend`], never free.
//! [`Locker::list`] lists every node and applies the same rule per key.
//! [`Locker::force_release`] ([`ForceRelease::Lock`] only) deletes the key
//! and its record on every node whoever holds it there, each node
//! publishing the release, and returns the majority's view of what it
//! evicted; nodes that fail keep their copy until its ttl, which a minority
//! cannot turn into a grant. A grant re-taken on a node by a refresh (the
//! node had lost it) records no holder there; the other nodes' records
//! still name it.
//!
//! # What else it does not guarantee
//!
//! - **The same server twice counts twice.** Nodes are told apart by their
//!   address as written; the config refuses an address listed twice, but
//!   not one server reached under two names (`localhost:6379` and
//!   `127.0.0.1:6379`). List each server once.
//! - **An even number of nodes** needs more than half of them: four nodes
//!   tolerate one failure, like three. Use 3 or 5.
//! - **Forget needs every node**: [`Locker::forget`] deletes the per-node
//!   counters only if every node answers and none holds the key.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::inspect::{ForceRelease, HeldLock};
use crate::redis::RedisLocker;
use crate::{validate, Capabilities, Error, Lease, Locker, ReleaseWatch, Result};

mod acquire;
mod config;
mod inspect;
mod landing;
mod nodes;
mod quorum;

pub use config::{
    Config, DEFAULT_DRIFT_FACTOR, DEFAULT_MIN_VALIDITY, DEFAULT_NODE_TIMEOUT, ENV_PREFIX,
};

use quorum::{drift, majority, remaining_validity, QuorumFailure, Tally};

const BACKEND: &str = "redlock";

/// The Redlock backend. Cheap to clone; clones share the nodes'
/// connections.
///
/// Build it with [`RedlockLocker::from_config`] or
/// [`RedlockLocker::from_url`]; [`crate::connect`] does the latter for
/// `redlock://` URLs. Read the [module docs](self) before relying on it.
#[derive(Clone)]
pub struct RedlockLocker {
    inner: Arc<Inner>,
}

struct Inner {
    /// The `Arc` every lease of this locker and its clones shares.
    leases: crate::SharedLocker,
    nodes: Vec<RedisLocker>,
    quorum: usize,
    node_timeout: Duration,
    drift_factor: f64,
    min_validity: Duration,
    /// Acquires still running on slow nodes after a grant: a release by
    /// their token waits for them on those nodes.
    landings: Arc<landing::Landings>,
}

impl fmt::Debug for RedlockLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints: Vec<&str> = self.inner.nodes.iter().map(|n| n.endpoint()).collect();
        f.debug_struct("RedlockLocker")
            .field("nodes", &endpoints)
            .field("quorum", &self.inner.quorum)
            .field("node_timeout", &self.inner.node_timeout)
            .finish_non_exhaustive()
    }
}

impl RedlockLocker {
    /// Builds a locker on the nodes `config` lists and checks that a
    /// majority of them answer a `PING` (each within the nodes' connect and
    /// response timeouts). Nodes that do not are reconnected to on use.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a config without nodes, with a node
    /// listed twice, or otherwise malformed (see [`Config`]);
    /// [`Error::Backend`] naming each failed node if fewer than a majority
    /// answered (an authentication failure says so);
    /// [`Error::InvalidInput`] naming the node if one that answered may
    /// evict keys (`maxmemory` with a `maxmemory-policy` other than
    /// `noeviction`) and `allow_eviction` is not set, as for
    /// [`RedisLocker::from_config`](crate::redis::RedisLocker::from_config).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use distlock::redlock::{Config, RedlockLocker};
    ///
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let locker = RedlockLocker::from_config(Config::from_env()?).await?;
    /// assert!(locker.nodes() >= 1);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_config(config: Config) -> Result<Self> {
        config.check()?;
        let mut nodes = Vec::with_capacity(config.nodes.addresses.len());
        for address in &config.nodes.addresses {
            let node = crate::redis::Config {
                addresses: vec![address.clone()],
                ..config.nodes.clone()
            };
            nodes.push(RedisLocker::from_config_lazy(node)?);
        }
        let quorum = majority(nodes.len());
        let pings = futures_util::future::join_all(nodes.iter().map(|node| node.ping())).await;
        // Each node that answered is checked like a Redis locker's server
        // (eviction, persistence); one that did not is not read at all.
        let checks = nodes
            .iter()
            .zip(&pings)
            .filter(|(_, answer)| answer.is_ok())
            .map(|(node, _)| node.check_server());
        for check in futures_util::future::join_all(checks).await {
            check?;
        }
        let mut tally = Tally::default();
        for (node, answer) in nodes.iter().zip(pings) {
            tally.count(node.endpoint(), answer.map(|()| true));
        }
        if tally.yes < quorum {
            return Err(Error::backend(
                BACKEND,
                "connect",
                QuorumFailure::new(
                    format!(
                        "only {} of {} Redlock nodes answered; a majority ({quorum}) is needed",
                        tally.yes,
                        nodes.len()
                    ),
                    tally.failures,
                ),
            ));
        }
        for (endpoint, error) in &tally.failures {
            tracing::warn!(component = "distlock", backend = BACKEND, node = endpoint, %error,
                "a Redlock node does not answer; the majority does, so the locker works without it and reconnects on use");
        }
        Ok(RedlockLocker {
            inner: Arc::new(Inner {
                leases: crate::SharedLocker::default(),
                nodes,
                quorum,
                node_timeout: config.node_timeout,
                drift_factor: config.drift_factor,
                min_validity: config.min_validity,
                landings: Arc::default(),
            }),
        })
    }

    /// Builds a locker from a `redlock://` URL (see [`Config::from_url`]).
    ///
    /// # Errors
    ///
    /// As [`from_config`](Self::from_config), and [`Error::InvalidInput`]
    /// for a malformed URL.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::from_config(Config::from_url(url)?).await
    }

    /// How many nodes this locker uses.
    pub fn nodes(&self) -> usize {
        self.inner.nodes.len()
    }

    /// How many nodes a grant, a refresh and a release need: `nodes / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The bound on each call to each node ([`Config::node_timeout`]).
    pub fn node_timeout(&self) -> Duration {
        self.inner.node_timeout
    }

    /// The clock-drift allowance for a lock of `ttl`: `ttl × drift_factor +
    /// 2 ms`. A lease's validity is its ttl less this, less the time the
    /// grant took.
    ///
    /// ```no_run
    /// # async fn demo(locker: distlock::redlock::RedlockLocker) {
    /// use std::time::Duration;
    /// // With the default factor (1 %):
    /// assert_eq!(locker.drift(Duration::from_secs(10)), Duration::from_millis(102));
    /// # }
    /// ```
    pub fn drift(&self, ttl: Duration) -> Duration {
        drift(ttl, self.inner.drift_factor)
    }

    /// The Redis key that holds the lock on `key` on every node:
    /// `<prefix>{<key>}`.
    pub fn backend_key(&self, key: &str) -> String {
        self.first_node().backend_key(key)
    }

    fn first_node(&self) -> &RedisLocker {
        // `Config::check` refuses a config without nodes.
        &self.inner.nodes[0]
    }

    /// The bound on one node's part of an acquire of `ttl`.
    fn acquire_bound(&self, ttl: Duration) -> Duration {
        self.inner.node_timeout.min(ttl)
    }
}

#[async_trait]
impl Locker for RedlockLocker {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: false,
            marks: false,
            shared: false,
            ..Capabilities::ALL
        }
    }

    /// [`Error::Unsupported`]: a reader would need a place in the reader
    /// set of a majority of nodes, within the drift-adjusted validity, and
    /// every writer's quorum to see it; that recipe is not written. The
    /// single-node Redis backend has shared locks.
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        validate::acquire(key, ttl)?;
        Err(Error::unsupported(
            BACKEND,
            "try_lock_shared",
            "shared locks are not done on Redlock (a reader needs a majority of the nodes' \
             reader sets, and every writer's quorum must see it: that recipe is not written); \
             the single-node Redis backend (redis://), memory and file have shared locks",
        ))
    }

    fn backend_key(&self, key: &str) -> String {
        RedlockLocker::backend_key(self, key)
    }

    /// One attempt on every node (see the [module docs](self)), bounded by
    /// the node timeout (or the ttl, if shorter) per node.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] when failed or silent nodes kept the majority out
    /// of reach, or the grant left too little validity (each failed node is
    /// named); [`Error::InvalidInput`] for a bad key or ttl. Contention is
    /// `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped attempt is released on every node by its
    /// owner token in the background (failing that, its keys expire at the
    /// ttl).
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        validate::acquire(key, ttl)?;
        self.acquire(key, ttl).await
    }

    /// Releases on every node by owner token.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if a majority does not hold it for this owner
    /// (so it was not held: a minority's keys of this owner, left by a
    /// partial expiry or by a release still finishing in the background,
    /// are deleted all the same); [`Error::Backend`] if too few nodes
    /// answered to tell (the key then expires at its ttl where it was not
    /// deleted).
    ///
    /// # Cancel safety
    ///
    /// A dropped release may have deleted the key on some nodes; releasing
    /// again by token is safe.
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        validate::key(key)?;
        let (quorum, nodes) = (self.inner.quorum, self.nodes());
        let (shared_key, shared_owner): (Arc<str>, Arc<str>) = (key.into(), owner.into());
        let tally = self
            .on_nodes(
                "release",
                self.inner.node_timeout,
                |node| {
                    let (key, owner) = (shared_key.clone(), shared_owner.clone());
                    let landed = self.inner.landings.landed(&owner, node.endpoint());
                    async move {
                        landed.await;
                        match node.unlock(&key, &owner).await {
                            Ok(()) => Ok(true),
                            Err(Error::NotHeld { .. }) => Ok(false),
                            Err(error) => Err(error),
                        }
                    }
                },
                // Decided once a majority held it (released) or can no
                // longer have (not held); the rest are deleted in the
                // background. A majority that answered with some nodes
                // still out is not enough: a release of the same owner
                // still finishing there would count as held.
                |tally| tally.yes >= quorum || tally.no > nodes - quorum,
            )
            .await;
        if tally.yes >= quorum {
            return Ok(());
        }
        if tally.no > nodes - quorum {
            return Err(Error::not_held(key));
        }
        let summary = format!(
            "released on {} of {nodes} nodes; too few answered to tell whether a majority \
             held it, so the lock may still be held until its ttl",
            tally.yes
        );
        Err(self.quorum_error("release", summary, tally))
    }

    /// Extends the lock on every node; while a majority still holds it,
    /// re-locks it, by the same token, on a node where it is gone and free
    /// (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] once the nodes that do not hold the key for this
    /// owner (it is gone there, or held by someone else) leave no majority; [`Error::Backend`] if fewer than a majority could be
    /// extended for other reasons, or the refresh took so long that less
    /// than [`Config::min_validity`] would be left.
    ///
    /// # Cancel safety
    ///
    /// A dropped refresh may have extended some nodes; the lease keeps its
    /// earlier validity.
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        validate::acquire(key, ttl)?;
        let (quorum, nodes) = (self.inner.quorum, self.nodes());
        let (shared_key, shared_owner): (Arc<str>, Arc<str>) = (key.into(), owner.into());
        // How many nodes extended the key and how many did not, so far.
        let answered = Arc::new(watch::Sender::new((0usize, 0usize)));
        let started = Instant::now();
        let tally = self
            .on_nodes(
                "refresh",
                self.inner.node_timeout,
                |node| {
                    let (key, owner) = (shared_key.clone(), shared_owner.clone());
                    let answered = answered.clone();
                    async move {
                        let refreshed = node.refresh(&key, &owner, ttl).await;
                        answered.send_modify(|(yes, no)| match refreshed {
                            Ok(()) => *yes += 1,
                            Err(_) => *no += 1,
                        });
                        match refreshed {
                            Ok(()) => Ok(true),
                            // Gone here: a restart without persistence, an
                            // early expiry, or a release. Re-locked, by the
                            // same token, only if a majority extended it
                            // (the lock is still ours, this node forgot it):
                            // without one the lock is not held, and
                            // re-locking would bring back a lock its owner
                            // or an operator released. `false` if another
                            // token holds it here. Without a holder record:
                            // the refresh runs on the keepalive's task,
                            // whose label is not the holder's, and the
                            // majority's records still name the holder.
                            Err(Error::NotHeld { .. }) => {
                                let mut seen = answered.subscribe();
                                let still_ours = seen
                                    .wait_for(|&(yes, no)| yes >= quorum || no > nodes - quorum)
                                    .await
                                    .is_ok_and(|answers| answers.0 >= quorum);
                                if still_ours {
                                    node.acquire_as(&key, &owner, ttl, None).await
                                } else {
                                    Ok(false)
                                }
                            }
                            Err(error) => Err(error),
                        }
                    }
                },
                |tally| tally.yes >= quorum || tally.refused_by_majority(nodes),
            )
            .await;
        if tally.yes >= self.inner.quorum {
            let elapsed = started.elapsed();
            let drift = self.drift(ttl);
            let min_validity = self.inner.min_validity;
            return match remaining_validity(ttl, elapsed, drift) {
                Some(left) if left > min_validity => Ok(()),
                left => Err(self.quorum_error(
                    "refresh",
                    format!(
                        "extended on {} of {nodes} nodes, but only {:?} of the {ttl:?} ttl \
                         was left after {elapsed:?} (minimum {min_validity:?})",
                        tally.yes,
                        left.unwrap_or_default()
                    ),
                    tally,
                )),
            };
        }
        if tally.refused_by_majority(nodes) {
            return Err(Error::not_held(key));
        }
        let summary = format!(
            "extended on {} of {nodes} nodes, not held for this owner on {}; the others failed, \
             so no majority ({}) was reached",
            tally.yes, tally.no, self.inner.quorum
        );
        Err(self.quorum_error("refresh", summary, tally))
    }

    /// Deletes the per-node counters of `key` (see the [module
    /// docs](self), "Fencing") on every node where it is free, unless a
    /// majority holds it.
    ///
    /// A key held on a minority of nodes is not held: that is what a
    /// release leaves behind for a moment (it returns once a majority has
    /// released, the others finish in the background), or a client that
    /// died mid-acquire. Those nodes keep their key until it expires or its
    /// release lands; with no fencing tokens on Redlock, a counter left
    /// there changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::NotAcquired`] if a majority holds `key`; [`Error::Backend`]
    /// if any node failed (each node's deletion is atomic; nodes that
    /// answered may have forgotten it).
    async fn forget(&self, key: &str) -> Result<()> {
        validate::key(key)?;
        let shared_key: Arc<str> = key.into();
        let tally = self
            .on_nodes(
                "forget",
                self.inner.node_timeout,
                |node| {
                    let key = shared_key.clone();
                    async move {
                        match node.forget(&key).await {
                            Ok(()) => Ok(true),
                            Err(Error::NotAcquired { .. }) => Ok(false),
                            Err(error) => Err(error),
                        }
                    }
                },
                // Every node's answer counts.
                |_| false,
            )
            .await;
        if tally.no >= self.inner.quorum {
            return Err(Error::not_acquired(key));
        }
        if !tally.failures.is_empty() {
            let summary = format!(
                "forgotten on {} of {} nodes; forget needs every node",
                tally.yes,
                self.nodes()
            );
            return Err(self.quorum_error("forget", summary, tally));
        }
        Ok(())
    }

    /// Asks every node at once, each bounded by the node timeout, and reports
    /// the majority's view (see the [module docs](self), "Inspection").
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] when failed nodes hide whether a majority holds
    /// the key (never reported free then).
    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        self.inspect_lock(key).await
    }

    /// Lists every node at once; each key any node holds is reported if a
    /// majority hold it for one grant (see the [module docs](self),
    /// "Inspection").
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] when failed nodes hide whether a majority holds a
    /// key, or a majority of nodes could not be listed.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.list_locks(prefix).await
    }

    /// [`ForceRelease::Lock`] only: deletes the key on every node (each
    /// publishes the release), waiting for each within the node timeout,
    /// and returns the grant a majority held (see the [module docs](self),
    /// "Inspection").
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for [`ForceRelease::TerminateSession`];
    /// [`Error::Backend`] when failed nodes hide what was evicted (the key
    /// may still be held on them: inspect it).
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        self.force_release_lock(key, how).await
    }

    /// Subscribes to `key`'s release channel on every node that can be
    /// subscribed within the node timeout; `Ok(None)` (waiters poll) if
    /// none can.
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        validate::key(key)?;
        let watches = self
            .ask_every_node("watch_releases", |node| node.watch_releases(key))
            .await;
        let streams: Vec<_> = watches
            .into_iter()
            .filter_map(|watch| watch.ok().flatten())
            .map(|watch| {
                futures_util::stream::unfold(watch, |mut watch| async move {
                    watch.next().await.then_some(((), watch))
                })
                .boxed()
            })
            .collect();
        if streams.is_empty() {
            return Ok(None);
        }
        // Ends when every node's stream has ended.
        Ok(Some(ReleaseWatch::from_stream(
            futures_util::stream::select_all(streams),
        )))
    }
}
