//! The lock recipe's names: where a key's lock lives, what a contender's
//! node is called, which children of a lock path are contenders and in
//! what order, and the owner token.
//!
//! The recipe is ZooKeeper's own ("Locks" and "Shared Locks" in
//! <https://zookeeper.apache.org/doc/r3.8.4/recipes.html>), as Apache
//! Curator's `InterProcessMutex` and `InterProcessReadWriteLock` implement
//! it: each contender creates an ephemeral sequential child of the lock
//! path; a writer holds the lock when its sequence number is the lowest, a
//! reader when no writer's is lower than its own; a waiter watches only
//! the one node that must go before it can hold (a writer: the contender
//! just ahead; a reader: the closest writer ahead), so a release wakes one
//! waiter, not the herd.
//!
//! # Node names: whose readers and writers are seen
//!
//! Readers and writers of every client queue in the one lock path, and
//! ZooKeeper's sequence counter is one per parent whatever the name, so
//! the order is the same for all; what differs is how each client tells a
//! reader from a writer by name:
//!
//! | client | writer's node | reader's node | what it counts as a contender |
//! | --- | --- | --- | --- |
//! | distlock | `_c_<uuid>-lock-<seq>` | `_c_<uuid>-__READ__<seq>` | every name below (its kind by its suffix) |
//! | Curator `InterProcessMutex` | `_c_<uuid>-lock-<seq>` | (none) | every child, ordered by what follows its last `lock-` |
//! | Curator `InterProcessReadWriteLock` | `_c_<uuid>-__WRIT__<seq>` | `_c_<uuid>-__READ__<seq>` | a writer: every child, ordered by what follows `__READ__`/`__WRIT__`; a reader: only names containing `__WRIT__` |
//! | kazoo `Lock`, `WriteLock` | `<uuid hex>__lock__<seq>` | | `Lock`: `__lock__\d{10}$`; `WriteLock`: also `__rlock__`; plus `extra_lock_patterns` |
//! | kazoo `ReadLock` | | `<uuid hex>__rlock__<seq>` | `__lock__\d{10}$`, plus `extra_lock_patterns` |
//!
//! (Curator: `InterProcessReadWriteLock.java`, `READ_LOCK_NAME`,
//! `WRITE_LOCK_NAME`, the reader's `getsTheLock`, and
//! `StandardLockInternalsDriver.fixForSorting`; kazoo: `kazoo/recipe/lock.py`,
//! `_NODE_NAME` and `_EXCLUDE_NAMES` of `Lock`, `WriteLock`, `ReadLock`.)
//!
//! **A reader's name follows Curator's** (`__READ__` right before the
//! sequence), not kazoo's (`__rlock__`): ZooKeeper appends the sequence to
//! the name, so a name ends in one of the two, never both. With Curator's,
//! a Curator writer orders distlock's readers by sequence (it waits for
//! them and they for it) and a Curator reader passes them by (it waits
//! only for `__WRIT__` names); kazoo can be told with
//! `extra_lock_patterns=["__READ__"]` (and `["-lock-"]` for distlock's
//! writers), which Curator has no counterpart of: a `__rlock__` name
//! would sort, to Curator's writer, after every node of its own, and it
//! would take the lock over a holding distlock reader.
//!
//! **A writer's name stays Curator's `InterProcessMutex`'s**, as before
//! readers came: Curator's mutex and its read-write lock do not
//! interoperate with each other on one path (the mutex orders a `__WRIT__`
//! node by its whole name, the read-write lock a `-lock-` one), and no name
//! ends in both. So Curator's `InterProcessReadWriteLock` does **not** see
//! a distlock writer: its readers and writers can be granted while a
//! distlock writer holds. distlock itself counts every name in the table,
//! so a distlock writer never holds while any of those clients' readers or
//! writers holds, and a distlock reader never while any of their writers
//! does. (Curator's mutex, for its part, sees no reader at all: it orders
//! a `__READ__` name by its whole text.)

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
/// (`StandardLockInternalsDriver.fixForSorting`). distlock's writers.
const CURATOR_LOCK: &str = "-lock-";
/// Curator's `InterProcessReadWriteLock` reader's name (`READ_LOCK_NAME`,
/// after Curator's `-` that ends the protection prefix). distlock's readers.
const CURATOR_READ: &str = "__READ__";
/// Curator's `InterProcessReadWriteLock` writer's name (`WRITE_LOCK_NAME`).
const CURATOR_WRITE: &str = "__WRIT__";
/// kazoo's `Lock` and `WriteLock` name (`kazoo/recipe/lock.py`:
/// `uuid4().hex + "__lock__"`); kazoo counts as contenders the children
/// matching `(?:__lock__)(-?\d{10})$`, plus any `extra_lock_patterns` it is
/// given.
const KAZOO_LOCK: &str = "__lock__";
/// kazoo's `ReadLock` name (`_NODE_NAME = "__rlock__"`).
const KAZOO_READ: &str = "__rlock__";

