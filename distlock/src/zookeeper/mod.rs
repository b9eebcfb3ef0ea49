//! Locks in a ZooKeeper ensemble (`zookeeper://`; feature `zookeeper`), by
//! ZooKeeper's own lock recipe as Apache Curator's `InterProcessMutex`
//! implements it, so they interoperate with Curator and (see below) with
//! kazoo's `Lock`; shared (reader) locks by ZooKeeper's read-write lock
//! recipe in the same queue ([shared locks](#shared-locks)).
//!
//! - **Paths**: the distlock key `K` is the lock path `<key_prefix>K`
//!   (default prefix `/distlock/locks/`), with `/` and `%` in `K`
//!   percent-encoded so every key is one node
//!   ([`ZooKeeperLocker::backend_key`] gives the path to hand another
//!   client). The lock path is a container node, which the server deletes
//!   once it has no child; its parent is created when missing.
//! - **Acquire**: create an ephemeral sequential child
//!   `<lock path>/_c_<uuid>-lock-<sequence>` (Curator's protected lock
//!   name), holding the holder record as its data; list the children; the
//!   contender with the lowest sequence number holds the lock. A
//!   [`Locker::try_lock`] that is not first deletes its node again and
//!   reports contention.
//! - **Waiting** ([`Locker::lock`]) keeps its node and watches only the
//!   contender just ahead of it (an `exists` watch), then looks again when
//!   that one is deleted: no herd, FIFO, no polling. At the deadline (or
//!   when the future is dropped) its node is deleted.
//! - **Contenders of other clients.** A child counts as a contender when its
//!   name ends in `-lock-<digits>` (Curator's mutex, and ours),
//!   `__lock__<digits>` (kazoo's `Lock` and `WriteLock`), or, from
//!   read-write locks, `__WRIT__<digits>`, `__READ__<digits>` (Curator's)
//!   or `__rlock__<digits>` (kazoo's); the last two (and distlock's
//!   readers) are readers. Sequence numbers are one counter per parent,
//!   whatever the name, so they order contenders of every client, and a
//!   writer waits for every one of them.
//! - **Fencing token**: the holder node's **czxid** (the zxid of the
//!   transaction that created it), not its sequence number. Sequence
//!   numbers are per parent and start again at 0 when the lock path is
//!   deleted and created again (which the container node makes routine),
//!   so they go backwards; a zxid is the ensemble's one transaction counter
//!   (epoch in the high 32 bits, counter in the low 32), every write gets a
//!   larger one, it is persisted in the transaction log and snapshots, and
//!   a new leader starts a higher epoch: czxids strictly increase across
//!   every grant of every key, restarts and leader changes included. They
//!   are large numbers (`0x100000002a` after the first restart), never 1.
//! - **Release** deletes the holder's node by name. The name's random part
//!   is never reused, so a retried or stale unlock never deletes another
//!   grant's node.
//! - **Owner tokens** are `<czxid hex>/<node name>`, so [`Locker::unlock`]
//!   and [`Locker::refresh`] work from any process that has the token
//!   ([`Capabilities::unlock_by_owner`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use distlock::Locker;
//! use distlock::zookeeper::ZooKeeperLocker;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = ZooKeeperLocker::from_url("zookeeper://10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181/apps?session_timeout=10s").await?;
//! assert_eq!(locker.backend_key("nightly"), "/distlock/locks/nightly");
//! let lease = locker.lock("nightly", Duration::from_secs(30), Duration::from_secs(30)).await?;
//! // ... work, passing lease.fencing_token() (a czxid) to what you write to ...
//! lease.release().await?;
//! locker.close().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! - **Sessions and what ttl means.** A lock lives on a ZooKeeper session,
//!   kept alive by zookeeper-client (it pings, and moves to another server
//!   after a connection loss). A locker spreads its keys over up to
//!   [`Config::sessions`] sessions (4 by default, each opened when a key
//!   first needs it), a key always on the same one: one session answers
//!   its requests in order and costs the server more CPU a request when
//!   busy, so many callers of one locker are faster over several
//!   (BENCHMARKS.md). Each session has its own watchdog and lost signal,
//!   and everything below holds per session. **A holder that
//!   crashes, hangs or is cut off keeps its locks until the ensemble expires
//!   its session: one negotiated session timeout after the server last
//!   heard from it** (`session_timeout` in the URL; the ensemble negotiates
//!   it into its `minSessionTimeout`..`maxSessionTimeout`, 2 to 20 ticks by
//!   default). A live holder keeps a lock until it releases it, however long
//!   that is ([`Capabilities::expires`] is false, as on Postgres and etcd).
//!   The `ttl` given to an acquire is only validated and recorded in the
//!   holder record; it does not bound anything. Bound a live holder with
//!   [`KeepAlive::max_hold`](crate::KeepAlive::max_hold).
//! - **Losing a lock.** The lost signal ([`LostReason::ConnectionLost`](crate::LostReason::ConnectionLost))
//!   fires when the session expires (the server deleted the nodes), and,
//!   before that, when no server has answered for so long that the session
//!   may be expiring: at *the send time of the last answered heartbeat +
//!   the session timeout − [`drift_margin`](crate::drift_margin)*, with
//!   what is left as grace. Heartbeats go every fifth of the session
//!   timeout, so a holder cut off from the ensemble stops between 4/5 of a
//!   session timeout and a session timeout after the cut (the table of
//!   states is in `session.rs`). The session is then abandoned (closed if
//!   a server answers again), so a lock is never kept by a holder that
//!   stopped working under it; later acquires open a new session.
//! - **Reconnecting.** After a connection loss zookeeper-client retries
//!   the servers with a doubling backoff (100 ms × 2^n for one server,
//!   from min(1 s, 100 ms × servers) for several; not configurable), and
//!   gives up a connection that says nothing after a connection timeout
//!   this backend sets to a tenth of the session timeout, 250 ms to 1 s
//!   (the crate's default, 2/5 of the session timeout, once kept a holder
//!   off its restarted server for ~9 s). So a holder is back on its
//!   session within one connection timeout + one backoff step of a server
//!   answering again: under 2 s after an outage of about a second, but
//!   the backoff step grows with the outage (about as long as the outage
//!   so far), so a long outage can cost a holder near its give-up time.
//! - **Ownership (CURATOR-696).** Curator once granted a lock to a client
//!   whose node had been created by an earlier, expired session. Here a
//!   node counts as ours only if its `ephemeralOwner` is the session id of
//!   the session the lease was granted on: [`Locker::refresh`] checks it
//!   (and the czxid), and a node found again after a lost create answer is
//!   checked the same way.
//! - **Refresh** ([`Locker::refresh`]) confirms in one request (an
//!   `exists`) that the holder's node exists with its czxid and is owned
//!   by the holding session: [`Error::NotHeld`] once it is not (deleted by
//!   a forced release, or another node). The `ttl` argument is only
//!   validated: a refresh extends nothing, it only finds a lost lock.
//! - **What the keepalive costs.** [`Locker::refresh_many`] (the
//!   keepalive's batch) makes the same checks as multi reads (`getData` of
//!   each holder node) on each lease's session: one request per 1,000
//!   leases of a session (so at least one per session), fewer per request
//!   when their paths are long (a request stays under 512 KiB, half of
//!   ZooKeeper's default `jute.maxbuffer`), up to four on their way at
//!   once. The keepalive refreshes a lease every third of its ttl
//!   (gathering those due within half of that into one batch), so 100,000
//!   leases held with ttl 30 s cost 100 requests per 10 s, about 10
//!   requests/s (each answer about 230 bytes a lease with the holder
//!   record), not 10,000. A multi read that fails (connection lost, no
//!   answer within the request timeout) is that error for each of its
//!   leases, which keep their lock; a check refused on its own (`NoAuth`:
//!   `getData` needs read permission, `exists` does not) is done again as
//!   an `exists`. Multi reads came in ZooKeeper 3.6: a 3.5 server answers
//!   one `Unimplemented` (and drops that connection; the session lives
//!   on), after which the locker checks one `exists` per lease (not tested
//!   here: the tests run 3.8).
//! - **Contention vs outage**: a held lock is `Ok(None)`; an unreachable
//!   ensemble or one without quorum is [`Error::Backend`] or
//!   [`Error::DeadlineExceeded`], never contention. A [`Locker::lock`]
//!   whose wait outlived a failure ends at its deadline as
//!   [`Error::Timeout`]; only a failure still current at the deadline makes
//!   it an outage.
//! - **Timeouts** ([`Config`]): `connect_timeout` bounds opening a session,
//!   `request_timeout` every request (zookeeper-client has none: a request
//!   made while disconnected waits for the reconnection). [`Locker::try_lock`]
//!   is bounded by [`ZooKeeperLocker::operation_bound`];
//!   [`Locker::lock`] by its timeout + [`DEADLINE_GRACE`].
//! - **A create whose outcome is unknown** (the connection was lost under
//!   it, its answer timed out, or its future was dropped) may have made the
//!   node: it is found by its protection prefix (`_c_<uuid>`; after a
//!   `sync`, so the server read from has caught up) and used, or deleted in
//!   the background until that succeeds or the session ends.
//! - **Closing.** [`ZooKeeperLocker::close`] (or dropping the last clone
//!   of the locker and every lease it granted) closes the sessions, which
//!   deletes their nodes at once.
//! - **Cancel safety**: dropping a `try_lock` or `lock` future is safe: a
//!   node it may have created is deleted in the background. Dropping a
//!   release or refresh leaves the lock as the request left it.
//!
//! # Interoperability
//!
//! distlock names its nodes as Curator does; kazoo names its
//! `<uuid hex>__lock__<sequence>`, and one name cannot be both: kazoo
//! counts as contenders only names matching `__lock__\d{10}$` plus the
//! `extra_lock_patterns` it is given, and Curator orders children by what
//! follows their last `lock-` (a kazoo name has none, so Curator misorders
//! it). distlock follows Curator, the recipe the JVM services that run
//! ZooKeeper use (Kafka, HBase, Solr), and reads both namings:
//!
//! - a Curator or kazoo holder excludes distlock, and a distlock holder
//!   excludes Curator;
//! - a distlock holder excludes kazoo when kazoo's lock is made with
//!   `Lock(client, path, extra_lock_patterns=["-lock-"])` (kazoo 2.7.1+,
//!   the option kazoo added "for cross-implementation compatibility");
//!   **a kazoo `Lock` without it does not see distlock's nodes and can be
//!   granted the lock while distlock holds it** (checked in the test
//!   `zookeeper::interop`).
//!
//! Read-write locks of other clients on the same path (the table of names
//! is in `recipe.rs`):
//!
//! - a distlock writer waits for every reader and writer of kazoo
//!   (`ReadLock`, `WriteLock`) and Curator (`InterProcessReadWriteLock`)
//!   queued before it, and a distlock reader for every writer of theirs;
//! - distlock's readers coexist with theirs: a Curator or kazoo reader
//!   never waits for a distlock reader, nor a distlock reader for one;
//! - a Curator `InterProcessReadWriteLock` writer waits for distlock's
//!   readers (their names carry `__READ__` before the sequence, as
//!   Curator's own readers' do), and a kazoo `WriteLock` does given
//!   `extra_lock_patterns=["-lock-", "__READ__"]`; a kazoo `ReadLock`
//!   waits for distlock's writers given `extra_lock_patterns=["-lock-"]`
//!   (checked in `zookeeper::interop`); without those patterns kazoo does
//!   not see distlock's nodes, as above;
//! - **Curator's `InterProcessReadWriteLock` does not see distlock's
//!   writers**: they are named for Curator's `InterProcessMutex` (so that
//!   one keeps working), which Curator's read-write lock passes by (its
//!   readers wait only for `__WRIT__` names, its writers order a `-lock-`
//!   name by its whole text, after their own). No name serves both of
//!   Curator's recipes; distlock keeps the mutex's, the one in wide use.
//!   Likewise Curator's `InterProcessMutex` does not see any reader (it
//!   orders a `__READ__` name by its whole text too): it can be granted
//!   while distlock's, or Curator's own, readers hold.
//!
//! # Shared locks
//!
//! [`Locker::try_lock_shared`] and [`Locker::lock_shared`] follow
//! ZooKeeper's "Shared Locks" recipe
//! (<https://zookeeper.apache.org/doc/r3.8.4/recipes.html>) in the same
//! lock path as the exclusive lock:
//!
//! - **A reader** creates an ephemeral sequential node
//!   `<lock path>/_c_<uuid>-__READ__<sequence>` (Curator's
//!   `InterProcessReadWriteLock` reader's protected name), lists the
//!   children, and holds when no writer's node has a lower sequence
//!   number. Otherwise [`Locker::try_lock_shared`] deletes its node again
//!   (contention), and [`Locker::lock_shared`] watches only the closest
//!   writer ahead of it (an `exists` watch), looking again when that one
//!   is deleted. A writer (an exclusive [`Locker::lock`]) waits for every
//!   node ahead of it, readers' included, watching the one just ahead.
//!   So a release wakes one waiter, or the readers that waited for that
//!   writer: no herd.
//! - **Order: a waiting writer holds later readers back**
//!   ([`Capabilities::writer_priority`]). Readers and writers queue in
//!   sequence order, and a reader waits for every writer queued before it,
//!   *waiting or holding*. So while a writer waits for readers, a new
//!   reader's `try_lock_shared` is contention and its `lock_shared` waits
//!   until that writer has held and released the lock: readers cannot
//!   starve a writer, as on etcd and Postgres (not on memory, file or
//!   Redis). A writer waiting behind several readers watches the newest
//!   of them, then looks again, so it may wake once per reader.
//! - **Fencing token**: the czxid of the queue's first contender when the
//!   reader's turn came: its own node's when it is first, else the oldest
//!   reader's ahead of it (one `exists` more), the rule etcd's readers
//!   follow with revisions. Every writer granted before the reader's turn
//!   was granted only once every older node had gone, so its czxid is
//!   below every node still queued; every writer granted after it was
//!   queued after the reader (a writer queued before it would have held it
//!   back), so its czxid is above the reader's node, which is at or above
//!   the first one. So a reader's token is above every earlier writer's
//!   and below every later writer's (the reader's own czxid would satisfy
//!   that too), and, since the first node only moves forward, tokens never
//!   decrease over all grants and readers granted while one first node
//!   stays share its token. A reader writes nothing for it.
//! - **Everything else is a lease's**: the owner token
//!   `<czxid hex>/<node name>` of the reader's own node releases and
//!   refreshes it from any process ([`Locker::unlock`] deletes the node,
//!   [`Locker::refresh`] checks its czxid and `ephemeralOwner`); it lives on
//!   the locker's session, whose watchdog fires its lost signal as a
//!   writer's; dropping the lease deletes the node; a dropped or timed-out
//!   attempt's node is deleted at once or in the background.
//! - **One locker, both modes.** A reader of a key this locker holds
//!   exclusively is contention (its writer is ahead); an exclusive
//!   [`Locker::lock`] of a key this locker holds shared waits behind its
//!   own reader until that reader is released (or the timeout).
//!
//! # Inspection
//!
//! - **The record** is the holder node's data: host, pid, label, grant
//!   time and ttl ([`Config::holder_record`] off: empty). [`Locker::inspect`]
//!   reads the first contender: its czxid is the fencing token, `session`
//!   is `session 0x…` (its `ephemeralOwner`, as `cons` shows it), `granted`
//!   is the node's creation time on the **server's** clock, and `ttl_left`
//!   is `None` (nothing expires while the session lives). A node written
//!   by kazoo or Curator is held by an unknown holder (its data, if text,
//!   in `value`), never free.
//! - **Held shared**: a first contender that is a reader (distlock's,
//!   Curator's or kazoo's) means the lock is held by every reader ahead of
//!   the first writer, reported with
//!   [`HeldLock::shared`](inspect_api::HeldLock::shared) set and the oldest
//!   reader's record, session and czxid as `fencing_token` (the token a
//!   reader granted now gets). [`Locker::list`] reports it so too.
//! - [`Locker::list`] lists the children of the lock paths' parent whose
//!   keys start with the prefix (marks are skipped), and inspects each.
//! - [`Locker::force_release`] with [`ForceRelease::Lock`](crate::inspect::ForceRelease::Lock)
//!   deletes the holder's node (by name, so a newer holder's node is never
//!   deleted), which wakes the next waiter; a lock held shared loses every
//!   holding reader's node. The evicted holder learns it at its next
//!   refresh. [`ForceRelease::TerminateSession`](crate::inspect::ForceRelease::TerminateSession)
//!   is [`Error::Unsupported`]: a client cannot end another client's
//!   session without its password.
//! - **Marks** ([`Locker::advance_mark`]): a persistent node
//!   `<key_prefix><escaped name>%mark` (a `%` followed by a letter never
//!   comes out of a key's escaping), its data raised by a `setData` with
//!   the version read (compare-and-set).
//!
//! # What it does not guarantee
//!
//! - **A lock without fencing cannot guarantee mutual exclusion.** A holder
//!   paused (GC, SIGSTOP) or partitioned past its session timeout keeps
//!   running while the ensemble expires its session and grants the lock to
//!   the next contender; its lost signal fires only when it runs again.
//!   The fencing token (the czxid) is the remedy: pass it to the protected
//!   resource and have it reject writes with a smaller one.
//! - **The give-up bound assumes the server's clock runs no faster than
//!   the holder's by more than the drift margin.** In an ensemble, a
//!   follower reports the sessions it heard from to the leader (which
//!   expires them) about every half tick; the drift margin (1 % + 100 ms)
//!   is meant to cover that with ticks of 2 s and less.
//! - **Nested readers deadlock behind a writer**: with writer priority, a
//!   reader that asks for the key again while holding it waits behind a
//!   writer queued meanwhile, which waits for the first read. Do not nest
//!   readers of one key.
//! - **TLS** is not supported yet (see [`Config::tls`]).
//! - **A create retried after a connection loss** can, in a rare race (the
//!   lost create is applied by the old server after the new one was
//!   synced and listed), leave a second node of the attempt: it lives until
//!   the session ends, and a waiter behind it waits until its timeout.
//!   Curator's protected mode has the same window.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::inspect as inspect_api;
use crate::wait::{lock_in_queue, try_in_queue};
#[cfg(doc)]
use crate::DEADLINE_GRACE;
use crate::{validate, Capabilities, Error, Lease, Locker, MarkAdvance, RefreshRequest, Result};

