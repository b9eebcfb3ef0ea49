//! The Lua scripts behind acquire, release, refresh, forget and marks.
//!
//! Each runs atomically on the server, so "check the owner token, then act" is
//! one step no other client can interleave with. They are sent by `EVALSHA`
//! ([`redis::Script::invoke_async`]): the text crosses the wire only when the
//! server answers `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`),
//! and redis-rs then loads it and retries once. Sending the whole text with
//! every `EVAL` cost peer libraries a large share of their throughput.

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` lock key, `KEYS[2]` fence key; `ARGV[1]` owner token, `ARGV[2]`
/// ttl in milliseconds. Returns the fencing token of the grant (at least 1),
/// or 0 if the lock is held by another token (contention).
///
/// The counter is bumped only on a new grant, in the same atomic step as the
/// `SET`, so every grant gets a token greater than every earlier grant's.
///
/// **Idempotent per owner token.** An acquire whose reply was lost (the
/// connection broke after the request was sent) is retried with the *same*
/// token. If the first run took effect, the key already holds our token: the
/// script then re-arms its ttl and returns the counter's current value, which
/// is our grant's token, because the counter moves only when a `SET NX`
/// succeeds, and none can succeed while our token stays in the key. Without
/// this the retry would find its own orphan and report contention while
/// nobody else holds the lock. (A counter deleted by a foreign client is
/// started again by `INCR`.)
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return redis.call('INCR', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local fence = tonumber(redis.call('GET', KEYS[2]))
    if fence then
        return fence
    end
    return redis.call('INCR', KEYS[2])
end
return 0
";

/// `KEYS[1]` lock key; `ARGV[1]` owner token, `ARGV[2]` release channel,
/// `ARGV[3]` the publish command (`PUBLISH`, or `SPUBLISH` on a cluster).
/// Returns 1 if the token matched and the lock was deleted, else 0 (nothing
/// deleted).
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
    redis.call('DEL', KEYS[1])
    redis.pcall(ARGV[3], ARGV[2], 'released')
    return 1
end
return 0
";

/// `KEYS[1]` lock key; `ARGV[1]` owner token, `ARGV[2]` new ttl in
/// milliseconds. Returns 1 if the token matched and the ttl was reset, else 0.
const REFRESH: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// `KEYS[i]` lock keys; `ARGV[2i - 1]` the owner token of `KEYS[i]`,
/// `ARGV[2i]` its new ttl in milliseconds. Returns one integer per key, in
/// order: 1 if that token matched and the ttl was reset, else 0 (that key
/// untouched). [`REFRESH`] for many keys in one round trip: the keepalive
/// scheduler's batch. On a cluster every key of one call is in one slot.
const REFRESH_MANY: &str = r"
local refreshed = {}
for i = 1, #KEYS do
    if redis.call('GET', KEYS[i]) == ARGV[2 * i - 1] then
        refreshed[i] = redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    else
        refreshed[i] = 0
    end
end
return refreshed
";

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
pub(crate) static ADVANCE_MARK_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ADVANCE_MARK));
