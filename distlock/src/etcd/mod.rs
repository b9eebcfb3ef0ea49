//! Locks in an etcd cluster (`etcd://`, `etcd+https://`; feature `etcd`),
//! by etcd's own mutex recipe, so they interoperate with `etcdctl lock` and
//! with Go services using `go.etcd.io/etcd/client/v3/concurrency`.
//!
//! - **Names**: the distlock key `K` is the etcd lock name `<prefix>K`
//!   (prefix default `lock:`), the name `etcdctl lock lock:K` takes.
//! - **Names that nest are distinct locks.** The queue of `K` is its
//!   *direct members*, the keys `<prefix>K/<lease hex>`; the keys of `K/x`
//!   (`<prefix>K/x/<lease hex>`), though under the same etcd prefix, are
//!   another queue. Every read of a queue (acquire, the wait for the key
//!   ahead, inspect, list, forget, force-release) keeps the direct members
//!   only, so `jobs` is free while `jobs/nightly` is held, and forcing
//!   `jobs` out never deletes a `jobs/nightly` key.
//! - **Interoperability with `etcdctl lock` and Go's `concurrency.Mutex`**
//!   holds for every key, nested or not: the same name is the same queue,
//!   and neither side is ever granted a lock the other holds. One
//!   difference is theirs: Go's recipe ranges over the whole prefix, so
//!   `etcdctl lock lock:K` also waits while anyone (us included) holds or
//!   waits for `K/x` (checked against etcd 3.4's `etcdctl`). While it waits
//!   there, its key is the first of `K`'s queue, so our `K` waits behind
//!   it and [`Locker::inspect`] reports it as `K`'s holder: it costs
//!   waiting, never exclusion. Names without a `/` are not affected.
//! - **Acquire** is one transaction, as `concurrency.Mutex` does it: write
//!   `<name>/<lease id in hex>` on this locker's session lease *only if
//!   absent*, and read the key under `<name>/` with the lowest create
//!   revision: that key's owner holds the lock. If that key is a nested
//!   name's, one more read finds whether a direct member is ahead of ours.
//!   A [`Locker::try_lock`] that is not first deletes its own key again and
//!   reports contention.
//! - **Waiting** ([`Locker::lock`]) keeps its key in the queue and watches
//!   the key just ahead of it for deletion, then looks again: waiters are
//!   woken in FIFO order by etcd itself, without polling. When nothing is
//!   ahead, it checks that its own key still exists before taking the
//!   lock (etcd has handed `concurrency.Mutex` a lock whose lease had
//!   already expired during the wait: that check is what `Mutex.Lock` does
//!   after `waitDeletes`). Waiters of *one* locker for one key queue
//!   locally first (see "Two leases of one locker").
//! - **Fencing token**: the create revision of the holder's key. etcd's
//!   revision is one counter for the whole cluster, so tokens strictly
//!   increase across every grant of every key, never repeat, and survive
//!   restarts (they are not reset by [`Locker::forget`], which has nothing
//!   to forget). A shared lease's token is the first reader's revision,
//!   never advanced: see [shared locks](#shared-locks).
//! - **Shared locks** ([`Locker::try_lock_shared`], [`Locker::lock_shared`])
//!   follow etcd's reader-writer recipe in the same queue: a reader's key
//!   `<name>/read-<lease id in hex>-<n>` waits only for the writers' keys
//!   ahead of it, and every writer waits for it. **A waiting writer blocks
//!   the readers that come after it** ([`Capabilities::writer_priority`]): see
//!   [shared locks](#shared-locks).
//! - **Marks** ([`Locker::advance_mark`]): a key per mark,
//!   `<key prefix><name>:mark` with `/` and `%` in the name
//!   percent-encoded (a `/` would put it inside the queue of another lock),
//!   without a lease, raised by compare-and-put transactions.
//! - **Release** deletes the holder's key only if its create revision is
//!   still the granted one *and* its value (an election candidate's: its
//!   owner key's, below) still starts with the grant's secret (a
//!   compare-and-delete transaction): a retried or stale unlock never
//!   deletes a newer holder's key (etcd issue
//!   <https://github.com/etcd-io/etcd/issues/22082> is what deleting by
//!   name alone did).
//! - **Owner tokens** are `<lease id hex>:<create revision>:<secret>` (the
//!   secret is 128 random bits, the first line of the key's value), with
//!   `:owner` after it for an election candidate, so [`Locker::unlock`] and
//!   [`Locker::refresh`] work from any process that has the token
//!   ([`Capabilities::unlock_by_owner`]).
//! - **Elections** ([`crate::elect`]) use the same queue, as Go's
//!   `concurrency.Election` uses its `Mutex`'s, and their keys carry what
//!   the election's tools read: `Campaign` writes the candidate's value on
//!   its key, and `Leader` and `Observe` (so `etcdctl elect -l`) read the
//!   value of the key with the lowest create revision
//!   (<https://github.com/etcd-io/etcd/blob/main/client/v3/concurrency/election.go>).
//!   So a distlock candidate's key `<name>/<lease id in hex>` holds exactly
//!   its proclaimed value ([`Election::proclaim`](crate::elect::Election::proclaim);
//!   without one, the holder label it records, or nothing with
//!   `holder_record=off`), and `etcdctl elect -l <name>` prints it. Its
//!   secret and holder record go to its **owner key**
//!   `<key prefix><key>:owner:<lease id in hex>` (`/` and `%` in the key
//!   percent-encoded, as in a mark's key, so it is in no lock's queue),
//!   written by the acquire transaction on the same lease: release and
//!   refresh compare the key's create revision and the owner key's secret,
//!   and a release (forced ones too) deletes both. Go's election proves
//!   ownership by the key's create revision alone; the secret is what makes
//!   the owner token a capability, since the revision is the fencing token
//!   anybody who inspects the lock reads. distlock has no `Proclaim`
//!   within a term: a new value comes with the next term.
//!
//! ```no_run
//! use std::time::Duration;
//! use distlock::Locker;
//! use distlock::etcd::EtcdLocker;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = EtcdLocker::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379").await?;
//! assert_eq!(locker.backend_key("nightly"), "lock:nightly");
//! let lease = locker.lock("nightly", Duration::from_secs(10), Duration::from_secs(30)).await?;
//! // ... work, passing lease.fencing_token() (a create revision) to what you write to ...
//! lease.release().await?;
//! locker.close().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! - **Sessions and what ttl means.** A lock lives on a *session lease*:
//!   one etcd lease per whole-second ttl per locker (a "ttl class"), kept
//!   alive by one background task per session, which sends a keep-alive
//!   about every ttl/3 and reads each answer. The ttl is how long the lock
//!   outlives its holder's keep-alive: **a holder that crashes, hangs or
//!   is cut off keeps the lock until its lease expires, one ttl (rounded
//!   up to whole seconds) after its last successful keep-alive**, and up
//!   to one more ttl for each leader change meanwhile (see "What it does
//!   not guarantee"); a live
//!   holder keeps it until it releases, however long that is, as with
//!   `etcdctl lock` ([`Capabilities::expires`] is false, like Postgres).
//!   Bound a live holder with [`KeepAlive::max_hold`](crate::KeepAlive::max_hold).
//! - **ttl rounding.** etcd leases have whole-second ttls: a ttl is
//!   rounded *up* (400 ms and 1 s are both a 1 s lease, 1.2 s is 2 s), so
//!   the server never frees a lock sooner than asked. etcd also raises a
//!   lease's ttl to its own minimum, 1.5 × the election timeout rounded up
//!   to seconds (2 s with etcd's default 1 s election timeout); a lease
//!   reports the ttl the caller asked for.
//! - **Losing a lock.** The keep-alive gives the lease up, and every lock
//!   under it fires its lost signal ([`LostReason::ConnectionLost`](crate::LostReason::ConnectionLost)), when
//!   etcd answers a keep-alive with ttl 0 (the lease was revoked, for
//!   example by `etcdctl lease revoke`, or expired), or when no keep-alive
//!   has succeeded for ttl − [`drift_margin`](crate::drift_margin) (so the
//!   holder stops its work before the server can free the lock). Until
//!   then, a broken or silent keep-alive stream is reopened (through
//!   another member if one is down) every 100 ms.
//! - **Refresh** ([`Locker::refresh`], and so [`crate::Lease::keep_alive`])
//!   confirms, in one round trip, that the holder's key still exists with
//!   its create revision and secret: [`Error::NotHeld`] once it does not.
//!   It does not change the ttl (the session's keep-alive renews the
//!   lease); the `ttl` argument is only validated. A keepalive batch
//!   ([`Locker::refresh_many`]) reads up to 128 keys (etcd's default
//!   `--max-txn-ops`; an election candidate's grant reads two, its key and
//!   its owner key) in one read-only transaction; on a cluster started
//!   with a lower `--max-txn-ops`, which refuses it, it checks them one
//!   transaction each.
//! - **Contention vs outage**: a held lock is `Ok(None)`; an unreachable
//!   cluster or one without quorum is [`Error::Backend`] or
//!   [`Error::DeadlineExceeded`] (then [`Error::Unavailable`] through a
//!   [`BreakerLocker`](crate::BreakerLocker)), never contention. Members
//!   are asked to refuse requests while they have no leader
//!   (`require_leader`), so a partitioned member fails fast. A
//!   [`Locker::lock`] whose wait outlived a failure (its watch broke, then
//!   etcd answered again) ends at its deadline as [`Error::Timeout`]; only
//!   a failure still current at the deadline makes it an outage.
//! - **Timeouts.** etcd-client has no default request timeout; this
//!   backend sets three ([`Config`]): `connect_timeout` per connection,
//!   `request_timeout` per request, `keepalive_timeout` per keep-alive
//!   answer (and the HTTP/2 ping timeout). [`Locker::try_lock`] is bounded
//!   by [`EtcdLocker::operation_bound`] (four requests: a lease grant for
//!   a new ttl class, the acquire transaction, a read of the queue when a
//!   nested name's key is older than ours, and the undo on contention);
//!   [`Locker::lock`] by its timeout + [`DEADLINE_GRACE`].
//! - **An acquire whose outcome is unknown** (its answer timed out, the
//!   connection broke after it was sent, or its future was dropped) may
//!   have written the key: it is deleted by lease and secret before the
//!   error is reported (once, bounded by the request timeout), and if that
//!   fails too, in the background until it succeeds or the session ends,
//!   so no orphan outlives the lease. Meanwhile this locker reports the key
//!   as being cleaned up ([`Error::Backend`]), not as free or contended.
//! - **A release that fails** (etcd unreachable, no quorum) is retried in
//!   the background until etcd answers or the session ends; the lease
//!   reports the error. Until the retry lands, this locker answers an
//!   attempt on the key as it does during an unknown acquire's cleanup
//!   ([`Error::Backend`], an outage): the key is still held under its own
//!   session, but reading that as contention would be an outage reported
//!   as "held elsewhere".
//! - **Two leases of one locker.** One lease per ttl class means two
//!   grants of one key by one locker would write the same key
//!   `<name>/<lease>`. The locker excludes them itself (as the Postgres
//!   backend does for its re-entrant sessions): a second `try_lock` of a
//!   key this locker holds or is taking is contention, and a second
//!   `lock` waits, locally, for the first to end (woken by it, not
//!   polling; local waiters are not ordered FIFO among themselves).
//!   Readers are not excluded locally: each has a key of its own.
//! - **Closing.** [`EtcdLocker::close`] (or dropping the last clone of the
//!   locker and every lease it granted) stops the keep-alives and revokes
//!   the session leases, which frees every lock still held under them at
//!   once.
//! - **Cancel safety**: dropping a `try_lock`, `lock`, `try_lock_shared` or
//!   `lock_shared` future is safe: a key it may have written is deleted in
//!   the background. Dropping a release or refresh leaves the lock as the
//!   request left it.
//!
//! # Shared locks
//!
//! etcd's reader-writer recipe
//! (`client/v3/experimental/recipes/rwmutex.go`), inside the mutex's queue
//! so that `etcdctl lock` and Go's `concurrency.Mutex` still exclude and
//! are excluded:
//!
//! - **Keys.** A reader writes `<name>/read-<lease id in hex>-<n>` under
//!   its session lease (the lease of its ttl class, as a writer's key), `n`
//!   numbering this locker's readers so that one locker holds any number
//!   at once; its value is a writer's (the secret, then the holder record).
//!   It is a direct member of `<name>`'s queue like any contender key, so
//!   every writer (ours, `etcdctl lock`, Go's mutex: each waits for every
//!   older key under the prefix) waits for it. To a reader, every other
//!   direct member is a writer: ours (`<name>/<lease hex>`), `etcdctl
//!   lock`'s and Go's (the same layout), and anything else another program
//!   put there. Go's *experimental* `RWMutex` is not interoperable: its keys
//!   `<name>/read/<ns>` and `<name>/write/<ns>` are the nested names
//!   `<name>/read` and `<name>/write` here (though `etcdctl lock` waits for
//!   them).
//! - **Acquire.** [`Locker::try_lock_shared`] is one transaction: write the
//!   reader's key if absent, read the newest writer's key in the queue
//!   (the newer of two sorted reads, one each side of the readers' key
//!   range) and the queue's first key (one read of the members more when a
//!   nested name's key answers first, as for a writer). With a writer
//!   ahead it deletes its key again and reports contention. [`Locker::lock_shared`] keeps its key
//!   and watches that writer's key for deletion, then looks again, bounded
//!   by its timeout; a key left on timeout, error or a dropped future is
//!   deleted as an exclusive attempt's is (at once, or in the background).
//! - **Order: a waiting writer blocks new readers.** Readers and writers
//!   queue in etcd's revision order. A reader waits for every writer queued
//!   before it, *waiting or holding*; a writer for every key before it. So
//!   while a writer waits for readers, a new reader's `try_lock_shared` is
//!   contention and its `lock_shared` waits until that writer has held and
//!   released the lock: readers cannot starve a writer, and a writer waits
//!   only for the readers already queued ([`Capabilities::writer_priority`]).
//!   This differs from the memory and file backends, where a waiting writer
//!   does not hold readers back. A writer waiting behind several readers
//!   watches the newest of them, then looks again, so it may wake once per
//!   reader (as `rwmutex.go`'s does).
//! - **Fencing token.** One rule for every grant: the create revision of
//!   the queue's first key when the grant's turn came. For a writer that
//!   is its own key, as before; for a reader, the oldest reader's then (its
//!   own if it is alone). A reader advances nothing and writes nothing for
//!   it. Every writer granted before a reader's turn had left the queue by
//!   then, and was granted only once every older key had left, so it is
//!   older than every key still there; every writer granted after it is
//!   newer than its key; and as each new key is newer than all before it,
//!   the queue's first key only moves forward. So a reader's token is
//!   above every earlier writer's and below every later writer's, tokens
//!   never decrease over all grants and strictly increase over exclusive
//!   ones, and a resource that has seen writer `N + 1` can reject a reader
//!   still presenting `N`. Readers granted while one first key stays share
//!   its token. It is not the latest exclusive grant's token, as the file
//!   backend's is, but like memory's counter, a value of one cluster-wide
//!   counter between the writers'.
//! - **Everything else is a lease's**: the owner token
//!   `read-<lease hex>-<n>:<create revision>:<secret>` releases and
//!   refreshes from any process ([`Locker::unlock`], [`Locker::refresh`],
//!   compared on revision and secret as a writer's); the session's
//!   keep-alive renews it, and its loss fires the lost signal; dropping the
//!   lease releases it.
//! - **One locker, both modes.** A reader of a name this locker holds
//!   exclusively is contention (its key is ahead); an exclusive
//!   [`Locker::lock`] of a name this locker holds shared waits in etcd
//!   behind its own reader, until that reader is released (or the
//!   timeout). While an abandoned exclusive attempt of this locker on the
//!   name is being cleaned up, its readers answer as its writers do (an
//!   error, not contention); an abandoned *reader*'s key is, until its
//!   deletion lands, a reader like any other (writers wait for it).
//!
//! # Inspection
//!
//! - **The record** is the value of the contender's key
//!   `<name>/<lease hex>` (an election candidate's: of its owner key,
//!   whose mod revision is the key's create revision): the grant's secret
//!   on the first line, then the holder record (host, pid, label, grant
//!   time on the **holder's** clock,
//!   [`Clock::Holder`](crate::inspect::Clock::Holder): etcd has no server
//!   time to read, ttl), written by the acquire transaction itself: no
//!   extra request. `holder=off` ([`Config::holder_record`]) writes only the
//!   secret. Release and refresh compare the value's first line, not the
//!   whole value (two range compares: etcd compares whole values only); a
//!   key written by a distlock before this (the bare secret) cannot be
//!   released by token from a newer one, only by its own process or its
//!   lease.
//! - [`Locker::inspect`] reads the first key of the queue (lowest create
//!   revision, as acquire does): its create revision is the fencing token,
//!   `session` is `lease <hex>` (as `etcdctl lease list` shows it), and
//!   `ttl_left` is that lease's `TimeToLive` (whole seconds; one request
//!   more): how long the lock outlives a holder that stopped renewing now.
//!   A first key whose value holds no record costs one read more, of the
//!   owner key its holder would have as an election candidate: found, the
//!   record is there and the key's value is the proclaimed value
//!   ([`HeldLock::value`](inspect_api::HeldLock::value)). A key written by
//!   `etcdctl lock` or Go's `concurrency.Mutex` (an empty value) is held by
//!   an unknown holder, never free; so is one written by `etcdctl elect`,
//!   whose proposal is reported as the value.
//! - **Held shared**: a first key that is a reader's means the lock is held
//!   by every reader older than the oldest writer, reported with
//!   [`HeldLock::shared`](inspect_api::HeldLock::shared) set, and the oldest
//!   reader's record, session, `ttl_left` and revision as `fencing_token`
//!   (the token a reader granted now gets; readers granted while an older
//!   one was first carry a lower one). [`Locker::list`] reports such a lock
//!   in the same way.
//!   [`Locker::force_release`] evicts every holding reader: with
//!   `ForceRelease::Lock` it deletes each one's key (compared on its create
//!   revision), with `ForceRelease::TerminateSession` it revokes each one's
//!   lease, freeing every lock under each.
//! - [`Locker::list`] reads every key under `<key prefix><prefix>` in
//!   pages of 512 keys (each page under the request timeout, not the whole
//!   listing, which grows with the number of locks; all pages at the
//!   revision of the first, so the listing is one snapshot), grouped by
//!   lock name (the key up to its last `/`, so `K` and `K/x` are listed
//!   apart; marks keys have no `/` and are skipped), reporting the lowest
//!   create revision of each, plus one `TimeToLive` per holding lease. One
//!   unpaginated read failed past the 4 MiB a gRPC answer may have (about
//!   10,000 held locks).
//! - [`Locker::force_release`] with [`ForceRelease::Lock`](crate::inspect::ForceRelease::Lock)
//!   deletes the holder's key, compared on its create revision (so a new
//!   holder's key is never deleted), which hands the lock to the next
//!   waiter in the queue. The evicted holder is not told: its next refresh
//!   (within ttl/3 under a keep-alive) is [`Error::NotHeld`] and fires its
//!   lost signal; `etcdctl lock` never notices (it does not watch its key).
//!   With [`ForceRelease::TerminateSession`](crate::inspect::ForceRelease::TerminateSession)
//!   it revokes the holder's lease instead: **every lock under that lease
//!   is freed** (a distlock locker has one lease per ttl class for all its
//!   locks), and their holders learn it at their next keep-alive.
//!   Logged at `warn` either way.
//!
//! # What it does not guarantee
//!
//! - **A lock without fencing cannot guarantee mutual exclusion.** Jepsen's
//!   analysis of etcd 3.4.3 (<https://jepsen.io/analyses/etcd-3.4.3>) found
//!   that etcd locks are not safe on their own: a holder paused (GC,
//!   SIGSTOP, a slow VM) or partitioned past its lease keeps running while
//!   etcd grants the lock to another. The fencing token (the create
//!   revision) is the remedy: pass it to the protected resource and have it
//!   reject writes with a smaller token than it has seen.
//! - **Each leader change extends the orphan bound.** etcd 3.4 resets
//!   every lease's remaining ttl to its full ttl, plus an election timeout,
//!   when a new leader takes over (a lease with 3 s of 10 left gets 10 s
//!   again): the new leader's lessor is promoted with fresh expiries
//!   (`Promote` in
//!   <https://github.com/etcd-io/etcd/blob/release-3.4/lease/lessor.go>).
//!   So a holder that crashed keeps its lock for **up to ttl × (1 + the
//!   number of leader changes before its lease runs out)**, plus an
//!   election timeout per change; under a leader that keeps flapping, for
//!   as long as it flaps. Measured: 4.4 s at a 2 s ttl with the leader
//!   killed 1.2 s after the holder (2.4 s without); 7.9 s at a 3 s ttl with
//!   leadership moved at 2.2 s and 4.3 s (the test
//!   `each_leader_change_extends_a_dead_holders_lease_by_up_to_one_ttl`).
//!   A restart of a single-node cluster restores leases with their full
//!   ttl in the same way. Nothing is granted early by it: the reset only
//!   ever lengthens. There is no sound client-side remedy: a waiter that
//!   reads the holder's lease (`LeaseTimeToLive`) cannot tell a reset from
//!   a renewal by a live holder, and revoking on that guess could free a
//!   lock its holder is still using. etcd 3.4.23's only lease-checkpoint
//!   setting, `--experimental-enable-lease-checkpoint`, was not measured as
//!   a remedy here. Rely on the fencing token for safety, and keep leader
//!   changes rare (a stable network, an election timeout suited to it).
//! - **Clock rate.** The holder gives its lease up on its own clock,
//!   ttl − drift margin after the last keep-alive it sent; the server
//!   expires it on the leader's clock. A holder whose clock runs much
//!   slower than the leader's could believe its lease alive after the
//!   server freed it.
//! - **Unlocks from elsewhere.** A holder learns that its lock was
//!   released by token from another process (or its key deleted with
//!   `etcdctl del`) only at its next refresh ([`crate::Lease::keep_alive`]
//!   refreshes about every ttl/3).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::Client;
use tokio::sync::Notify;

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
mod owner;
mod recipe;
mod refresh;
mod session;

