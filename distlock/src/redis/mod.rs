//! Locks in Redis (feature `redis`): one server (`redis://`, `rediss://`), a
//! Redis Cluster (`redis+cluster://`, `rediss+cluster://`), or a master found
//! through Sentinel (`redis+sentinel://.../MASTER_NAME`), optionally waiting
//! for replicas to acknowledge each grant (`?min_replicas=N`).
//!
//! A lock is one key, `<prefix>{<key>}` (prefix default `lock:`), holding the
//! owner token of the holder, then its holder record (see "Inspection"
//! below), and expiring after the ttl:
//!
//! - **acquire** is one Lua script: `SET <lock key> <token…> NX PX <ttl>`
//!   and, only if that succeeded, `INCR <prefix>{<key>}:fence`, whose result
//!   is the fencing token;
//! - **release** is a compare-and-delete script: it deletes the key only if
//!   it still holds this owner's token, then publishes on
//!   `<prefix>{<key>}:released` so waiters wake at once;
//! - **refresh** is a compare-and-`PEXPIRE` script.
//!
//! The lock key, the fence key and the channel share one
//! Redis Cluster hash tag (the braces). Scripts are sent by `EVALSHA` and loaded again when the
//! server has forgotten them (`NOSCRIPT` after a restart, a failover or
//! `SCRIPT FLUSH`).
//!
//! ```no_run
//! use std::time::Duration;
//! use distlock::Locker;
//! use distlock::redis::RedisLocker;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = RedisLocker::from_url("redis://:secret@127.0.0.1:6379/0?prefix=jobs:").await?;
//! assert_eq!(locker.backend_key("nightly"), "jobs:{nightly}");
//! if let Some(lease) = locker.try_lock("nightly", Duration::from_secs(30)).await? {
//!     // ... work, passing lease.fencing_token() to what you write to ...
//!     lease.release().await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! - **ttl is enforced by Redis**: the key expires on the server's clock. A
//!   holder that crashes, hangs or is cut off keeps the lock until its ttl runs
//!   out, then the next caller gets it; nobody has to notice the crash. Work
//!   that may outlast the ttl must refresh ([`crate::Lease::keep_alive`]). The
//!   lease's [`valid_until`](crate::Lease::valid_until) is measured from
//!   *before* the acquire was sent, so the holder's view errs on the short
//!   side (clock *rate* differences between client and server are not
//!   corrected for).
//! - **Owner tokens**: 128 random bits per grant. Release and refresh act only
//!   on a matching token, so a late release cannot delete a newer holder's
//!   lock; [`Error::NotHeld`] means nothing was changed. Any process knowing
//!   the token can release ([`Capabilities::unlock_by_owner`]).
//! - **Fencing**: the per-key counter increases with every grant on this
//!   server. It is never deleted (one small key per lock name ever used).
//! - **Contention vs outage**: a held key is `Ok(None)` (contention); a server
//!   that cannot be reached or fails is [`Error::Backend`], one that does not
//!   answer within the operation bound (below) is [`Error::DeadlineExceeded`]:
//!   both outages, never contention.
//!   **An acquire whose outcome is unknown** (reply timed out, connection
//!   broken after the request was sent, the call abandoned at its bound, or
//!   its future dropped by the caller) may have succeeded: it is reported as
//!   an outage (or not at all, when dropped) and released by its owner token
//!   in the background; if that fails too, the key expires at its ttl.
//! - **Connections**: commands share one multiplexed connection that
//!   reconnects on its own (redis-rs [`ConnectionManager`], RESP3, so a
//!   dropped connection is noticed and re-established in the background even
//!   while idle). An acquire that finds the connection broken (the server
//!   restarted, the connection was reset) is tried once more on the new
//!   connection **with the same owner token**; the acquire script recognises
//!   its own token, so if the first attempt took effect the retry returns
//!   that grant and its fencing token instead of reporting contention on its
//!   own orphan. A release or refresh that finds the connection broken fails,
//!   and the next call uses the new connection. Each connection attempt is
//!   bounded by [`Config::connect_timeout`], each reply by
//!   [`Config::response_timeout`]. **Every call** (an acquire with its retry,
//!   a release, a refresh, [`RedisLocker::remaining_ttl`], connecting) **is
//!   bounded by `connect_timeout + response_timeout + 0.7 s`** (one
//!   connection attempt, one reply and the pauses of one reconnect cycle;
//!   2.2 s by default; [`RedisLocker::operation_bound`]): past it the call
//!   is abandoned with [`Error::DeadlineExceeded`]. Without that bound a call
//!   against a server that accepts connections but never answers waited for
//!   every reconnect attempt, twice for an acquire, several seconds. A
//!   refused connection fails sooner, as [`Error::Backend`]: reconnecting is
//!   retried for about 0.35–0.7 s.
//!   Requires Redis 6 or newer (`HELLO 3`).
//! - **Cancel safety**: dropping a [`Locker::try_lock`] future is safe: an
//!   acquire already sent is released by its token in the background (see
//!   above). Dropping a release or refresh future leaves the lock as it was,
//!   or as the command left it.
//! - **Waiting**: [`Locker::lock`] polls with backoff and is woken at once by
//!   the release script's `PUBLISH`. All waiters of one locker share one
//!   subscriber connection, opened on first use (each waiter waits at most
//!   the connect timeout for it, never for another waiter's attempt). While
//!   waiters listen it is `PING`ed every response timeout; a connection that
//!   dies, or stops answering (half-open, partitioned), is closed within
//!   about twice the response timeout: waiters then poll and the next waiter
//!   reconnects. A lock freed by *expiry* publishes nothing
//!   and is found by polling. A user whose ACL forbids the channel can still
//!   lock and release (the publish is best-effort); its waiters poll. Cost:
//!   the first waiter of a key (per locker) subscribes before its first
//!   attempt, one round trip on the subscriber connection, and the last one
//!   to leave unsubscribes; [`Locker::try_lock`] never subscribes.
//! - **Keys**: `<prefix>{<key>}`; see [`RedisLocker::backend_key`]. On a
//!   cluster, a key starting with `}` has an empty hash tag, which Redis
//!   ignores (then lock and fence key may land in different slots and the
//!   scripts fail with `CROSSSLOT`: an error, never a wrong answer). A key
//!   containing `{` or `}` is hashed by Redis' first-brace rule, still one
//!   tag for all of the lock's keys.
//! - **Marks** ([`Locker::advance_mark`]): `<prefix>{<name>}:mark`, without
//!   expiry, raised by one script. **A mark is as durable as the server's
//!   persistence**: without `appendonly yes` a restart forgets it (an RDB
//!   snapshot rolls it back), and the scheduler re-runs ticks it had
//!   finished; with `appendfsync everysec` a crash loses at most the last
//!   second's marks. A failover can lose the last mark unless
//!   [`Config::min_replicas`] is set: then every mark that was advanced is
//!   followed by `WAIT`, and too few acknowledgements fail it as an outage
//!   whose outcome is unknown (the mark stays advanced on the master; the
//!   scheduler then does not run that tick). See "What the server must be
//!   configured with".
//!
//! # Deployments
//!
//! - **One server** (`redis://host:port`): a redis-rs `ConnectionManager`.
//! - **Redis Cluster** (`redis+cluster://h1:p1,h2:p2,...`, or
//!   [`Config::cluster`] with the seed nodes as [`Config::addresses`]): a
//!   redis-rs cluster-async connection learns the slot map from any seed,
//!   sends each script to the master of its key's slot (every script's keys
//!   share the lock's hash tag, so one slot), and follows `MOVED` and `ASK`,
//!   so a slot migration while a lock is held is invisible to its holder: its
//!   refresh and release reach the key on its new node. Release
//!   notifications use **sharded pub/sub** (Redis 7+): the release script
//!   `SPUBLISH`es on the key's channel (same slot), and waiters `SSUBSCRIBE`
//!   through a RESP3 cluster connection of the locker's own, which
//!   redis-rs routes to the slot's node and resubscribes after reconnects;
//!   when a slot migrates, the old node drops the subscription and the
//!   locker subscribes again on the new one. On a Redis 6 cluster (no
//!   sharded pub/sub) releases still work and waiters poll. A master that
//!   dies without a replica to take over makes every operation on its slots
//!   fail ([`Error::Backend`] or [`Error::DeadlineExceeded`]: an outage, never
//!   contention), while other masters' locks work if the cluster runs with
//!   `cluster-require-full-coverage no` (otherwise the whole cluster refuses
//!   commands until the slots are served again). Only database 0 exists.
//! - **Sentinel** (`redis+sentinel://s1:26379,s2:26379/MASTER_NAME`, or
//!   [`Config::sentinel_master`] with the sentinels as addresses): the locker
//!   asks the sentinels (redis-rs' `Sentinel`, which checks the named server
//!   reports itself master) and keeps one reconnecting connection to that
//!   master. When the server answers `READONLY` (demoted by a failover) or
//!   cannot be reached, the locker asks the sentinels again; a command
//!   refused that way is sent once more to the new master, so callers see at
//!   most the failures of the switch itself (the acquire retry on a dropped
//!   connection applies as on one server). The locker is not rebuilt. A lease
//!   whose grant the new master lacks is lost at its next refresh
//!   ([`Error::NotHeld`]; with [`crate::Lease::keep_alive`] its lost signal
//!   fires). The subscriber connects to the master named when it opens; a
//!   failover closes it (Sentinel kills the reconfigured servers' clients),
//!   waiters poll, and the next waiter connects to the new master. The
//!   locker learns of a failover from its own commands, not from Sentinel's
//!   `+switch-master` events: until Sentinel reconfigures a demoted master
//!   that is still alive (Sentinel does so when it next sees it, within
//!   seconds), this locker may keep writing to it, like any client that
//!   keeps its connection.
//!
//! # Inspection
//!
//! The acquire script records who holds the lock in the lock key's own
//! value, after the owner token: the ttl, the grant time, and the
//! [`crate::inspect::Holder`] (pid, host, label, read on the caller's task),
//! one per line, the label last (`owner \n ttl_ms \n granted_ms \n pid \n
//! host \n label`). It costs no round trip, no key and no command: the
//! client builds the value and the grant's `SET NX PX` writes it. The grant
//! time is the server's clock without a `TIME` call at acquire: the `PX` the
//! grant armed fixes it (expiry minus ttl), and the first re-arming of the
//! expiry (a refresh) writes it into the value before moving the expiry; a
//! refresh with a new ttl rewrites the ttl line. The fencing token is the
//! fence counter's value while the grant holds the lock.
//! [`Config::record_holder`] (`?holder=false`) turns it off: the value is
//! then the bare owner token. Release and refresh compare the token with
//! the value's first line, so tools that expect the value to be exactly the
//! token (a `GET` in a script of yours) must take its first line. Cost: the
//! server runs about 72.5k instructions per acquire+release cycle with the
//! record (a 130-byte label) and 65.2k without (`callgrind` on
//! `redis-server` 7.0, 20,000 cycles), about 23 more per byte of label:
//! Redis's Lua hashes every byte of every string it makes, and the record
//! becomes one when the acquire's argument arrives and again when the
//! release reads the value. Where many concurrent callers keep the server
//! busy that costs cycles/s in about that proportion; `distlock bench` with
//! and without `?holder=false` measures it on your machine.
//!
//! - [`Locker::inspect`] is one read-only script: the lock key (present:
//!   held), its `PTTL` (`ttl_left`) and the record in its value. It
//!   reports every [`HeldLock`] field but `session`
//!   (a Redis lock belongs to no connection), the grant time as
//!   [`Clock::Server`](crate::inspect::Clock::Server). A key held by a
//!   client that left no record (redis-py's `Lock`, which is a plain `SET
//!   name token NX PX`; a locker with `holder=false`; a distlock older than
//!   records) is **held by an unknown holder**: `holder`, `granted`, `ttl`
//!   and `fencing_token` are `None`, `ttl_left` is its `PTTL` (`None` if the
//!   key has no expiry).
//! - [`Locker::list`] runs `SCAN` with `MATCH <prefix>{<key prefix>*}`
//!   (glob characters escaped) over the whole key space: on a cluster, on
//!   every master (one `SCAN` cursor per master, from `CLUSTER SLOTS`), then
//!   inspects each lock found (32 at a time on the multiplexed connection),
//!   sorted by key. `SCAN` visits every key that exists for the whole
//!   listing; one taken or freed meanwhile may or may not be in it, and a
//!   slot that migrates during the listing may be missed. Each round trip
//!   is bounded by [`RedisLocker::operation_bound`]; the listing as a whole
//!   grows with the key space (`SCAN` walks every key of the database, a
//!   cost on the server for large databases: it is for operators, not for
//!   hot paths).
//! - [`Locker::force_release`] with [`ForceRelease::Lock`] is one script
//!   that deletes the lock and its record whoever holds it, publishes the
//!   release (waiters wake at once) and returns what it deleted, logged at
//!   `warn` with the operator. The evicted holder is not told: its next
//!   refresh gets [`Error::NotHeld`] (its lost signal fires, within ttl/3
//!   under a keepalive); until then it may still be working, and only its
//!   fencing token makes its late writes rejectable. Its release later
//!   frees nothing (the token does not match).
//!   [`ForceRelease::TerminateSession`] is [`Error::Unsupported`]: a Redis
//!   lock outlives its client's connection.
//!
//! # Replica acknowledgement
//!
//! With `?min_replicas=N&replica_timeout=T` ([`Config::min_replicas`],
//! [`Config::replica_timeout`], default 100 ms) every grant is followed by
//! `WAIT N T` on the node that took it (on a cluster, the master of the
//! key's slot). Fewer than `N` acknowledgements within `T` fail the acquire:
//! the lock is released at once, by its token, and the error is
//! [`Error::Backend`] (an outage, so the circuit breaker counts it), never
//! contention. Contention itself does not wait. Cost: one more round trip
//! plus the replicas' acknowledgement per grant (see the throughput bench).
//! Every acquire is then bounded by the operation bound plus twice the
//! response timeout (the `WAIT` and the release).
//!
//! A mark ([`Locker::advance_mark`]) that was advanced is followed by the
//! same `WAIT` (one that found the mark already there writes nothing and
//! does not wait, nor does a first write of 0 or less, which records no
//! progress: the cron scheduler's peek); fewer than `N` acknowledgements fail it as
//! [`Error::Backend`] with an unknown outcome: the mark stays advanced on
//! the master (a mark never goes back), and the scheduler treats the tick
//! as taken and does not run it. Every mark is then bounded by twice the
//! operation bound.
//!
//! This narrows the failover window the section below describes; **it does
//! not close it**: `WAIT` is not a transaction (a grant a replica has not
//! acknowledged is still visible on the master, to everybody, until it is
//! released), a replica that acknowledged can still fall behind or be
//! skipped by the failover, and Redis does not promise that a failover
//! promotes a replica that acknowledged. The connection is multiplexed: the
//! `WAIT` covers every write sent on it before, so it can only wait longer
//! than needed; but if the connection is replaced between the grant and the
//! `WAIT` (it broke and reconnected), the `WAIT` runs on a connection with
//! no writes and vouches for nothing. Where two holders would be a
//! correctness failure, use the fencing token, or a backend with
//! consensus.
//!
//! # ACL: the least a lock user needs
//!
//! The backend sends `EVALSHA` (every operation is a script), `SCRIPT LOAD`
//! (after the server forgot a script), `PING` (the subscriber's heartbeat;
//! Redlock's check of its nodes), `SUBSCRIBE` and `UNSUBSCRIBE` (waiters),
//! `PTTL` ([`RedisLocker::remaining_ttl`]), `SELECT` when `db` is not 0, and
//! `HELLO`/`AUTH` (allowed to every user), `SCAN` ([`Locker::list`]); its
//! scripts call `SET`, `GET`, `INCR`, `PEXPIRE`, `DEL`, `EXISTS`,
//! `PUBLISH`, `PTTL` and, for the holder record's grant time (at a
//! refresh and at inspection, never at acquire), `TIME`, which
//! Redis checks against the user as well. With the default prefix
//! `lock:`:
//!
//! ```text
//! ACL SETUSER lockuser on >PASSWORD resetkeys ~lock:* resetchannels &lock:* -@all
//!     +evalsha +script|load +set +get +incr +pexpire +del +exists +publish
//!     +ping +subscribe +unsubscribe +pttl +time +scan +info
//! ```
//!
//! `+info` lets the locker read the server's eviction and persistence
//! settings when it is built (see "What the server must be configured
//! with"); it also tries `CONFIG GET`, which this user need not have (and
//! should not: `CONFIG GET` can read the server's passwords).
//!
//! (add `+select` for a database other than 0; [`ACL_RULES`] holds the
//! command part). A user missing one of these gets [`Error::Backend`]
//! saying "permission denied" and quoting the server, never contention; an
//! acquire refused half-way through its script is released by its owner
//! token. Without `+subscribe` or the channels (`&lock:*`) waiters poll,
//! and without `+publish` releases still work (waiters then poll).
//!
//! The other deployments send more (read from redis-rs 1.8's sources; the
//! standalone list above is what `MONITOR` showed):
//!
//! - **Redis Cluster**: add [`ACL_CLUSTER_RULES`] (`+cluster|slots`, the
//!   slot map redis-rs loads from the seeds and refreshes after `MOVED`;
//!   `+spublish`, which the release script calls instead of `PUBLISH`;
//!   `+ssubscribe +sunsubscribe` for waiters). The sharded channels are
//!   covered by the same `&lock:*` pattern. No `READONLY` is sent (the
//!   locker never reads from replicas), so none is needed.
//! - **Sentinel**: on the master add `+role` (redis-rs checks that the server
//!   the sentinels name reports itself master; `+info` for its fallback,
//!   `INFO REPLICATION`). On the sentinels, their user
//!   ([`Config::sentinel_username`]) needs `+sentinel|masters` (how the
//!   master is found) and `+ping`.
//! - **Replica acknowledgement** ([`Config::min_replicas`]): add `+wait`.
//!
//! # What the server must be configured with
//!
//! When it is built, the locker reads from each master it writes to (the
//! one server, the master the sentinels name, every master of a cluster,
//! each Redlock node that answers) `maxmemory`, `maxmemory-policy`,
//! `appendonly`, `appendfsync` and `save` with one `CONFIG GET`, and `INFO`
//! at the same time (replicas attached, and the fallback where `CONFIG` is
//! refused by an ACL or renamed, as on managed Redis: `INFO` reports
//! `maxmemory`, `maxmemory_policy` and `aof_enabled`).
//! [`RedisLocker::server_facts`] returns what was read.
//!
//! - **Eviction: `maxmemory-policy noeviction`, or no `maxmemory`.** A
//!   server with `maxmemory` set and any other policy evicts keys when its
//!   memory fills: `volatile-*` (`volatile-lru` is the default of the
//!   ElastiCache, Azure Cache and Memorystore parameter groups) evicts keys
//!   with a ttl first, so a held lock's key can vanish and the next `SET NX`
//!   succeeds (two holders, neither told); `allkeys-*` can also evict the
//!   fence counter (tokens restart at 1) and cron marks (finished ticks run
//!   again). Such a server is **refused** ([`Error::InvalidInput`], `what`
//!   `"server configuration"`, naming the setting, its value and the fix)
//!   unless [`Config::allow_eviction`] (`?allow_eviction=true`) accepts the
//!   risk, which is then logged at `warn`. Under `noeviction` a full server
//!   refuses writes (`OOM`): acquires fail as outages, nothing is lost.
//! - **Persistence: `appendonly yes`** for marks and fence counters to
//!   survive a restart (`appendfsync everysec` loses at most about 1 s of
//!   writes, `always` none). Without it (RDB snapshots only, or nothing) a
//!   restart rolls back to the last snapshot or to nothing: locks are
//!   forgotten, fencing tokens restart where the snapshot left them (at 1
//!   with no snapshot), and the cron scheduler re-runs ticks it had
//!   finished. This is **not refused by default** (many deployments, and
//!   the Redis of a developer's machine, run with `--save "" --appendonly
//!   no`, for locks whose loss at a restart they accept):
//!   [`Locker::durability_warnings`] says so, the first mark write logs it
//!   at `warn` (unless asked already), and `distlock cron` prints it at
//!   start. [`Config::require_appendonly`] (`?require_appendonly=true`)
//!   refuses such a server instead.
//! - **Replicas: [`Config::min_replicas`]**, or a failover can lose the last
//!   grants and marks (replication is asynchronous; see "Replica
//!   acknowledgement"). A master with replicas attached and `min_replicas`
//!   0 is one of the durability warnings.
//!
//! Settings that cannot be read (both `CONFIG GET` and `INFO` refused) are
//! logged at `warn` once, when the locker is built, and the locker works
//! unchecked (under `require_appendonly` it is refused: nothing proves the
//! setting). The settings are read **once**: a `CONFIG SET` later, or a
//! failover to a differently configured replica (a Sentinel's new master,
//! a cluster's promoted replica), is not noticed; configure replicas like
//! their masters. Redlock nodes that do not answer when the Redlock locker
//! is built are not read.
//!
//! # What it does not guarantee
//!
//! - **Not Redlock.** Exclusivity rests on one key on one master (on a
//!   cluster, the master of the key's slot). For a quorum across independent
//!   nodes see the `redlock` module (feature `redlock`).
//! - **Failover can hand the lock to a second holder.** Redis replicates
//!   asynchronously: a primary can acknowledge the `SET`, then fail before a
//!   replica has it; the promoted replica has no lock and grants it again.
//!   Neither holder is told. Where two holders would corrupt data, pass the
//!   fencing token to the protected resource and have it reject stale tokens
//!   — though a promoted replica may also have missed the latest `INCR`s.
//! - **A restart without persistence forgets every lock and can reset fence
//!   counters**, so tokens can repeat after it, and forgets cron marks, so
//!   finished ticks can run again. Run Redis with `appendonly yes` (ideally
//!   `appendfsync always` where fencing matters) to keep them across
//!   restarts (see "What the server must be configured with").
//! - **Releases are not retried.** A release that times out is reported as an
//!   error; the key then expires at its ttl. (Retrying a release by token is
//!   safe; the caller may.)
//!
//! [`ConnectionManager`]: redis::aio::ConnectionManager

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelNodeConnectionInfo;
use redis::{ProtocolVersion, TlsMode};
use tokio::time::Instant;

