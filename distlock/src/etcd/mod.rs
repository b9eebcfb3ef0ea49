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
//!   to forget).
//! - **Marks** ([`Locker::advance_mark`]): a key per mark,
//!   `<key prefix><name>:mark` with `/` and `%` in the name
//!   percent-encoded (a `/` would put it inside the queue of another lock),
//!   without a lease, raised by compare-and-put transactions.
//! - **Release** deletes the holder's key only if its create revision is
//!   still the granted one *and* its value is still the grant's secret (a
//!   compare-and-delete transaction): a retried or stale unlock never
//!   deletes a newer holder's key (etcd issue
//!   <https://github.com/etcd-io/etcd/issues/22082> is what deleting by
//!   name alone did).
//! - **Owner tokens** are `<lease id hex>:<create revision>:<secret>` (the
//!   secret is 128 random bits, the first line of the key's value), so
//!   [`Locker::unlock`] and [`Locker::refresh`] work from any process that
//!   has the token ([`Capabilities::unlock_by_owner`]).
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
//!   `--max-txn-ops`) in one read-only transaction; on a cluster started
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
//! - **Closing.** [`EtcdLocker::close`] (or dropping the last clone of the
//!   locker and every lease it granted) stops the keep-alives and revokes
//!   the session leases, which frees every lock still held under them at
//!   once.
//! - **Cancel safety**: dropping a `try_lock` or `lock` future is safe: a
//!   key it may have written is deleted in the background. Dropping a
//!   release or refresh leaves the lock as the request left it.
//!
//! # Inspection
//!
//! - **The record** is the value of the contender's key
//!   `<name>/<lease hex>`: the grant's secret on the first line, then the
//!   holder record (host, pid, label, grant time on the **holder's** clock,
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
//!   A key written by `etcdctl lock` or Go's `concurrency.Mutex` (an empty
//!   value) is held by an unknown holder, never free.
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
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Certificate, Client, ConnectOptions, TlsOptions};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::deadline::{bounded, checked_deadline};
use crate::inspect::{self as inspect_api, HolderRecord};
use crate::session_registry::{Busy, Held, Ticket};
use crate::util::decode_mark;
use crate::{
    new_owner_token, validate, Capabilities, Error, Lease, LeaseParts, Locker, MarkAdvance,
    RefreshRequest, Result, DEADLINE_GRACE,
};

mod config;
mod errors;
mod inspect;
mod marks;
mod recipe;
mod session;

pub use config::{
    Config, Password, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_KEY_PREFIX,
    DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT, ENV_PREFIX,
};

use recipe::{contender_key, Enqueued, Token, WatchFailure, Watched};
use session::Session;

const BACKEND: &str = "etcd";

/// The most [`Locker::refresh_many`] transactions of one batch on their way
/// at once: enough to keep a round trip's worth of reads going, few enough
/// that the answers of a 100,000-lease batch (every key's value) are not
/// all buffered at once.
const REFRESH_TXNS_IN_FLIGHT: usize = 4;

/// Which lock names this locker holds, on which session, for which owner.
pub(crate) type Registry = crate::session_registry::Registry<String, Session>;

