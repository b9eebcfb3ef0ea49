//! The Lua scripts behind acquire, release, refresh, forget, marks, and
//! inspection and operator release.
//!
//! Each runs atomically on the server, so "check the owner token, then act" is
//! one step no other client can interleave with. They are sent by `EVALSHA`
//! ([`redis::Script::invoke_async`]): the text crosses the wire only when the
//! server answers `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`),
//! and redis-rs then loads it and retries once. Sending the whole text with
//! every `EVAL` cost peer libraries a large share of their throughput.

use std::sync::LazyLock;

use redis::Script;

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
/// `false` when the lock is free, `{pttl, grant}` when its value carries no
/// record (a foreign client such as redis-py's `Lock`, or a holder with
/// recording off), else `{pttl, grant, ttl_ms, granted_ms, 'pid \n host \n label',
/// fence}` (the counter's value is the grant's fencing token: it moves only
/// when a grant is made). `grant` is the SHA-1 of the owner token: it tells
/// grants apart (Redlock finds the one a majority of nodes hold) without
/// revealing the token.
macro_rules! describe_lua {
    () => {
        r"
local function describe(lock, fence)
    local value = redis.call('GET', lock)
    if not value then
        return false
    end
    local pttl = redis.call('PTTL', lock)
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
    };
}

/// `KEYS[1]` lock key, `KEYS[2]` fence key; `ARGV[1]` the lock's value: the
/// owner token, alone or followed by a line break and the holder record (see
/// `lock_value_lua`); `ARGV[2]` ttl in milliseconds. Returns the fencing
/// token of the grant (at least 1), or 0 if the lock is held by another
/// token (contention).
///
/// The token is not sent apart from the value: every argument costs the
/// server a Lua string (an allocation and a hash of every byte), on every
/// acquire, while only the retry below needs the token alone, and cuts it
/// from the value.
///
/// The counter is bumped only on a new grant, in the same atomic step as the
/// `SET`, so every grant gets a token greater than every earlier grant's.
///
/// **Idempotent per owner token.** An acquire whose reply was lost (the
/// connection broke after the request was sent) is retried with the *same*
/// token. If the first run took effect, the key already holds our token: the
/// script then re-arms its ttl and returns the counter's current value,
/// which is our grant's token, because the counter moves only when a `SET
/// NX` succeeds, and none can succeed while our token stays in the key.
/// Without this the retry would find its own orphan and report contention
/// while nobody else holds the lock. (A counter deleted by a foreign client
/// is started again by `INCR`.)
const ACQUIRE: &str = concat!(
    r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return redis.call('INCR', KEYS[2])
end
",
    lock_value_lua!(),
    r"
local line_end = string.find(ARGV[1], '\n', 1, true)
local owner = line_end and string.sub(ARGV[1], 1, line_end - 1) or ARGV[1]
local value = redis.call('GET', KEYS[1])
if owns(value, owner) then
    rearm(KEYS[1], value, owner, ARGV[2])
    local fence = tonumber(redis.call('GET', KEYS[2]))
    if not fence then
        fence = redis.call('INCR', KEYS[2])
    end
    return fence
end
return 0
"
);

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
if ",
    owns_lua!("value", "ARGV[1]"),
    r" then
    redis.call('DEL', KEYS[1])
    redis.pcall(ARGV[3], ARGV[2], 'released')
    return 1
end
return 0
"
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

/// `KEYS[1]` lock key, `KEYS[2]` fence key; `ARGV[1]` release channel,
/// `ARGV[2]` the publish command (as for `RELEASE`). Deletes the lock
/// whoever holds it, publishes the release so waiters wake, and returns
/// what it evicted (as `INSPECT` reads it), or nil if the lock was free
/// (nothing done). One script, so what it returns is exactly what it
/// deleted.
const FORCE_RELEASE: &str = concat!(
    lock_value_lua!(),
    describe_lua!(),
    r"
local evicted = describe(KEYS[1], KEYS[2])
if not evicted then
    return false
end
redis.call('DEL', KEYS[1])
redis.pcall(ARGV[2], ARGV[1], 'released')
return evicted
"
);

/// `KEYS[i]` lock keys; `ARGV[2i - 1]` the owner token of lock `i`,
/// `ARGV[2i]` its new ttl in milliseconds. Returns one integer per lock, in
/// order: what [`REFRESH`] returns for it. [`REFRESH`] for many locks in
/// one round trip: the keepalive scheduler's batch. On a cluster every key
/// of one call is in one slot.
const REFRESH_MANY: &str = concat!(
    lock_value_lua!(),
    refresh_lua!(),
    r"
local refreshed = {}
for i = 1, #KEYS do
    refreshed[i] = refresh(KEYS[i], ARGV[2 * i - 1], ARGV[2 * i])
end
return refreshed
"
);

/// `KEYS[1]` lock key, `KEYS[2]` fence key. Deletes the fencing counter if
/// the lock is free and returns 1; returns 0 (nothing deleted) if it is held.
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

// The SHA1 of each script is computed once per process.
pub(crate) static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
pub(crate) static REFRESH_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(REFRESH));
pub(crate) static REFRESH_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(REFRESH_MANY));
pub(crate) static FORGET_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(FORGET));
pub(crate) static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT));
pub(crate) static FORCE_RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(FORCE_RELEASE));
pub(crate) static ADVANCE_MARK_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ADVANCE_MARK));
