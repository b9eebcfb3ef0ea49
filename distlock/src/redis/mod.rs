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
//! - **refresh** is a compare-and-`PEXPIRE` script;
//! - **shared (reader) locks** keep their readers in a sorted set beside the
//!   lock key, `<prefix>{<key>}:readers`, and mark the lock key as held by
//!   readers (see "Shared locks" below).
//!
//! The lock key, the fence key, the reader set and the channel share one
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
//! - **Fencing off** ([`Config::fencing`], `?fencing=off`): the grant is the
//!   `SET NX PX` alone, no counter is written, and every lease's (and
//!   inspection's) fencing token is `None`; [`Capabilities::fencing`] is
//!   false. Everything above but fencing holds as it is. What is given up:
//!   a holder that stalls past its ttl (a pause, a stopped VM, a partition)
//!   while the next holder is granted cannot be told apart by the resource
//!   it writes to, so **a paused holder's late writes cannot be rejected**;
//!   only the ttl and refreshes bound the overlap, which is the guarantee
//!   the locks without tokens it is compared with give (BENCHMARKS.md). Use
//!   it only when nothing downstream checks a token. Lockers with fencing
//!   on and off may share keys: they exclude each other as before, and a
//!   grant with fencing off leaves the counter as it was, so the next
//!   fenced grant's token is still above every earlier fenced one.
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
//!   ignores (then lock, fence and reader keys may land in different slots
//!   and the scripts fail with `CROSSSLOT`: an error, never a wrong answer).
//!   A key containing `{` or `}` is hashed by Redis' first-brace rule, still
//!   one tag for all of the lock's keys.
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
//! # Shared locks
//!
//! [`Locker::try_lock_shared`] and [`Locker::lock_shared`] grant reader
//! leases, one script per operation, as for exclusive locks:
//!
//! - **Readers** are the members of a sorted set beside the lock key,
//!   `<prefix>{<key>}:readers` ([`RedisLocker::readers_key`]): each reader's
//!   owner token, scored by its expiry in milliseconds on the **server's**
//!   clock (`TIME` plus its ttl; never the client's). While any reader
//!   holds the key, **the lock key holds the marker `shared:readers`** and
//!   expires with the last reader (`PEXPIREAT` of the highest score; the set
//!   expires at the same instant). A shared acquire succeeds unless a writer
//!   holds the lock key: it drops the readers that expired, adds itself,
//!   and re-arms the set and the marker to the last reader's expiry.
//! - **Writers are kept out by the marker.** The exclusive acquire script
//!   is unchanged: its `SET NX` fails while the marker is there, as it does
//!   while another writer holds the key, so exclusive locks cost what they
//!   did (no command, key or argument more per acquire, release or
//!   refresh). Every script that changes the reader set first drops the
//!   expired readers and re-arms the marker to the highest live score (or
//!   deletes it with the last reader), so the marker outlives its last
//!   reader by at most a millisecond. Clients of other libraries that lock
//!   with `SET NX` (redis-py's `Lock`) are kept out by readers too.
//! - **Reader or writer, told by the owner token**: a reader's token is
//!   `shared:` followed by 32 hex digits, a writer's the 32 hex digits
//!   alone. [`Locker::unlock`] and [`Locker::refresh`] send a token with
//!   the prefix to the reader scripts (remove it from the set; move its
//!   score and the marker's expiry), any other to the exclusive scripts,
//!   which are unchanged. A reader script that finds no reader by its
//!   token but the key held by a writer with that token (a client of
//!   another library whose tokens happen to start with `shared:`) acts as
//!   the exclusive script would, so a token is found whichever it is, in
//!   one script. [`Locker::refresh_many`] carries both kinds in one batch.
//!   Refreshing or releasing a reader whose ttl ran out is
//!   [`Error::NotHeld`]: it is not revived.
//! - **Fencing**: a reader's fencing token is the fence counter's value,
//!   read, not advanced: the last writer's (0 if no writer ever held the
//!   key). The next writer's `INCR` gives it a larger one.
//! - **Release notifications**: the reader leaving last deletes the marker
//!   and publishes on the release channel, which wakes waiting writers; a
//!   writer's release wakes waiting readers as it wakes writers. A reader
//!   that leaves others behind publishes nothing (only writers wait for
//!   readers, and they wait for the last one). Readers that expire publish
//!   nothing; waiters find the key free by polling, as after a writer's
//!   expiry.
//! - **A waiting writer does not block new readers**: a writer waiting in
//!   [`Locker::lock`] is woken (or polls) and gets the key only once no
//!   reader holds it, so readers that keep overlapping can starve it.
//! - **Loss** is found as for a writer: a reader whose entry or marker is
//!   gone (a restart without persistence, a failover that lost it, a forced
//!   release, an operator's `DEL`) gets [`Error::NotHeld`] at its next
//!   refresh, and under a keepalive its lost signal fires. Eviction is as
//!   dangerous as for writers (the marker has a ttl, so a `volatile-*`
//!   policy can evict it and let a writer in beside readers) and refused
//!   the same way (see "What the server must be configured with").
//! - **Inspection**: a key held by readers is reported held,
//!   [`HeldLock::shared`], `ttl_left` running until the last reader's
//!   expiry, with the fencing token the readers carry. Readers write no
//!   holder record (their grant writes the token alone), so `holder`,
//!   `granted` and `ttl` are `None`. [`Locker::list`] finds it (its lock
//!   key holds the marker), [`RedisLocker::remaining_ttl`] is the last
//!   reader's, [`Locker::forget`] refuses it as held, and
//!   [`ForceRelease::Lock`] evicts every reader.
//! - Redlock has no shared locks (see its docs).
//!
//! # Semaphores
//!
//! A [`Semaphore`](crate::semaphore::Semaphore)'s permits are ordinary
//! locks, `name#0` to `name#N-1`, and one attempt is
//! [`Locker::try_lock_any`] over them. Here that is **one script call at
//! any occupancy**: the acquire script (the one [`Locker::try_lock`] runs,
//! given one key) takes the keys in order and grants the first free one as
//! it grants a single key (`SET NX PX` of the owner token and holder
//! record, `INCR` of that key's fence counter), or answers that all are
//! held. A permit attempt that finds every permit held costs one more
//! round trip: the semaphore's inspection of permit N (holders with a
//! larger limit). So a permit acquire is at most **2 round trips**,
//! against up to N + 1 one key at a time (`BENCHMARKS.md`, "Semaphores:
//! permit cycles", measures both). **Cost**: every call carries all N
//! keys (lock and fence key each), whichever is granted, and the server
//! runs one `SET NX` per key it tries, blocking other clients meanwhile;
//! measured, about 0.6 µs per key end to end with one client (N = 100: 94
//! µs against 37 µs one key at a time, when the first key tried is free),
//! and more under many clients. So the native attempt wins where permits
//! are scarce (all 10 held: 0.6 ms against 4.7 ms) and costs more than the
//! one-key-at-a-time attempt, also one round trip, where most of many
//! permits are free. A semaphore has at most
//! [`MAX_PERMITS`](crate::semaphore::MAX_PERMITS) permits.
//!
//! - **Redis Cluster** keeps the one-key-at-a-time default
//!   ([`try_lock_in_turn`](crate::try_lock_in_turn)): a script may only
//!   touch keys of one slot, and every permit key is its own hash tag
//!   (`{name#i}`), so the permits of one semaphore lie in different slots,
//!   and grouping consecutive keys by slot would almost never put two in
//!   one call. (Putting them under one tag would move every existing
//!   permit key, and load one node with all of a semaphore's traffic.)
//! - **Sentinel** and **one server**: the one script; [`Config::min_replicas`]
//!   confirms the granted key as for `try_lock`.
//! - **Redlock** is its own locker and keeps the default (see its docs).
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
//! `PUBLISH`, `PTTL`, for shared locks `ZADD`, `ZREM`, `ZSCORE`,
//! `ZREMRANGEBYSCORE`, `ZREVRANGE` and `PEXPIREAT`, and `TIME` (the
//! holder record's grant time, at a refresh and at inspection, never at an
//! exclusive acquire; the readers' expiries), which
//! Redis checks against the user as well. With the default prefix
//! `lock:`:
//!
//! ```text
//! ACL SETUSER lockuser on >PASSWORD resetkeys ~lock:* resetchannels &lock:* -@all
//!     +evalsha +script|load +set +get +incr +pexpire +del +exists +publish
//!     +ping +subscribe +unsubscribe +pttl +time +scan +info +zadd +zrem
//!     +zscore +zremrangebyscore +zrevrange +pexpireat
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
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::{validate, Result};
// The module docs link to these; the code that uses them is in `locker.rs`.
#[cfg(doc)]
use crate::{
    inspect::{ForceRelease, HeldLock},
    Capabilities, Error, Locker,
};