/// The first and the largest pause between tries of a background clean-up.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(1);

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
    /// Connects to the cluster `config` names and checks that it answers a
    /// linearizable read (so a cluster without quorum fails here), within
    /// `connect_timeout + request_timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a config that names no endpoint or is
    /// otherwise unusable (an unreadable `ca_file`), [`Error::Backend`] if
    /// the cluster cannot be reached or rejects the credentials,
    /// [`Error::DeadlineExceeded`] if it does not answer within the bound.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: nothing is written while connecting.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use distlock::etcd::{Config, EtcdLocker};
    ///
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let locker = EtcdLocker::from_config(Config::from_env()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_config(config: Config) -> Result<Self> {
        let urls = config.endpoint_urls()?;
        let cluster = config.display_url();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(config.keepalive_timeout, config.keepalive_timeout)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some(user) = &config.username {
            let password = config.password.as_ref().map_or("", Password::expose);
            options = options.with_user(user.clone(), password);
        }
        if config.uses_tls() {
            let tls = match &config.ca_file {
                Some(path) => {
                    let pem = std::fs::read(path).map_err(|e| {
                        Error::invalid(
                            "config",
                            format!("cannot read ca_file {}: {e}", path.display()),
                        )
                    })?;
                    TlsOptions::new().ca_certificate(Certificate::from_pem(pem))
                }
                None => TlsOptions::new().with_native_roots(),
            };
            options = options.with_tls(tls);
        }
        let bound = config
            .connect_timeout
            .saturating_add(config.request_timeout);
        let client = bounded(BACKEND, "connect", bound, async {
            let client = Client::connect(&urls, Some(options))
                .await
                .map_err(|e| errors::backend(&cluster, "connect", e, false))?;
            // Connecting is lazy: one linearizable read proves a quorum.
            recipe::queue_length(client.kv_client(), &config.key_prefix)
                .await
                .map_err(|e| errors::backend(&cluster, "connect", e, false))?;
            Ok(client)
        })
        .await?;
        Ok(EtcdLocker {
            inner: Arc::new(Inner {
                leases: crate::SharedLocker::default(),
                client,
                prefix: config.key_prefix,
                request_timeout: config.request_timeout,
                keepalive_timeout: config.keepalive_timeout,
                cluster,
                sessions: tokio::sync::Mutex::default(),
                registry: Arc::new(Registry::new(BACKEND)),
                freed: Arc::new(Notify::new()),
                holder_record: config.holder_record,
            }),
        })
    }

    /// Connects to the cluster an `etcd://` or `etcd+https://` URL names
    /// (see [`Config::from_url`] for the format).
    ///
    /// # Errors
    ///
    /// As [`from_config`](Self::from_config), and [`Error::InvalidInput`]
    /// for a malformed URL (the message never contains the password).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: nothing is written while connecting.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let locker = distlock::etcd::EtcdLocker::from_url("etcd://127.0.0.1:2379?prefix=jobs:").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::from_config(Config::from_url(url)?).await
    }

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

    /// Stops every keep-alive and revokes every session lease, which frees
    /// at once every lock this locker still holds (their lost signals fire
    /// with [`LostReason::ConnectionLost`](crate::LostReason::ConnectionLost)). Each revoke is bounded by the
    /// request timeout; a lease whose revoke fails expires at its ttl. Later
    /// acquires open new sessions.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after it started leaves the keep-alives
    /// stopped; leases not yet revoked expire at their ttl.
    pub async fn close(&self) {
        let sessions: Vec<Arc<Session>> = {
            let mut map = self.inner.sessions.lock().await;
            map.drain().map(|(_, session)| session).collect()
        };
        for session in sessions {
            session.stop();
            self.inner.registry.session_closed(
                session.lease as u64,
                "the locker was closed",
                Duration::ZERO,
            );
            let mut lease = self.inner.client.lease_client();
            let revoked =
                tokio::time::timeout(self.inner.request_timeout, lease.revoke(session.lease)).await;
            if !matches!(revoked, Ok(Ok(_))) {
                tracing::warn!(
                    component = "distlock",
                    backend = BACKEND,
                    lease = format_args!("{:x}", session.lease),
                    "could not revoke an etcd session lease; it expires at its ttl"
                );
            }
        }
        self.inner.freed.notify_waiters();
    }

    /// The etcd lock name of `key`.
    fn name(&self, key: &str) -> String {
        self.backend_key(key)
    }

    /// Runs one request under the request timeout: an etcd-client error
    /// becomes [`Error::Backend`] (`outcome_unknown` if the request writes
    /// and may have been applied), the timeout [`Error::DeadlineExceeded`].
    async fn request<T, Fut>(
        &self,
        operation: &'static str,
        writes: bool,
        call: impl FnMut() -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.inner.request(operation, writes, call).await
    }

    /// The contender key and token a refresh of `key` by `owner` reads, or
    /// its answer when no read is needed: the request is invalid, the token
    /// is not one of ours, or its session has ended (its lease is gone).
    fn grant_to_check(&self, key: &str, owner: &str, ttl: Duration) -> Result<(String, Token)> {
        validate::acquire(key, ttl)?;
        let not_held = || Error::NotHeld {
            key: key.to_owned(),
        };
        let token = Token::parse(owner).ok_or_else(not_held)?;
        let name = self.name(key);
        if self
            .inner
            .registry
            .session_of(&name, owner)
            .is_some_and(|session| session.is_closed())
        {
            return Err(not_held());
        }
        Ok((contender_key(&name, token.lease), token))
    }

    /// [`Locker::refresh_many`] of at most [`recipe::MAX_TXN_OPS`] leases:
    /// the ones that need a read are read in one transaction.
    async fn refresh_chunk(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let checks: Vec<Result<(String, Token)>> = requests
            .iter()
            .map(|request| self.grant_to_check(request.key, request.owner, request.ttl))
            .collect();
        let grants: Vec<recipe::Grant<'_>> = checks
            .iter()
            .filter_map(|check| check.as_ref().ok())
            .map(|(contender, token)| recipe::Grant {
                key: contender,
                revision: token.revision,
                secret: &token.secret,
            })
            .collect();
        let read = if grants.is_empty() {
            Ok(Vec::new())
        } else {
            self.request("refresh", false, || {
                recipe::still_ours_many(self.inner.kv(), &grants)
            })
            .await
        };
        let mut ours = read.as_deref().unwrap_or_default().iter();
        checks
            .into_iter()
            .zip(requests)
            .map(|(check, request)| match (check, &read) {
                (Err(answer), _) => Err(answer),
                (Ok(_), Ok(_)) => still_held(request.key, ours.next().copied().unwrap_or(false)),
                (Ok(_), Err(error)) => Err(error.duplicate()),
            })
            .collect()
    }

    /// The live session of `ttl`'s class, granting a lease if there is none.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        let seconds = lease_seconds(ttl);
        let mut sessions = self.inner.sessions.lock().await;
        if let Some(session) = sessions.get(&seconds).filter(|s| !s.is_closed()) {
            return Ok(session.clone());
        }
        let granted_at = Instant::now();
        let ttl_arg = i64::try_from(seconds).unwrap_or(i64::MAX);
        // A grant whose answer is lost leaves a lease with no keys, which
        // expires at its ttl.
        let granted = self
            .request("grant lease", false, || {
                let mut lease_client = self.inner.client.lease_client();
                async move { lease_client.grant(ttl_arg, None).await }
            })
            .await?;
        let granted_ttl = Duration::from_secs(granted.ttl().unsigned_abs().max(seconds));
        let session = Session::start(
            self.inner.client.clone(),
            self.inner.registry.clone(),
            self.inner.freed.clone(),
            granted.id(),
            granted_ttl,
            granted_at,
            self.inner.keepalive_timeout,
        );
        sessions.insert(seconds, session.clone());
        Ok(session)
    }

    /// Reserves `name` for one attempt of this locker, waiting (woken by
    /// local releases) until `deadline` while another of its attempts or
    /// grants has it; `None` at the deadline. An abandoned attempt still
    /// being cleaned up at the deadline (the cluster is failing) is an
    /// error, not a timeout: whether the key is free is unknown.
    async fn reserve_waiting(
        &self,
        key: &str,
        name: &str,
        deadline: Option<Instant>,
    ) -> Result<Option<Ticket<String>>> {
        loop {
            let freed = self.inner.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a release in between wakes us.
            freed.as_mut().enable();
            if let Ok(ticket) = self.inner.registry.reserve(name.to_owned()) {
                return Ok(Some(ticket));
            }
            tokio::select! {
                () = freed => {}
                () = crate::deadline::sleep_until(deadline) => {
                    return match self.inner.registry.state(&name.to_owned()) {
                        Some(Busy::CleaningUp) => Err(cleaning_up(key)),
                        _ => Ok(None),
                    };
                }
            }
        }
    }

    /// One acquire: `wait` is `None` for a single attempt, or the deadline
    /// (`None`: for ever) to wait in the queue until. `Ok(None)` is
    /// contention (or, when waiting, the deadline).
    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Option<Option<Instant>>,
    ) -> Result<Option<Lease>> {
        let name = self.name(key);
        let ticket = match wait {
            None => match self.inner.registry.reserve(name.clone()) {
                Ok(ticket) => ticket,
                Err(Busy::Contended) => return Ok(None),
                Err(Busy::CleaningUp) => return Err(cleaning_up(key)),
            },
            Some(deadline) => match self.reserve_waiting(key, &name, deadline).await? {
                Some(ticket) => ticket,
                None => return Ok(None),
            },
        };
        let mut attempt = Attempt {
            inner: self.inner.clone(),
            ticket: Some(ticket),
            written: None,
        };
        let secret = new_owner_token();
        // Read on the caller's task, where its label scope is.
        let record = self.inner.holder_record.then(|| HolderRecord::now(ttl));
        let value = recipe::contender_value(&secret, record.as_ref());
        let mut renewed_session = false;
        let (session, revision, first) = loop {
            let session = self.session(ttl).await?;
            let key_name = contender_key(&name, session.lease);
            // From here on the key may be written: armed.
            attempt.written = Some(Written {
                key: key_name.clone(),
                secret: secret.clone(),
                revision: None,
                session: session.clone(),
            });
            let enqueued = self
                .inner
                .call(|| recipe::enqueue(self.inner.kv(), &name, session.lease, &value))
                .await;
            match enqueued {
                Some(Ok(Enqueued::Written { revision, first })) => {
                    break (session, revision, first)
                }
                Some(Ok(Enqueued::Orphan { revision })) => {
                    // Not written by this attempt: nothing of ours to undo
                    // but the orphan itself, which no grant owns (the
                    // registry reserved the name).
                    attempt.disarm();
                    tracing::warn!(
                        component = "distlock",
                        backend = BACKEND,
                        key,
                        "deleting an orphaned etcd lock key of this locker's lease"
                    );
                    self.request("acquire", true, || {
                        recipe::delete_orphan(self.inner.kv(), &key_name, revision)
                    })
                    .await?;
                    if renewed_session {
                        return Err(errors::plain(
                            "acquire",
                            format!("{key_name} reappeared after its orphan was deleted"),
                        ));
                    }
                    renewed_session = true;
                }
                Some(Err(error)) if errors::lease_not_found(&error) && !renewed_session => {
                    // The session lease is gone (revoked, or expired before
                    // its keep-alive noticed): nothing was written. Its locks
                    // are lost; try once more on a new session.
                    attempt.disarm();
                    session.lost(
                        &self.inner.registry,
                        "etcd no longer knows the lease",
                        Duration::ZERO,
                    );
                    renewed_session = true;
                }
                Some(Err(error)) => {
                    let unknown = !errors::certainly_not_applied(&error);
                    if unknown {
                        attempt.undo_now().await;
                    } else {
                        attempt.disarm();
                    }
                    return Err(errors::backend(
                        &self.inner.cluster,
                        "acquire",
                        error,
                        unknown,
                    ));
                }
                None => {
                    attempt.undo_now().await;
                    return Err(Error::DeadlineExceeded {
                        backend: BACKEND,
                        operation: "acquire",
                        after: self.inner.request_timeout,
                    });
                }
            }
        };
        if let Some(written) = attempt.written.as_mut() {
            written.revision = Some(revision);
        }
        let key_name = contender_key(&name, session.lease);
        let first = match first {
            Some(first) => first == revision,
            // A nested name's key is older than ours: is one of ours?
            None => self
                .request("acquire", false, || {
                    recipe::ahead_of(self.inner.kv(), &name, revision)
                })
                .await?
                .is_none(),
        };
        if !first {
            match wait {
                None => {
                    // Not first: leave the queue and report contention.
                    attempt.undo_now().await;
                    return Ok(None);
                }
                Some(deadline) => {
                    if !self.wait_turn(&name, revision, deadline).await? {
                        attempt.undo_now().await;
                        return Ok(None);
                    }
                    // etcd can hand the lock to a key whose lease expired
                    // during the wait: check ours is still there.
                    let ours = self
                        .request("acquire", false, || {
                            recipe::still_ours(self.inner.kv(), &key_name, revision, &secret)
                        })
                        .await?;
                    if !ours {
                        attempt.disarm();
                        return Err(errors::plain(
                            "acquire",
                            format!("{key_name} vanished while waiting: the session lease expired"),
                        ));
                    }
                }
            }
        }
        let token = Token {
            lease: session.lease,
            revision,
            secret,
        }
        .encode();
        let lease = Lease::new(
            LeaseParts {
                key: key.to_owned(),
                owner: token.clone(),
                fencing_token: u64::try_from(revision).ok(),
                ttl,
                valid_until: None,
            },
            self.inner.leases.get_or_init(|| Arc::new(self.clone())),
        );
        let held = Held {
            owner: token,
            session: session.clone(),
            lost: lease.lost_notifier(),
        };
        if self.inner.registry.grant(name, held).is_err() {
            // The session died meanwhile: its lease, and so the key, is gone.
            attempt.disarm();
            return Err(errors::plain(
                "acquire",
                format!("the session lease of {key_name} was lost while acquiring"),
            ));
        }
        attempt.granted();
        Ok(Some(lease))
    }

    /// Waits until no key is ahead of revision `revision` in `name`'s queue
    /// (true), or until `deadline` (false). A failure still current at the
    /// deadline (the last read or watch failed, and nothing answered since)
    /// is reported as that error, not as a timeout: an outage is not
    /// contention. One that a later read answered is forgotten, so a brief
    /// outage early in a wait does not turn its plain timeout into one.
    async fn wait_turn(
        &self,
        name: &str,
        revision: i64,
        deadline: Option<Instant>,
    ) -> Result<bool> {
        let mut watch = self.inner.client.watch_client();
        let mut last_error: Option<Error> = None;
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return match last_error {
                    Some(error) => Err(error),
                    None => Ok(false),
                };
            }
            let ahead = match self
                .request("acquire", false, || {
                    recipe::ahead_of(self.inner.kv(), name, revision)
                })
                .await
            {
                // etcd answers again: whatever failed before is over.
                Ok(ahead) => {
                    last_error = None;
                    ahead
                }
                Err(error) => {
                    last_error = Some(error);
                    self.pause(deadline).await;
                    continue;
                }
            };
            let Some((key, read_at)) = ahead else {
                return Ok(true);
            };
            match recipe::wait_deleted(
                &mut watch,
                key,
                read_at,
                deadline,
                self.inner.request_timeout,
            )
            .await
            {
                Ok(Watched::Deleted | Watched::TimedOut) => {}
                Err(failure) => {
                    last_error = Some(match failure {
                        WatchFailure::Etcd(error) => {
                            errors::backend(&self.inner.cluster, "acquire", error, false)
                        }
                        WatchFailure::Canceled(reason) => {
                            errors::plain("acquire", format!("etcd canceled the watch: {reason}"))
                        }
                        WatchFailure::TimedOut => Error::DeadlineExceeded {
                            backend: BACKEND,
                            operation: "acquire",
                            after: self.inner.request_timeout,
                        },
                    });
                    self.pause(deadline).await;
                }
            }
        }
    }

    /// A short pause between tries of a wait step, never past `deadline`.
    async fn pause(&self, deadline: Option<Instant>) {
        let until = crate::deadline::saturating_deadline(Instant::now(), FIRST_RETRY);
        let until = deadline.map_or(until, |d| d.min(until));
        tokio::time::sleep_until(until).await;
    }
}

