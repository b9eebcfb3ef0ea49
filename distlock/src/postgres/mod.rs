//! Postgres session advisory locks (`postgres://`, `postgresql://`; feature
//! `postgres`).
//!
//! A lock is `pg_try_advisory_lock` on a 64-bit key derived from the string
//! key, held on a session connection that distlock keeps open, and never
//! returns to any pool, for as long as the lock is held. When that connection
//! dies, the server drops the lock: a crashed holder never strands one.
//!
//! ```no_run
//! use std::time::Duration;
//! use distlock::Locker;
//! use distlock::postgres::PostgresLocker;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = PostgresLocker::from_url("postgres://app:secret@db.internal/app").await?;
//! // Waits on the server (no polling) for up to 10 s.
//! let lease = locker.lock("nightly-report", Duration::from_secs(60), Duration::from_secs(10)).await?;
//! println!("fencing token {:?}", lease.fencing_token());
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # ⚠ Connection poolers and proxies
//!
//! **Do not point this backend at PgBouncer (or RDS Proxy, Supavisor, ...) in
//! transaction mode.** Such a pooler hands each transaction to whichever
//! server session is free, so two clients can share one session, and advisory
//! locks are re-entrant within a session: a second client got
//! `pg_try_advisory_lock = true` for a key another client held (PgBouncer's
//! docs list advisory locks among the session features transaction pooling
//! breaks: <https://www.pgbouncer.org/features.html>).
//! Both then run the "exclusive" section. The same holds for shared locks:
//! a reader and a writer sharing one server session are both granted.
//! Connect to Postgres directly, or through a pooler in *session* mode, or
//! use the transaction-scoped functions [`try_lock_xact`] and [`lock_xact`]
//! (and, for readers, [`try_lock_shared_xact`] and [`lock_shared_xact`])
//! inside your own transaction.
//!
//! **Between the client and the server** (a Cloud SQL or AlloyDB auth proxy,
//! an Envoy/Istio/Linkerd sidecar, PgBouncer in session mode, an SSH tunnel,
//! `kubectl port-forward`), the hop answers each side's TCP keepalive itself,
//! so neither kernel notices when the other side goes silent behind it.
//! distlock does not rely on them for its bounds: every session is pinged
//! after `ping_interval` (1 s) without an answer and closed when it has
//! answered nothing for `ping_interval + ping_timeout` (4 s), so the holder
//! learns; and every session runs with the server's `idle_session_timeout`
//! (10 s, Postgres 14+), so the server ends a session it no longer hears
//! from, and frees its locks, whatever the hop does with its connections.
//! What a pooler must be configured with:
//!
//! - **session mode** (`pool_mode = session`), as above;
//! - **its client-side keepalive must not give up sooner than 10 s**
//!   (`tcp_keepidle + tcp_keepintvl × tcp_keepcnt` and `tcp_user_timeout`
//!   in `pgbouncer.ini`, or `client_idle_timeout`): when the pooler notices a
//!   vanished client it closes the server session at once, and a holder is
//!   promised its locks for 10 s after its last answered statement. The
//!   defaults (the OS's: 2 hours) are safe. `tcp_keepalive = 1`,
//!   `tcp_keepidle = 2`, `tcp_keepintvl = 2`, `tcp_keepcnt = 5` and
//!   `tcp_user_timeout = 12000` mirror what distlock asks of the server
//!   ([`TcpKeepalive::SERVER`]);
//! - on **Postgres 13 and older**, which have no `idle_session_timeout`, the
//!   pooler's client-side keepalive is the only thing that ends the server
//!   session of a vanished client: with the OS defaults a dead holder's
//!   locks stay for up to 2 hours. Set the values above.
//!
//! distlock cannot read a pooler's configuration through its sessions, so it
//! cannot check these; `distlock`'s fault suite runs the PgBouncer cells
//! (session mode, a client gone silent) with the settings above.
//!
//! # Semantics
//!
//! - **ttl is not enforced.** A lock is held until it is released or its
//!   session ends. The ttl only paces [`Lease::keep_alive`] (which here
//!   verifies the lock every ttl/3) and bounds [`crate::KeepAlive::max_hold`].
//!   A holder that is alive but hung keeps the lock: use `max_hold`.
//! - **Holder crash.** The lock is free when the server ends the holder's
//!   session:
//!   - the holder process exits or is killed (even `SIGKILL`): its kernel
//!     closes the socket, the server sees it at once, and the lock is free
//!     within milliseconds;
//!   - the holder's host dies or is cut off, or anything between it and the
//!     server goes silent: the server notices through TCP keepalive, which
//!     distlock sets per session ([`TcpKeepalive::SERVER`]) instead of the
//!     usual 2 hours, or through `idle_session_timeout` (10 s, set per
//!     session on Postgres 14+), which also covers a proxy or pooler that
//!     keeps the server's connection open: the lock is freed no sooner than
//!     10 s after the holder's last answered statement was sent (its pings
//!     keep that within a second of the cut), and on Postgres 14+ within
//!     about 12 s;
//!   - `pg_terminate_backend` of the session: at once.
//! - **Lost locks.** When a session ends, every lease on it fires
//!   [`LostReason::ConnectionLost`](crate::LostReason::ConnectionLost), and
//!   its [`Lease::valid_until`] says until when the lock may still be
//!   treated as held:
//!   - the server went silent (a partition, a server cut off behind a proxy,
//!     a pooler or a tunnel, a paused server): the holder learns it from its
//!     own pings, not from its socket, which a hop in between keeps alive.
//!     Every session that has gone `ping_interval` (1 s) without an answer
//!     is pinged, and one that has answered nothing for `ping_interval +
//!     ping_timeout` (**4 s**) is given up: its leases are told at once, and
//!     its connection is closed only once their grace has passed, so that a
//!     server that was alive after all frees nothing under them. (A ping
//!     judged late because the holder's own process stalled, a SIGSTOP or a
//!     frozen VM, is sent again rather than judged.) The server keeps the locks at least
//!     10 s after the last answered statement was sent (see the previous
//!     item), so the lease stays valid until then: about **6 s** after the
//!     lost signal with the defaults. `distlock run` SIGKILLs its command by
//!     `valid_until − drift_margin(ttl)`, before the server can grant the
//!     lock to anyone else. (This client's TCP keepalive and user timeout,
//!     [`TcpKeepalive::CLIENT`], may notice a direct connection's death
//!     sooner; the grace is counted the same way.)
//!   - the server closed or reset the connection (`pg_terminate_backend`,
//!     a restart), distlock closed it, or the server's keepalive is left
//!     alone (`server_keepalives=off`): no grace, `valid_until` is the
//!     instant of the signal, since the lock may already be free.
//!
//!   Those bounds count from the last statement the server answered, on
//!   each side's own clock: a holder paused through them gets no such
//!   promise (its server ends a session it has not heard from for 10 s, and
//!   the paused holder learns only when it resumes), which is what fencing
//!   tokens are for.
//! - **Fencing.** Each grant bumps a counter row of the key in the statement
//!   that takes the lock, while the lock is held, in a committed transaction
//!   (see [Fencing table](#fencing-table)): tokens strictly increase across
//!   grants, clients and restarts. They are exactly as durable as the
//!   server's commits (`synchronous_commit`).
//! - **Marks** ([`Locker::advance_mark`]): one row per mark in
//!   `distlock_marks`, in the fencing table's schema, created on the first
//!   mark (the role then needs `CREATE` there once); raised by one upsert,
//!   as durable as any commit.
//! - **Release by owner** works only on the locker that acquired the lock: a
//!   session lock can only be released by its session. Elsewhere,
//!   [`Locker::unlock`] with the right owner token is [`Error::Unsupported`]
//!   (naming the holder's server process), with a wrong one [`Error::NotHeld`].
//! - **Refresh** asks the holding session whether it still holds the lock: a
//!   round trip that also proves the session is alive.
//! - **Waiting.** [`Locker::lock`] first tries once; if the key is held, it
//!   waits on the server (`pg_advisory_lock` under `lock_timeout`), which
//!   grants the lock the moment it is released: no polling. A grant that
//!   races with the timeout is detected and kept rather than stranded, and a
//!   cancelled wait is cancelled on the server and its connection closed, so
//!   nothing stays granted. Each such wait needs a connection of its own;
//!   when `max_waiters` are in use, further waits poll instead (see
//!   [Connections](#connections)).
//! - **Exclusivity within one locker.** Many locks share a few sessions
//!   (see [Connections](#connections)) and advisory locks are re-entrant
//!   within a session (in either mode: a session holding a key shared is
//!   granted it exclusively too), so the locker itself refuses a second
//!   grant of a key it holds: a second `try_lock` through the same locker,
//!   or a `try_lock` while it holds the key shared, is contention, as from
//!   any other client.
//! - **Shared (reader) locks** ([`Locker::try_lock_shared`],
//!   [`Locker::lock_shared`]): `pg_try_advisory_lock_shared`, held like an
//!   exclusive lock on the key's shared session (or, after a wait, on the
//!   waiter connection that won it) and a lease like any other: owner
//!   token, [`Locker::unlock`] by it, refresh and keepalive (which confirm
//!   the session still holds the key), the lost signal when the session
//!   dies, release of a dropped lease in the background. Readers of any
//!   client coexist; readers of **one** locker on one session share one
//!   server hold of the key (the first takes it, the others join it, the
//!   last to leave releases it), since the server counts re-entrant holds
//!   but cannot say how many a session has, and an abandoned attempt could
//!   then not be undone exactly. A reader's fencing token is the key's
//!   counter (the last writer's token, 0 if none), read in a statement of
//!   its own after the grant (sent with the attempt: still one round trip),
//!   never advanced: **readers write nothing** to the fencing table.
//!   [`lock_shared`](Locker::lock_shared) waits on the server
//!   (`pg_advisory_lock_shared`) as [`lock`](Locker::lock) does.
//! - **Semaphore attempts are at most two statements.**
//!   [`Locker::try_lock_any`] (a [`Semaphore`](crate::semaphore::Semaphore)'s
//!   attempt over its permit keys) tries the first key alone, as
//!   [`Locker::try_lock`] does (one round trip, and the common case while
//!   permits are free, since a semaphore starts at a random permit), and,
//!   if it is held, the rest in one statement, whatever the occupancy. The
//!   first-key try keeps the statement below, and its reservations, off the
//!   path of a semaphore with free permits: with 16 callers of one locker,
//!   sending every attempt through the statement cut throughput 3 to 6
//!   times at 10 and 100 permits (a loaded machine; BENCHMARKS.md has the
//!   figures). The statement takes the first
//!   key in the order given that `pg_try_advisory_lock`
//!   grants, and only that one, and bumps that key's fencing counter and
//!   writes its record as [`Locker::try_lock`] would, so the permit is an
//!   ordinary lock of its key. The statement is a recursive `WITH` that
//!   tries the next key only while none is taken; why that can never take
//!   two keys, with the Postgres documentation it rests on, is written
//!   beside the statement (`postgres/fencing.rs`, `TRY_ANY_STEPS`). Keys
//!   this locker holds or is trying already are left out of the statement
//!   (contention, as for `try_lock`), so it is never granted a key
//!   re-entrantly on a session already holding it. It runs on the shared
//!   session of the first key it sends, which then carries the key taken.
//!   Two round trips at any occupancy (one when the first key is free),
//!   where the trait's default costs one per key tried (N when all N are
//!   held); a semaphore adds one round trip (its check of permit N) only
//!   when all are held. Callers of **one**
//!   locker trying the same keys at once are the exception: an attempt
//!   reserves every key it sends, so a key another caller of this locker
//!   is trying is not sent, and, if nothing else was free, is tried again
//!   once that attempt has its answer (a statement more each time, within
//!   `query_timeout`): `None` means every key was held, never "another
//!   caller of this locker was trying it". A key whose abandoned
//!   attempt is still being cleaned up is skipped, and is the answer
//!   ([`Error::Backend`]) only if no other key was free.
//! - **A waiting writer holds later readers back**
//!   ([`Capabilities::writer_priority`](crate::Capabilities::writer_priority),
//!   unlike the memory and file backends): while a writer waits on the
//!   server in [`Locker::lock`], Postgres queues it, and refuses a later
//!   `pg_try_advisory_lock_shared` from any other session (and queues a
//!   later `pg_advisory_lock_shared` behind it); only a session that
//!   already holds the key shared would be granted it again past the
//!   queue, so a reader joining its locker's hold first asks the server
//!   whether a writer waits, and is refused too. So `try_lock_shared` is
//!   contention, and `lock_shared` waits, until the writer has had the key:
//!   readers cannot starve a writer. (Observed on Postgres 15; the lock
//!   manager checks a new request against the waiters' modes.) A writer
//!   that polls instead (every waiter connection in use, or a
//!   [`WaitLocker`](crate::WaitLocker)'s `lock`) is in no queue and holds
//!   no reader back. As with a writer-preferring `RwLock`, a task that
//!   takes a key shared again while holding it can wait for a writer that
//!   waits for it: do not nest readers of one key.
//! - **Dropped leases** are released in the background on the current tokio
//!   runtime. A lease dropped outside a runtime stays held until its session
//!   closes (when the locker and all its leases are gone, or the process
//!   exits).
//! - **Every call is bounded.** [`Locker::lock`] returns within its
//!   `timeout` + [`DEADLINE_GRACE`](crate::DEADLINE_GRACE) whatever the
//!   server does (a paused or vanished server is
//!   [`Error::DeadlineExceeded`], never [`Error::Timeout`]); whatever step
//!   it abandons is undone as if the call had been cancelled.
//!   [`Locker::try_lock`], [`Locker::unlock`] and [`Locker::refresh`] wait
//!   at most `query_timeout` for their statement (opening a session first
//!   is bounded by `connect_timeout` per host plus `query_timeout`).
//! - **Server-side timeouts.** Every session turns `statement_timeout` and
//!   `idle_in_transaction_session_timeout` off, whatever the role or
//!   database sets: they would end a native wait with an error, or end a
//!   session and free its locks under their holders. It sets
//!   `idle_session_timeout` to 10 s (Postgres 14+; `idle_session_timeout`
//!   parameter), which its pings stay well inside while the holder lives.
//!   Every session runs with a `lock_timeout` of half the ping timeout
//!   (1.5 s; at most half the query timeout), so a fencing-row update
//!   blocked by another client (a `SELECT … FOR UPDATE` on
//!   `distlock_fencing`, an `ALTER TABLE`) fails that one attempt with
//!   [`Error::Backend`] (and releases its lock) instead of stalling every
//!   lock on its shared session past the point where its silence would
//!   close it.
//! - **Abandoned attempts.** A [`Locker::try_lock`] dropped (or timed out)
//!   after its statement was sent may have taken the lock; it is released
//!   in the background, one round trip later. Until then, `try_lock` and
//!   [`Locker::unlock`] of that key through the same locker are
//!   [`Error::Backend`] ("still being cleaned up"): whether it is free is
//!   not known yet. [`Locker::lock`] waits through it.
//! - **Not guaranteed**: anything across a failover. Advisory locks are not
//!   replicated; a promoted standby starts with none. Sessions are opened
//!   with `target_session_attrs=read-write` (unless the URL says otherwise)
//!   so a lock is never taken on a standby.
//!
//! # Connections
//!
//! A locker (with its clones) has at most **`sessions` + `max_waiters`**
//! connections open at once, 4 + 16 = 20 with the defaults:
//!
//! - `sessions` ([`DEFAULT_SESSIONS`], 4) shared sessions, carrying every
//!   lock taken without waiting ([`Locker::try_lock`], and [`Locker::lock`]
//!   when the key is free; the same for shared locks), however many:
//!   **1,000 held leases use 4 connections**;
//! - at most `max_waiters` ([`DEFAULT_MAX_WAITERS`], 16) waiter connections,
//!   counting every one open: each [`Locker::lock`] call waiting on the
//!   server for a held key has one, keeps it while it holds the lock it won
//!   (until release, or until that connection dies), and then leaves it idle
//!   for the next wait if fewer than `idle_waiters`
//!   ([`DEFAULT_IDLE_WAITERS`], 2) are idle, or closes it. Idle ones count
//!   toward `max_waiters`.
//!
//! When all `max_waiters` are in use, a further [`Locker::lock`] on a held
//! key waits by polling instead, without a connection of its own: repeated
//! `try_lock` on the key's shared session with jittered backoff (5 ms
//! growing to 200 ms, as [`WaitPolicy::default`](crate::WaitPolicy)),
//! bounded by its timeout. It acquires up to about 200 ms after a release
//! rather than at once, and stays polling even if a waiter connection frees
//! up meanwhile. Contention, timeouts and outages are reported exactly as
//! for a native wait.
//!
//! The bound counts the sessions this client holds open; the server may
//! list one it has just closed in `pg_stat_activity` for a moment longer,
//! and a cancelled wait also sends Postgres' cancel request over a
//! short-lived connection of its own, which is not a session. Each
//! key always uses the same shared session (a [`Locker::try_lock_any`]
//! uses the first key's, for whichever key it takes), so a session's
//! death loses about a quarter of the held locks, not all. Sessions are opened lazily
//! (the first by `connect`, to fail fast on a wrong password) and their
//! `application_name` is `distlock` unless the URL names one.
//!
//! # Keys
//!
//! A string key becomes the first 8 bytes of its SHA-256 digest, optionally
//! after a namespace: see [`advisory_key`], which also gives the SQL
//! equivalent and the collision odds (about n² / 2⁶⁵ for n keys). Programs
//! that already use integer advisory keys can use them directly:
//! [`PostgresLocker::try_lock_raw`], [`PostgresLocker::lock_raw`] and
//! [`PostgresLocker::raw_keys`]. Both kinds share one key space with each
//! other and with `pg_advisory_lock(bigint)` in SQL (not with the
//! `(int4, int4)` form, which Postgres keeps apart).
//!
//! # Fencing table
//!
//! `distlock_fencing` in the connection's current schema unless configured
//! (URL `fencing_table=schema.table`, or
//! [`PostgresLockerBuilder::fencing_table`]); created if missing, which needs
//! `CREATE` on the schema once:
//!
//! ```sql
//! CREATE TABLE distlock_fencing (
//!     lock_key bigint PRIMARY KEY,      -- the advisory key
//!     token bigint NOT NULL,            -- the last fencing token granted
//!     owner_digest text NOT NULL,       -- SHA-256 (128 bits, hex) of the last holder's owner token
//!     granted_at timestamptz NOT NULL DEFAULT now(), -- the last grant, server time
//!     -- the last grant's record (see Inspection):
//!     key_name text,                    -- the key as the caller named it
//!     session_pid integer,              -- the server process that was granted it
//!     ttl_ms bigint,                    -- its ttl
//!     holder_host text,                 -- its holder: host, process id, label
//!     holder_pid bigint,
//!     holder_label text
//! );
//! ```
//!
//! A table created before the record columns existed gets them added
//! (`ALTER TABLE … ADD COLUMN IF NOT EXISTS`, by the table's owner, once)
//! when a locker connects; older clients leave them alone, and their
//! grants then read as held by an unknown holder. Every column is written
//! by the statement that takes the lock: recording adds no round trip.
//!
//! A release clears the holder columns (host, pid, label) in the statement
//! that unlocks the key: they describe a holder, and are not kept past its
//! grant; the token, grant time, key name, ttl and session pid stay. A
//! holder whose session dies without releasing leaves its record until the
//! key's next grant overwrites it.
//!
//! Rows are never deleted: one small row per key ever locked. With fencing
//! off (`fencing=off`, [`PostgresLockerBuilder::fencing`]) an acquire is a
//! bare `pg_try_advisory_lock`, no table is used, and leases have no fencing
//! token. Either way an acquire is one round trip.
//!
//! # Inspection
//!
//! [`Locker::inspect`] is one statement: the key's granted hold in
//! `pg_locks` (locktype `advisory`, the 64-bit key split into `classid` and
//! `objid`, in this database) joined with the key's fencing row. It reports
//! the holding server process as `session: "pid N"` (find it in
//! `pg_stat_activity`), and from the row the [`Holder`](crate::inspect::Holder),
//! the grant time on the **server's** clock (`now()` of the granting
//! statement, [`Clock::Server`](crate::inspect::Clock::Server)), the ttl and
//! the fencing token. `ttl_left` is always `None`: locks here do not expire.
//!
//! - The row is the holder's only if the process that wrote it is the one
//!   holding the key now. A lock taken with plain SQL (`pg_advisory_lock`,
//!   including the transaction-scoped [`try_lock_xact`] and
//!   [`lock_xact`], which `pg_locks` shows alike), by a distlock that
//!   predates holder records, with `holder=off`, or with `fencing=off` (no
//!   row at all) is reported held by an unknown holder (`holder: None`),
//!   with its session: never free. (One blind spot: if the recorded
//!   process exits and the OS gives its pid to a new session that takes the
//!   same key with plain SQL, that session is taken for the recorded
//!   holder.)
//! - A key held shared (`pg_locks.mode = 'ShareLock'`) is reported
//!   [`HeldLock::shared`](crate::inspect::HeldLock::shared), with one
//!   reader's session and by unknown holders (readers record nothing; the
//!   fencing row, if any, is the last writer's), the token readers carry
//!   (the row's counter, 0 without a row), and no grant time or ttl.
//! - [`Locker::list`] joins every held advisory lock of the database with
//!   the fencing rows whose `key_name` starts with the prefix, and keeps
//!   the keys of this locker's namespace (raw keys through [`RawKeys`]).
//!   A lock without a fencing row has no name and is not listed; without
//!   fencing, `list` is [`Error::Unsupported`]. Readers write no row, so a
//!   key only ever held shared is not listed (one a writer ever held is,
//!   as held shared while readers hold it).
//! - [`Locker::force_release`] supports only
//!   [`ForceRelease::TerminateSession`]: **`pg_terminate_backend` of the
//!   holding session, which frees EVERY lock that session holds.** A
//!   distlock process keeps many locks on each of its few shared sessions:
//!   all of them are freed, all their holders' lost signals fire
//!   ([`LostReason::ConnectionLost`](crate::LostReason)), and any
//!   transaction of a plain-SQL holder is rolled back. The statement checks
//!   that the session still holds the key and waits up to 5 s for it to exit
//!   (Postgres 14+), so the lock is free when the call returns. A key held
//!   shared is freed by ending **every** reader's session. It needs the
//!   holder's role, membership in `pg_signal_backend` (not for superuser
//!   sessions), or superuser; the server's refusal is [`Error::Backend`]
//!   naming them. [`ForceRelease::Lock`] is [`Error::Unsupported`] (only its
//!   own session can release a session advisory lock), and so is ending the
//!   locker's own session: release the lease instead. Nothing stops the
//!   evicted holder's work but its lost signal: fence its writes.
//!
//! # URL
//!
//! `postgres://user:password@host:port/dbname?param=value&...`, as for libpq
//! and tokio-postgres (several `host:port` pairs, `application_name`,
//! `connect_timeout`, `keepalives_*`, `target_session_attrs`, ... work as
//! there), plus:
//!
//! | parameter | meaning | default |
//! | --- | --- | --- |
//! | `key_prefix` (or the older `namespace`, `prefix`) | prefix of every key before hashing | none |
//! | `fencing` | `on` / `off` | `on` |
//! | `fencing_table` | `table` or `schema.table` | `distlock_fencing` |
//! | `holder_record` (or the older `holder`) | `off` records no holder in the fencing row (see [Inspection](#inspection)) | `on` |
//! | `sessions` | shared sessions | 4 |
//! | `idle_waiters` | idle wait connections kept | 2 |
//! | `max_waiters` | wait connections open at once, idle ones included (1 or more) | 16 |
//! | `query_timeout` | how long any statement may go unanswered (`5s`, `500ms`; a bare number is seconds, see [`crate::config`]) | `10s` |
//! | `ping_interval` | a session this long without an answer is pinged (`500ms`, `2s`; a bare number is seconds) | `1s` |
//! | `ping_timeout` | a ping unanswered this long closes its session | `3s` |
//! | `idle_session_timeout` | the server's `idle_session_timeout` for distlock's sessions, or `off` | `10s` |
//! | `server_keepalives` | `off` leaves the server's TCP keepalive alone | `on` |
//! | `tcp_user_timeout` | a bare number is milliseconds, as in libpq (`connect_timeout` and `keepalives_*` keep libpq's seconds); units accepted | 4000 |
//! | `sslmode` | `disable`, `prefer`, `require`, `verify-ca`, `verify-full` | `prefer` |
//! | `sslrootcert` | CA file (PEM), or `system` | `system` |
//!
//! # TLS
//!
//! rustls with the `ring` provider. `prefer` and `require` encrypt without
//! checking the certificate (as libpq does); `verify-ca` checks it chains to
//! a trusted root; `verify-full` also checks it names the host. Client
//! certificates are not supported. Passwords never appear in errors, logs or
//! `Debug` output.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