/// The name endings (before the sequence) of every client's contenders,
/// and what each is.
const NAMES: [(&str, Kind); 5] = [
    (CURATOR_LOCK, Kind::Write),
    (CURATOR_WRITE, Kind::Write),
    (KAZOO_LOCK, Kind::Write),
    (CURATOR_READ, Kind::Read),
    (KAZOO_READ, Kind::Read),
];

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

/// What a contender asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Exclusive: holds when no contender is ahead of it.
    Write,
    /// Shared: holds when no writer is ahead of it.
    Read,
}

/// The name prefix of a new contender node of `kind`: Curator's protected
/// lock name, `_c_<32 hex digits>-lock-` for a writer and
/// `_c_<32 hex digits>-__READ__` for a reader (see the [table](self)), to
/// which ZooKeeper appends the sequence number. The random part finds the
/// node again after a create whose answer was lost (the "protection"
/// Curator and kazoo both use), and makes the node's name unique for ever,
/// so a node name is an identity.
pub(super) fn contender_prefix(kind: Kind) -> String {
    let guid = guid();
    match kind {
        Kind::Write => format!("{PROTECTED}{guid}{CURATOR_LOCK}"),
        // Curator ends a protected name's prefix with `-`, then the lock name.
        Kind::Read => format!("{PROTECTED}{guid}-{CURATOR_READ}"),
    }
}

