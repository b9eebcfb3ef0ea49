//! The Lua scripts behind acquire, release, refresh, forget, marks, shared
//! (reader) locks, and inspection and operator release.
//!
//! Each runs atomically on the server, so "check the owner token, then act" is
//! one step no other client can interleave with. They are sent by `EVALSHA`
//! ([`redis::Script::invoke_async`]): the text crosses the wire only when the
//! server answers `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`),
//! and redis-rs then loads it and retries once. Sending the whole text with
//! every `EVAL` cost peer libraries a large share of their throughput.

use std::sync::LazyLock;

use redis::Script;

/// # Shared locks
///
/// Readers are members of a sorted set beside the lock key,
/// `<prefix>{<key>}:readers`: each reader's owner token, scored by its
/// expiry in milliseconds on the server's clock (`TIME` when it was
/// granted or refreshed, plus its ttl; never the client's clock). While any
/// reader holds the key, **the lock key itself holds [`SHARED_MARKER`]**
/// and expires with the last reader (`PEXPIREAT` of the highest score; the
/// set expires at the same instant). So the exclusive scripts need no
/// change and cost nothing more: a writer's `SET NX` fails while the
/// marker is there, exactly as it does while another writer holds the key,
/// and a foreign client's `SET NX` (redis-py's `Lock`) is kept out by
/// readers too. The marker outlives no live reader: every script that
/// changes a score (grant, refresh, release) first drops the readers
/// expired at `TIME`, then re-arms both keys to the highest remaining
/// score, or deletes them when none is left. (A reader is live while its
/// score is above `TIME` in milliseconds; Redis keeps a key until its
/// clock passes the `PEXPIREAT` instant, and a script's expiry clock is
/// never ahead of `TIME`: the marker lives at least as long as the last
/// live reader, and at most the millisecond after it.)
///
/// **Reader and writer tokens.** A reader's owner token is
/// [`READER_TOKEN_PREFIX`] and 32 hex digits; a writer's is the 32 hex
/// digits alone (`crate::new_owner_token`). `unlock` and `refresh` get only
/// the token: the client sends a token with the prefix to the reader
/// scripts ([`RELEASE_SHARED`], [`REFRESH_SHARED`]), any other to the
/// exclusive ones, which are unchanged. A reader script that finds no
/// reader by that token, and the key held by a writer, treats the token
/// as a writer's (a client of another library whose tokens happen to start
/// with the prefix); so an owner token is found whichever it is, in one
/// script. The marker starts with the prefix too, so an owner token equal
/// to the marker reaches the reader scripts, which never release or
/// re-arm the marker by it.
///
/// **Fencing**: a reader's token is the fence counter's value, read, not
/// advanced (0 if no writer ever held the key): the last writer's.
macro_rules! reader_prefix {
    () => {
        "shared:"
    };
}

/// The lock key's value while readers hold the key: see `reader_prefix`.
macro_rules! shared_marker {
    () => {
        concat!(reader_prefix!(), "readers")
    };
}

/// What every reader's owner token starts with (see "Shared locks" on
/// `reader_prefix`).
pub(crate) const READER_TOKEN_PREFIX: &str = reader_prefix!();

/// Lua helpers over the reader set (see "Shared locks" on
/// `reader_prefix`), for the scripts that change it:
///
/// - `now_millis()`: the server's clock (`TIME`) in whole milliseconds.
///   Lua numbers are doubles, exact for milliseconds since 1970.
/// - `millis(n)`: `n` as an integer string, for scores and `PEXPIREAT`.
/// - `expire_readers(readers, now)`: drops the readers expired at `now`,
///   sets the set to expire with the last one left and returns its score
///   (a string), or `false` if none is left (the set is then gone).
macro_rules! readers_lua {
    () => {
        r"
local function now_millis()
    local now = redis.call('TIME')
    return now[1] * 1000 + math.floor(now[2] / 1000)
end

local function millis(n)
    return string.format('%.0f', n)
end

local function expire_readers(readers, now)
    redis.call('ZREMRANGEBYSCORE', readers, '-inf', millis(now))
    local last = redis.call('ZREVRANGE', readers, 0, 0, 'WITHSCORES')[2]
    if last then
        redis.call('PEXPIREAT', readers, last)
        return last
    end
    return false
end
"
    };
}

