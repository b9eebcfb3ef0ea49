//! The lock recipe's names: where a key's lock lives, what a contender's
//! node is called, which children of a lock path are contenders and in
//! what order, and the owner token.
//!
//! The recipe is ZooKeeper's own ("Locks" in
//! <https://zookeeper.apache.org/doc/r3.8.4/recipes.html>), as Apache
//! Curator's `InterProcessMutex` implements it: each contender creates an
//! ephemeral sequential child of the lock path, the lowest sequence number
//! holds the lock, and a waiter watches only the contender just ahead of
//! it.

use std::cmp::Ordering;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

/// What a key's characters become in a node name: `/` would nest the lock
/// inside another lock's path (and ZooKeeper refuses empty segments), `%`
/// is the escape itself, and control characters are refused in node names.
const ESCAPED: &AsciiSet = &CONTROLS.add(b'/').add(b'%');

/// The name prefix distlock gives its contender nodes before the protection
/// GUID: Curator's (`CreateBuilder.withProtection()` names nodes
/// `_c_<uuid>-<name>`), so Curator's tools recognize the node as protected.
const PROTECTED: &str = "_c_";
/// Curator's lock name: `InterProcessMutex` creates `<path>/_c_<uuid>-lock-`
/// and orders its children by what follows the last `lock-`
/// (`StandardLockInternalsDriver.fixForSorting`).
const CURATOR_LOCK: &str = "-lock-";
/// kazoo's lock name (`kazoo/recipe/lock.py`: `uuid4().hex + "__lock__"`);
/// kazoo counts as contenders the children matching
/// `(?:__lock__)(-?\d{10})$`, plus any `extra_lock_patterns` it is given.
const KAZOO_LOCK: &str = "__lock__";

/// The suffix of a mark's node name. A `%` followed by a letter never comes
/// out of [`escape`] (it writes `%` as `%25`), so no key's lock node can be
/// taken for a mark, nor a mark for a lock.
pub(super) const MARK_SUFFIX: &str = "%mark";

/// `key` as one node name.
pub(super) fn escape(key: &str) -> String {
    let escaped = utf8_percent_encode(key, ESCAPED).to_string();
    // `.` and `..` are refused as node names.
    match escaped.as_str() {
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        _ => escaped,
    }
}

/// The key a node name (an [`escape`]d key) stands for.
pub(super) fn unescape(name: &str) -> Option<String> {
    percent_decode_str(name)
        .decode_utf8()
        .ok()
        .map(|key| key.into_owned())
}

/// The name prefix of a new contender node: Curator's protected lock name,
/// `_c_<32 hex digits>-lock-`, to which ZooKeeper appends the sequence
/// number. The random part finds the node again after a create whose
/// answer was lost (the "protection" Curator and kazoo both use), and makes
/// the node's name unique for ever, so a node name is an identity.
pub(super) fn contender_prefix() -> String {
    format!("{PROTECTED}{:032x}{CURATOR_LOCK}", rand::random::<u128>())
}

/// One contender of a lock: a child of the lock path named by distlock,
/// Curator (`..-lock-<seq>`) or kazoo (`..__lock__<seq>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Contender {
    pub(super) name: String,
    pub(super) sequence: i64,
}

/// The contender a child name is, if it is one.
///
/// The sequence number is ZooKeeper's per-parent counter, shared by every
/// child whatever its name, so it orders contenders of every naming
/// scheme: this is what lets a distlock contender wait behind a kazoo one.
pub(super) fn contender(name: &str) -> Option<Contender> {
    let digits_at = name.len() - name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (head, digits) = name.split_at(digits_at);
    // ZooKeeper writes 10 digits (19 past i32::MAX).
    if digits.len() < 10 || !(head.ends_with(CURATOR_LOCK) || head.ends_with(KAZOO_LOCK)) {
        return None;
    }
    let sequence = digits.parse().ok()?;
    Some(Contender {
        name: name.to_owned(),
        sequence,
    })
}

/// The contenders among `children`, first (lowest sequence) first.
pub(super) fn queue(children: &[String]) -> Vec<Contender> {
    let mut queue: Vec<Contender> = children.iter().filter_map(|c| contender(c)).collect();
    queue.sort_by(|a, b| match a.sequence.cmp(&b.sequence) {
        Ordering::Equal => a.name.cmp(&b.name),
        other => other,
    });
    queue
}

/// Where `name` stands in `queue`: `Ok(None)` first, `Ok(Some(ahead))`
/// the contender just ahead of it, `Err(())` not in the queue at all.
pub(super) fn ahead_of<'q>(queue: &'q [Contender], name: &str) -> Result<Option<&'q str>, ()> {
    let at = queue.iter().position(|c| c.name == name).ok_or(())?;
    Ok(at.checked_sub(1).map(|before| queue[before].name.as_str()))
}

/// A grant's owner token: `<czxid in hex>/<node name>`. The node name
/// alone identifies the node for ever (its random part is never reused);
/// the czxid is checked too, so a token names one grant even to a reader
/// that did not create it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Token {
    pub(super) czxid: i64,
    pub(super) node: String,
}

impl Token {
    pub(super) fn encode(&self) -> String {
        format!("{:x}/{}", self.czxid, self.node)
    }

    /// `None` for anything that is not a token of this backend.
    pub(super) fn parse(owner: &str) -> Option<Token> {
        let (czxid, node) = owner.split_once('/')?;
        let czxid = i64::from_str_radix(czxid, 16).ok()?;
        (contender(node).is_some() && !node.contains('/')).then(|| Token {
            czxid,
            node: node.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_one_node_name_and_back() {
        for key in [
            "nightly",
            "jobs/nightly",
            "100%",
            "a b:c",
            ".",
            "..",
            "x%mark",
        ] {
            let name = escape(key);
            assert!(!name.contains('/'), "{name}");
            assert!(!name.ends_with(MARK_SUFFIX), "{name}");
            assert!(name != "." && name != "..");
            assert_eq!(unescape(&name).as_deref(), Some(key));
        }
        assert_eq!(escape("jobs/nightly"), "jobs%2Fnightly");
        assert_eq!(escape("billing:nightly"), "billing:nightly");
    }

    #[test]
    fn contenders_of_every_naming_scheme_are_ordered_by_sequence() {
        let ours = format!("{}0000000007", contender_prefix());
        let children = vec![
            ours.clone(),
            "3f2a9c__lock__0000000003".to_owned(),
            "_c_5b1e-lock-0000000005".to_owned(),
            "leases".to_owned(),
            "x-lock-12".to_owned(),
            "9ad__rlock__0000000001".to_owned(),
        ];
        let queue = queue(&children);
        let names: Vec<&str> = queue.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "3f2a9c__lock__0000000003",
                "_c_5b1e-lock-0000000005",
                ours.as_str()
            ]
        );
        assert_eq!(ahead_of(&queue, &ours), Ok(Some("_c_5b1e-lock-0000000005")));
        assert_eq!(ahead_of(&queue, "3f2a9c__lock__0000000003"), Ok(None));
        assert_eq!(ahead_of(&queue, "gone-lock-0000000009"), Err(()));
    }

    #[test]
    fn tokens_round_trip_and_refuse_strangers() {
        let token = Token {
            czxid: 0x1_0000_002a,
            node: format!("{}0000000001", contender_prefix()),
        };
        assert_eq!(Token::parse(&token.encode()), Some(token));
        for stranger in [
            "",
            "zz/x-lock-0000000001",
            "2a",
            "2a/plain",
            "2a/a/b-lock-0000000001",
        ] {
            assert_eq!(Token::parse(stranger), None, "{stranger}");
        }
    }
}
