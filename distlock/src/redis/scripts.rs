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

/// Writes the holder record of the grant just made (inside a script whose
/// `KEYS[3]` is the record's key, `ARGV[1]` the owner token, `ARGV[2]` the
/// ttl in milliseconds, `ARGV[3]` the holder as `pid \n host \n label`),
/// expiring with the lock.
///
/// The record is one string, `ttl_ms \n owner \n seconds \n microseconds \n
/// pid \n host \n label` (the grant time as `TIME` returns it; the label
/// last, so it may contain line breaks), written by one `SET ... PX` and
/// built from strings only, because it rides in every acquire and the
/// server's time per script is what bounds throughput under concurrency: a
/// hash (`HSET` of seven fields, `PEXPIRE`, a SHA-1 of the token) cost about
/// twice the server time of this, and turning numbers into strings in Lua
/// (the grant time in milliseconds, the fencing token) a third more. The
/// fencing token is not in it: while the grant holds the lock it is the
/// fence counter's value, which inspection reads. `owner`
/// ties the record to its grant: one left by an earlier grant (a locker
/// with recording off, or a foreign client, took the lock after it) never
/// describes the current one. It is the token the lock key itself holds,
/// so whoever may read the record may read the lock key anyway; the
/// inspect script never returns it. The grant time is the server's clock
/// (`TIME`); Redis 5+ replicates scripts by their effects, so reading it
/// before writing is allowed.
macro_rules! record_holder_lua {
    () => {
        r"
local function record_holder()
    local now = redis.call('TIME')
    redis.call('SET', KEYS[3], ARGV[2] .. '\n' .. ARGV[1] .. '\n' .. now[1] .. '\n' .. now[2] ..
        '\n' .. ARGV[3], 'PX', ARGV[2])
end
"
    };
}

/// Reads what is known of the lock `KEYS[1]` held by `owner` (its value),
/// with its holder record `KEYS[2]` (see `record_holder_lua`) and fence
/// counter `KEYS[3]`: `{pttl, grant}` when the record does not describe
/// this grant (a foreign client such as redis-py's `Lock`, or a holder with
/// recording off), else `{pttl, grant, ttl_ms, 'seconds \n microseconds \n
/// pid \n host \n label', fence}` (the counter's value is the grant's
/// fencing token: it moves only when a grant is made). `grant`
/// is the SHA-1 of the owner token: it tells grants apart (Redlock finds the
/// one a majority of nodes hold) without revealing the token.
macro_rules! describe_lua {
    () => {
        r"
local function describe(owner)
    local pttl = redis.call('PTTL', KEYS[1])
    local grant = redis.sha1hex(owner)
    local record = redis.call('GET', KEYS[2])
    if record then
        local ttl_end = string.find(record, '\n', 1, true)
        local owner_end = ttl_end and string.find(record, '\n', ttl_end + 1, true)
        if owner_end and string.sub(record, ttl_end + 1, owner_end - 1) == owner then
            return {pttl, grant, string.sub(record, 1, ttl_end - 1),
                string.sub(record, owner_end + 1), redis.call('GET', KEYS[3]) or ''}
        end
    end
    return {pttl, grant}
end
"
    };
}

/// `KEYS[1]` lock key, `KEYS[2]` fence key, `KEYS[3]` holder record;
/// `ARGV[1]` owner token, `ARGV[2]` ttl in milliseconds, and, when the
/// holder is recorded, `ARGV[3]` the holder (`pid \n host \n label`).
/// Returns the fencing token of the grant (at least 1), or 0 if the lock is
/// held by another token (contention).
///
/// The counter is bumped only on a new grant, in the same atomic step as the
/// `SET`, so every grant gets a token greater than every earlier grant's.
/// The holder record rides in the same script (no extra round trip; see
/// `record_holder_lua`).
///
/// **Idempotent per owner token.** An acquire whose reply was lost (the
/// connection broke after the request was sent) is retried with the *same*
/// token. If the first run took effect, the key already holds our token: the
/// script then re-arms its ttl (and its record's, writing the record if it is
/// missing) and returns the counter's current value, which is our grant's
/// token, because the counter moves only when a `SET NX` succeeds, and none
/// can succeed while our token stays in the key. Without this the retry
/// would find its own orphan and report contention while nobody else holds
/// the lock. (A counter deleted by a foreign client is started again by
/// `INCR`.)
const ACQUIRE: &str = concat!(
    record_holder_lua!(),
    r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local fence = redis.call('INCR', KEYS[2])
    if ARGV[3] then
        record_holder()
    end
    return fence
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local fence = tonumber(redis.call('GET', KEYS[2]))
    if not fence then
        fence = redis.call('INCR', KEYS[2])
    end
    if ARGV[3] and redis.call('PEXPIRE', KEYS[3], ARGV[2]) == 0 then
        record_holder()
    end
    return fence
end
return 0
"
);