/// Lua helpers over the lock key's value, which is the owner token of the
/// grant, followed, when the holder is recorded, by its holder record:
/// `owner \n ttl_ms \n granted_ms \n pid \n host \n label` (the label last,
/// so it may contain line breaks).
///
/// The record rides in the lock key's own value, built by the client and
/// written by the grant's `SET NX PX`, because it rides in every acquire and
/// the server's time per script is what bounds throughput under
/// concurrency. Instructions the server ran per acquire+release, counted
/// with `valgrind --tool=callgrind` on `redis-server` 7.0 (both scripts'
/// bodies in one, 20,000 runs; repeatable to 0.2 %): no record 53.8k; the
/// record in a key of its own, timed by `TIME`, 76.3k; in the lock's value,
/// timed by `TIME`, 66.5k; in the lock's value with no `TIME` (this), 59.4k.
///
/// The grant time is still the server's clock: the acquire leaves it empty,
/// since the `PX` the grant armed already fixes it (the key's expiry minus
/// its ttl), and the first re-arming of the expiry (a refresh, or an
/// acquire retried by its own token) writes it down before moving the
/// expiry; until then inspection reads it off the expiry. The fencing token
/// is not in it: while the grant holds the lock it is the fence counter's
/// value, which inspection reads.
///
/// - `owns(value, owner)`: whether `value` (a `GET` reply) is `owner`'s: the
///   token alone, or the token and a record.
/// - `granted_millis(lock, ttl)`: the server time, in milliseconds, at which
///   `lock` was armed with `ttl` (a string) milliseconds: its expiry minus
///   the ttl. Lua numbers are doubles, exact for milliseconds since 1970.
/// - `rearm(lock, value, owner, ttl)`: extends `lock`, whose value `value`
///   `owner` holds, to `ttl` milliseconds; a record keeps its grant time and
///   takes the new ttl. 1 (the ttl was set).
///
/// The hot paths (a grant, a release) run none of these: every run of a
/// script executes its top-level `local function` statements, each making
/// a closure, so the acquire script defines them after its fast path, and
/// the release script tests ownership with the `owns_lua` expression.
macro_rules! lock_value_lua {
    () => {
        concat!(
            r"
local function owns(value, owner)
    return ",
            owns_lua!("value", "owner"),
            r"
end
",
            r"
local function granted_millis(lock, ttl)
    local now = redis.call('TIME')
    local expires = now[1] * 1000 + math.floor(now[2] / 1000) + redis.call('PTTL', lock)
    return string.format('%.0f', expires - tonumber(ttl))
end

local function rearm(lock, value, owner, ttl)
    if value == owner then
        return redis.call('PEXPIRE', lock, ttl)
    end
    local ttl_start = #owner + 2
    local ttl_end = string.find(value, '\n', ttl_start, true)
    local granted_end = ttl_end and string.find(value, '\n', ttl_end + 1, true)
    if not granted_end then
        return redis.call('PEXPIRE', lock, ttl)
    end
    local armed = string.sub(value, ttl_start, ttl_end - 1)
    local granted = string.sub(value, ttl_end + 1, granted_end - 1)
    if granted ~= '' and armed == ttl then
        return redis.call('PEXPIRE', lock, ttl)
    end
    if granted == '' then
        granted = granted_millis(lock, armed)
    end
    redis.call('SET', lock, owner .. '\n' .. ttl .. '\n' .. granted .. string.sub(value, granted_end),
        'PX', ttl)
    return 1
end
"
        )
    };
}

/// A Lua expression: whether the variable `$value` (a `GET` reply, `false`
/// when the key is absent) holds the owner token in the variable `$owner`,
/// alone or followed by a holder record (see `lock_value_lua`). Interned
/// strings compare by pointer, so the bare token costs one comparison;
/// `string.sub` of the token's length finds the interned `$owner` itself.
macro_rules! owns_lua {
    ($value:literal, $owner:literal) => {
        concat!(
            "(",
            $value,
            " == ",
            $owner,
            " or (",
            $value,
            " and string.byte(",
            $value,
            ", #",
            $owner,
            " + 1) == 10 and string.sub(",
            $value,
            ", 1, #",
            $owner,
            ") == ",
            $owner,
            "))"
        )
    };
}