pub use config::{
    Config, Password, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_KEY_PREFIX,
    DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT, ENV_PREFIX,
};

use acquire::{delete_in_background, Written};
use owner::SecretAt;
use recipe::{Role, Token};
use session::Session;

const BACKEND: &str = "etcd";

/// Which lock names this locker holds, on which session, for which owner.
pub(crate) type Registry = crate::session_registry::Registry<Slot, Session>;

/// What this locker's registry keys its attempts and grants by: the
/// exclusive lock of a name (one per name per locker: every writer of a
/// locker would write the same key, `<name>/<lease hex>`), or one reader of
/// a name (any number per name: `n` gives each its own key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    Exclusive(String),
    Reader(String, u64),
}

impl Slot {
    /// The slot of a contender of `name` in `role`.
    fn of(name: String, role: Role) -> Slot {
        match role {
            Role::Writer => Slot::Exclusive(name),
            Role::Reader(n) => Slot::Reader(name, n),
        }
    }

    fn name(&self) -> &str {
        match self {
            Slot::Exclusive(name) | Slot::Reader(name, _) => name,
        }
    }

    fn role(&self) -> Role {
        match self {
            Slot::Exclusive(_) => Role::Writer,
            Slot::Reader(_, n) => Role::Reader(*n),
        }
    }
}