/// `KEYS[1]` lock key, `KEYS[2]` holder record; `ARGV[1]` owner token,
/// `ARGV[2]` release channel, `ARGV[3]` the publish command (`PUBLISH`, or
/// `SPUBLISH` on a cluster). Returns 1 if the token matched and the lock
/// (with its holder record) was deleted, else 0 (nothing deleted).
///
/// The release is announced on the key's channel so waiters wake at once.
/// On a cluster it is `SPUBLISH` (sharded pub/sub, Redis 7+): the channel
/// shares the lock key's hash tag, so it is in the script's slot and the
/// message stays on that shard, where the waiters subscribed with
/// `SSUBSCRIBE`; a classic `PUBLISH` would be broadcast to every node.
/// `pcall`: a user whose ACL forbids publishing on the channel (or a server
/// without `SPUBLISH`) can still release; its waiters then find the release
/// by polling.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1], KEYS[2])
    redis.pcall(ARGV[3], ARGV[2], 'released')
    return 1
end
return 0
";

/// Extends the lock `lock` held by `owner` to `ttl` milliseconds and its
/// holder record `record`, if there is one, to the same expiry, with the new
/// ttl as the record's first field (see `record_holder_lua`); a keepalive
/// refresh with an unchanged ttl only re-arms the record's expiry. 1 if the
/// token matched and the ttl was reset, else 0 (nothing touched).
macro_rules! refresh_lua {
    () => {
        r"
local function refresh(lock, record, owner, ttl)
    if redis.call('GET', lock) ~= owner then
        return 0
    end
    local text = redis.call('GET', record)
    local ttl_end = text and string.find(text, '\n', 1, true)
    if ttl_end and string.sub(text, 1, ttl_end - 1) == ttl then
        redis.call('PEXPIRE', record, ttl)
    elseif ttl_end then
        redis.call('SET', record, ttl .. string.sub(text, ttl_end), 'PX', ttl)
    end
    return redis.call('PEXPIRE', lock, ttl)
end
"
    };
}

/// `KEYS[1]` lock key, `KEYS[2]` holder record; `ARGV[1]` owner token,
/// `ARGV[2]` new ttl in milliseconds. Returns 1 if the token matched and the
/// ttl was reset, else 0 (see `refresh_lua`).
const REFRESH: &str = concat!(
    refresh_lua!(),
    r"
return refresh(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
"
);

/// `KEYS[1]` lock key, `KEYS[2]` holder record, `KEYS[3]` fence key.
/// Returns nil if the lock is free, else what `describe_lua` reads.
/// Read-only.
const INSPECT: &str = concat!(
    describe_lua!(),
    r"
local owner = redis.call('GET', KEYS[1])
if not owner then
    return false
end
return describe(owner)
"
);

/// `KEYS[1]` lock key, `KEYS[2]` holder record, `KEYS[3]` fence key;
/// `ARGV[1]` release channel, `ARGV[2]` the publish command (as for
/// `RELEASE`). Deletes the lock and
/// its record whoever holds it, publishes the release so waiters wake, and
/// returns what it evicted (as `INSPECT` reads it), or nil if the lock was
/// free (nothing done). One script, so what it returns is exactly what it
/// deleted.
const FORCE_RELEASE: &str = concat!(
    describe_lua!(),
    r"
local owner = redis.call('GET', KEYS[1])
if not owner then
    return false
end
local evicted = describe(owner)
redis.call('DEL', KEYS[1], KEYS[2])
redis.pcall(ARGV[2], ARGV[1], 'released')
return evicted
"
);

/// `KEYS[2i - 1]` lock keys, `KEYS[2i]` their holder records; `ARGV[2i -
/// 1]` the owner token of lock `i`, `ARGV[2i]` its new ttl in milliseconds.
/// Returns one integer per lock, in order: what [`REFRESH`] returns for it.
/// [`REFRESH`] for many locks in one round trip: the keepalive scheduler's
/// batch. On a cluster every key of one call is in one slot.
const REFRESH_MANY: &str = concat!(
    refresh_lua!(),
    r"
local refreshed = {}
for i = 1, #KEYS / 2 do
    refreshed[i] = refresh(KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1], ARGV[2 * i])
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
