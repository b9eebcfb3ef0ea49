//! Durable marks ([`crate::Locker::advance_mark`]) on etcd: one key per mark,
//! raised by compare-and-put transactions.
//!
//! The key is `<key prefix><name>:mark` with every `/` and `%` of the name
//! percent-encoded: a key with a `/` in it would sit inside the queue of the
//! lock named by what comes before the `/` (`P/` is lock `P`'s queue), and
//! the mutex recipe would count it as a contender. The value is
//! [`encode_mark`]'s fixed-width encoding, which etcd's byte-wise value
//! comparison orders like the integers.

use etcd_client::{Compare, CompareOp, KvClient, Txn, TxnOp, TxnOpResponse};

use super::{errors, EtcdLocker};
use crate::util::{encode_mark, StoredMark};
use crate::{validate, MarkAdvance, Result};

impl EtcdLocker {
    /// [`Locker::advance_mark`](crate::Locker::advance_mark): the two
    /// transactions of [`advance`] on the mark's key, the values decoded.
    pub(super) async fn raise_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        validate::key(name)?;
        let key = mark_key(&self.inner.prefix, name);
        let raw = self
            .inner
            .request("advance_mark", true, || {
                advance(self.inner.kv(), &key, value)
            })
            .await?;
        match raw {
            Some(stored) => stored
                .decode(&key)
                .map_err(|message| errors::plain("advance_mark", message)),
            None => Err(errors::plain(
                "advance_mark",
                format!("{key} was deleted and recreated by another client on every try"),
            )),
        }
    }
}

/// The etcd key of mark `name` under `key_prefix`.
fn mark_key(key_prefix: &str, name: &str) -> String {
    format!("{key_prefix}{}:mark", super::owner::escaped(name))
}

/// How often a mark created by another client between our two
/// transactions sends us round again. Marks are never deleted by distlock,
/// so a second round finds the key; the bound only stops a loop against a
/// client that keeps deleting it.
const ROUNDS: usize = 3;

/// Raises the mark at `key` to `value` if it is lower or absent.
///
/// etcd fails a value comparison on a missing key, so two transactions
/// cover the two cases: "lower than `value`: read it, then put" and, if the
/// key is missing, "create revision 0: put".
async fn advance(
    mut client: KvClient,
    key: &str,
    value: i64,
) -> std::result::Result<Option<StoredMark>, etcd_client::Error> {
    let encoded = encode_mark(value);
    for _ in 0..ROUNDS {
        let raise = Txn::new()
            .when([Compare::value(key, CompareOp::Less, encoded.as_str())])
            .and_then([
                TxnOp::get(key, None),
                TxnOp::put(key, encoded.as_str(), None),
            ])
            .or_else([TxnOp::get(key, None)]);
        let response = client.txn(raise).await?;
        let stored = match response.op_responses().first() {
            Some(TxnOpResponse::Get(get)) => get
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            _ => None,
        };
        match (response.succeeded(), stored) {
            (true, previous) => return Ok(Some(StoredMark::Advanced { previous })),
            (false, Some(current)) => return Ok(Some(StoredMark::AlreadyAt { current })),
            (false, None) => {}
        }
        let create = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, encoded.as_str(), None)]);
        if client.txn(create).await?.succeeded() {
            return Ok(Some(StoredMark::Advanced { previous: None }));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_keys_never_fall_inside_a_lock_queue() {
        assert_eq!(mark_key("lock:", "cron:report"), "lock:cron:report:mark");
        assert_eq!(
            mark_key("lock:", "jobs/nightly"),
            "lock:jobs%2Fnightly:mark"
        );
        assert_eq!(mark_key("lock:", "100%/x"), "lock:100%25%2Fx:mark");
        assert!(!mark_key("lock:", "a/b/c").contains('/'));
    }
}
