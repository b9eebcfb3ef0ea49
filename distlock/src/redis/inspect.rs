//! Who holds a Redis lock: [`Locker::inspect`](crate::Locker::inspect),
//! [`Locker::list`](crate::Locker::list) and
//! [`Locker::force_release`](crate::Locker::force_release) for every
//! deployment, on the holder record the acquire script writes into the
//! lock key's value (see `scripts.rs`, `lock_value_lua`).

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use redis::Value;

use super::scripts::{FORCE_RELEASE_SCRIPT, INSPECT_SCRIPT};
use super::{RedisLocker, BACKEND};
use crate::inspect::{self, Clock, GrantTime, HeldLock, Holder};
use crate::{validate, Error, Result};

/// How many keys one `SCAN` page asks for (a hint to the server).
const SCAN_COUNT: u32 = 1000;
/// How many locks [`Locker::list`](crate::Locker::list) inspects at once on
/// the multiplexed connection.
const INSPECT_CONCURRENCY: usize = 32;

/// One node's view of a held lock: what it reports, and which grant holds
/// it there (the SHA-1 of the owner token), so Redlock can find the grant a
/// majority of its nodes agree on.
#[derive(Debug, Clone)]
pub(crate) struct LockView {
    pub(crate) held: HeldLock,
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) grant: String,
}

impl RedisLocker {
    /// One run of the inspect script (read-only, bounded).
    pub(crate) async fn inspect_view(&self, key: &str) -> Result<Option<LockView>> {
        validate::key(key)?;
        let mut inspect = INSPECT_SCRIPT.key(self.inner.keys.lock_key(key));
        inspect.key(self.inner.keys.fence_key(key));
        self.read_view("inspect", key, &inspect).await
    }

    /// Runs `script`, one that answers what `describe_lua` reads of `key`'s
    /// lock (nil: free), bounded like every call, and reads its answer.
    async fn read_view(
        &self,
        operation: &'static str,
        key: &str,
        script: &redis::ScriptInvocation<'_>,
    ) -> Result<Option<LockView>> {
        let reply: Option<Vec<Value>> = self
            .bounded(operation, async {
                script.invoke_async(&mut self.connection()).await
            })
            .await?;
        let mut view = reply.map(|reply| lock_view(key, reply)).transpose()?;
        if let Some(view) = view.as_mut().filter(|_| !self.inner.fencing) {
            // No lease of this locker carries a token: a counter another
            // locker (with fencing) left in the key is not this grant's.
            view.held.fencing_token = None;
        }
        Ok(view)
    }

