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
/// `KEYS[1]` is the lock key, `KEYS[3]` the holder hash, `ARGV[1]` the owner
/// token, `ARGV[2]` the ttl, `ARGV[3..5]` host, pid and label), given its
/// fencing token, and expires it with the lock.
///
/// The hash names its grant by `owner`, the SHA-1 of the owner token (the
/// token itself would let anybody who can read the record release the lock):
/// a record left by an earlier grant (a holder with recording off, or a
/// foreign client, took the lock after it) never describes the current one.
/// `granted_ms` is the server's clock (`TIME`); Redis 5+ replicates scripts
/// by their effects, so reading it before writing is allowed.
macro_rules! record_holder_lua {
    () => {
        r"
local function record_holder(fence)
    local now = redis.call('TIME')
    local granted_ms = now[1] * 1000 + math.floor(now[2] / 1000)
    redis.call('HSET', KEYS[3], 'owner', redis.sha1hex(ARGV[1]), 'host', ARGV[3],
        'pid', ARGV[4], 'label', ARGV[5], 'granted_ms', string.format('%.0f', granted_ms),
        'ttl_ms', ARGV[2], 'fence', fence)
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
"
    };
}

/// Reads what is known of the lock `KEYS[1]` held by `owner` (its value),
/// with its holder hash `KEYS[2]`: `{pttl, grant}` when the hash does not
/// describe this grant (a foreign client such as redis-py's `Lock`, or a
/// holder with recording off), else `{pttl, grant, host, pid, label,
/// granted_ms, ttl_ms, fence}`. `grant` is the SHA-1 of the owner token: it
/// tells grants apart (Redlock finds the one a majority of nodes hold)
/// without revealing the token.
macro_rules! describe_lua {
    () => {
        r"
local function describe(owner)
    local pttl = redis.call('PTTL', KEYS[1])
    local grant = redis.sha1hex(owner)
    local r = redis.call('HMGET', KEYS[2], 'owner', 'host', 'pid', 'label', 'granted_ms',
        'ttl_ms', 'fence')
    if r[1] == grant then
        return {pttl, grant, r[2], r[3], r[4], r[5], r[6], r[7]}
    end
    return {pttl, grant}
end
"
    };
}

/// `KEYS[1]` lock key, `KEYS[2]` fence key, `KEYS[3]` holder hash; `ARGV[1]`
/// owner token, `ARGV[2]` ttl in milliseconds, and, when the holder is
/// recorded, `ARGV[3]` host, `ARGV[4]` pid, `ARGV[5]` label. Returns the
/// fencing token of the grant (at least 1), or 0 if the lock is held by
/// another token (contention).
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
        record_holder(fence)
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
        record_holder(fence)
    end
    return fence
end
return 0
"
);

/// `KEYS[1]` lock key, `KEYS[2]` holder hash; `ARGV[1]` owner token,
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

/// `KEYS[1]` lock key, `KEYS[2]` holder hash; `ARGV[1]` owner token,
/// `ARGV[2]` new ttl in milliseconds. Returns 1 if the token matched and the
/// ttl was reset, else 0. The holder record, if there is one, gets the same
/// expiry and the new ttl.
const REFRESH: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    if redis.call('PEXPIRE', KEYS[2], ARGV[2]) == 1 then
        redis.call('HSET', KEYS[2], 'ttl_ms', ARGV[2])
    end
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// `KEYS[1]` lock key, `KEYS[2]` holder hash. Returns nil if the lock is
/// free, else what `describe_lua` reads. Read-only.
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

/// `KEYS[1]` lock key, `KEYS[2]` holder hash; `ARGV[1]` release channel,
/// `ARGV[2]` the publish command (as for `RELEASE`). Deletes the lock and
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
pub(crate) static FORGET_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(FORGET));
pub(crate) static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT));
pub(crate) static FORCE_RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(FORCE_RELEASE));
pub(crate) static ADVANCE_MARK_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ADVANCE_MARK));