use crate::deadline::bounded;
use crate::pending::PendingAcquire;
use crate::util::{decode_mark, encode_mark};
use crate::{
    new_owner_token, validate, Capabilities, Error, Lease, LeaseParts, Locker, MarkAdvance,
    RefreshRequest, ReleaseWatch, Result,
};

mod config;
mod connection;
mod errors;
mod inspect;
mod keys;
mod releases;
mod scripts;
mod server;

pub use server::{FactsSource, ServerFacts};

pub use config::{
    Config, Password, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_PORT,
    DEFAULT_REPLICA_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_SENTINEL_PORT, ENV_PREFIX,
};

#[cfg(feature = "redlock")]
pub(crate) use inspect::LockView;

use config::Deployment;
use connection::{ClusterSettings, Connection, SentinelConnection};
use errors::{Outcome, Target};
use keys::KeySpace;
use releases::{ReleaseHub, SubscriberSource};
use scripts::{
    ACQUIRE_SCRIPT, ADVANCE_MARK_SCRIPT, FORGET_SCRIPT, REFRESH_MANY_SCRIPT, REFRESH_SCRIPT,
    RELEASE_SCRIPT,
};

use crate::inspect::{current_label, host_name, ForceRelease, HeldLock};

const BACKEND: &str = "redis";