/// Reads what is known of the lock `lock`, with its fence counter `fence`:
/// `false` when the lock is free, `{pttl, grant, fence}` when readers hold
/// it (its value is the shared marker; `pttl` runs until the last reader's
/// expiry; readers leave no holder record), `{pttl, grant}` when its value
/// carries no record (a foreign client such as redis-py's `Lock`, or a holder with
/// recording off), else `{pttl, grant, ttl_ms, granted_ms, 'pid \n host \n label',
/// fence}` (the counter's value is the grant's fencing token: it moves only
/// when a grant is made). `grant` is the SHA-1 of the owner token: it tells
/// grants apart (Redlock finds the one a majority of nodes hold) without
/// revealing the token.
macro_rules! describe_lua {
    () => {
        concat!(
            r"
local function describe(lock, fence)
    local value = redis.call('GET', lock)
    if not value then
        return false
    end
    local pttl = redis.call('PTTL', lock)
    if value == '",
            shared_marker!(),
            r"' then
        return {pttl, redis.sha1hex(value), redis.call('GET', fence) or ''}
    end
    local owner_end = string.find(value, '\n', 1, true)
    local ttl_end = owner_end and string.find(value, '\n', owner_end + 1, true)
    local granted_end = ttl_end and string.find(value, '\n', ttl_end + 1, true)
    if not granted_end then
        return {pttl, redis.sha1hex(value)}
    end
    local ttl = string.sub(value, owner_end + 1, ttl_end - 1)
    local granted = string.sub(value, ttl_end + 1, granted_end - 1)
    if granted == '' then
        granted = granted_millis(lock, ttl)
    end
    return {pttl, redis.sha1hex(string.sub(value, 1, owner_end - 1)), ttl, granted,
        string.sub(value, granted_end + 1), redis.call('GET', fence) or ''}
end
"
        )
    };
}