/// The etcd backend. Cheap to clone; clones share the connection, the
/// session leases and the registry of held locks.
///
/// Build it with [`EtcdLocker::from_config`] or [`EtcdLocker::from_url`];
/// [`crate::connect`] does the latter for `etcd://` and `etcd+https://`
/// URLs. See the [module docs](self) for what it guarantees and what it
/// does not.
#[derive(Clone)]
pub struct EtcdLocker {
    inner: Arc<Inner>,
}

struct Inner {
    /// The `Arc` every lease of this locker and its clones shares.
    leases: crate::SharedLocker,
    client: Client,
    prefix: String,
    request_timeout: Duration,
    keepalive_timeout: Duration,
    /// The cluster, without the password, for messages.
    cluster: String,
    /// One session per ttl class (whole seconds).
    sessions: tokio::sync::Mutex<HashMap<u64, Arc<Session>>>,
    registry: Arc<Registry>,
    /// Woken whenever this locker frees a name locally (a release, an
    /// attempt's end, a lost session), for its own waiters.
    freed: Arc<Notify>,
    /// Grants write their holder record into their key's value.
    holder_record: bool,
    /// The number of the next reader's key (`<name>/read-<lease hex>-<n>`).
    readers: AtomicU64,
}

impl fmt::Debug for EtcdLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLocker")
            .field("cluster", &self.inner.cluster)
            .field("key_prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdLocker {
    /// The etcd lock name of `key`: `<prefix><key>`, the name to give
    /// `etcdctl lock` or Go's `concurrency.NewMutex` to share the lock.
    ///
    /// ```no_run
    /// # async fn demo(locker: distlock::etcd::EtcdLocker) {
    /// assert_eq!(locker.backend_key("reports/daily"), "lock:reports/daily");
    /// # }
    /// ```
    pub fn backend_key(&self, key: &str) -> String {
        format!("{}{key}", self.inner.prefix)
    }

    /// The prefix of every lock name this locker uses.
    pub fn key_prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The bound on [`Locker::try_lock`]: four request timeouts (a lease
    /// grant for a new ttl class, the acquire transaction, a read of the
    /// queue when a nested name's key is older than ours, the undo of a
    /// contended attempt). 8 s with the default timeouts.
    pub fn operation_bound(&self) -> Duration {
        self.inner.request_timeout.saturating_mul(4)
    }

    /// The session lease ids this locker holds now, one per ttl class in
    /// use, in hex as etcd's keys and `etcdctl lease list` show them (for
    /// operators and tests).
    pub async fn session_leases(&self) -> Vec<String> {
        let sessions = self.inner.sessions.lock().await;
        let mut leases: Vec<String> = sessions
            .values()
            .filter(|s| !s.is_closed())
            .map(|s| format!("{:x}", s.lease))
            .collect();
        leases.sort();
        leases
    }

    /// The etcd lock name of `key`.
    fn name(&self, key: &str) -> String {
        self.backend_key(key)
    }

    /// Where the secret of `token`'s grant of `key` is: its contender key's
    /// value, or an election candidate's owner key.
    fn secret_at(&self, key: &str, token: &Token) -> SecretAt {
        match token.in_owner_key {
            true => SecretAt::OwnerKey(owner::owner_key(&self.inner.prefix, key, token.lease)),
            false => SecretAt::Value,
        }
    }
}

#[async_trait]
impl Locker for EtcdLocker {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::SESSION_QUEUE
    }

    fn backend_key(&self, key: &str) -> String {
        EtcdLocker::backend_key(self, key)
    }

    /// One attempt, bounded by [`EtcdLocker::operation_bound`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a key the attempt may have written is deleted in the
    /// background (see the [module docs](self)).
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        try_in_queue(self, key, ttl, false).await
    }

    /// Waits in etcd's queue for `key` (woken by the deletion of the key
    /// ahead, in FIFO order), bounded by `timeout` + [`DEADLINE_GRACE`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the waiter's key is deleted in the background.
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        lock_in_queue(self, key, ttl, timeout, false).await
    }

    /// One attempt at a shared (reader) lock, by etcd's reader-writer
    /// recipe in one transaction: write a reader's key into `key`'s queue,
    /// and read the newest writer's key ahead of it; with one there, delete
    /// the reader's key again and report contention. A writer *waiting* in
    /// the queue is ahead too: see [shared locks](self#shared-locks).
    /// Bounded by [`EtcdLocker::operation_bound`].
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Locker::try_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a key the attempt may have written is deleted in the
    /// background (see the [module docs](self)).
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        try_in_queue(self, key, ttl, true).await
    }

    /// Waits in etcd's queue for a shared (reader) lock of `key`, watching
    /// the newest writer's key ahead (woken by its deletion, then looking
    /// again), bounded by `timeout` + [`DEADLINE_GRACE`]. Readers never
    /// wait for readers; they do wait for writers queued before them.
    ///
    /// # Errors
    ///
    /// As [`lock`](Locker::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the waiter's key is deleted in the background.
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        lock_in_queue(self, key, ttl, timeout, true).await
    }

    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        validate::key(key)?;
        let name = self.name(key);
        let Some(token) = Token::parse(owner) else {
            return Err(Error::not_held(key));
        };
        let contender = token.key(&name);
        let at = self.secret_at(key, &token);
        let deleted = self
            .inner
            .request("release", true, || {
                recipe::delete_if_ours(
                    self.inner.kv(),
                    &contender,
                    Some(token.revision),
                    &token.secret,
                    &at,
                )
            })
            .await;
        match deleted {
            Ok(deleted) => {
                self.inner.registry.take(&Slot::of(name, token.role), owner);
                self.inner.freed.notify_waiters();
                Error::unless_held(key, deleted)
            }
            Err(error) => {
                // Held here: keep deleting in the background, so a lock
                // whose session stays alive is not kept for ever.
                self.retry_release(name, contender, owner, token, at);
                Err(error)
            }
        }
    }

    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.refresh_grant(key, owner, ttl).await
    }

    /// One read-only transaction per 128 leases (etcd's default
    /// `--max-txn-ops`; per 64 election candidates' terms, which read their
    /// owner keys too), sent four at a time, instead of
    /// [`refresh`](Locker::refresh)'s transaction per lease: 100,000 held
    /// leases cost about 800 requests per keepalive round, not 100,000.
    /// Each lease answers as `refresh` would; a failed transaction fails
    /// the leases it carried.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        self.refresh_grants(requests).await
    }

    /// Nothing to forget (fencing tokens are etcd's revisions): succeeds if
    /// nobody holds or waits for `key`, [`Error::NotAcquired`] otherwise.
    async fn forget(&self, key: &str) -> Result<()> {
        validate::key(key)?;
        let name = self.name(key);
        if self
            .inner
            .registry
            .state(&Slot::Exclusive(name.clone()))
            .is_some()
        {
            return Err(Error::not_acquired(key));
        }
        match self
            .inner
            .request("forget", false, || {
                recipe::queue_length(self.inner.kv(), &name)
            })
            .await?
        {
            0 => Ok(()),
            _ => Err(Error::not_acquired(key)),
        }
    }

    /// A key of its own per mark (`<key prefix><name>:mark`, no lease: it
    /// outlives every session), raised by compare-and-put transactions (see
    /// `marks.rs`). A write whose answer is lost leaves the outcome unknown.
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        self.raise_mark(name, value).await
    }

    /// Two requests: the first key of the queue (its value's holder record,
    /// its create revision) and its lease's `TimeToLive`; three when its
    /// value holds no record (its owner key, an election candidate's, is
    /// read too; see the [module docs](self#inspection)).
    async fn inspect(&self, key: &str) -> Result<Option<inspect_api::HeldLock>> {
        validate::key(key)?;
        self.inspect_key(key).await
    }

    /// Range reads over `<key prefix><prefix>` in pages of 512 keys (each
    /// under the request timeout, all at one revision), plus one
    /// `TimeToLive` per holding lease.
    async fn list(&self, prefix: &str) -> Result<Vec<inspect_api::HeldLock>> {
        self.list_keys(prefix).await
    }

    /// [`ForceRelease::Lock`](inspect_api::ForceRelease::Lock) deletes the
    /// holder's key (compared on its create revision), handing the lock to
    /// the next waiter; [`ForceRelease::TerminateSession`](inspect_api::ForceRelease::TerminateSession)
    /// revokes the holder's lease, freeing **every** lock under it (see the
    /// [module docs](self#inspection)).
    async fn force_release(
        &self,
        key: &str,
        how: inspect_api::ForceRelease,
    ) -> Result<Option<inspect_api::HeldLock>> {
        validate::key(key)?;
        self.force_release_key(key, how).await
    }
}

impl EtcdLocker {
    /// Retries the release of a lock whose release failed, in the
    /// background, until etcd answers or the session ends. Meanwhile the
    /// key is reserved as being cleaned up
    /// ([`Registry::release_pending`]), so this locker answers an attempt
    /// on it with an error (is it free? nobody knows) rather than
    /// contention. Nothing if `owner` no longer holds it here: the release
    /// is already retried, or the session was lost.
    fn retry_release(
        &self,
        name: String,
        contender: String,
        owner: &str,
        token: Token,
        at: SecretAt,
    ) {
        let slot = Slot::of(name, token.role);
        let Some((held, ticket)) = self.inner.registry.release_pending(slot, owner) else {
            return;
        };
        let written = Written {
            key: contender,
            secret: token.secret,
            revision: Some(token.revision),
            session: held.session,
            at,
        };
        delete_in_background(self.inner.clone(), written, ticket, "a failed release's");
    }
}