/// Why one script of a [`Locker::refresh_many`] batch failed: every key it
/// carried gets this error.
enum GroupFailure {
    Redis(redis::RedisError),
    Deadline(Duration),
}

impl GroupFailure {
    fn to_error(&self, locker: &RedisLocker) -> Error {
        match self {
            GroupFailure::Redis(error) => {
                locker.inner.target.error("refresh", error.clone(), false)
            }
            GroupFailure::Deadline(after) => Error::DeadlineExceeded {
                backend: BACKEND,
                operation: "refresh",
                after: *after,
            },
        }
    }
}

/// The commands a lock user needs (inspection and listing included), as `ACL SETUSER` rules (see the module
/// docs, "ACL"); add the key and channel patterns of your prefix
/// (`~lock:* &lock:*`) and `+select` for a database other than 0.
///
/// ```
/// assert!(distlock::redis::ACL_RULES.starts_with("-@all +evalsha"));
/// ```
pub const ACL_RULES: &str = "-@all +evalsha +script|load +set +get +incr +pexpire +del +exists \
     +publish +ping +subscribe +unsubscribe +pttl +time +scan +info";

/// What a lock user on a Redis Cluster needs on top of [`ACL_RULES`] (see
/// the module docs, "ACL"): the slot map, sharded publish from the release
/// script, and sharded subscriptions for waiters.
///
/// ```
/// let rules = format!("{} {}", distlock::redis::ACL_RULES, distlock::redis::ACL_CLUSTER_RULES);
/// assert!(rules.ends_with("+cluster|slots +spublish +ssubscribe +sunsubscribe"));
/// ```
pub const ACL_CLUSTER_RULES: &str = "+cluster|slots +spublish +ssubscribe +sunsubscribe";