mod acquire;
mod client;
mod config;
mod errors;
mod inspect;
mod marks;
mod recipe;
mod refresh;
mod session;

pub use config::{
    Config, Password, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_PORT,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_SESSIONS, DEFAULT_SESSION_TIMEOUT, ENV_PREFIX,
};

use acquire::{delete_in_background, Target};
use recipe::{Kind, Token};
use session::{Registry, Session};

const BACKEND: &str = "zookeeper";

/// The ZooKeeper backend. Cheap to clone; clones share the sessions and
/// the registry of held locks.
///
/// Build it with [`ZooKeeperLocker::from_config`] or
/// [`ZooKeeperLocker::from_url`]; [`crate::connect`] does the latter for
/// `zookeeper://` URLs. See the [module docs](self) for what it guarantees
/// and what it does not.
#[derive(Clone)]
pub struct ZooKeeperLocker {
    inner: Arc<Inner>,
}

struct Inner {
    /// The `Arc` every lease of this locker and its clones shares.
    leases: crate::SharedLocker,
    /// zookeeper-client's connect string (`h1:p1,h2:p2[/chroot]`).
    connect: String,
    /// `user:password` for the `digest` scheme.
    auth: Option<String>,
    /// The ensemble, without the password, for messages.
    ensemble: String,
    chroot: Option<String>,
    session_timeout: Duration,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// Prepended to every escaped key.
    prefix: String,
    /// The parent of every lock path (the prefix up to its last `/`; empty
    /// for the root).
    parent: String,
    /// The sessions the locks live on ([`Config::sessions`] of them), a
    /// key's always on the same one; each opened when first needed and
    /// replaced when it ends.
    sessions: Vec<tokio::sync::Mutex<Option<Arc<Session>>>>,
    /// A session no key's locks live on yet (opened to check the ensemble
    /// when the locker was built, or for a listing): the next slot to need
    /// one takes it.
    spare: tokio::sync::Mutex<Option<Arc<Session>>>,
    registry: Arc<Registry>,
    /// Grants write their holder record as their node's data.
    holder_record: bool,
    /// The ensemble answered a multi read `Unimplemented` (ZooKeeper before
    /// 3.6): refreshes are single `exists` from then on.
    no_multi_read: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for ZooKeeperLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperLocker")
            .field("ensemble", &self.inner.ensemble)
            .field("key_prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl ZooKeeperLocker {
    /// The lock path of `key` (relative to the chroot, if any): the path to
    /// give Curator's `InterProcessMutex` or kazoo's `Lock` to share the
    /// lock.
    ///
    /// ```no_run
    /// # async fn demo(locker: distlock::zookeeper::ZooKeeperLocker) {
    /// assert_eq!(locker.backend_key("reports/daily"), "/distlock/locks/reports%2Fdaily");
    /// # }
    /// ```
    pub fn backend_key(&self, key: &str) -> String {
        format!("{}{}", self.inner.prefix, recipe::escape(key))
    }

    /// The prefix of every lock path this locker uses.
    pub fn key_prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The bound on [`Locker::try_lock`] and [`Locker::try_lock_shared`]:
    /// opening a session (when the last one ended) and four requests
    /// (creating the lock path, the create, the listing, and deleting the
    /// node again on contention, or, for a reader granted behind readers,
    /// reading the first one's czxid). 10 s with the default timeouts.
    pub fn operation_bound(&self) -> Duration {
        self.inner
            .connect_timeout
            .saturating_add(self.inner.request_timeout.saturating_mul(4))
    }

    /// The contender node a refresh or unlock of `key` by `owner` names.
    fn node_of(&self, key: &str, token: &Token) -> String {
        format!("{}/{}", self.backend_key(key), token.node)
    }

    /// A refresh's answer once `held` says whether the node still holds:
    /// a lease found gone is forgotten and its lost signal fired.
    fn refreshed(&self, key: &str, owner: &str, held: Result<bool>) -> Result<()> {
        let held = held?;
        if !held {
            if let Some(gone) = self.inner.registry.take(owner) {
                gone.lost.notify(crate::LostReason::NotHeld);
            }
        }
        Error::unless_held(key, held)
    }
}

#[async_trait]
impl Locker for ZooKeeperLocker {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Everything but expiry and release notifications (waiters are woken
    /// by watches on the node ahead, not by a stream of releases); shared
    /// locks with writer priority (readers and writers queue in sequence
    /// order: see [shared locks](self#shared-locks)).
    fn capabilities(&self) -> Capabilities {
        Capabilities::SESSION_QUEUE
    }

    /// One attempt at a shared (reader) lock by ZooKeeper's "Shared Locks"
    /// recipe: create a reader's node in `key`'s queue and list the queue;
    /// with a writer ahead (holding or *waiting*: see
    /// [shared locks](self#shared-locks)), delete the node again and
    /// report contention. Bounded by [`ZooKeeperLocker::operation_bound`]
    /// (a reader behind readers reads the first one's czxid instead of
    /// deleting its node: four requests still).
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Locker::try_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a node the attempt may have created is deleted in the
    /// background (see the [module docs](self)).
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        try_in_queue(self, key, ttl, Kind::Read).await
    }

