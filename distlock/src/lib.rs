//! Distributed locks with one contract for many backends.
//!
//! A [`Locker`] grants [`Lease`]s on string keys. Every backend (in-process
//! [`memory`], cross-process [`file`](mod@file), and the server backends behind cargo
//! features) implements the same trait and reports the same [`Error`] kinds, so
//! switching backend never changes how errors are classified. Cross-cutting
//! behaviour is written once as wrappers around any `Locker` and composed with
//! [`LockerExt`]: [`WaitLocker`] (wait policy), [`PrefixLocker`] (key namespaces),
//! [`BreakerLocker`] (fail fast while a backend is down), [`MetricsLocker`] and
//! [`TraceLocker`] (observability). Leader election ([`elect`]) and
//! counting semaphores ([`semaphore`]) are composed over the same contract,
//! so they work on every backend too.
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = distlock::connect("memory://").await?;
//!
//! // Acquire (waiting up to 5 s), run, release — even if this future is dropped.
//! let total = distlock::with_lock(
//!     &*locker,
//!     "nightly-report",
//!     Duration::from_secs(30),
//!     Duration::from_secs(5),
//!     || async { 40 + 2 },
//! )
//! .await?;
//! assert_eq!(total, 42);
//!
//! // Or hold the lease yourself.
//! let lease = locker
//!     .try_lock("nightly-report", Duration::from_secs(30))
//!     .await?
//!     .expect("nobody else holds it");
//! println!("fencing token {:?}", lease.fencing_token());
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # The contract
//!
//! - [`Locker::try_lock`] makes one attempt. `Ok(None)` means the lock is held
//!   elsewhere: contention is an answer, not a failure.
//! - [`Locker::lock`] waits up to a timeout (zero means one attempt), waking on
//!   a release where the backend can say so and polling with jittered backoff
//!   otherwise.
//! - [`Locker::unlock`] releases by `(key, owner token)` only: a non-holder
//!   gets [`Error::NotHeld`] and nothing is deleted.
//! - [`Locker::refresh`] extends the ttl, owner-checked, where the backend
//!   supports it ([`Capabilities`]).
//! - A [`Lease`] carries a strictly increasing fencing token and a
//!   [`LostSignal`]; dropping it still releases the lock.
//! - [`Locker::try_lock_shared`] and [`Locker::lock_shared`] take a shared
//!   (reader) lease where [`Capabilities::shared`] says so: shared holders
//!   coexist, an exclusive lock excludes them and they exclude it. A shared
//!   lease is a [`Lease`] like any other; its fencing token is the key's
//!   latest exclusive grant's, not advanced (see
//!   [`try_lock_shared`](Locker::try_lock_shared)).
//!
//! # Backends
//!
//! | URL | module | feature | lock freed when holder crashes |
//! | --- | --- | --- | --- |
//! | `memory://` | [`memory`] | always | n/a (in-process) |
//! | `file:///dir` | [`file`](mod@file) | always | at once (kernel drops the `flock`) |
//! | `redis://host:6379`, `rediss://` | `redis` | `redis` | at ttl expiry (Redis enforces the ttl) |
//! | `redis+cluster://h1:7000,h2:7000`, `rediss+cluster://` | `redis` (Redis Cluster) | `redis` | at ttl expiry |
//! | `redis+sentinel://s1:26379,s2:26379/MASTER`, `rediss+sentinel://` | `redis` (master found through Sentinel) | `redis` | at ttl expiry |
//! | `redlock://h1:6379,h2:6379,h3:6379` | `redlock` | `redlock` | at ttl expiry on each node; no fencing tokens (see its docs) |
//! | `postgres://user@host/db`, `postgresql://` | `postgres` | `postgres` | when the server ends the session: at once if the process dies, about 11 s if its host vanishes |
//! | `etcd://host1:2379,host2:2379`, `etcd+https://` | `etcd` | `etcd` | at lease expiry: one ttl (whole seconds) after the last keep-alive, up to one more after a leader change |
//! | `mysql://user@host:3306/db`, `mariadb://` | `mysql` | `mysql` | when the server ends the session: at once if the process dies, 14 to 15 s if its host vanishes |
//! | `zookeeper://host1:2181,host2:2181[/chroot]` | `zookeeper` | `zookeeper` | at session expiry: one negotiated session timeout after the server last heard from the holder |
//!
//! Every server backend reads its settings through [`config`]: one syntax per
//! kind of value and one name per concept, from a URL, `DISTLOCK_<BACKEND>_*`
//! variables, JSON or YAML.
//!
//! # Where to add things
//!
//! - **A backend**: a folder beside `redis/` or `etcd/` behind its own cargo
//!   feature, split by role (`mod.rs` the type and its [`Locker`] impl, or
//!   `locker.rs` for the impl where the module docs fill `mod.rs`, as in
//!   `redis/`; `acquire.rs`, `client.rs`, `config.rs` with its field table), a row in
//!   `parse.rs`'s scheme table, and a module in the conformance suite
//!   (`testkit`). A SQL server whose locks live on sessions (SQL Server's
//!   `sp_getapplock`, Oracle's `DBMS_LOCK`) is a dialect over the shared core
//!   in `src/sql/` (the session pool, the registry of held locks, the lock
//!   flow, the fencing table's name, and the one [`Locker`] impl over the
//!   `Dialect` trait in `sql/dialect.rs`), not a copy of `postgres/` or
//!   `mysql/`: its folder holds its driver session, SQL text, key mapping,
//!   TLS and errors.
//! - **A coordination primitive** (election, semaphore): a
//!   module written once over [`Locker`] and [`Lease`], so every backend and
//!   every wrapper serves it, with its checks in the conformance suite; a
//!   backend-native path only where it measures better or a backend's own
//!   tools must interoperate.
//! - **Shared locks on a backend**: they need the backend's own reader
//!   mode (`flock(LOCK_SH)`, readers beside the exclusive entry, a reader
//!   set beside the Redis lock key), so
//!   they are trait methods, not a module over [`Locker`]: override
//!   [`Locker::try_lock_shared`] (and [`Locker::lock_shared`] for a
//!   server-side wait), set [`Capabilities::shared`] (and
//!   [`Capabilities::writer_priority`]: does a waiting writer hold later
//!   readers back?), and make [`Locker::unlock`] and [`Locker::refresh`]
//!   find shared holders by their owner token too; the suite's shared
//!   checks (`testkit/shared.rs`) then run on it. A SQL dialect implements
//!   the shared steps of its `Dialect` (Postgres: `postgres/dialect.rs`).
//! - **Cross-cutting behaviour**: a wrapper like [`MetricsLocker`], with
//!   the pass-through methods from `forward.rs`.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod background;
mod breaker;
mod capabilities;
pub mod config;
#[cfg(feature = "cron")]
pub mod cron;
mod deadline;
pub mod elect;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod file;
mod forward;
pub mod inspect;
mod lease;
mod locker;
mod locker_ext;
pub mod memory;
mod metrics;
#[cfg(feature = "mysql")]
pub mod mysql;
mod parse;
#[cfg(feature = "redis")]
mod pending;
#[cfg(feature = "postgres")]
pub mod postgres;
mod prefix;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
pub mod semaphore;
#[cfg(any(feature = "postgres", feature = "etcd", feature = "mysql"))]
mod session_registry;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql;
pub mod validate;
mod wait;
mod with_lock;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