/// A random GUID in the text form Curator's protection uses
/// (`UUID.toString()`: 8-4-4-4-12 hex digits), so that Curator's
/// `ProtectedUtils.isProtectedZNode` (curator-framework,
/// `imps/ProtectedUtils.java`: `_c_`, 36 characters, `-`) takes distlock's
/// nodes for protected ones, as it does its own.
fn guid() -> String {
    let hex = format!("{:032x}", rand::random::<u128>());
    // 32 ASCII hex digits: every slice below is in bounds.
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// One contender of a lock: a child of the lock path named by distlock,
/// Curator or kazoo (see the [table](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Contender {
    pub(super) name: String,
    pub(super) sequence: i64,
    pub(super) kind: Kind,
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
    if digits.len() < 10 {
        return None;
    }
    let (_, kind) = NAMES.iter().find(|(ending, _)| head.ends_with(ending))?;
    let sequence = digits.parse().ok()?;
    Some(Contender {
        name: name.to_owned(),
        sequence,
        kind: *kind,
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

/// Where a contender stands in its queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Turn<'q> {
    /// It holds the lock; `first` is the queue's first contender (itself,
    /// or for a reader the oldest reader ahead of it), whose czxid is the
    /// grant's fencing token.
    Holds { first: &'q str },
    /// It waits for this contender to go: for a writer the one just ahead,
    /// for a reader the closest writer ahead.
    Behind(&'q str),
}

/// Where `name`, of `kind`, stands in `queue` (as [`queue`] orders it);
/// `Err(())` if it is not in the queue at all.
pub(super) fn turn<'q>(queue: &'q [Contender], name: &str, kind: Kind) -> Result<Turn<'q>, ()> {
    let at = queue.iter().position(|c| c.name == name).ok_or(())?;
    let ahead = &queue[..at];
    let blocker = match kind {
        Kind::Write => ahead.last(),
        Kind::Read => ahead.iter().rev().find(|c| c.kind == Kind::Write),
    };
    Ok(match blocker {
        Some(blocker) => Turn::Behind(&blocker.name),
        None => Turn::Holds {
            first: &queue[0].name,
        },
    })
}

/// The contenders that hold the lock now: the first, if it is a writer;
/// else every reader ahead of the first writer.
pub(super) fn holders(queue: &[Contender]) -> &[Contender] {
    match queue.first() {
        Some(first) if first.kind == Kind::Write => &queue[..1],
        _ => {
            let writer = queue
                .iter()
                .position(|c| c.kind == Kind::Write)
                .unwrap_or(queue.len());
            &queue[..writer]
        }
    }
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
        let ours = format!("{}0000000007", contender_prefix(Kind::Write));
        let children = vec![
            ours.clone(),
            "3f2a9c__lock__0000000003".to_owned(),
            "_c_5b1e-lock-0000000005".to_owned(),
            "leases".to_owned(),
            "x-lock-12".to_owned(),
            "9ad__rlock__0000000001".to_owned(),
            "_c_77-__WRIT__0000000004".to_owned(),
            "_c_78-__READ__0000000002".to_owned(),
            "_c_79-__READ__".to_owned(),
        ];
        let queue = queue(&children);
        let named: Vec<(&str, Kind)> = queue.iter().map(|c| (c.name.as_str(), c.kind)).collect();
        assert_eq!(
            named,
            [
                ("9ad__rlock__0000000001", Kind::Read),
                ("_c_78-__READ__0000000002", Kind::Read),
                ("3f2a9c__lock__0000000003", Kind::Write),
                ("_c_77-__WRIT__0000000004", Kind::Write),
                ("_c_5b1e-lock-0000000005", Kind::Write),
                (ours.as_str(), Kind::Write),
            ]
        );
        assert_eq!(
            turn(&queue, &ours, Kind::Write),
            Ok(Turn::Behind("_c_5b1e-lock-0000000005"))
        );
        assert_eq!(turn(&queue, "gone-lock-0000000009", Kind::Write), Err(()));
    }

    /// ZooKeeper's "Shared Locks": a reader holds while no writer is ahead
    /// (and waits for the closest writer ahead), a writer only when first
    /// (and waits for the one just ahead, reader or writer).
    #[test]
    fn readers_wait_for_writers_ahead_and_writers_for_everyone() {
        let reader = format!("{}0000000006", contender_prefix(Kind::Read));
        assert!(reader.starts_with("_c_") && reader.ends_with("-__READ__0000000006"));
        assert_eq!(contender(&reader).map(|c| c.kind), Some(Kind::Read));
        let children: Vec<String> = [
            "_c_1-__READ__0000000001",
            "k__rlock__0000000002",
            "_c_3-lock-0000000003",
            "_c_4-__READ__0000000004",
            "_c_5-__WRIT__0000000005",
            reader.as_str(),
        ]
        .map(str::to_owned)
        .to_vec();
        let queue = queue(&children);
        let first = "_c_1-__READ__0000000001";
        for holding in [first, "k__rlock__0000000002"] {
            assert_eq!(turn(&queue, holding, Kind::Read), Ok(Turn::Holds { first }));
        }
        // A writer waits for the node just ahead, a reader among them.
        assert_eq!(
            turn(&queue, "_c_3-lock-0000000003", Kind::Write),
            Ok(Turn::Behind("k__rlock__0000000002"))
        );
        // A reader behind a waiting writer waits for it (writer priority),
        // and for the closest writer ahead only.
        assert_eq!(
            turn(&queue, "_c_4-__READ__0000000004", Kind::Read),
            Ok(Turn::Behind("_c_3-lock-0000000003"))
        );
        assert_eq!(
            turn(&queue, &reader, Kind::Read),
            Ok(Turn::Behind("_c_5-__WRIT__0000000005"))
        );
        let holding: Vec<&str> = holders(&queue).iter().map(|c| c.name.as_str()).collect();
        assert_eq!(holding, [first, "k__rlock__0000000002"]);
        assert_eq!(holders(&queue[2..]).len(), 1, "a first writer holds alone");
        assert!(holders(&[]).is_empty());
    }

    /// Curator's `ProtectedUtils.isProtectedZNode`: longer than 40
    /// characters, `_c_`, a UUID's 36, then `-` at index 39.
    #[test]
    fn contender_names_are_protected_names_to_curator() {
        for kind in [Kind::Write, Kind::Read] {
            let name = format!("{}0000000001", contender_prefix(kind));
            assert!(name.len() > 40 && name.starts_with("_c_"), "{name}");
            assert_eq!(name.as_bytes()[39], b'-', "{name}");
            let groups: Vec<usize> = name[3..39].split('-').map(str::len).collect();
            assert_eq!(groups, [8, 4, 4, 4, 12], "{name}");
            assert!(name[3..39]
                .bytes()
                .all(|b| b == b'-' || b.is_ascii_hexdigit()));
        }
    }

    #[test]
    fn tokens_round_trip_and_refuse_strangers() {
        let token = Token {
            czxid: 0x1_0000_002a,
            node: format!("{}0000000001", contender_prefix(Kind::Read)),
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