/// The acquire scripts' answer for a grant of the key at `KEYS[i]`, its
/// fencing token in the variable `fence`: the bare token for the first key
/// (a one-key attempt's reply costs no array; see [`ACQUIRE`]), else
/// `{$position, fence}`. One text for the new grant and for a key already
/// ours, because `granted_key` in `acquire.rs` decodes this one shape.
macro_rules! grant_reply_lua {
    ($position:literal) => {
        concat!(
            r"
        if i == 1 then
            return fence
        end
        return {",
            $position,
            r", fence}"
        )
    };
}

/// The grant, over the keys of one attempt in order: the first key whose
/// `SET NX` succeeds is granted, its fence counter bumped in the same atomic
/// step (`INCR`), and the script returns for it as [`ACQUIRE`] says. Writes
/// nothing when every key is held. Used twice in [`ACQUIRE`]: inline, not a
/// `local function`, so the hot path makes no closure (see
/// `lock_value_lua`).
///
/// Its arguments make the grant of [`ACQUIRE_UNFENCED`] from the same text:
/// the stride of `KEYS` (2: each lock key followed by its fence key), the
/// fence a grant answers, and the key's position in the caller's list.
macro_rules! grant_first_free_lua {
    ($stride:literal, $fence:literal, $position:literal) => {
        concat!(
            r"
for i = 1, #KEYS, ",
            $stride,
            r" do
    if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
        local fence = ",
            $fence,
            grant_reply_lua!($position),
            r"
    end
end
"
        )
    };
}

/// [`ACQUIRE`] and [`ACQUIRE_UNFENCED`] from one text: `$stride` keys per
/// lock key, `$fence` the grant's fence (an expression), `$retry_fence` the
/// statement setting `fence` for a key already ours, `$position` the
/// key's position in the caller's list.
macro_rules! acquire_lua {
    ($stride:literal, $fence:literal, $retry_fence:literal, $position:literal) => {
        concat!(
            r"
local several = #KEYS > ",
            $stride,
            r"
if not (several and ARGV[3]) then
",
            grant_first_free_lua!($stride, $fence, $position),
            r"
    if several then
        return 0
    end
end
",
            lock_value_lua!(),
            r"
local line_end = string.find(ARGV[1], '\n', 1, true)
local owner = line_end and string.sub(ARGV[1], 1, line_end - 1) or ARGV[1]
for i = 1, #KEYS, ",
            $stride,
            r" do
    local value = redis.call('GET', KEYS[i])
    if owns(value, owner) then
        rearm(KEYS[i], value, owner, ARGV[2])
",
            $retry_fence,
            grant_reply_lua!($position),
            r"
    end
end
if several then
",
            grant_first_free_lua!($stride, $fence, $position),
            r"
end
return 0
"
        )
    };
}

/// One attempt at one key ([`Locker::try_lock`](crate::Locker::try_lock))
/// or at the first free one of several
/// ([`Locker::try_lock_any`](crate::Locker::try_lock_any), a semaphore's
/// permits): one script either way, so a key is granted the same way
/// whichever asked.
///
/// `KEYS` the keys to try, in order, each as its lock key then its fence
/// key (`KEYS[2i - 1]`, `KEYS[2i]` for the `i`-th); `ARGV[1]` the lock's
/// value: the owner token, alone or followed by a line break and the holder
/// record (see `lock_value_lua`); `ARGV[2]` ttl in milliseconds; `ARGV[3]`,
/// present only when the attempt is sent again with the same token (see
/// below). Returns the fencing token `fence` (at least 1) if the first key
/// was granted, `{i, fence}` if the `i`-th (`i` > 1) was, or 0 if every key
/// is held by another token (contention). Keys are tried in the order given
/// and at most one is granted.
///
/// **One key costs what it did before keys were a list**: the first key's
/// grant answers the bare integer, as the one-key script did. Measured on
/// Redis 7.0 (server time per `EVALSHA` of a grant, `usec_per_call` of
/// `INFO commandstats`, medians of 8 interleaved `redis-benchmark` runs of
/// 100,000 grants): the one-key script 5.35 µs, this one 5.35 µs, this
/// one answering `{1, fence}` for the first key too 6.17 µs. The loop over
/// the keys costs nothing measurable; an array reply does.
///
/// The token is not sent apart from the value: every argument costs the
/// server a Lua string (an allocation and a hash of every byte), on every
/// acquire, while only the checks below need the token alone, and cut it
/// from the value.
///
/// The counter is bumped only on a new grant, in the same atomic step as the
/// `SET`, so every grant gets a token greater than every earlier grant's.
///
/// **Idempotent per owner token.** An acquire whose reply was lost (the
/// connection broke after the request was sent) is retried with the *same*
/// token. If the first run took effect, a key already holds our token: the
/// script then re-arms its ttl and returns the counter's current value,
/// which is our grant's token, because the counter moves only when a `SET
/// NX` succeeds, and none can succeed while our token stays in the key.
/// Without this the retry would find its own orphan and report contention
/// while nobody else holds the lock. (A counter deleted by a foreign client
/// is started again by `INCR`.) With one key that check follows a failed
/// `SET NX`, as it always did (the Redlock backend relies on it without
/// saying it retries). With several, a retry (`ARGV[3]`) looks for its
/// token **before** granting anything: an earlier key freed between the
/// two runs would otherwise be granted too, leaving the first grant under
/// a token no lease carries until its ttl. A first run looks for nothing:
/// its fresh token is in no key.
///
/// **Readers keep a writer out with no extra command**: while readers hold
/// the key its value is the shared marker (see "Shared locks" on
/// `reader_prefix`), so the `SET NX` fails as for a writer's hold; the
/// marker expires with the last reader.
const ACQUIRE: &str = acquire_lua!(
    "2",
    "redis.call('INCR', KEYS[i + 1])",
    "        local fence = tonumber(redis.call('GET', KEYS[i + 1]))
        if not fence then
            fence = redis.call('INCR', KEYS[i + 1])
        end",
    "(i + 1) / 2"
);

/// [`ACQUIRE`] for a locker with fencing off ([`Config::fencing`]): the
/// same grant, retry and answers, over the lock keys alone (`KEYS[i]` the
/// `i`-th, no fence keys), with no counter bumped or read; a grant answers
/// 1 where [`ACQUIRE`] answers its token (the caller gives the lease none).
/// The `SET NX` is the whole grant, as in the locks without fencing it is
/// compared with.
///
/// [`Config::fencing`]: super::Config::fencing
const ACQUIRE_UNFENCED: &str = acquire_lua!("1", "1", "        local fence = 1", "i");

/// Lua statements, with the arguments of `RELEASE`, that end the script:
/// if `value` (the lock key's) is the writer `ARGV[1]`'s, delete the key,
/// announce the release and return 1, else return 0. The whole of
/// `RELEASE`, and `RELEASE_SHARED`'s answer when a writer holds the key.
macro_rules! release_writer_lua {
    () => {
        concat!(
            "if ",
            owns_lua!("value", "ARGV[1]"),
            r" then
    redis.call('DEL', KEYS[1])
    redis.pcall(ARGV[3], ARGV[2], 'released')
    return 1
end
return 0
"
        )
    };
}

/// `KEYS[1]` lock key; `ARGV[1]` owner token, `ARGV[2]` release channel,
/// `ARGV[3]` the publish command (`PUBLISH`, or `SPUBLISH` on a cluster).
/// Returns 1 if the token matched and the lock (with its holder record) was
/// deleted, else 0 (nothing deleted).
///
/// The release is announced on the key's channel so waiters wake at once.
/// On a cluster it is `SPUBLISH` (sharded pub/sub, Redis 7+): the channel
/// shares the lock key's hash tag, so it is in the script's slot and the
/// message stays on that shard, where the waiters subscribed with
/// `SSUBSCRIBE`; a classic `PUBLISH` would be broadcast to every node.
/// `pcall`: a user whose ACL forbids publishing on the channel (or a server
/// without `SPUBLISH`) can still release; its waiters then find the release
/// by polling.
const RELEASE: &str = concat!(
    r"
local value = redis.call('GET', KEYS[1])
",
    release_writer_lua!()
);

/// Extends the lock `lock` held by `owner` to `ttl` milliseconds (see
/// `rearm` in `lock_value_lua`). 1 if the token matched and the ttl was
/// reset, else 0 (nothing touched).
macro_rules! refresh_lua {
    () => {
        r"
local function refresh(lock, owner, ttl)
    local value = redis.call('GET', lock)
    if not owns(value, owner) then
        return 0
    end
    return rearm(lock, value, owner, ttl)
end
"
    };
}

/// `KEYS[1]` lock key; `ARGV[1]` owner token, `ARGV[2]` new ttl in
/// milliseconds. Returns 1 if the token matched and the ttl was reset, else
/// 0 (see `refresh_lua`).
const REFRESH: &str = concat!(
    lock_value_lua!(),
    refresh_lua!(),
    r"
return refresh(KEYS[1], ARGV[1], ARGV[2])
"
);

/// `KEYS[1]` lock key, `KEYS[2]` fence key. Returns nil if the lock is
/// free, else what `describe_lua` reads. Writes nothing.
const INSPECT: &str = concat!(
    lock_value_lua!(),
    describe_lua!(),
    r"
return describe(KEYS[1], KEYS[2])
"
);

/// `KEYS[1]` lock key, `KEYS[2]` fence key, `KEYS[3]` reader set; `ARGV[1]`
/// release channel, `ARGV[2]` the publish command (as for `RELEASE`).
/// Deletes the lock whoever holds it (every reader, when readers hold it),
/// publishes the release so waiters wake, and returns what it evicted (as
/// `INSPECT` reads it), or nil if the lock was free (nothing done). One
/// script, so what it returns is exactly what it deleted.
const FORCE_RELEASE: &str = concat!(
    lock_value_lua!(),
    describe_lua!(),
    r"
local evicted = describe(KEYS[1], KEYS[2])
if not evicted then
    return false
end
redis.call('DEL', KEYS[1], KEYS[3])
redis.pcall(ARGV[2], ARGV[1], 'released')
return evicted
"
);

/// `KEYS[1]` lock key, `KEYS[2]` reader set, `KEYS[3]` fence key; `ARGV[1]`
/// the reader's owner token (see "Shared locks" on `reader_prefix`),
/// `ARGV[2]` ttl in milliseconds. Returns the fencing token the reader
/// carries (the counter's value, not advanced; 0 if no writer ever held
/// the key), or -1 if a writer (or a client of another library) holds the
/// key (contention).
///
/// A free key's reader set is deleted first: a set whose marker is gone
/// holds no live reader (they expire together), only the orphans of a
/// marker deleted behind the readers' backs (an operator's `DEL`). Writes
/// are ordered so that a script stopped half-way (a command refused by an
/// ACL, a full server) never leaves the marker without its expiry: the
/// reader set is written and given its expiry before the marker is set,
/// and `PEXPIREAT` is not refused under `maxmemory`. (A set left without
/// its expiry by a refused `PEXPIREAT` holds no one: without the marker it
/// keeps no writer out, and the key's next shared acquire deletes it.)
///
/// **Idempotent per owner token**, like [`ACQUIRE`]: a retry with the same
/// token after a lost reply re-adds the reader with a new expiry (`ZADD`
/// updates its score) and returns the same fencing token (no writer can
/// have come between: the reader held the key).
const ACQUIRE_SHARED: &str = concat!(
    readers_lua!(),
    r"
local value = redis.call('GET', KEYS[1])
if value and value ~= '",
    shared_marker!(),
    r"' then
    return -1
end
if not value then
    redis.call('DEL', KEYS[2])
end
local now = now_millis()
redis.call('ZADD', KEYS[2], millis(now + tonumber(ARGV[2])), ARGV[1])
local last = expire_readers(KEYS[2], now)
if not value then
    redis.call('SET', KEYS[1], '",
    shared_marker!(),
    r"')
end
redis.call('PEXPIREAT', KEYS[1], last)
return tonumber(redis.call('GET', KEYS[3]) or '0')
"
);

/// `KEYS[1]` lock key, `KEYS[2]` reader set; `ARGV[1]` an owner token with
/// the reader prefix, `ARGV[2]` release channel, `ARGV[3]` the publish
/// command (as for [`RELEASE`]). Returns 1 if the token was a live reader
/// and was removed (or held the key as a writer and released it), else 0
/// (nothing changed, or an expired reader's leftover entry was cleared).
///
/// The reader leaving last deletes the marker and publishes the release,
/// so a writer waiting for the key wakes at once; one that leaves others
/// behind re-arms the marker to the last remaining reader's expiry and
/// publishes nothing (only writers wait for readers, and they wait for all
/// of them).
const RELEASE_SHARED: &str = concat!(
    readers_lua!(),
    r"
local value = redis.call('GET', KEYS[1])
if value ~= '",
    shared_marker!(),
    r"' then
",
    release_writer_lua!(),
    r"end
local expires = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not expires then
    return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
local now = now_millis()
local last = expire_readers(KEYS[2], now)
if last then
    redis.call('PEXPIREAT', KEYS[1], last)
else
    redis.call('DEL', KEYS[1])
    redis.pcall(ARGV[3], ARGV[2], 'released')
end
if tonumber(expires) > now then
    return 1
end
return 0
"
);

/// Extends the reader `owner` of the lock `lock`, whose reader set is
/// `readers`, to `ttl` milliseconds from now on the server's clock, and
/// the marker and the set with it: 1 if it was a live reader, else 0
/// (nothing touched; an expired reader is not revived, as an expired
/// writer's key is not). A key held by a writer is refreshed as
/// `refresh_lua` does, for a writer whose token starts with the reader
/// prefix. Needs `lock_value_lua`, `refresh_lua` and `readers_lua`.
macro_rules! refresh_reader_lua {
    () => {
        concat!(
            r"
local function refresh_reader(lock, readers, owner, ttl)
    if redis.call('GET', lock) ~= '",
            shared_marker!(),
            r"' then
        return refresh(lock, owner, ttl)
    end
    local now = now_millis()
    local expires = redis.call('ZSCORE', readers, owner)
    if not expires or tonumber(expires) <= now then
        return 0
    end
    redis.call('ZADD', readers, millis(now + tonumber(ttl)), owner)
    redis.call('PEXPIREAT', lock, expire_readers(readers, now))
    return 1
end
"
        )
    };
}

/// `KEYS[1]` lock key, `KEYS[2]` reader set; `ARGV[1]` an owner token with
/// the reader prefix, `ARGV[2]` new ttl in milliseconds. Returns 1 if the
/// reader (or a writer with that token) was extended, else 0 (see
/// `refresh_reader_lua`).
const REFRESH_SHARED: &str = concat!(
    lock_value_lua!(),
    refresh_lua!(),
    readers_lua!(),
    refresh_reader_lua!(),
    r"
return refresh_reader(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
"
);

/// `ARGV[2i - 1]` the owner token of request `i`, `ARGV[2i]` its new ttl in
/// milliseconds; `KEYS` the lock key of each request, in order, each
/// followed by its reader set where the owner token has the reader prefix
/// (the client adds it by the same rule). Returns one integer per request,
/// in order: what [`REFRESH`] (or, for a reader, [`REFRESH_SHARED`])
/// returns for it. Many refreshes in one round trip: the keepalive
/// scheduler's batch. On a cluster every key of one call is in one slot.
const REFRESH_MANY: &str = concat!(
    lock_value_lua!(),
    refresh_lua!(),
    readers_lua!(),
    refresh_reader_lua!(),
    r"
local prefix = '",
    reader_prefix!(),
    r"'
local refreshed, k = {}, 1
for i = 1, #ARGV / 2 do
    local owner, ttl = ARGV[2 * i - 1], ARGV[2 * i]
    if string.sub(owner, 1, #prefix) == prefix then
        refreshed[i] = refresh_reader(KEYS[k], KEYS[k + 1], owner, ttl)
        k = k + 2
    else
        refreshed[i] = refresh(KEYS[k], owner, ttl)
        k = k + 1
    end
end
return refreshed
"
);

/// `KEYS[1]` lock key, `KEYS[2]` fence key. Deletes the fencing counter if
/// the lock is free and returns 1; returns 0 (nothing deleted) if it is held
/// (by a writer, or by readers: the lock key then holds the shared marker).
/// One script, so no grant can slip in between the check and the `DEL`.
const FORGET: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
end
redis.call('DEL', KEYS[2])
return 1
";

/// `KEYS[1]` mark key; `ARGV[1]` the new value, encoded by
/// `util::encode_mark`. Returns `{1, previous}` if the mark was absent (previous
/// `''`) or lower and is now `ARGV[1]`, else `{0, current}` (unchanged).
///
/// The values are compared as strings: Lua numbers are doubles, which
/// cannot tell 2^53 from 2^53 + 1, while the encoding orders like the
/// integers it encodes.
const ADVANCE_MARK: &str = r"
local current = redis.call('GET', KEYS[1])
if current and current >= ARGV[1] then
    return {0, current}
end
redis.call('SET', KEYS[1], ARGV[1])
return {1, current or ''}
";

/// A `pub(crate) static` [`Script`] for each script text (`NAME_SCRIPT`
/// for `NAME`): its SHA1 is computed once per process.
macro_rules! script_statics {
    ($($script:ident => $text:ident,)*) => {$(
        pub(crate) static $script: LazyLock<Script> = LazyLock::new(|| Script::new($text));
    )*};
}

script_statics! {
    ACQUIRE_SCRIPT => ACQUIRE,
    ACQUIRE_UNFENCED_SCRIPT => ACQUIRE_UNFENCED,
    RELEASE_SCRIPT => RELEASE,
    REFRESH_SCRIPT => REFRESH,
    ACQUIRE_SHARED_SCRIPT => ACQUIRE_SHARED,
    RELEASE_SHARED_SCRIPT => RELEASE_SHARED,
    REFRESH_SHARED_SCRIPT => REFRESH_SHARED,
    REFRESH_MANY_SCRIPT => REFRESH_MANY,
    FORGET_SCRIPT => FORGET,
    INSPECT_SCRIPT => INSPECT,
    FORCE_RELEASE_SCRIPT => FORCE_RELEASE,
    ADVANCE_MARK_SCRIPT => ADVANCE_MARK,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The safety of telling readers from writers by the token (see
    /// "Shared locks" on `reader_prefix`): the marker and readers' tokens
    /// reach the reader scripts only, writers' tokens never do, and no
    /// owner token but the marker itself could `owns` the marker (it has
    /// no line break).
    #[test]
    fn the_marker_and_reader_tokens_go_to_the_reader_scripts_and_writers_never_do() {
        let marker = shared_marker!();
        assert!(marker.starts_with(READER_TOKEN_PREFIX));
        assert!(!marker.contains('\n'));
        for _ in 0..100 {
            assert!(!crate::new_owner_token().starts_with(READER_TOKEN_PREFIX));
        }
        for script in [ACQUIRE_SHARED, RELEASE_SHARED, REFRESH_SHARED, REFRESH_MANY] {
            assert!(script.contains(marker) || script.contains(READER_TOKEN_PREFIX));
        }
        assert!(
            !ACQUIRE.contains(READER_TOKEN_PREFIX),
            "the exclusive acquire is unchanged"
        );
        assert!(
            !RELEASE.contains(READER_TOKEN_PREFIX),
            "the exclusive release is unchanged"
        );
    }
}