#[cfg(test)]
mod test_support;
#[cfg(feature = "testkit")]
pub mod testkit;
mod trace;
mod util;

pub use breaker::{BreakerConfig, BreakerLocker, BreakerState};
pub use capabilities::Capabilities;
pub use deadline::DEADLINE_GRACE;
pub use error::{BoxError, Error, Result};
pub use lease::{
    drift_margin, new_owner_token, KeepAlive, Lease, LeaseInfo, LeaseParts, LostNotifier,
    LostReason, LostSignal, SharedLocker, DEFAULT_RELEASE_TIMEOUT,
};
pub use locker::{try_lock_in_turn, Locker, MarkAdvance, RefreshRequest};
pub use locker_ext::LockerExt;
pub use metrics::{describe_metrics, MetricsLocker, DURATION_BUCKETS};
pub use parse::{connect, SUPPORTED_SCHEMES};
pub use prefix::PrefixLocker;
pub use trace::TraceLocker;
pub use wait::{ReleaseWatch, WaitLocker, WaitPolicy};
pub use with_lock::{with_lease, with_lock, Completed, WithLock};

/// The README's Rust blocks, compiled and run as doctests so they cannot
/// rot (`distlock/README.md` links to the repository's README; the rustdoc
/// book, "Include items only when collecting doctests"). Its testing
/// section uses the `testkit` feature, hence the gate.
#[cfg(all(doctest, feature = "testkit"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