mod acquire;
mod cleanup;
mod config;
mod dialect;
mod errors;
mod fencing;
mod inspect;
mod keys;
mod marks;
mod pool;
mod session;
mod tls;
mod xact;

pub use config::{
    Config, PostgresLockerBuilder, TcpKeepalive, DEFAULT_APPLICATION_NAME, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_IDLE_SESSION_TIMEOUT, DEFAULT_IDLE_WAITERS, DEFAULT_MAX_WAITERS, DEFAULT_PING_INTERVAL,
    DEFAULT_PING_TIMEOUT, DEFAULT_QUERY_TIMEOUT, DEFAULT_SESSIONS,
};
pub use fencing::DEFAULT_TABLE as DEFAULT_FENCING_TABLE;
pub use keys::advisory_key;
pub use tls::{RootCerts, SslMode};
pub use xact::{lock_shared_xact, lock_xact, try_lock_shared_xact, try_lock_xact};

use self::config::Settings;
use self::fencing::Sql;
use self::marks::MarksSql;
use crate::sql::core::Core;
use crate::sql::dialect::SqlKeys;
use crate::{validate, Lease, Locker, Result};
// Named by the docs above.
#[cfg(doc)]
use crate::{inspect::ForceRelease, Error};

/// The Postgres backend. Cheap to clone; clones share sessions and held
/// locks. See the [module docs](self) for what it guarantees.
#[derive(Clone)]
pub struct PostgresLocker {
    inner: Arc<Inner>,
}