impl Inner {
    /// Runs one request under the request timeout: an etcd-client error
    /// becomes [`Error::Backend`] (`outcome_unknown` if the request writes
    /// and may have been applied), the timeout [`Error::DeadlineExceeded`].
    async fn request<T, Fut>(
        &self,
        operation: &'static str,
        writes: bool,
        call: impl FnMut() -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        match self.call(call).await {
            Some(Ok(value)) => Ok(value),
            Some(Err(error)) => {
                let unknown = writes && !errors::certainly_not_applied(&error);
                Err(errors::backend(&self.cluster, operation, error, unknown))
            }
            None => Err(Error::DeadlineExceeded {
                backend: BACKEND,
                operation,
                after: self.request_timeout,
            }),
        }
    }

    /// Runs `call` until it is answered, sending it again while it failed
    /// without leaving this process (etcd-client balances requests over
    /// every endpoint, a member that is down included: a request the
    /// balancer sent to it fails to connect, and the next one likely goes
    /// to a live member); `None` once the request timeout passed.
    async fn call<T, Fut>(
        &self,
        mut call: impl FnMut() -> Fut,
    ) -> Option<std::result::Result<T, etcd_client::Error>>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        const RESEND_PAUSE: Duration = Duration::from_millis(20);
        let deadline = crate::deadline::saturating_deadline(Instant::now(), self.request_timeout);
        loop {
            match tokio::time::timeout_at(deadline, call()).await {
                Ok(Err(error))
                    if errors::not_sent(&error)
                        && crate::deadline::saturating_deadline(Instant::now(), RESEND_PAUSE)
                            < deadline =>
                {
                    tokio::time::sleep(RESEND_PAUSE).await;
                }
                Ok(answer) => return Some(answer),
                Err(_) => return None,
            }
        }
    }

    fn kv(&self) -> etcd_client::KvClient {
        self.client.kv_client()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last clone and the last lease are gone: stop renewing and
        // revoke, so the locks are freed now rather than at ttl expiry.
        let sessions: Vec<Arc<Session>> = self.sessions.get_mut().drain().map(|(_, s)| s).collect();
        if sessions.is_empty() {
            return;
        }
        for session in &sessions {
            session.stop();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(component = "distlock", backend = BACKEND,
                "etcd locker dropped outside a tokio runtime: its session leases expire at their ttl");
            return;
        };
        let client = self.client.clone();
        let timeout = self.request_timeout;
        runtime.spawn(async move {
            let mut lease = client.lease_client();
            for session in sessions {
                let _ = tokio::time::timeout(timeout, lease.revoke(session.lease)).await;
            }
        });
    }
}