/// How often the connection manager retries a broken connection before the
/// waiting command fails (it retries again on the next command). With the
/// delays below, restarts shorter than about 0.35 s are bridged, and a command
/// during an outage fails within about 0.7 s plus the connect attempts, or at
/// the operation bound ([`RedisLocker::operation_bound`]), whichever comes
/// first.
const RECONNECT_RETRIES: usize = 3;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(400);
/// The longest the connection manager sleeps between the attempts of one
/// reconnect cycle: 50 + 100 + 200 ms, each up to doubled by its jitter
/// (redis-rs builds a jittered exponential backoff; see
/// `ConnectionManager::new_lazy_with_config` in redis-rs 1.x).
const RECONNECT_PAUSES: Duration = Duration::from_millis(700);

/// The Redis backend. Cheap to clone; clones share the connection.
///
/// Build it with [`RedisLocker::from_config`] from a [`Config`], or with
/// [`RedisLocker::from_url`]; [`crate::connect`] does the latter for
/// `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`,
/// `redis+sentinel://` and `rediss+sentinel://` URLs. See the [module docs](self) for what it
/// guarantees and what it does not.
#[derive(Clone)]
pub struct RedisLocker {
    inner: Arc<Inner>,
}

struct Inner {
    /// The `Arc` every lease of this locker and its clones shares.
    leases: crate::SharedLocker,
    connection: Connection,
    /// [`RedisLocker::operation_bound`]: no call takes longer.
    operation_bound: Duration,
    /// The bound of one acquire: the operation bound, plus the `WAIT` and a
    /// release when replica acknowledgement is on.
    acquire_bound: Duration,
    keys: KeySpace,
    /// Where errors say they happened.
    target: Target,
    releases: ReleaseHub,
    /// The release script's publish command: `SPUBLISH` on a cluster (sharded
    /// pub/sub, delivered by the key's shard only), `PUBLISH` elsewhere.
    publish: &'static str,
    /// `Some` when each grant must reach that many replicas (`WAIT`).
    replicas: Option<ReplicaAck>,
    /// [`Config::record_holder`].
    record_holder: bool,
    /// [`Config::allow_eviction`].
    allow_eviction: bool,
    /// [`Config::require_appendonly`].
    require_appendonly: bool,
    /// What the server said about eviction and persistence, once read
    /// ([`RedisLocker::check_server`]).
    server: OnceLock<ServerReport>,
    /// The durability warnings were logged or handed to a caller
    /// ([`Locker::durability_warnings`]): the first mark write logs them
    /// otherwise, once.
    durability_reported: AtomicBool,
}

/// What [`RedisLocker::check_server`] learnt: each master's facts, and a
/// message per master whose settings could not be read.
#[derive(Debug, Default)]
struct ServerReport {
    facts: Vec<ServerFacts>,
    unread: Vec<String>,
}

impl ServerReport {
    /// Nothing read, for `reason`.
    fn unread(reason: impl ToString) -> Self {
        ServerReport {
            facts: Vec::new(),
            unread: vec![reason.to_string()],
        }
    }
}

/// [`Config::min_replicas`] and [`Config::replica_timeout`], when set.
#[derive(Debug, Clone, Copy)]
struct ReplicaAck {
    min_replicas: u32,
    timeout: Duration,
}