mod acquire;
mod client;
mod config;
mod connection;
mod errors;
mod inspect;
mod keys;
mod locker;
mod marks;
mod refresh;
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

use acquire::ReplicaAck;
use connection::Connection;
use errors::Target;
use keys::KeySpace;
use releases::ReleaseHub;
use scripts::READER_TOKEN_PREFIX;
use server::ServerReport;

const BACKEND: &str = "redis";

/// The commands a lock user needs (inspection and listing included), as `ACL SETUSER` rules (see the module
/// docs, "ACL"); add the key and channel patterns of your prefix
/// (`~lock:* &lock:*`) and `+select` for a database other than 0.
///
/// ```
/// assert!(distlock::redis::ACL_RULES.starts_with("-@all +evalsha"));
/// ```
pub const ACL_RULES: &str = "-@all +evalsha +script|load +set +get +incr +pexpire +del +exists \
     +publish +ping +subscribe +unsubscribe +pttl +time +scan +info +zadd +zrem +zscore \
     +zremrangebyscore +zrevrange +pexpireat";

/// What a lock user on a Redis Cluster needs on top of [`ACL_RULES`] (see
/// the module docs, "ACL"): the slot map, sharded publish from the release
/// script, and sharded subscriptions for waiters.
///
/// ```
/// let rules = format!("{} {}", distlock::redis::ACL_RULES, distlock::redis::ACL_CLUSTER_RULES);
/// assert!(rules.ends_with("+cluster|slots +spublish +ssubscribe +sunsubscribe"));
/// ```
pub const ACL_CLUSTER_RULES: &str = "+cluster|slots +spublish +ssubscribe +sunsubscribe";

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
    /// [`Config::fencing`].
    fencing: bool,
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

impl fmt::Debug for RedisLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLocker")
            .field("endpoint", &self.inner.target.endpoint)
            .field("key_prefix", &self.inner.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl RedisLocker {
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

    /// The sorted set of `key`'s shared (reader) holders:
    /// `<prefix>{<key>}:readers`, each member a reader's owner token scored
    /// by its expiry in milliseconds on the server's clock (see the [module
    /// docs](self), "Shared locks").
    pub fn readers_key(&self, key: &str) -> String {
        self.inner.keys.readers_key(key)
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

    /// How long `key`'s lock has left on the server's clock (`PTTL`), or
    /// `None` if it is not held; held by readers, until the last reader's
    /// expiry. A key without expiry (only a foreign client
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
}

/// Whether `owner` is a reader's token, which the reader scripts handle
/// (see `scripts.rs`, "Shared locks").
fn is_reader_token(owner: &str) -> bool {
    owner.starts_with(READER_TOKEN_PREFIX)
}

/// The ttl in whole milliseconds, rounded up: the server then holds the lock
/// at least as long as the lease believes.
fn ttl_millis(ttl: Duration) -> u64 {
    validate::whole_units(ttl, Duration::from_millis(1))
}
