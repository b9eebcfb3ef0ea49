//! MySQL and MariaDB named locks (`mysql://`, `mariadb://`; feature
//! `mysql`).
//!
//! A lock is `GET_LOCK(name, 0)` on a name derived from the namespace (by
//! default the URL's database) and the key ([`lock_name_in`]), held on a session that distlock keeps open, and never
//! returns to any pool, for as long as the lock is held. When that session
//! ends, the server drops the lock: a crashed holder never strands one.
//! Needs MySQL 5.7+ or MariaDB 10.0.2+ (one session holding many named
//! locks).
//!
//! ```no_run
//! use std::time::Duration;
//! use distlock::Locker;
//! use distlock::mysql::MysqlLocker;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = MysqlLocker::from_url("mysql://app:secret@db.internal:3306/app").await?;
//! // Waits on the server (no polling) for up to 10 s.
//! let lease = locker.lock("nightly-report", Duration::from_secs(60), Duration::from_secs(10)).await?;
//! println!("fencing token {:?}", lease.fencing_token());
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # ⚠ Connection pools and proxies
//!
//! A `GET_LOCK` belongs to the session that took it, and a session reset
//! (`COM_RESET_CONNECTION`, which `mysql_async::Pool` and most pools run when
//! a connection is returned) or a change of user silently releases it. This
//! backend therefore never uses a pool. Do not point it at a proxy that
//! multiplexes client sessions onto server sessions (ProxySQL with
//! multiplexing, RDS Proxy): two clients could then share one server session,
//! on which `GET_LOCK` is re-entrant, and both would "hold" the lock.
//!
//! # Semantics
//!
//! - **ttl is not enforced.** A lock is held until it is released or its
//!   session ends. The ttl only paces [`Lease::keep_alive`](crate::Lease::keep_alive) (which here
//!   verifies the lock every ttl/3) and bounds
//!   [`KeepAlive::max_hold`](crate::KeepAlive::max_hold). A holder that is
//!   alive but hung keeps the lock: use `max_hold`.
//! - **Holder crash.** The lock is free when the server ends the holder's
//!   session:
//!   - the holder process exits or is killed (even `SIGKILL`): its kernel
//!     closes the socket, the server sees it at once, and the lock is free
//!     within milliseconds;
//!   - the holder's host dies or is cut off: the server ends the session
//!     when it has heard nothing for the session's `wait_timeout`, which
//!     distlock sets to 15 s ([`DEFAULT_WAIT_TIMEOUT`]) instead of the
//!     server's 8 hours, while it pings every idle session each second
//!     ([`DEFAULT_PING_INTERVAL`]) so that a live holder is never idle that
//!     long. The lock is freed 14 to 15 s after the holder went silent;
//!   - `KILL` of the session: at once.
//! - **Lost locks.** When a session ends, every lease on it fires
//!   [`LostReason::ConnectionLost`](crate::LostReason::ConnectionLost):
//!   - the server closed or killed it (`KILL`, a restart, its own
//!     `wait_timeout`): the holder learns it at its next ping or statement,
//!     at most about 1 s later ([`DEFAULT_PING_INTERVAL`]). The lock may
//!     already be free, so [`Lease::valid_until`](crate::Lease::valid_until) is
//!     the instant of the signal;
//!   - the server went silent (a ping or statement unanswered for
//!     `query_timeout`, 5 s): the holder closes the session at most
//!     `ping_interval + query_timeout` = 6 s after it last heard from the
//!     server, and the server cannot free the lock earlier than
//!     `wait_timeout` after it, so the lease stays valid for a grace of
//!     `wait_timeout − ping_interval − query_timeout − 1 s` = **8 s** after
//!     the signal (with the defaults). `distlock run` SIGKILLs its command
//!     by then, minus its drift margin.
//!
//!   The client's TCP keepalive idles 1 s ([`TCP_KEEPALIVE_IDLE`]), but
//!   mysql_async sets only that; the interval and count stay the kernel's
//!   (75 s, 9 probes), so the bound above comes from the pings, not from
//!   TCP. The server's own TCP keepalive is a global setting distlock does
//!   not change. These bounds count from the last packet each side heard,
//!   on their clocks: a holder paused (or whose runtime stalls) past
//!   `wait_timeout` loses its lock with no warning before it, which is
//!   what fencing tokens are for.
//! - **Fencing.** Each grant bumps a counter row of the lock name in the
//!   round trip that takes the lock, while the lock is held, committed at
//!   once (see [Fencing table](#fencing-table)): tokens strictly increase
//!   across grants, clients and restarts, as durable as InnoDB's commits
//!   (`innodb_flush_log_at_trx_commit`).
//! - **Marks** ([`Locker::advance_mark`]): one row per mark in
//!   `distlock_marks`, beside the fencing table, created on the first mark;
//!   raised by one upsert that reports the value it replaced.
//! - **Release by owner** works only on the locker that acquired the lock:
//!   only the holding session can `RELEASE_LOCK`. Elsewhere,
//!   [`Locker::unlock`] with the right owner token is [`Error::Unsupported`]
//!   (naming the holder's connection id), with a wrong one [`Error::NotHeld`].
//!   `RELEASE_LOCK` answers 1 (released), 0 (held by another session) or
//!   NULL (no such lock); the last two are [`Error::NotHeld`].
//! - **Refresh** asks the holding session whether it still holds the lock
//!   (`IS_USED_LOCK(name) = CONNECTION_ID()`); a keepalive batch
//!   ([`Locker::refresh_many`]) asks it about up to 256 locks per statement.
//! - **Answers.** `GET_LOCK` answers 1 (taken), 0 (held elsewhere: `Ok(None)`,
//!   or [`Error::Timeout`] after a wait) or NULL, an error (a `KILL QUERY` of
//!   the statement gives NULL): NULL is [`Error::Backend`], never contention.
//! - **Waiting.** [`Locker::lock`] first tries once; if the key is held, it
//!   waits on the server (`GET_LOCK(name, seconds)`, fractional seconds),
//!   which grants the lock the moment it is released: no polling. A
//!   cancelled wait is ended on the server with `KILL QUERY` and its
//!   connection closed, so nothing stays granted. Each such wait needs a
//!   connection of its own; when `max_waiters` are in use, further waits
//!   poll instead (see [Connections](#connections)).
//! - **Exclusivity within one locker.** Many locks share a few sessions and
//!   `GET_LOCK` is re-entrant within a session, so the locker itself refuses
//!   a second grant of a name it holds: a second `try_lock` through the same
//!   locker is contention, as from any other client.
//! - **No shared locks.** `GET_LOCK` has no shared mode: a named lock is
//!   exclusive only, so [`Locker::try_lock_shared`] and
//!   [`Locker::lock_shared`] are [`Error::Unsupported`] with that reason
//!   ([`Capabilities::shared`](crate::Capabilities::shared) is false). The
//!   Postgres backend has them.
//! - **Semaphore attempts try one key at a time.** [`Locker::try_lock_any`]
//!   (a [`Semaphore`](crate::semaphore::Semaphore)'s attempt over its
//!   permit keys) is the trait's default here: one `try_lock` per key until
//!   one is granted, so up to N round trips for N permits, where Postgres
//!   answers in one statement. One statement would have to call `GET_LOCK`
//!   on several names and stop at the first granted, and neither server
//!   documents an evaluation order that guarantees it: MySQL's manual says
//!   a nondeterministic function in a `WHERE` clause "is evaluated for
//!   every row" ("Function Call Optimization",
//!   <https://dev.mysql.com/doc/refman/8.4/en/function-optimization.html>),
//!   so `LIMIT 1` does not stop it, and it promises nothing about which
//!   arms of `CASE` or `IF()` are evaluated. A second `GET_LOCK` granted by
//!   the same statement would hold a permit for nobody, excluding a real
//!   holder, until something released it. MariaDB's anonymous compound
//!   statement (`BEGIN NOT ATOMIC … IF … ELSEIF … END IF; END`, 10.1.1+)
//!   does run its branches in order, but MySQL has none, and the fencing
//!   bump (see [Fencing table](#fencing-table)) would have to be rebuilt
//!   inside it; not done.
//! - **Dropped leases** are released in the background on the current tokio
//!   runtime. A lease dropped outside a runtime stays held until its session
//!   closes.
//! - **Every call is bounded.** [`Locker::lock`] returns within its
//!   `timeout` + [`DEADLINE_GRACE`](crate::DEADLINE_GRACE); the other calls
//!   wait at most `query_timeout` for their statement (opening a session
//!   first is bounded by `connect_timeout + query_timeout`). A statement
//!   unanswered for its bound closes its session (its locks are then lost,
//!   and freed by the server).
//! - **Abandoned attempts.** A [`Locker::try_lock`] dropped (or timed out)
//!   after its statement was queued still runs to its end on the session;
//!   if it took the lock, the lock is released on the same session right
//!   after. Until then, `try_lock` and [`Locker::unlock`] of that key through
//!   the same locker are [`Error::Backend`] ("still being cleaned up").
//! - **Server-side settings.** Every session sets its own `wait_timeout`,
//!   `innodb_lock_wait_timeout` and `lock_wait_timeout` (half the query
//!   timeout, so a fencing row locked by another client fails one attempt
//!   instead of stalling a shared session), `autocommit = 1`, and on MariaDB
//!   `max_statement_time = 0`.
//! - **Not guaranteed**: anything across a failover. Named locks are not
//!   replicated (not by asynchronous replication, semi-synchronous
//!   replication nor Galera, whose docs list `GET_LOCK` as unsupported); a
//!   promoted replica starts with none, so two holders can then overlap:
//!   fencing tokens are the remedy, and they are only as good as the
//!   replication of the fencing table. Lock names are server-wide, not per
//!   database: each locker puts its namespace, by default its database,
//!   into every name (see [Namespaces](#namespaces)).
//!
//! # Connections
//!
//! A locker (with its clones) has at most **`sessions` + `max_waiters`**
//! connections open at once, 4 + 16 = 20 with the defaults:
//!
//! - `sessions` ([`DEFAULT_SESSIONS`], 4) shared sessions, carrying every
//!   lock taken without waiting, however many: **1,000 held leases use 4
//!   connections**;
//! - at most `max_waiters` ([`DEFAULT_MAX_WAITERS`], 16) waiter connections,
//!   idle ones included: each [`Locker::lock`] waiting on the server for a
//!   held key has one, keeps it while it holds the lock it won, and then
//!   leaves it idle for the next wait if fewer than `idle_waiters`
//!   ([`DEFAULT_IDLE_WAITERS`], 2) are idle, or closes it.
//!
//! When all `max_waiters` are in use, a further [`Locker::lock`] on a held
//! key polls instead: repeated `try_lock` on the key's shared session with
//! jittered backoff (5 ms growing to 200 ms, as
//! [`WaitPolicy::default`](crate::WaitPolicy)), bounded by its timeout.
//! Creating the marks table uses one short-lived connection more, once.
//! Each key always uses the same shared session, so a session's death loses
//! about a quarter of the held locks, not all.
//!
//! # Keys
//!
//! See [`lock_name_in`]: in a namespace, a key's lock name is the readable
//! start of the namespace and of the key plus 128 bits of the SHA-256 of
//! both (`svc_a~cleanup~…`); with an empty namespace ([`lock_name`]), a key
//! made of lowercase letters, digits and `_ . : / -`, at most 64 bytes, is
//! the lock name itself and any other becomes a readable prefix plus 128
//! bits of its SHA-256. Either way `Job` and `job` never collide or wrongly
//! match, and no name exceeds MySQL's 64 characters.
//! [`Locker::backend_key`] gives the name of a key.
//!
//! # Namespaces
//!
//! `GET_LOCK` names are server-wide, while the fencing rows and marks live
//! in a database: two services on one server whose jobs share a key would
//! otherwise contend for one lock while keeping separate marks (two
//! `distlock cron` on databases `svc_a` and `svc_b`, each with a job
//! `cleanup`, each ran about half of its ticks). So every lock name carries
//! the locker's namespace:
//!
//! - by default, the URL's **database** (`mysql://…/svc_a` locks
//!   `svc_a~cleanup~…`): two databases never share a lock;
//! - URL `prefix=NAME` (also spelled `namespace`, as Postgres, or
//!   `key_prefix`), or [`MysqlLockerBuilder::namespace`]: another namespace,
//!   for example one that services on different databases share on purpose
//!   (the fencing table must then be shared too, `fencing_table=schema.table`,
//!   or tokens would not increase across them);
//! - `prefix=` (empty): no namespace, the key's [`lock_name`] itself, for
//!   interoperating with other `GET_LOCK` users or with distlock before
//!   namespaces. A URL without a database has no namespace either.
//!
//! The fencing row, the mark, inspection, [`Locker::list`] (which skips the
//! rows of other namespaces in a shared table), [`Locker::force_release`]
//! and the keepalive all use the namespaced name. **Upgrading** from a
//! distlock without namespaces changes the names of every locker whose URL
//! names a database: stop every old client of a lock before a new one takes
//! it (or pin `prefix=` on both). Under the new names **fencing tokens
//! start again at 1** (the counter rows are per name: a resource that keeps
//! the highest token it saw refuses the new holders until their tokens pass
//! it) and **marks start afresh** (a `distlock cron --catch-up` replica may
//! run again a tick that finished before the upgrade). Pin `prefix=` (empty)
//! to keep the old names, tokens and marks.
//!
//! Every backend has such a namespace: Postgres `namespace` (hashed into the
//! advisory key; none by default: advisory locks are per database), Redis,
//! Redlock and etcd `prefix` (`lock:` by default), the file backend its
//! directory, the memory backend its process.
//!
//! # Fencing table
//!
//! `distlock_fencing` in the URL's database unless configured (URL
//! `fencing_table=schema.table`, or [`MysqlLockerBuilder::fencing_table`]);
//! created if missing, which needs `CREATE` once (and a database in the URL
//! or the table name):
//!
//! ```sql
//! CREATE TABLE distlock_fencing (
//!     lock_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
//!     token BIGINT NOT NULL,              -- the last fencing token granted
//!     owner_digest CHAR(32) CHARACTER SET ascii NOT NULL, -- SHA-256 (128 bits, hex) of its owner token
//!     granted_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), -- the last grant, server time
//!     -- the last grant's record (see Inspection):
//!     key_name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,  -- the key as the caller named it
//!     session_id BIGINT UNSIGNED NULL,    -- the connection that was granted it
//!     ttl_ms BIGINT NULL,                 -- its ttl
//!     holder_host TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- its holder: host, process id, label
//!     holder_pid BIGINT NULL,
//!     holder_label TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
//! ) ENGINE=InnoDB;
//! ```
//!
//! A table created before the record columns existed gets the missing ones
//! added (`ALTER TABLE`, which needs `ALTER` on it, once) when a locker
//! connects; older clients leave them alone, and their grants then read as
//! held by an unknown holder. The record is written by the same round trip
//! that takes the lock.
//!
//! A release clears the holder columns (host, pid, label) in the query
//! that releases the lock: they describe a holder, and are not kept past
//! its grant; the token, grant time, key name, ttl and session id stay. A
//! holder whose connection dies without releasing leaves its record until
//! the name's next grant overwrites it.
//!
//! Rows are deleted only by [`Locker::forget`]. With fencing off
//! (`fencing=off`, [`MysqlLockerBuilder::fencing`]) an acquire is a bare
//! `GET_LOCK`, no table is used, and leases have no fencing token. Either
//! way an acquire is one round trip. With fencing, an attempt that does
//! not wait is one statement, `INSERT … SELECT … WHERE GET_LOCK(name, 0) =
//! 1 ON DUPLICATE KEY UPDATE`, the token read back from its OK packet; a
//! wait on the server is five statements in one query, the `GET_LOCK` in a
//! statement of its own so that no write holds the table while it waits.
//!
//! # Inspection
//!
//! [`Locker::inspect`] is one statement: `IS_USED_LOCK(name)` (the holding
//! connection, reported as `session: "connection N"`, its id in the
//! processlist) joined with the name's fencing row, which gives the
//! [`Holder`](crate::inspect::Holder), the grant time on the **server's**
//! clock (`CURRENT_TIMESTAMP(6)` of the grant,
//! [`Clock::Server`](crate::inspect::Clock::Server)), the ttl and the fencing
//! token. `ttl_left` is always `None`: locks here do not expire.
//!
//! - The row is the holder's only if the connection that wrote it is the one
//!   holding the name now. A plain `GET_LOCK`, a grant by a distlock that
//!   predates holder records, with `holder=off`, or with `fencing=off` (no
//!   row) is reported held by an unknown holder (`holder: None`), with its
//!   connection: never free.
//! - [`Locker::list`] scans the fencing table (one row per name ever locked,
//!   until [`Locker::forget`]) for keys starting with the prefix (compared
//!   byte for byte) and keeps those `IS_USED_LOCK` says are held. It does not
//!   use `performance_schema.metadata_locks`: that table shows user locks
//!   only while the performance schema runs with its
//!   `wait/lock/metadata/sql/mdl` instrument (MariaDB 10.11 starts with the
//!   performance schema off), and it names the lock, not the key.
//!   A lock without a row has no key to list it by; without fencing, `list`
//!   is [`Error::Unsupported`].
//! - [`Locker::force_release`] supports only
//!   [`ForceRelease::TerminateSession`]: **`KILL` of the holding connection,
//!   which frees EVERY lock it holds.** A distlock process keeps many locks
//!   on each of its few shared connections: all are freed, all their
//!   holders' lost signals fire
//!   ([`LostReason::ConnectionLost`](crate::LostReason)), and a plain
//!   client's open transaction is rolled back. The check that the
//!   connection still holds the name and the `KILL` run in one round trip
//!   (a prepared `KILL` chosen by `IS_USED_LOCK`), and the call returns once
//!   the server has freed the lock (within 5 s). Killing another user's
//!   connection needs `CONNECTION_ADMIN` (MySQL 8) or `SUPER`; the server's
//!   refusal (error 1095) is [`Error::Backend`] naming them.
//!   [`ForceRelease::Lock`] is [`Error::Unsupported`] (only the holding
//!   connection can `RELEASE_LOCK`), and so is killing the locker's own
//!   connection: release the lease instead. Nothing stops the evicted
//!   holder's work but its lost signal (at its next ping, about a second):
//!   fence its writes.
//!
//! # URL
//!
//! `mysql://user:password@host:port/database?param=value&...` (or
//! `mariadb://`; user, password and database percent-encoded), with:
//!
//! | parameter | meaning | default |
//! | --- | --- | --- |
//! | `key_prefix` (or the older `prefix`, `namespace`) | namespace in every lock name, empty for none (see [Namespaces](#namespaces)) | the database |
//! | `fencing` | `on` / `off` | `on` |
//! | `fencing_table` | `table` or `schema.table` | `distlock_fencing` |
//! | `holder_record` (or the older `holder`) | `off` records no holder in the fencing row (see [Inspection](#inspection)) | `on` |
//! | `sessions` | shared sessions | 4 |
//! | `idle_waiters` | idle wait connections kept | 2 |
//! | `max_waiters` | wait connections open at once, idle ones included (1 or more) | 16 |
//! | `query_timeout` | how long any statement or ping may go unanswered (`3s`, `500ms`; a bare number is seconds, see [`crate::config`]) | `5s` |
//! | `connect_timeout` | how long opening a connection may take | `5s` |
//! | `ping_interval` | time between pings of an idle session (`500ms`; a bare number is seconds, and one of 60 or more is refused: it was milliseconds before) | `1s` |
//! | `wait_timeout` | silence after which the server ends a session (whole seconds) | `15s` |
//! | `ssl-mode` | `DISABLED`, `PREFERRED`, `REQUIRED`, `VERIFY_IDENTITY` | `PREFERRED` (the CLI: `VERIFY_IDENTITY`) |
//! | `ssl-ca` | CA file (PEM) trusted besides the Mozilla roots | none |
//!
//! # TLS
//!
//! rustls with the `ring` provider. `PREFERRED` and `REQUIRED` encrypt
//! without checking the certificate (as MySQL's client does), so they stop
//! passive eavesdropping only. `PREFERRED` falls back to plain TCP when the
//! server's greeting offers no TLS, deciding again for every connection it
//! opens: that answer is unauthenticated, and a forged one must not turn
//! TLS off for the locker's lifetime. `REQUIRED` and `VERIFY_IDENTITY`
//! refuse such a server ("the server offers no TLS, which ssl-mode=…
//! requires; pass ssl-mode=DISABLED to connect without it"). The `distlock`
//! CLI uses `VERIFY_IDENTITY` for a URL without `ssl-mode`, which checks
//! that the certificate chains to a trusted root (`ssl-ca`, and the Mozilla
//! roots) and names the host. `VERIFY_CA` is refused: mysql_async
//! 0.37 recognises rustls' host-mismatch error by its old text, so it would
//! fail every connection. Client certificates are not supported. Passwords
//! never appear in errors, logs or `Debug` output.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

