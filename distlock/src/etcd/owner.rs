//! Where a grant's secret lives, which is what release and refresh compare:
//! the first line of its contender key's value, or, for an election
//! candidate, the first line of an *owner key* beside it.
//!
//! An election's key must carry the leader's proclaimed value and nothing
//! else: Go's `concurrency.Election` writes the candidate's value on its
//! key (`Campaign`, which `Proclaim` later overwrites, compared on the
//! key's create revision), and `Leader` and `Observe` (so `etcdctl elect
//! -l`) read the value of the key with the lowest create revision
//! (<https://github.com/etcd-io/etcd/blob/main/client/v3/concurrency/election.go>).
//! So a distlock candidate's contender key holds its proclamation
//! ([`crate::elect::campaign_value`]), and the secret and holder record
//! that other keys keep in their value ([`super::recipe::contender_value`])
//! go to the owner key [`owner_key`]:
//!
//! - written by the acquire transaction that writes the contender key, on
//!   the same session lease, so both appear at one revision (the owner
//!   key's mod revision is the contender's create revision) and go away
//!   together when the lease ends; a release, a forced release and the
//!   clean-up of an abandoned attempt delete both in one transaction;
//! - named `<key prefix><key>:owner:<lease id in hex>`, the key with `/`
//!   and `%` percent-encoded as a mark's is ([`escaped`]): with no `/` after
//!   the key prefix it is in no lock's queue (etcd's mutex and election
//!   count every key under `<name>/` as a contender), [`super::EtcdLocker`]'s
//!   listing skips it, and it ends in hex where a mark key ends in `:mark`;
//! - ownership is proved as for every other key: the contender key still
//!   has the grant's create revision, and the secret (128 random bits in
//!   the owner token) starts the owner key's value. Go's election proves it
//!   by create revision alone, which a stale owner cannot fake either, but
//!   which anyone who can inspect the lock reads (it is the fencing token);
//!   the secret is what makes an owner token a capability.

use etcd_client::{KeyValue, TxnOp};

use crate::inspect::HolderRecord;

/// `name` with `%` and `/` percent-encoded: a key made from it has no `/`
/// of its own, so it falls in no lock's queue (`P/` is lock `P`'s).
pub(super) fn escaped(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// The owner key of the election candidate of `key` (a distlock key) on
/// session lease `lease`, under `key_prefix`.
pub(super) fn owner_key(key_prefix: &str, key: &str, lease: i64) -> String {
    format!("{key_prefix}{}:owner:{lease:x}", escaped(key))
}

/// Where a grant's secret lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SecretAt {
    /// The first line of the contender key's own value: every grant but an
    /// election candidate's.
    Value,
    /// The first line of this owner key's value ([`owner_key`]): an
    /// election candidate's, whose contender key holds what it proclaims.
    OwnerKey(String),
}

impl SecretAt {
    /// The key whose value starts with the secret of the grant whose
    /// contender key is `contender`.
    pub(super) fn key<'a>(&'a self, contender: &'a str) -> &'a str {
        match self {
            SecretAt::Value => contender,
            SecretAt::OwnerKey(owner) => owner,
        }
    }

    /// What a release of the grant whose contender key is `contender`
    /// deletes: that key, and the owner key with it.
    pub(super) fn deletes(&self, contender: &str) -> Vec<TxnOp> {
        let mut deletes = vec![TxnOp::delete(contender, None)];
        if let SecretAt::OwnerKey(owner) = self {
            deletes.push(TxnOp::delete(owner.as_str(), None));
        }
        deletes
    }
}

/// What the owner key `owner` says of the grant of `contender`, if it is
/// that grant's (written by the same transaction: its mod revision is the
/// contender's create revision, and its value starts with a secret): the
/// holder record after the secret, `Some(None)` without one (`holder=off`).
/// `None` if it is not that grant's owner key: the contender is not a
/// distlock election candidate's (`etcdctl elect`'s, Go's), or the owner
/// key is a leftover of an earlier grant.
pub(super) fn owned_record(owner: &KeyValue, contender: &KeyValue) -> Option<Option<HolderRecord>> {
    let text = std::str::from_utf8(owner.value()).ok()?;
    let (secret, _) = text.split_once('\n')?;
    let is_secret = secret.len() == 32 && secret.bytes().all(|b| b.is_ascii_hexdigit());
    (is_secret && owner.mod_revision() == contender.create_revision())
        .then(|| super::recipe::record_of(owner.value()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_keys_fall_in_no_queue_and_never_meet_a_mark() {
        assert_eq!(
            owner_key("lock:", "scheduler", 0x694d_77a1_b2c3),
            "lock:scheduler:owner:694d77a1b2c3"
        );
        assert_eq!(owner_key("lock:", "jobs/a", 0x1f), "lock:jobs%2Fa:owner:1f");
        assert_eq!(
            owner_key("lock:", "100%/x", 0x1f),
            "lock:100%25%2Fx:owner:1f"
        );
        let owner = owner_key("lock:", "a/b/c", 0x1f);
        assert!(!owner["lock:".len()..].contains('/'), "{owner}");
        // A mark key ends in `:mark`, never in a hex lease id.
        assert!(!owner.ends_with(":mark"));
    }

    #[test]
    fn a_release_deletes_the_owner_key_with_the_contender() {
        assert_eq!(SecretAt::Value.deletes("lock:k/1f").len(), 1);
        let at = SecretAt::OwnerKey("lock:k:owner:1f".into());
        assert_eq!(at.deletes("lock:k/1f").len(), 2);
        assert_eq!(at.key("lock:k/1f"), "lock:k:owner:1f");
        assert_eq!(SecretAt::Value.key("lock:k/1f"), "lock:k/1f");
    }
}
