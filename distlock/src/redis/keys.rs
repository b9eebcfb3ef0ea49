//! How a caller's key maps to the Redis keys and channel that carry its lock.

/// Suffix of the per-key fencing counter, after the lock key.
const FENCE_SUFFIX: &str = ":fence";
/// Suffix of the per-key release channel, after the lock key.
const RELEASED_SUFFIX: &str = ":released";
/// Suffix of the per-key reader set (shared holders), after the lock key.
const READERS_SUFFIX: &str = ":readers";
/// Suffix of a mark ([`crate::Locker::advance_mark`]), after the lock key of
/// the same name.
const MARK_SUFFIX: &str = ":mark";

/// Names the Redis keys of a lock: `<prefix>{<key>}` for the lock itself,
/// `<prefix>{<key>}:fence` for its fencing counter, `<prefix>{<key>}:readers`
/// for its shared holders and `<prefix>{<key>}:released` for the channel its
/// releases are published on.
///
/// The braces are a Redis Cluster hash tag: the companion keys extend the
/// lock key, so all of them hash to the slot of the lock key's tag and one
/// script may touch them together on a cluster. (A key starting with `}` gives an empty tag, which Redis
/// Cluster ignores; a single node does not care.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeySpace {
    prefix: String,
}

impl KeySpace {
    pub(crate) fn new(prefix: impl Into<String>) -> Self {
        KeySpace {
            prefix: prefix.into(),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key holding the owner token (and the holder record, see
    /// `scripts.rs`) while the lock is held.
    pub(crate) fn lock_key(&self, key: &str) -> String {
        format!("{}{{{key}}}", self.prefix)
    }

    /// The counter whose `INCR` is the fencing token of each grant.
    pub(crate) fn fence_key(&self, key: &str) -> String {
        self.lock_key(key) + FENCE_SUFFIX
    }

    /// The sorted set of `key`'s shared holders: their owner tokens, each
    /// scored by its expiry in milliseconds on the server's clock (see
    /// `scripts.rs`, "Shared locks").
    pub(crate) fn readers_key(&self, key: &str) -> String {
        self.lock_key(key) + READERS_SUFFIX
    }

    /// The key holding the mark `name`, in the slot of the lock of that name.
    pub(crate) fn mark_key(&self, name: &str) -> String {
        self.lock_key(name) + MARK_SUFFIX
    }

    /// The `SCAN ... MATCH` pattern of every lock key whose caller's key
    /// starts with `key_prefix`: `<prefix>{<key_prefix>*}`, glob characters of
    /// both escaped. Lock keys end with `}`; the companion keys (fence,
    /// readers, mark) end with their suffix, so the pattern leaves them
    /// out. A key held only by readers is still found: its lock key holds
    /// the shared marker while any reader does.
    pub(crate) fn lock_pattern(&self, key_prefix: &str) -> String {
        format!(
            "{}{{{}*}}",
            escape_glob(&self.prefix),
            escape_glob(key_prefix)
        )
    }

    /// The caller's key of `redis_key` if it is a lock key of this key space
    /// (`<prefix>{<key>}`), else `None`.
    pub(crate) fn key_of<'a>(&self, redis_key: &'a str) -> Option<&'a str> {
        redis_key
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('{')?
            .strip_suffix('}')
    }

    /// The channel a release of `key` is published on.
    pub(crate) fn release_channel(&self, key: &str) -> String {
        self.lock_key(key) + RELEASED_SUFFIX
    }
}

/// `text` matching itself only in a Redis glob pattern (`stringmatchlen` in
/// Redis' `util.c`: `*`, `?`, `[`, `]` and `\` are special, a backslash
/// quotes the next character).
fn escape_glob(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_fence_and_channel_share_the_hash_tag() {
        let keys = KeySpace::new("lock:");
        assert_eq!(keys.lock_key("jobs/nightly"), "lock:{jobs/nightly}");
        assert_eq!(keys.fence_key("jobs/nightly"), "lock:{jobs/nightly}:fence");
        assert_eq!(keys.mark_key("jobs/nightly"), "lock:{jobs/nightly}:mark");
        assert_eq!(
            keys.readers_key("jobs/nightly"),
            "lock:{jobs/nightly}:readers"
        );
        assert_eq!(
            keys.release_channel("jobs/nightly"),
            "lock:{jobs/nightly}:released"
        );
    }

    #[test]
    fn an_empty_prefix_is_allowed() {
        assert_eq!(KeySpace::new("").lock_key("k"), "{k}");
    }

    #[test]
    fn the_list_pattern_escapes_globs_and_matches_lock_keys_only() {
        let keys = KeySpace::new("a*[x]:");
        assert_eq!(keys.lock_pattern("jobs?/"), r"a\*\[x\]:{jobs\?/*}");
        assert_eq!(keys.lock_pattern(""), r"a\*\[x\]:{*}");
        assert_eq!(keys.key_of("a*[x]:{jobs/1}"), Some("jobs/1"));
        assert_eq!(keys.key_of("a*[x]:{k}}"), Some("k}"));
        for companion in [
            "a*[x]:{k}:fence",
            "a*[x]:{k}:readers",
            "a*[x]:{k}:holder",
            "b:{k}",
            "a*[x]:k",
        ] {
            assert_eq!(keys.key_of(companion), None, "{companion}");
        }
    }
}