mod acquire;
mod config;
mod dialect;
mod errors;
mod fencing;
mod inspect;
mod marks;
mod names;
mod pool;
mod session;

pub use config::{
    Config, MysqlLockerBuilder, SslMode, DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_WAITERS,
    DEFAULT_MAX_WAITERS, DEFAULT_PING_INTERVAL, DEFAULT_QUERY_TIMEOUT, DEFAULT_SESSIONS,
    DEFAULT_WAIT_TIMEOUT, TCP_KEEPALIVE_IDLE,
};
pub use fencing::DEFAULT_TABLE as DEFAULT_FENCING_TABLE;
pub use names::{lock_name, lock_name_in, MAX_NAME_LEN};

use self::config::Settings;
use self::fencing::Sql;
use crate::sql::core::Core;
use crate::{validate, Result};
// Named by the docs above.
#[cfg(doc)]
use crate::{inspect::ForceRelease, Error, Locker};

/// The MySQL / MariaDB backend. Cheap to clone; clones share sessions and
/// held locks. See the [module docs](self) for what it guarantees.
#[derive(Clone)]
pub struct MysqlLocker {
    inner: Arc<Inner>,
}

/// The locker's state, shared by its clones and views: the SQL dialect
/// the shared flows run over.
pub(crate) struct Inner {
    /// The `Arc` every lease of this locker and its clones shares.
    leases: crate::SharedLocker,
    settings: Arc<Settings>,
    sql: Sql,
    /// The pool, the held locks, and the steps every SQL dialect shares.
    core: Core<pool::Connect, String>,
    /// The marks table is known to exist (created on the first mark).
    marks_ready: AtomicBool,
}