/// The whole seconds of an etcd lease for `ttl`: rounded up, at least 1.
fn lease_seconds(ttl: Duration) -> u64 {
    let whole = ttl.as_secs();
    let seconds = if ttl.subsec_nanos() > 0 {
        whole.saturating_add(1)
    } else {
        whole
    };
    seconds.max(1)
}

/// A refresh's answer once etcd said whether `key`'s grant is still there.
fn still_held(key: &str, ours: bool) -> Result<()> {
    if ours {
        Ok(())
    } else {
        Err(Error::NotHeld {
            key: key.to_owned(),
        })
    }
}

fn cleaning_up(key: &str) -> Error {
    errors::plain(
        "acquire",
        format!(
            "this locker's abandoned attempt or failed release of {key:?} has not reached etcd yet (it is retried in the background); whether the key is free is unknown until it does"
        ),
    )
}

/// A key an attempt may have written.
struct Written {
    key: String,
    secret: String,
    /// Its create revision, once known.
    revision: Option<i64>,
    session: Arc<Session>,
}

/// One attempt's reservation of a name, and the key it may have written:
/// dropped while a key may be written (a cancelled future, an error), it
/// deletes that key in the background and only then ends the reservation.
struct Attempt {
    inner: Arc<Inner>,
    ticket: Option<Ticket<String>>,
    written: Option<Written>,
}