impl fmt::Debug for RedisLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLocker")
            .field("endpoint", &self.inner.target.endpoint)
            .field("key_prefix", &self.inner.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl RedisLocker {
    /// Connects to the deployment `config` names (one server, a Redis
    /// Cluster's seed nodes, or sentinels and their master), failing if it
    /// cannot be reached or rejects the credentials (one attempt plus the
    /// reconnect retries, all within [`RedisLocker::operation_bound`]).
    /// Then reads each master's eviction and persistence settings (one more
    /// round trip, also bounded; see the [module docs](self), "What the
    /// server must be configured with").
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a config that names no server, several
    /// without saying they are a cluster or sentinels, or has invalid
    /// settings; also (`what` = `"server configuration"`) for a server that
    /// may evict keys (`maxmemory` set, `maxmemory-policy` other than
    /// `noeviction`) unless [`Config::allow_eviction`], and for one without
    /// `appendonly yes` under [`Config::require_appendonly`].
    /// [`Error::Backend`] if connecting fails (an authentication
    /// failure says so; for Sentinel, also when no sentinel names a reachable
    /// master); [`Error::DeadlineExceeded`] if it does not finish within the
    /// bound.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempt; nothing is left
    /// behind on the server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use distlock::redis::{Config, RedisLocker};
    ///
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let locker = RedisLocker::from_config(Config::from_env()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_config(config: Config) -> Result<Self> {
        let parts = Parts::new(&config)?;
        let (connection, subscriber, publish) = match &parts.deployment {
            Deployment::Standalone(endpoint) => {
                let (command_client, subscriber_client) = standalone_clients(&config, endpoint)?;
                let connection = bounded(BACKEND, "connect", parts.operation_bound, async {
                    ConnectionManager::new_with_config(command_client, parts.manager.clone())
                        .await
                        .map_err(|e| parts.target.error("connect", e, false))
                })
                .await?;
                (
                    Connection::Standalone(connection),
                    SubscriberSource::Node(subscriber_client),
                    "PUBLISH",
                )
            }
            Deployment::Cluster(seeds) => {
                let settings = ClusterSettings {
                    seeds: seeds
                        .iter()
                        .map(|seed| config.connection_info(seed, ProtocolVersion::RESP3))
                        .collect::<Result<_>>()?,
                    certificates: config.tls_certificates()?,
                    connect_timeout: config.connect_timeout,
                    response_timeout: config.response_timeout,
                };
                let client = settings.client(None).map_err(|e| parts.invalid(e))?;
                let connection = bounded(BACKEND, "connect", parts.operation_bound, async {
                    client
                        .get_async_connection()
                        .await
                        .map_err(|e| parts.target.error("connect", e, false))
                })
                .await?;
                (
                    Connection::Cluster(connection),
                    SubscriberSource::Cluster(settings),
                    "SPUBLISH",
                )
            }
            Deployment::Sentinel { sentinels, master } => {
                let node = |protocol| {
                    let info = SentinelNodeConnectionInfo::default()
                        .set_redis_connection_info(config.redis_settings(protocol));
                    if config.tls {
                        info.set_tls_mode(TlsMode::Secure)
                    } else {
                        info
                    }
                };
                let connection = SentinelConnection::new(
                    sentinels
                        .iter()
                        .map(|sentinel| config.sentinel_connection_info(sentinel))
                        .collect::<Result<_>>()?,
                    master.clone(),
                    config.db,
                    node(ProtocolVersion::RESP3),
                    node(ProtocolVersion::RESP2),
                    parts.manager.clone(),
                )
                .map_err(|e| parts.invalid(e))?;
                bounded(BACKEND, "connect", parts.operation_bound, async {
                    connection
                        .connect()
                        .await
                        .map_err(|e| parts.target.error("connect", e, false))
                })
                .await?;
                (
                    Connection::Sentinel(connection.clone()),
                    SubscriberSource::Sentinel(connection),
                    "PUBLISH",
                )
            }
        };
        let locker = parts.into_locker(config, connection, subscriber, publish);
        locker.check_server().await?;
        Ok(locker)
    }

    /// A locker on the one server `config` names that connects on first use
    /// (and keeps reconnecting), so it can be built while the server is
    /// down: the Redlock backend's nodes, a minority of which may be. Only a
    /// standalone server without replica acknowledgement: a Redlock node is
    /// an independent server, and Redlock's acquire does not `WAIT`.
    #[cfg(feature = "redlock")]
    pub(crate) fn from_config_lazy(config: Config) -> Result<Self> {
        let parts = Parts::new(&config)?;
        let Deployment::Standalone(endpoint) = &parts.deployment else {
            return Err(Error::invalid(
                "config",
                format!(
                    "{}: a Redlock node is one independent server, not a Redis Cluster or a \
                     master behind Sentinel",
                    parts.deployment
                ),
            ));
        };
        if config.min_replicas > 0 {
            return Err(Error::invalid(
                "config",
                format!(
                    "{endpoint}: min_replicas is {}; Redlock's nodes are independent servers \
                     and its acquire does not wait for replicas (leave it 0)",
                    config.min_replicas
                ),
            ));
        }
        let (command_client, subscriber_client) = standalone_clients(&config, endpoint)?;
        let connection =
            ConnectionManager::new_lazy_with_config(command_client, parts.manager.clone())
                .map_err(|e| parts.target.error("connect", e, false))?;
        Ok(parts.into_locker(
            config,
            Connection::Standalone(connection),
            SubscriberSource::Node(subscriber_client),
            "PUBLISH",
        ))
    }

    /// Connects to the deployment a URL names (see [`Config::from_url`] for
    /// the schemes and parameters).
    ///
    /// # Errors
    ///
    /// As [`Config::from_url`] and [`RedisLocker::from_config`].
    ///
    /// # Cancel safety
    ///
    /// As [`RedisLocker::from_config`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use distlock::redis::RedisLocker;
    ///
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let cluster = RedisLocker::from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").await?;
    /// let sentinel = RedisLocker::from_url("redis+sentinel://10.0.0.5,10.0.0.6/orders").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::from_config(Config::from_url(url)?).await
    }

    /// The Redis key that holds the lock on `key`: `<prefix>{<key>}`. Spans
    /// and operators use it to find the lock in Redis.
    ///
    /// ```no_run
    /// # async fn demo(locker: distlock::redis::RedisLocker) {
    /// assert_eq!(locker.backend_key("reports/daily"), "lock:{reports/daily}");
    /// # }
    /// ```
    pub fn backend_key(&self, key: &str) -> String {
        self.inner.keys.lock_key(key)
    }

    /// The Redis key of `key`'s fencing counter: `<prefix>{<key>}:fence`.
    pub fn fence_key(&self, key: &str) -> String {
        self.inner.keys.fence_key(key)
    }

    /// The channel `key`'s releases are published on:
    /// `<prefix>{<key>}:released`.
    pub fn release_channel(&self, key: &str) -> String {
        self.inner.keys.release_channel(key)
    }

    /// The bound on every call of this locker: `connect_timeout +
    /// response_timeout + 0.7 s` (the pauses of one reconnect cycle), 2.2 s
    /// with the default timeouts. A call still running at the bound is
    /// abandoned with [`Error::DeadlineExceeded`] (an acquire is then undone
    /// by its owner token in the background).
    pub fn operation_bound(&self) -> Duration {
        self.inner.operation_bound
    }

    /// The prefix of every key this locker writes.
    pub fn key_prefix(&self) -> &str {
        self.inner.keys.prefix()
    }

    /// What each master this locker writes to reported, when the locker
    /// was built, about eviction (`maxmemory`, `maxmemory-policy`) and
    /// persistence (`appendonly`, `appendfsync`, `save`, replicas): one
    /// entry for one server or the sentinel-managed master, one per master
    /// of a cluster. Empty where nothing could be read (`CONFIG GET` and
    /// `INFO` both refused) or not read yet (a Redlock node that did not
    /// answer when the Redlock locker was built). A snapshot: a master that
    /// a failover or `CONFIG SET` changes later is not read again (see the
    /// [module docs](self), "What the server must be configured with").
    pub fn server_facts(&self) -> &[ServerFacts] {
        self.inner
            .server
            .get()
            .map(|report| report.facts.as_slice())
            .unwrap_or_default()
    }

    /// Reads what each master reports about eviction and persistence
    /// (`CONFIG GET`, with `INFO` as the fallback), keeps it for
    /// [`server_facts`](Self::server_facts), and refuses a server that may
    /// evict our keys unless [`Config::allow_eviction`] (then it warns), or
    /// one without `appendonly yes` under [`Config::require_appendonly`]. A
    /// master whose settings cannot be read is logged at `warn` (once, here)
    /// and accepted, unless `require_appendonly` asks for proof.
    pub(crate) async fn check_server(&self) -> Result<()> {
        let mut connection = self.connection();
        let nodes = match tokio::time::timeout(self.inner.operation_bound, connection.nodes()).await
        {
            Ok(Ok(nodes)) => nodes,
            Ok(Err(error)) => return self.keep_server_report(ServerReport::unread(error)),
            Err(_) => {
                let reason = format!("no answer within {:?}", self.inner.operation_bound);
                return self.keep_server_report(ServerReport::unread(reason));
            }
        };
        let reads = futures_util::future::join_all(nodes.into_iter().map(|(address, node)| {
            let connection = &connection;
            async move {
                let name = address
                    .clone()
                    .unwrap_or_else(|| self.inner.target.endpoint.clone());
                let read = ServerFacts::read(connection, &node, name);
                let failure = match tokio::time::timeout(self.inner.operation_bound, read).await {
                    Ok(Ok(facts)) => return Ok(facts),
                    Ok(Err(reason)) => reason,
                    Err(_) => format!("no answer within {:?}", self.inner.operation_bound),
                };
                // A cluster's master is named; the one server is named by
                // the message these reasons go into.
                Err(match address {
                    Some(address) => format!("{address}: {failure}"),
                    None => failure,
                })
            }
        }))
        .await;
        let mut report = ServerReport::default();
        for read in reads {
            match read {
                Ok(facts) => report.facts.push(facts),
                Err(reason) => report.unread.push(reason),
            }
        }
        for facts in &report.facts {
            if let Some(risk) = facts.eviction_risk() {
                if !self.inner.allow_eviction {
                    return Err(Error::invalid(
                        "server configuration",
                        format!(
                            "{risk}; or, accepting that risk, set allow_eviction=true (URL \
                             parameter; Config::allow_eviction)"
                        ),
                    ));
                }
                tracing::warn!(component = "distlock", backend = BACKEND, node = %facts.node,
                    "{risk} (accepted: allow_eviction is set)");
            }
            if self.inner.require_appendonly && facts.appendonly != Some(true) {
                return Err(Error::invalid(
                    "server configuration",
                    format!(
                        "{}: appendonly is {} and require_appendonly is set: a restart of this \
                         server would forget which cron ticks ran and reset fencing tokens to \
                         1. Set `CONFIG SET appendonly yes` (and in its config file), or drop \
                         require_appendonly",
                        facts.node,
                        match facts.appendonly {
                            Some(_) => "no",
                            None => "not reported",
                        }
                    ),
                ));
            }
        }
        self.keep_server_report(report)
    }

    /// Keeps `report` for [`server_facts`](Self::server_facts) and
    /// [`Locker::durability_warnings`]; settings that could not be read are
    /// logged at `warn` (or refused under [`Config::require_appendonly`]),
    /// and their message kept as one durability warning.
    fn keep_server_report(&self, mut report: ServerReport) -> Result<()> {
        if !report.unread.is_empty() {
            let reasons = report.unread.join("; ");
            if self.inner.require_appendonly {
                return Err(Error::invalid(
                    "server configuration",
                    format!(
                        "{}: require_appendonly is set, but the server's settings cannot be \
                         read ({reasons}); allow this user `INFO` (or `CONFIG GET`), or drop \
                         require_appendonly",
                        self.inner.target.endpoint
                    ),
                ));
            }
            let message = format!(
                "{}: cannot read the server's maxmemory-policy and appendonly ({reasons}), so \
                 neither eviction (an evicted lock has two holders) nor persistence (a restart \
                 forgets cron marks and resets fencing tokens to 1) was checked; make sure it \
                 runs with maxmemory-policy noeviction and appendonly yes, and allow this user \
                 `INFO`",
                self.inner.target.endpoint
            );
            tracing::warn!(component = "distlock", backend = BACKEND, "{message}");
            report.unread = vec![message];
        }
        // Set once: a locker is checked when it is built.
        let _ = self.inner.server.set(report);
        Ok(())
    }

    /// What makes this locker's marks and fence counters less durable than
    /// they look (see [`Locker::durability_warnings`]).
    fn durability_report(&self) -> Vec<String> {
        let Some(report) = self.inner.server.get() else {
            return Vec::new();
        };
        let min_replicas = self.inner.replicas.map_or(0, |ack| ack.min_replicas);
        report
            .facts
            .iter()
            .flat_map(|facts| facts.durability_warnings(min_replicas))
            .chain(report.unread.iter().cloned())
            .collect()
    }

    /// How long `key`'s lock has left on the server's clock (`PTTL`), or
    /// `None` if it is not held. A key without expiry (only a foreign client
    /// can set one) reports [`Duration::MAX`]. Bounded like every call (see
    /// the module docs' "Connections"); read-only, so safe to cancel.
    pub async fn remaining_ttl(&self, key: &str) -> Result<Option<Duration>> {
        validate::key(key)?;
        let millis: i64 = self
            .bounded("remaining_ttl", async {
                redis::cmd("PTTL")
                    .arg(self.backend_key(key))
                    .query_async(&mut self.connection())
                    .await
            })
            .await?;
        Ok(match millis {
            -1 => Some(Duration::MAX),
            millis => u64::try_from(millis).ok().map(Duration::from_millis),
        })
    }

    fn connection(&self) -> Connection {
        self.inner.connection.clone()
    }

    /// Runs one Redis call under [`RedisLocker::operation_bound`]: its
    /// redis-rs error becomes [`Error::Backend`] (see [`Target::error`]), its
    /// timeout [`Error::DeadlineExceeded`].
    async fn bounded<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        bounded(BACKEND, operation, self.inner.operation_bound, async {
            call.await
                .map_err(|e| self.inner.target.error(operation, e, false))
        })
        .await
    }

    /// One [`REFRESH_MANY_SCRIPT`] call for the requests at `indexes` (all in
    /// one slot on a cluster), under the operation bound: one 0/1 per key.
    async fn refresh_group(
        &self,
        requests: &[RefreshRequest<'_>],
        indexes: &[usize],
    ) -> std::result::Result<Vec<i64>, GroupFailure> {
        let mut invocation = REFRESH_MANY_SCRIPT.prepare_invoke();
        for &index in indexes {
            let request = &requests[index];
            invocation
                .key(self.inner.keys.lock_key(request.key))
                .arg(request.owner)
                .arg(ttl_millis(request.ttl));
        }
        let mut connection = self.connection();
        let call = invocation.invoke_async(&mut connection);
        match tokio::time::timeout(self.inner.operation_bound, call).await {
            Ok(Ok(refreshed)) => Ok(refreshed),
            Ok(Err(error)) => Err(GroupFailure::Redis(error)),
            Err(_) => Err(GroupFailure::Deadline(self.inner.operation_bound)),
        }
    }

    /// One try: the acquire script, and once more with the same owner token
    /// if the connection was found broken. Not bounded by itself (see
    /// [`Locker::try_lock`]); every exit that leaves the outcome unknown,
    /// including being dropped, undoes the attempt by its token.
    async fn acquire(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        // Armed from here on: the request may be on the wire at any await below.
        let pending = PendingAcquire::arm(
            self,
            key,
            new_owner_token(),
            ttl,
            "an acquire whose outcome is unknown",
        );
        let owner = pending.owner();
        // Read on the caller's task, before anything is sent: its label scope.
        let value = self.inner.record_holder.then(|| {
            let label = current_label();
            inspect::recorded_value(owner, ttl, std::process::id(), host_name(), &label)
        });
        let value = value.as_deref().unwrap_or(owner);
        let mut sent_at = Instant::now();
        let mut granted = self.run_acquire_script(key, value, ttl).await;
        let mut retried = false;
        if let Err(err) = &granted {
            // The connection was found broken (a restart, a failover or a
            // reset closed it) and is being replaced: one more attempt, on the
            // new connection, with the same token. If the first one took
            // effect, the script recognises its own token and returns that
            // grant (see `scripts::ACQUIRE`). Refusals are not retried: the
            // server is down, and a retry would only double the wait.
            if err.is_connection_dropped() && !err.is_connection_refusal() {
                retried = true;
                sent_at = Instant::now();
                granted = self.run_acquire_script(key, value, ttl).await;
            }
        }
        let fencing_token = match granted {
            // Held by another token: ours is not in the key, nothing to undo.
            Ok(0) => {
                pending.settle();
                return Ok(None);
            }
            Ok(token) => token,
            Err(err) => {
                let outcome_unknown = retried || errors::outcome(&err) == Outcome::Unknown;
                if !outcome_unknown {
                    pending.settle();
                }
                // Dropping `pending` still armed releases the lock by its
                // token in the background, in case the acquire took effect.
                return Err(self.inner.target.error("acquire", err, outcome_unknown));
            }
        };
        if let Some(ack) = self.inner.replicas {
            // Still armed: a failed or short WAIT leaves a grant to undo,
            // unless it was released already.
            if let Err((error, released)) = self.confirm_replicas(key, ack, pending.owner()).await {
                if released {
                    pending.settle();
                }
                return Err(error);
            }
        }
        let parts = LeaseParts {
            key: key.to_owned(),
            owner: pending.settle(),
            fencing_token: Some(fencing_token),
            ttl,
            valid_until: Some(sent_at + ttl),
        };
        Ok(Some(Lease::new(
            parts,
            self.inner.leases.get_or_init(|| Arc::new(self.clone())),
        )))
    }

    /// One run of the acquire script for `owner`, a token the caller chose,
    /// without the retry and the undo guard of [`Locker::try_lock`]: the
    /// Redlock backend runs it on each of its nodes and undoes by token
    /// itself. `Ok(true)`: the key holds `owner` now (a new grant, or it
    /// already did and its ttl was re-armed); `Ok(false)`: another token
    /// holds it. An error says whether the script may have run
    /// ([`Error::is_outcome_unknown`]). Bounded by the caller. `holder` is
    /// recorded with a new grant when given (and this locker records
    /// holders).
    #[cfg(feature = "redlock")]
    pub(crate) async fn acquire_as(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        holder: Option<&crate::inspect::Holder>,
    ) -> Result<bool> {
        let value = holder
            .filter(|_| self.inner.record_holder)
            .map(|h| inspect::recorded_value(owner, ttl, h.pid, &h.host, &h.label));
        match self
            .run_acquire_script(key, value.as_deref().unwrap_or(owner), ttl)
            .await
        {
            Ok(fence) => Ok(fence != 0),
            Err(err) => {
                let unknown = errors::outcome(&err) == Outcome::Unknown;
                Err(self.inner.target.error("acquire", err, unknown))
            }
        }
    }

    /// `PING`, under the operation bound: the Redlock backend's check that a
    /// node answers (and, on a lazy locker, its first connection).
    #[cfg(feature = "redlock")]
    pub(crate) async fn ping(&self) -> Result<()> {
        self.bounded("connect", async {
            redis::cmd("PING")
                .query_async::<()>(&mut self.connection())
                .await
        })
        .await
    }

    /// Where this locker's errors say they happened: the server's URL
    /// without password.
    #[cfg(feature = "redlock")]
    pub(crate) fn endpoint(&self) -> &str {
        &self.inner.target.endpoint
    }

    /// Waits (`WAIT`, on the node that took the grant) until
    /// `ack.min_replicas` replicas have every write this connection made,
    /// the grant included. On a shortfall it releases the grant by `owner`
    /// at once and fails (`true`: released); if that release fails, or the
    /// `WAIT` itself does (`false`), the caller's armed [`PendingAcquire`]
    /// releases it in the background.
    ///
    /// The connection is multiplexed, so the `WAIT` also covers other tasks'
    /// writes sent before it: it can only wait longer than needed, never
    /// vouch for less.
    async fn confirm_replicas(
        &self,
        key: &str,
        ack: ReplicaAck,
        owner: &str,
    ) -> std::result::Result<(), (Error, bool)> {
        let acknowledged = self
            .wait_for_replicas(&self.inner.keys.lock_key(key), ack)
            .await
            .map_err(|e| (self.inner.target.error("acquire", e, true), false))?;
        if acknowledged >= ack.min_replicas {
            return Ok(());
        }
        let (released, undo) = match Locker::unlock(self, key, owner).await {
            Ok(()) | Err(Error::NotHeld { .. }) => (true, "it was released"),
            Err(_) => (
                false,
                "releasing it failed, so it is being released by its owner token in the \
                 background (failing that, it expires at its ttl)",
            ),
        };
        let error = Error::backend(
            BACKEND,
            "acquire",
            format!(
                "{}: only {acknowledged} replica(s) acknowledged the grant of {key:?} within \
                 {:?}, {} required (min_replicas); {undo}",
                self.inner.target.endpoint, ack.timeout, ack.min_replicas
            ),
        );
        Err((error, released))
    }

    /// `WAIT min_replicas timeout` on the node serving `redis_key` (on a
    /// cluster, the master of its slot): how many replicas have every write
    /// this connection made before it.
    async fn wait_for_replicas(&self, redis_key: &str, ack: ReplicaAck) -> redis::RedisResult<u32> {
        let timeout_millis = u64::try_from(ack.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut wait = redis::cmd("WAIT");
        wait.arg(ack.min_replicas).arg(timeout_millis);
        self.connection().query_on_node_of(redis_key, wait).await
    }

    /// Waits until `ack.min_replicas` replicas have the mark just advanced
    /// in `mark_key`, under the operation bound. A shortfall, or a `WAIT`
    /// that fails, is an outage whose outcome is unknown: the mark stays
    /// advanced on the master (a mark never goes back), but a failover now
    /// could lose it.
    async fn confirm_mark(&self, name: &str, mark_key: &str, ack: ReplicaAck) -> Result<()> {
        let acknowledged = bounded(BACKEND, "advance_mark", self.inner.operation_bound, async {
            self.wait_for_replicas(mark_key, ack)
                .await
                .map_err(|e| self.inner.target.error("advance_mark", e, true))
        })
        .await?;
        if acknowledged >= ack.min_replicas {
            return Ok(());
        }
        Err(Error::backend(
            BACKEND,
            "advance_mark",
            format!(
                "{}: only {acknowledged} replica(s) acknowledged the mark {name:?} within {:?}, \
                 {} required (min_replicas); the mark stays advanced on the master, but a \
                 failover now could lose it: treat the tick as taken, never as free to run",
                self.inner.target.endpoint, ack.timeout, ack.min_replicas
            ),
        )
        .with_outcome_unknown())
    }

    /// Logs the [durability warnings](Locker::durability_warnings) at
    /// `warn`, the first time marks are used, unless a caller already asked
    /// for them.
    fn report_durability_once(&self) {
        if self.inner.durability_reported.swap(true, Ordering::Relaxed) {
            return;
        }
        for warning in self.durability_report() {
            tracing::warn!(component = "distlock", backend = BACKEND, "{warning}");
        }
    }

    /// The acquire script, writing `value` into the lock: the bare owner
    /// token, or the token and its holder record (see
    /// [`inspect::recorded_value`]).
    async fn run_acquire_script(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> redis::RedisResult<u64> {
        ACQUIRE_SCRIPT
            .key(self.inner.keys.lock_key(key))
            .key(self.inner.keys.fence_key(key))
            .arg(value)
            .arg(ttl_millis(ttl))
            .invoke_async(&mut self.connection())
            .await
    }
}

/// What every constructor derives from a [`Config`] before it connects:
/// the checked deployment, the bounds and the connection manager settings.
struct Parts {
    deployment: Deployment,
    manager: ConnectionManagerConfig,
    operation_bound: Duration,
    target: Target,
}

impl Parts {
    fn new(config: &Config) -> Result<Self> {
        let deployment = config.deployment()?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(RECONNECT_MIN_DELAY)
            .set_max_delay(RECONNECT_MAX_DELAY);
        Ok(Parts {
            target: Target {
                endpoint: deployment.to_string(),
                connect_timeout: config.connect_timeout,
                response_timeout: config.response_timeout,
            },
            deployment,
            manager,
            operation_bound: operation_bound(config.connect_timeout, config.response_timeout),
        })
    }

    /// A client that redis-rs refused to build: bad input, naming the
    /// deployment.
    fn invalid(&self, error: redis::RedisError) -> Error {
        Error::invalid("config", format!("{}: {error}", self.deployment))
    }

    fn into_locker(
        self,
        config: Config,
        connection: Connection,
        subscriber: SubscriberSource,
        publish: &'static str,
    ) -> RedisLocker {
        let replicas = (config.min_replicas > 0).then_some(ReplicaAck {
            min_replicas: config.min_replicas,
            timeout: config.replica_timeout,
        });
        let acquire_bound = match replicas {
            // The WAIT's reply (held up to the replica timeout, which is
            // shorter than the response timeout) and the release of a grant
            // too few replicas acknowledged.
            Some(_) => self
                .operation_bound
                .saturating_add(config.response_timeout)
                .saturating_add(config.response_timeout),
            None => self.operation_bound,
        };
        RedisLocker {
            inner: Arc::new(Inner {
                leases: crate::SharedLocker::default(),
                connection,
                operation_bound: self.operation_bound,
                acquire_bound,
                keys: KeySpace::new(config.key_prefix),
                target: self.target,
                releases: ReleaseHub::new(
                    subscriber,
                    config.connect_timeout,
                    config.response_timeout,
                ),
                publish,
                replicas,
                record_holder: config.record_holder,
                allow_eviction: config.allow_eviction,
                require_appendonly: config.require_appendonly,
                server: OnceLock::new(),
                durability_reported: AtomicBool::new(false),
            }),
        }
    }
}

/// The command client (RESP3) and the subscriber's (RESP2: a connection in
/// `SUBSCRIBE` mode is what redis-rs' `PubSub` is built for, and any server
/// version supports it) for one server, with the configured TLS files.
fn standalone_clients(
    config: &Config,
    endpoint: &config::Endpoint,
) -> Result<(redis::Client, redis::Client)> {
    Ok((
        config.client(endpoint, ProtocolVersion::RESP3)?,
        config.client(endpoint, ProtocolVersion::RESP2)?,
    ))
}

/// The ttl in whole milliseconds, rounded up: the server then holds the lock
/// at least as long as the lease believes.
fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// The bound on every call of a locker (acquire with its retry, release,
/// refresh, `remaining_ttl`, connect): one connection attempt, one reply, and
/// the pauses of one reconnect cycle ([`RECONNECT_PAUSES`]), so a server that
/// refuses connections is still reported as refusing ([`Error::Backend`])
/// rather than cut short. Past it the call is abandoned with
/// [`Error::DeadlineExceeded`]. Without it a call against a server that
/// accepts connections but never answers waited for every reconnect attempt
/// of the connection manager (each up to the connect timeout), twice when the
/// acquire was retried: several seconds.
fn operation_bound(connect_timeout: Duration, response_timeout: Duration) -> Duration {
    connect_timeout
        .saturating_add(response_timeout)
        .saturating_add(RECONNECT_PAUSES)
}

#[async_trait]
impl Locker for RedisLocker {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            expires: true,
            refresh: true,
            unlock_by_owner: true,
            release_wakeup: true,
            release_notifications: true,
            fencing: true,
            marks: true,
            inspect: true,
            list: true,
            force_release: true,
        }
    }

    fn backend_key(&self, key: &str) -> String {
        RedisLocker::backend_key(self, key)
    }

    /// One attempt, bounded by [`RedisLocker::operation_bound`] (retry
    /// included; see the [module docs](self), "Connections").
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future after the request may have been sent
    /// releases the lock by its owner token in the background (failing that,
    /// it expires at its ttl), as does an attempt abandoned at its bound
    /// ([`Error::DeadlineExceeded`]) or whose reply was lost.
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        validate::acquire(key, ttl)?;
        bounded(
            BACKEND,
            "acquire",
            self.inner.acquire_bound,
            self.acquire(key, ttl),
        )
        .await
    }

    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        validate::key(key)?;
        let released: u8 = self
            .bounded("release", async {
                RELEASE_SCRIPT
                    .key(self.inner.keys.lock_key(key))
                    .arg(owner)
                    .arg(self.inner.keys.release_channel(key))
                    .arg(self.inner.publish)
                    .invoke_async(&mut self.connection())
                    .await
            })
            .await?;
        match released {
            1 => Ok(()),
            _ => Err(Error::NotHeld {
                key: key.to_owned(),
            }),
        }
    }

    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        validate::acquire(key, ttl)?;
        let refreshed: u8 = self
            .bounded("refresh", async {
                REFRESH_SCRIPT
                    .key(self.inner.keys.lock_key(key))
                    .arg(owner)
                    .arg(ttl_millis(ttl))
                    .invoke_async(&mut self.connection())
                    .await
            })
            .await?;
        match refreshed {
            1 => Ok(()),
            _ => Err(Error::NotHeld {
                key: key.to_owned(),
            }),
        }
    }

    /// One script per batch on one server (or sentinel-managed master), one
    /// per slot on a cluster (a script may only touch keys of one slot), the
    /// slots' scripts sent at once. Each key answers as
    /// [`refresh`](Locker::refresh) would; a failed script fails the keys it
    /// carried.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Option<Result<()>>> = requests
            .iter()
            .map(|request| validate::acquire(request.key, request.ttl).err().map(Err))
            .collect();
        // The valid requests by the script call that carries them.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let cluster = matches!(self.inner.connection, Connection::Cluster(_));
        let mut by_slot = std::collections::HashMap::new();
        for (index, _) in results.iter().enumerate().filter(|(_, r)| r.is_none()) {
            let group = if cluster {
                let slot = redis::cluster_routing::Slot::for_key(
                    self.inner.keys.lock_key(requests[index].key),
                );
                *by_slot.entry(slot).or_insert_with(|| {
                    groups.push(Vec::new());
                    groups.len() - 1
                })
            } else {
                if groups.is_empty() {
                    groups.push(Vec::new());
                }
                0
            };
            groups[group].push(index);
        }
        let answers = futures_util::future::join_all(
            groups
                .iter()
                .map(|group| self.refresh_group(requests, group)),
        )
        .await;
        for (group, answer) in groups.iter().zip(answers) {
            match answer {
                Ok(refreshed) => {
                    for (&index, refreshed) in group.iter().zip(refreshed) {
                        results[index] = Some(match refreshed {
                            1 => Ok(()),
                            _ => Err(Error::NotHeld {
                                key: requests[index].key.to_owned(),
                            }),
                        });
                    }
                }
                Err(failure) => {
                    for &index in group {
                        results[index] = Some(Err(failure.to_error(self)));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(Error::backend(
                        BACKEND,
                        "refresh",
                        "the refresh script answered fewer keys than it was sent",
                    ))
                })
            })
            .collect()
    }

    /// Deletes `key`'s fencing counter (`{key}:fence`) if the lock is free,
    /// in one script; [`Error::NotAcquired`] if it is held. Bounded like
    /// every call; the script is atomic, so a dropped call either forgot
    /// the key or left it as it was.
    async fn forget(&self, key: &str) -> Result<()> {
        validate::key(key)?;
        let forgotten: u8 = self
            .bounded("forget", async {
                FORGET_SCRIPT
                    .key(self.inner.keys.lock_key(key))
                    .key(self.inner.keys.fence_key(key))
                    .invoke_async(&mut self.connection())
                    .await
            })
            .await?;
        match forgotten {
            1 => Ok(()),
            _ => Err(Error::NotAcquired {
                key: key.to_owned(),
            }),
        }
    }

    /// One script on `<prefix>{<name>}:mark`, a key without expiry (see
    /// `scripts.rs` for its encoding). A reply lost on a broken connection
    /// leaves the outcome unknown ([`Error::is_outcome_unknown`]). With
    /// [`Config::min_replicas`], a mark that was advanced is followed by
    /// `WAIT` (bounded like every call); too few acknowledgements fail it as
    /// an outage whose outcome is unknown. The first call logs the
    /// [durability warnings](Locker::durability_warnings), unless they were
    /// asked for already.
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        validate::key(name)?;
        self.report_durability_once();
        let mark_key = self.inner.keys.mark_key(name);
        let (advanced, stored): (u8, String) =
            bounded(BACKEND, "advance_mark", self.inner.operation_bound, async {
                ADVANCE_MARK_SCRIPT
                    .key(&mark_key)
                    .arg(encode_mark(value))
                    .invoke_async(&mut self.connection())
                    .await
                    .map_err(|e| {
                        let unknown = e.is_io_error() || e.is_timeout();
                        let error = self.inner.target.error("advance_mark", e, false);
                        if unknown {
                            error.with_outcome_unknown()
                        } else {
                            error
                        }
                    })
            })
            .await?;
        let decode = |stored: &str| {
            decode_mark(stored).ok_or_else(|| {
                Error::backend(
                    BACKEND,
                    "advance_mark",
                    format!("{mark_key} holds {stored:?}, which distlock did not write"),
                )
            })
        };
        // A first write of 0 or less records no progress: losing it in a
        // failover loses nothing, so it is not waited for. (The cron
        // scheduler peeks at a mark by advancing it to 0, and a job's first
        // peek must not stall on missing replicas.)
        let records_progress = value > 0 || !stored.is_empty();
        if advanced == 1 && records_progress {
            if let Some(ack) = self.inner.replicas {
                self.confirm_mark(name, &mark_key, ack).await?;
            }
        }
        match (advanced, stored.as_str()) {
            (1, "") => Ok(MarkAdvance::Advanced { previous: None }),
            (1, previous) => Ok(MarkAdvance::Advanced {
                previous: Some(decode(previous)?),
            }),
            (_, current) => Ok(MarkAdvance::AlreadyAt {
                current: decode(current)?,
            }),
        }
    }

    /// What the locker read when it was built ([`RedisLocker::server_facts`]):
    /// `appendonly no` (a restart forgets marks and fence counters: see
    /// [`ServerFacts`]), `appendfsync no`, replicas without
    /// [`Config::min_replicas`], or settings it could not read. Asking
    /// counts as reporting them: the first mark write then does not log
    /// them again.
    fn durability_warnings(&self) -> Vec<String> {
        self.inner
            .durability_reported
            .store(true, Ordering::Relaxed);
        self.durability_report()
    }

    /// One read-only script: the lock key's value (held or not), its `PTTL`
    /// and its holder record (see the [module docs](self), "Inspection").
    /// Bounded like every call.
    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        self.inspect_lock(key).await
    }

    /// `SCAN ... MATCH <prefix>{<escaped prefix>*}` over the whole key space
    /// (every master of a cluster), then one inspect script per lock found;
    /// each round trip bounded like every call (see the [module
    /// docs](self), "Inspection").
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.list_locks(prefix).await
    }

    /// [`ForceRelease::Lock`] only (one script deletes the lock and its
    /// record and publishes the release); [`ForceRelease::TerminateSession`]
    /// is [`Error::Unsupported`]: a Redis lock outlives its client's
    /// connection. Bounded like every call.
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        self.force_release_lock(key, how).await
    }

    /// Subscribes to `key`'s release channel on the locker's shared subscriber
    /// connection. If subscribing fails, waiters poll (`Ok(None)`): the
    /// attempts that follow report any outage.
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        validate::key(key)?;
        match self.inner.releases.watch(self.release_channel(key)).await {
            Ok(watch) => Ok(Some(watch)),
            Err(error) if error.code() == Some("NOPERM") => {
                tracing::warn!(component = "distlock", backend = BACKEND, key, %error,
                    "this user may not subscribe to release channels; waiters poll");
                Ok(None)
            }
            Err(error) => {
                tracing::debug!(component = "distlock", backend = BACKEND, key, %error,
                    "cannot subscribe to release notifications; polling");
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(1)), 1);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_millis(Duration::from_secs(30)), 30_000);
        assert_eq!(ttl_millis(validate::MAX_TTL), 365 * 24 * 3600 * 1000);
    }

    #[test]
    fn the_reconnect_pauses_cover_one_jittered_backoff_cycle() {
        let mut delay = RECONNECT_MIN_DELAY;
        let mut longest = Duration::ZERO;
        for _ in 0..RECONNECT_RETRIES {
            // Each pause is at most twice its nominal delay (jitter).
            longest += 2 * delay;
            delay = (delay * 2).min(RECONNECT_MAX_DELAY);
        }
        assert_eq!(longest, RECONNECT_PAUSES);
        assert_eq!(
            operation_bound(DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT),
            Duration::from_millis(2200)
        );
        assert_eq!(operation_bound(Duration::MAX, Duration::MAX), Duration::MAX);
    }
}