crate::sql::dialect::sql_locker!(MysqlLocker, MysqlLockerBuilder, "DISTLOCK_MYSQL_", keys: {
    /// `key`'s lock in this locker's namespace: the one place names are
    /// made, so that acquires, keepalives, releases, fencing rows, marks
    /// and inspection all agree.
    fn id(&self, key: &str) -> Result<String> {
        validate::key(key)?;
        Ok(self.name_on_server(key))
    }

    /// The `GET_LOCK` name of `key` in this locker's namespace
    /// ([`lock_name_in`]).
    fn name_on_server(&self, key: &str) -> String {
        lock_name_in(&self.inner.settings.namespace, key)
    }
});

impl MysqlLocker {
    async fn start(settings: Settings) -> Result<Self> {
        let settings = Arc::new(settings);
        let inner = Arc::new(Inner {
            leases: crate::SharedLocker::default(),
            core: pool::core(&settings),
            sql: Sql::new(settings.fencing.as_ref(), settings.holder_record),
            marks_ready: AtomicBool::new(false),
            settings,
        });
        inner.core.pool.shared("").await?;
        Ok(MysqlLocker { inner })
    }

    /// The namespace in every lock name: the URL's `prefix`, else its
    /// database (see the [module docs](self#namespaces)).
    pub fn namespace(&self) -> &str {
        &self.inner.settings.namespace
    }
}