impl Attempt {
    /// Nothing of this attempt is on the server.
    fn disarm(&mut self) {
        self.written = None;
    }

    /// The lock was granted and recorded: end the reservation only.
    fn granted(mut self) {
        self.written = None;
    }

    /// Deletes the key this attempt may have written, once, bounded by the
    /// request timeout; on failure the drop retries in the background.
    async fn undo_now(&mut self) {
        let Some(written) = &self.written else {
            return;
        };
        let deleted = self
            .inner
            .call(|| {
                recipe::delete_if_ours(
                    self.inner.kv(),
                    &written.key,
                    written.revision,
                    &written.secret,
                )
            })
            .await;
        if matches!(deleted, Some(Ok(_))) {
            self.written = None;
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let Some(written) = self.written.take() else {
            self.inner.registry.release(ticket);
            self.inner.freed.notify_waiters();
            return;
        };
        self.inner.registry.cleaning_up(ticket.clone());
        delete_in_background(
            self.inner.clone(),
            written,
            Some(ticket),
            "an abandoned attempt's",
        );
    }
}

/// Deletes `written` if it is still ours, in the background
/// ([`delete_until_done`]), then ends `ticket`'s reservation and wakes this
/// locker's waiters. `whose` names the key in the log. Without a runtime
/// nothing can retry the delete: the key lives until its session lease
/// ends, and the reservation ends at once.
fn delete_in_background(
    inner: Arc<Inner>,
    written: Written,
    ticket: Option<Ticket<String>>,
    whose: &'static str,
) {
    let end = move |inner: &Inner| {
        if let Some(ticket) = ticket {
            inner.registry.release(ticket);
        }
        inner.freed.notify_waiters();
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(component = "distlock", backend = BACKEND, key = written.key, whose,
            "an etcd lock key cannot be deleted without a runtime; it lives until the session lease ends");
        end(&inner);
        return;
    };
    runtime.spawn(async move {
        delete_until_done(&inner, &written).await;
        end(&inner);
    });
}

/// Deletes `key` if it is still ours, retrying with backoff until that is
/// answered or the session ends (its lease takes the key with it).
async fn delete_until_done(inner: &Inner, written: &Written) {
    let Written {
        key,
        secret,
        revision,
        session,
    } = written;
    let key = key.as_str();
    let mut delay = FIRST_RETRY;
    loop {
        match inner
            .request("release", true, || {
                recipe::delete_if_ours(inner.kv(), key, *revision, secret)
            })
            .await
        {
            Ok(_) => return,
            Err(error) if session.is_closed() => {
                tracing::debug!(component = "distlock", backend = BACKEND, key, %error,
                    "stopped deleting an etcd lock key: its session lease ended");
                return;
            }
            Err(error) => {
                tracing::debug!(component = "distlock", backend = BACKEND, key, %error,
                    "deleting an etcd lock key failed; retrying");
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2).min(MAX_RETRY);
            }
        }
    }
}