    /// Waits in `key`'s queue for a shared (reader) lock, watching only the
    /// closest writer ahead (woken by its deletion, then looking again),
    /// bounded by `timeout` + [`DEADLINE_GRACE`]. Readers never wait for
    /// readers; they do wait for writers queued before them.
    ///
    /// # Errors
    ///
    /// As [`lock`](Locker::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the waiter's node is deleted in the background.
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        lock_in_queue(self, key, ttl, timeout, Kind::Read).await
    }

    fn backend_key(&self, key: &str) -> String {
        ZooKeeperLocker::backend_key(self, key)
    }

    /// One attempt, bounded by [`ZooKeeperLocker::operation_bound`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a node the attempt may have created is deleted in the
    /// background (see the [module docs](self)).
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        try_in_queue(self, key, ttl, Kind::Write).await
    }

    /// Waits in the lock's queue (woken by the deletion of the contender
    /// just ahead, in FIFO order), bounded by `timeout` + [`DEADLINE_GRACE`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the waiter's node is deleted in the background.
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        lock_in_queue(self, key, ttl, timeout, Kind::Write).await
    }

    /// Deletes `owner`'s node of `key` (one request). A delete that fails
    /// (no server answers) is retried in the background until a server
    /// answers or the session ends.
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        validate::key(key)?;
        let Some(token) = Token::parse(owner) else {
            return Err(Error::not_held(key));
        };
        let held = self.inner.registry.take(owner);
        let session = match &held {
            Some(held) if !held.session.is_closed() => held.session.clone(),
            // Its session ended: so did its node.
            Some(_) => return Err(Error::not_held(key)),
            None => self.inner.session(key).await?,
        };
        let Some(client) = session.client() else {
            return Err(Error::not_held(key));
        };
        let node = self.node_of(key, &token);
        let error = match self.inner.call(client.delete(&node, None)).await {
            Some(Err(zookeeper_client::Error::NoNode)) => return Err(Error::not_held(key)),
            answer => match self.inner.answered("release", true, answer) {
                Ok(()) => return Ok(()),
                Err(error) => error,
            },
        };
        // Keep deleting in the background, so a lock whose session stays
        // alive is not kept for ever.
        let (path, name) = node.rsplit_once('/').unwrap_or(("", &node));
        let target = Target {
            path: path.to_owned(),
            prefix: name.to_owned(),
            node: Some(name.to_owned()),
        };
        delete_in_background(client, session, target, "a failed release's");
        Err(error)
    }

    /// One `exists` of the holder's node: its czxid and `ephemeralOwner`
    /// must match (see the [module docs](self)). The ttl is only validated.
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        validate::acquire(key, ttl)?;
        let held = self.still_held(key, owner).await;
        self.refreshed(key, owner, held)
    }

    /// The same checks as [`refresh`](Locker::refresh), as multi reads: one
    /// request per 1,000 leases (fewer per request when their paths are
    /// long), so a keepalive batch is one request (see `refresh.rs`). A
    /// multi read that fails is that error for each of its leases.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let held = self.held_many(requests).await;
        requests
            .iter()
            .zip(held)
            .map(|(request, held)| self.refreshed(request.key, request.owner, held))
            .collect()
    }

    /// Deletes `key`'s lock path if it has no contender (fencing tokens are
    /// czxids, which nothing resets: there is nothing else to forget);
    /// [`Error::NotAcquired`] if anyone holds or waits for `key`.
    async fn forget(&self, key: &str) -> Result<()> {
        validate::key(key)?;
        let session = self.inner.session(key).await?;
        let client = session
            .client()
            .ok_or_else(|| acquire::session_gone("forget", &session))?;
        match self
            .inner
            .call(client.delete(&self.backend_key(key), None))
            .await
        {
            Some(Ok(()) | Err(zookeeper_client::Error::NoNode)) => Ok(()),
            Some(Err(zookeeper_client::Error::NotEmpty)) => Err(Error::not_acquired(key)),
            answer => self.inner.answered("forget", true, answer),
        }
    }

    /// A persistent node per mark (`<key prefix><escaped name>%mark`),
    /// raised by `setData` with the version read (see `marks.rs`). A write
    /// whose answer is lost leaves the outcome unknown.
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        self.raise_mark(name, value).await
    }

    /// Two requests: the lock path's children, and the first contender's
    /// data and stat (see the [module docs](self#inspection)).
    async fn inspect(&self, key: &str) -> Result<Option<inspect_api::HeldLock>> {
        validate::key(key)?;
        self.inspect_key(key).await
    }

    /// The children of the lock paths' parent, then [`inspect`](Locker::inspect)
    /// of each lock under `prefix`, all pipelined.
    async fn list(&self, prefix: &str) -> Result<Vec<inspect_api::HeldLock>> {
        self.list_keys(prefix).await
    }

    /// [`ForceRelease::Lock`](inspect_api::ForceRelease::Lock) deletes the
    /// holder's node, handing the lock to the next waiter;
    /// [`ForceRelease::TerminateSession`](inspect_api::ForceRelease::TerminateSession)
    /// is [`Error::Unsupported`] (see the [module docs](self#inspection)).
    async fn force_release(
        &self,
        key: &str,
        how: inspect_api::ForceRelease,
    ) -> Result<Option<inspect_api::HeldLock>> {
        validate::key(key)?;
        self.force_release_key(key, how).await
    }
}