/// The locker's state, shared by its clones and views: the SQL dialect
/// the shared flows run over.
pub(crate) struct Inner {
    /// The `Arc` every lease of this locker and its clones shares.
    leases: crate::SharedLocker,
    /// The same for the leases of [`PostgresLocker::raw_keys`].
    raw_leases: crate::SharedLocker,
    settings: Arc<Settings>,
    sql: Arc<Sql>,
    /// The pool, the held locks, and the steps every SQL dialect shares.
    core: Core<pool::Connect, i64>,
    marks: MarksSql,
    /// The marks table is known to exist (created on the first mark).
    marks_ready: AtomicBool,
}

crate::sql::dialect::sql_locker!(PostgresLocker, PostgresLockerBuilder, "DISTLOCK_POSTGRES_", keys: {
    fn id(&self, key: &str) -> Result<i64> {
        validate::key(key)?;
        Ok(self.advisory_key(key))
    }
});

impl PostgresLocker {
    async fn start(settings: Settings) -> Result<Self> {
        let settings = Arc::new(settings);
        let sql = Arc::new(Sql::new(settings.fencing.as_ref()));
        let inner = Arc::new(Inner {
            leases: crate::SharedLocker::default(),
            raw_leases: crate::SharedLocker::default(),
            core: pool::core(&settings, &sql),
            marks: MarksSql::new(settings.fencing.as_ref()),
            marks_ready: AtomicBool::new(false),
            settings,
            sql,
        });
        inner.core.pool.shared(&0_i64).await?;
        Ok(PostgresLocker { inner })
    }