#[async_trait]
impl Locker for EtcdLocker {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            expires: false,
            refresh: true,
            unlock_by_owner: true,
            release_wakeup: true,
            release_notifications: false,
            fencing: true,
            marks: true,
            inspect: true,
            list: true,
            force_release: true,
        }
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
        validate::acquire(key, ttl)?;
        bounded(
            BACKEND,
            "acquire",
            self.operation_bound(),
            self.acquire(key, ttl, None),
        )
        .await
    }

    /// Waits in etcd's queue for `key` (woken by the deletion of the key
    /// ahead, in FIFO order), bounded by `timeout` + [`DEADLINE_GRACE`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the waiter's key is deleted in the background.
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        validate::acquire(key, ttl)?;
        if timeout.is_zero() {
            return match self.try_lock(key, ttl).await? {
                Some(lease) => Ok(lease),
                None => Err(Error::NotAcquired {
                    key: key.to_owned(),
                }),
            };
        }
        let deadline = checked_deadline(Instant::now(), timeout);
        let limit = timeout.saturating_add(DEADLINE_GRACE);
        match bounded(
            BACKEND,
            "acquire",
            limit,
            self.acquire(key, ttl, Some(deadline)),
        )
        .await?
        {
            Some(lease) => Ok(lease),
            None => Err(Error::Timeout {
                key: key.to_owned(),
                waited: timeout,
            }),
        }
    }

    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        validate::key(key)?;
        let name = self.name(key);
        let Some(token) = Token::parse(owner) else {
            return Err(Error::NotHeld {
                key: key.to_owned(),
            });
        };
        let contender = contender_key(&name, token.lease);
        let deleted = self
            .request("release", true, || {
                recipe::delete_if_ours(
                    self.inner.kv(),
                    &contender,
                    Some(token.revision),
                    &token.secret,
                )
            })
            .await;
        match deleted {
            Ok(deleted) => {
                self.inner.registry.take(&name, owner);
                self.inner.freed.notify_waiters();
                if deleted {
                    Ok(())
                } else {
                    Err(Error::NotHeld {
                        key: key.to_owned(),
                    })
                }
            }
            Err(error) => {
                // Held here: keep deleting in the background, so a lock
                // whose session stays alive is not kept for ever.
                self.retry_release(name, contender, owner, token);
                Err(error)
            }
        }
    }

    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        let (contender, token) = self.grant_to_check(key, owner, ttl)?;
        let ours = self
            .request("refresh", false, || {
                recipe::still_ours(self.inner.kv(), &contender, token.revision, &token.secret)
            })
            .await?;
        still_held(key, ours)
    }

    /// One read-only transaction per 128 leases (etcd's default
    /// `--max-txn-ops`), sent four at a time, instead of
    /// [`refresh`](Locker::refresh)'s transaction per lease: 100,000 held
    /// leases cost about 800 requests per keepalive round, not 100,000.
    /// Each lease answers as `refresh` would; a failed transaction fails
    /// the leases it carried.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let mut answers = Vec::with_capacity(requests.len());
        for wave in requests.chunks(recipe::MAX_TXN_OPS * REFRESH_TXNS_IN_FLIGHT) {
            let chunks = wave.chunks(recipe::MAX_TXN_OPS);
            let answered =
                futures_util::future::join_all(chunks.map(|chunk| self.refresh_chunk(chunk))).await;
            answers.extend(answered.into_iter().flatten());
        }
        answers
    }

    /// Nothing to forget (fencing tokens are etcd's revisions): succeeds if
    /// nobody holds or waits for `key`, [`Error::NotAcquired`] otherwise.
    async fn forget(&self, key: &str) -> Result<()> {
        validate::key(key)?;
        let name = self.name(key);
        if self.inner.registry.state(&name).is_some() {
            return Err(Error::NotAcquired {
                key: key.to_owned(),
            });
        }
        match self
            .request("forget", false, || {
                recipe::queue_length(self.inner.kv(), &name)
            })
            .await?
        {
            0 => Ok(()),
            _ => Err(Error::NotAcquired {
                key: key.to_owned(),
            }),
        }
    }

    /// A key of its own per mark (`<key prefix><name>:mark`, no lease: it
    /// outlives every session), raised by compare-and-put transactions (see
    /// `marks.rs`). A write whose answer is lost leaves the outcome unknown.
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        validate::key(name)?;
        let key = marks::mark_key(&self.inner.prefix, name);
        let raw = self
            .request("advance_mark", true, || {
                marks::advance(self.inner.kv(), &key, value)
            })
            .await?;
        let decode = |stored: &str| {
            decode_mark(stored).ok_or_else(|| {
                errors::plain(
                    "advance_mark",
                    format!("{key} holds {stored:?}, which distlock did not write"),
                )
            })
        };
        match raw {
            Some(marks::Raw::Advanced { previous: None }) => {
                Ok(MarkAdvance::Advanced { previous: None })
            }
            Some(marks::Raw::Advanced {
                previous: Some(previous),
            }) => Ok(MarkAdvance::Advanced {
                previous: Some(decode(&previous)?),
            }),
            Some(marks::Raw::AlreadyAt { current }) => Ok(MarkAdvance::AlreadyAt {
                current: decode(&current)?,
            }),
            None => Err(errors::plain(
                "advance_mark",
                format!("{key} was deleted and recreated by another client on every try"),
            )),
        }
    }
    /// Two requests: the first key of the queue (its value's holder record,
    /// its create revision) and its lease's `TimeToLive` (see the
    /// [module docs](self#inspection)).
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
    fn retry_release(&self, name: String, contender: String, owner: &str, token: Token) {
        let Some((held, ticket)) = self.inner.registry.release_pending(name, owner) else {
            return;
        };
        let written = Written {
            key: contender,
            secret: token.secret,
            revision: Some(token.revision),
            session: held.session,
        };
        delete_in_background(self.inner.clone(), written, ticket, "a failed release's");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(lease_seconds(Duration::from_millis(1)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(400)), 1);
        assert_eq!(lease_seconds(Duration::from_secs(1)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1200)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
        assert_eq!(lease_seconds(validate::MAX_TTL), 365 * 24 * 3600);
    }
}