    /// `SCAN` with the prefix's pattern on every node that holds keys (each
    /// master of a cluster), then the inspect script on each lock found.
    /// Every round trip is bounded by the operation bound, not the whole
    /// listing, which grows with the key space.
    pub(crate) async fn list_views(&self, prefix: &str) -> Result<Vec<LockView>> {
        let pattern = self.inner.keys.lock_pattern(prefix);
        let mut connection = self.connection();
        let nodes = self.bounded("list", connection.scan_nodes()).await?;
        let mut keys = Vec::new();
        for node in &nodes {
            let mut cursor = 0;
            loop {
                let (next, page) = self
                    .bounded(
                        "list",
                        connection.scan_page(node, cursor, &pattern, SCAN_COUNT),
                    )
                    .await?;
                keys.extend(
                    page.into_iter()
                        .filter_map(|raw| String::from_utf8(raw).ok())
                        .filter_map(|redis_key| {
                            self.inner.keys.key_of(&redis_key).map(str::to_owned)
                        })
                        .filter(|key| key.starts_with(prefix)),
                );
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        // SCAN may return a key twice (the table was rehashed, or a slot
        // moved while the listing ran).
        keys.sort();
        keys.dedup();
        let held: Vec<Option<LockView>> = futures_util::stream::iter(keys)
            .map(|key| async move {
                match validate::key(&key) {
                    // Not a key distlock could have taken (too long): leave it out.
                    Err(_) => Ok(None),
                    Ok(()) => self.inspect_view(&key).await,
                }
            })
            .buffered(INSPECT_CONCURRENCY)
            .try_collect()
            .await?;
        // Released or expired between the scan and its inspection: gone.
        Ok(held.into_iter().flatten().collect())
    }

    /// One script deletes the lock and its record whoever holds it (every
    /// reader, when readers hold it), publishes the release (waiters wake) and returns what it deleted
    /// (`None`: the lock was free, nothing done). Bounded; not logged.
    pub(crate) async fn delete_lock(&self, key: &str) -> Result<Option<LockView>> {
        validate::key(key)?;
        let mut delete = FORCE_RELEASE_SCRIPT.key(self.inner.keys.lock_key(key));
        delete
            .key(self.inner.keys.fence_key(key))
            .key(self.inner.keys.readers_key(key))
            .arg(self.inner.keys.release_channel(key))
            .arg(self.inner.publish);
        self.read_view("force_release", key, &delete).await
    }
}

/// Decodes what the inspect and force-release scripts return for a held
/// lock: `{pttl, grant}`, `{pttl, grant, fence}` when readers hold it
/// (shared, holders unknown: readers leave no record), or `{pttl, grant,
/// ttl_ms, granted_ms, "pid \n host \n label", fence}` when the lock's
/// value carries a holder record (see `scripts.rs`). A record that does
/// not decode (written by something else) leaves the holder unknown; a
/// reply of another shape is an error.
fn lock_view(key: &str, reply: Vec<Value>) -> Result<LockView> {
    let malformed = || {
        Error::backend(
            BACKEND,
            "inspect",
            format!("the inspect script's reply for {key:?} has an unexpected shape"),
        )
    };
    let mut fields = reply.into_iter();
    let pttl: i64 = fields
        .next()
        .and_then(|pttl| redis::from_redis_value(pttl).ok())
        .ok_or_else(malformed)?;
    let grant: String = fields
        .next()
        .and_then(|grant| redis::from_redis_value(grant).ok())
        .ok_or_else(malformed)?;
    let mut held = HeldLock::new(key);
    // -1: no expiry (only a foreign client sets such a key).
    held.ttl_left = u64::try_from(pttl).ok().map(Duration::from_millis);
    let record: Vec<String> = fields
        .filter_map(|field| redis::from_redis_value(field).ok())
        .collect();
    if let [fence] = record.as_slice() {
        held.shared = true;
        // Empty: no writer ever held the key, so the readers carry 0.
        held.fencing_token = match fence.as_str() {
            "" => Some(0),
            fence => fence.parse().ok(),
        };
    } else if let [ttl_ms, granted_ms, holder, fence] = record.as_slice() {
        if let Some(record) = decode_record(ttl_ms, granted_ms, holder, fence) {
            held.holder = Some(record.holder);
            held.granted = Some(GrantTime {
                at: inspect::from_unix_millis(record.granted_ms),
                clock: Clock::Server,
            });
            held.ttl = Some(Duration::from_millis(record.ttl_ms));
            held.fencing_token = record.fence;
        }
    }
    Ok(LockView { held, grant })
}

struct Record {
    holder: Holder,
    granted_ms: u64,
    ttl_ms: u64,
    /// `None` when no counter exists: a grant of a locker with fencing off
    /// (its holder is still recorded).
    fence: Option<u64>,
}

fn decode_record(ttl_ms: &str, granted_ms: &str, holder: &str, fence: &str) -> Option<Record> {
    let mut parts = holder.splitn(3, '\n');
    let (pid, host, label) = (parts.next()?, parts.next()?, parts.next()?);
    Some(Record {
        holder: Holder {
            host: host.to_owned(),
            pid: pid.parse().ok()?,
            label: label.to_owned(),
        },
        granted_ms: granted_ms.parse().ok()?,
        ttl_ms: ttl_ms.parse().ok()?,
        fence: match fence {
            "" => None,
            fence => Some(fence.parse().ok()?),
        },
    })
}

/// The lock key's value for a grant to `owner` for `ttl` that records its
/// holder (`pid`, `host`, `label`): `owner \n ttl_ms \n \n pid \n host \n
/// label`, the grant time left empty for the server to fill in (see
/// `scripts.rs`, `lock_value_lua`; the label last, so it may contain line
/// breaks). Built into one allocation: it is made for every acquire.
pub(super) fn recorded_value(
    owner: &str,
    ttl: Duration,
    pid: u32,
    host: &str,
    label: &str,
) -> String {
    use std::fmt::Write as _;
    // 20 digits for the ttl, 10 for the pid, 5 line breaks.
    let mut value = String::with_capacity(owner.len() + host.len() + label.len() + 35);
    // Writing to a String cannot fail.
    let _ = write!(value, "{owner}\n{}\n\n{pid}\n", super::ttl_millis(ttl));
    value.push_str(host);
    value.push('\n');
    value.push_str(label);
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// The describe script's answer for a lock with a holder record: 29.5 s
    /// left of a 30 s grant made at 1764000000123 ms, grant `5f3c`, the
    /// record's `pid \n host \n label` lines and the fence counter's text.
    fn recorded_reply(record: &str, fence: &str) -> Vec<Value> {
        vec![
            Value::Int(29_500),
            text("5f3c"),
            text("30000"),
            text("1764000000123"),
            text(record),
            text(fence),
        ]
    }

    #[test]
    fn a_full_record_fills_every_field_but_the_session() {
        let holder = Holder {
            host: "web-1".into(),
            pid: 4242,
            label: "nightly\nbackup".into(),
        };
        let value = recorded_value(
            "token",
            Duration::from_secs(30),
            holder.pid,
            &holder.host,
            &holder.label,
        );
        assert_eq!(value, "token\n30000\n\n4242\nweb-1\nnightly\nbackup");
        let reply = recorded_reply("4242\nweb-1\nnightly\nbackup", "7");
        let view = lock_view("k", reply).expect("decodes");
        assert_eq!(view.grant, "5f3c");
        let held = view.held;
        assert_eq!(held.holder, Some(holder), "a label with a line break");
        assert_eq!(
            held.granted,
            Some(GrantTime {
                at: inspect::from_unix_millis(1_764_000_000_123),
                clock: Clock::Server
            })
        );
        assert_eq!(held.ttl, Some(Duration::from_secs(30)));
        assert_eq!(held.ttl_left, Some(Duration::from_millis(29_500)));
        assert_eq!(held.fencing_token, Some(7));
        assert_eq!(held.session, None);
    }

    #[test]
    fn a_record_without_a_counter_is_a_known_holder_without_a_token() {
        // A grant of a locker with fencing off writes no counter: the
        // script answers '' for it.
        let reply = recorded_reply("4242\nweb-1\nnightly", "");
        let held = lock_view("k", reply).expect("decodes").held;
        assert_eq!(
            held.holder.map(|h| (h.pid, h.host, h.label)),
            Some((4242, "web-1".to_owned(), "nightly".to_owned()))
        );
        assert_eq!(held.ttl, Some(Duration::from_secs(30)));
        assert_eq!(held.fencing_token, None);
    }

    #[test]
    fn a_key_held_by_readers_is_shared_with_unknown_holders_and_their_token() {
        let held = lock_view("k", vec![Value::Int(29_000), text("ab"), text("7")])
            .expect("decodes")
            .held;
        assert!(held.shared);
        assert_eq!(held.holder, None, "readers leave no record");
        assert_eq!(held.fencing_token, Some(7));
        assert_eq!(held.ttl_left, Some(Duration::from_secs(29)));
        assert_eq!((held.granted, held.ttl), (None, None));
        let never_written = lock_view("k", vec![Value::Int(1), text("ab"), text("")])
            .expect("decodes")
            .held;
        assert_eq!(
            never_written.fencing_token,
            Some(0),
            "no writer yet: readers carry 0"
        );
    }

    #[test]
    fn no_record_or_a_foreign_one_is_an_unknown_holder_never_free() {
        let held = lock_view("k", vec![Value::Int(1000), text("ab")])
            .expect("decodes")
            .held;
        assert_eq!(held.holder, None);
        assert_eq!(held.ttl_left, Some(Duration::from_secs(1)));
        let foreign = vec![
            Value::Int(-1),
            text("ab"),
            text("1"),
            text("1"),
            text("not a pid\nh\nl"),
            text("1"),
        ];
        let held = lock_view("k", foreign).expect("decodes").held;
        assert_eq!(
            (held.holder, held.fencing_token, held.ttl_left),
            (None, None, None)
        );
        assert!(lock_view("k", vec![]).is_err());
        assert!(lock_view("k", vec![Value::Int(5)]).is_err());
    }
}