    /// The advisory key this locker takes for `key` (with its namespace; see
    /// [`advisory_key`]). Useful to find a lock in `pg_locks`.
    pub fn advisory_key(&self, key: &str) -> i64 {
        advisory_key(&self.inner.settings.namespace, key)
    }

    /// [`Locker::try_lock`] on a raw advisory key, used as is (no hashing, no
    /// namespace): for programs that already lock integer keys with
    /// `pg_advisory_lock(bigint)`. The lease's key is the decimal number.
    pub async fn try_lock_raw(&self, key: i64, ttl: Duration) -> Result<Option<Lease>> {
        self.raw_keys().try_lock(&key.to_string(), ttl).await
    }

    /// [`Locker::lock`] on a raw advisory key (see
    /// [`try_lock_raw`](Self::try_lock_raw)).
    pub async fn lock_raw(&self, key: i64, ttl: Duration, timeout: Duration) -> Result<Lease> {
        self.raw_keys().lock(&key.to_string(), ttl, timeout).await
    }

    /// This locker seen as a [`Locker`] whose keys are raw advisory keys
    /// written as decimal integers (`"42"`, `"-7"`), for use with
    /// [`crate::with_lock`] and the wrappers. It shares sessions and held
    /// locks with `self`.
    pub fn raw_keys(&self) -> RawKeys {
        RawKeys {
            locker: self.clone(),
        }
    }
}

/// A [`PostgresLocker`] whose keys are raw advisory keys in decimal (see
/// [`PostgresLocker::raw_keys`]). A key that is not a decimal `i64` is
/// [`Error::InvalidInput`].
///
/// ```no_run
/// use std::time::Duration;
/// use distlock::Locker;
///
/// # async fn demo(locker: distlock::postgres::PostgresLocker) -> Result<(), distlock::Error> {
/// // The same lock as `SELECT pg_advisory_lock(42)` in SQL.
/// let raw = locker.raw_keys();
/// let lease = raw.try_lock("42", Duration::from_secs(30)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RawKeys {
    locker: PostgresLocker,
}

impl fmt::Debug for RawKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RawKeys").field(&self.locker).finish()
    }
}

impl SqlKeys for RawKeys {
    type Dialect = Inner;

    fn parts(&self) -> (&Inner, &crate::SharedLocker) {
        (&self.locker.inner, &self.locker.inner.raw_leases)
    }

    fn id(&self, key: &str) -> Result<i64> {
        keys::parse_raw(key)
    }
}
