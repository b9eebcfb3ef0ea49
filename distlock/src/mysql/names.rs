//! From string keys to `GET_LOCK` names.
//!
//! MySQL caps lock names at 64 characters (MariaDB 10.11 at 192) and has
//! compared them case-insensitively in some versions, so a key is never
//! passed through as typed unless that is safe everywhere. Lock names are
//! server-wide (not per database), so a locker puts its namespace (by
//! default its URL's database) into every name. The derivation is stable:
//! changing it would let two versions of one service hold "the same" lock at
//! once.

use crate::util::sha256_hex128;

/// The longest lock name MySQL accepts.
pub const MAX_NAME_LEN: usize = 64;

/// How many characters of the key a hashed name keeps, for people reading
/// `SHOW PROCESSLIST` or `performance_schema.metadata_locks`.
const READABLE_CHARS: usize = 24;

/// How many characters of the namespace and of the key a namespaced name
/// keeps: 12 + `~` + 18 + `~` + 32 hex digits = 64, MySQL's limit.
const READABLE_NAMESPACE_CHARS: usize = 12;
const READABLE_KEY_CHARS: usize = 18;

/// Characters a name passed through unchanged may contain: lowercase ASCII
/// letters, digits and `_ . : / -`. Never `~`, which only hashed names
/// contain, so a plain name can never equal a hashed one.
fn is_plain(byte: u8) -> bool {
    matches!(byte, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b':' | b'/' | b'-')
}

/// The `GET_LOCK` name distlock takes for `key` with no namespace (URL
/// `prefix=`, empty): see [`lock_name_in`] for the name a locker takes in
/// its namespace.
///
/// - A key of at most 64 bytes made only of lowercase ASCII letters, digits
///   and `_ . : / -` is used as it is: `nightly-report` locks
///   `nightly-report`.
/// - Any other key (uppercase letters, other characters, non-ASCII, longer
///   than 64 bytes) becomes a readable prefix, `~`, and the first 32 hex
///   digits (128 bits) of the SHA-256 of the key's UTF-8 bytes. The prefix
///   is the key's first 24 characters, each ASCII letter lowercased and
///   every character outside the plain set replaced by `_`. At most 57
///   characters in all.
///
/// So `job` and `Job` are two locks (`job` and `job~…`), whichever way the
/// server compares names, and no two keys share a name unless their 128-bit
/// digests collide (about n² / 2¹²⁹ for n keys).
///
/// The same in SQL, to take a lock by hand (MariaDB 10.0.5+, MySQL 8.0+, for
/// keys whose first 24 characters are ASCII; the `SHA2` of the whole key
/// works for any key):
///
/// ```sql
/// -- a plain key:
/// SELECT GET_LOCK('nightly-report', 10);
/// -- any other key, here 'Billing Run':
/// SELECT GET_LOCK(CONCAT(LOWER(REGEXP_REPLACE(LEFT('Billing Run', 24), '[^A-Za-z0-9_.:/-]', '_')),
///                        '~', LEFT(SHA2('Billing Run', 256), 32)), 10);
/// ```
///
/// ```
/// use distlock::mysql::lock_name;
///
/// assert_eq!(lock_name("nightly-report"), "nightly-report");
/// assert_eq!(lock_name("Job"), "job~ad617a0fdd57e3f4b8ebb27f6f60470b");
/// assert_ne!(lock_name("Job"), lock_name("job"));
/// assert!(lock_name(&"x".repeat(1000)).len() <= 64);
/// ```
pub fn lock_name(key: &str) -> String {
    if key.len() <= MAX_NAME_LEN && !key.is_empty() && key.bytes().all(is_plain) {
        return key.to_owned();
    }
    let mut name = readable(key, READABLE_CHARS);
    name.push('~');
    name.push_str(&sha256_hex128(key.as_bytes()));
    name
}

/// The `GET_LOCK` name distlock takes for `key` in `namespace` (URL
/// `prefix`, by default the URL's database; see the
/// [module docs](super#namespaces)).
///
/// - With an empty namespace, [`lock_name`]`(key)`: names other `GET_LOCK`
///   users can take by hand.
/// - Otherwise, always hashed: the namespace's first 12 characters, `~`, the
///   key's first 18 characters (both made readable as in [`lock_name`]),
///   `~`, and the first 32 hex digits (128 bits) of the SHA-256 of the
///   namespace's UTF-8 bytes, one zero byte and the key's UTF-8 bytes. At
///   most 64 characters.
///
/// Such a name has two `~`, a name without namespace none or one: the two
/// kinds never meet. A namespace holds no zero byte (the builder refuses
/// one), so two (namespace, key) pairs hash the same bytes only if they are
/// the same pair: distinct pairs share a name only if their 128-bit digests
/// collide.
///
/// The same in SQL (MariaDB 10.0.5+, MySQL 8.0+, for ASCII readable parts),
/// here namespace `svc_a` and key `cleanup`:
///
/// ```sql
/// SELECT GET_LOCK(CONCAT(LOWER(REGEXP_REPLACE(LEFT('svc_a', 12), '[^A-Za-z0-9_.:/-]', '_')), '~',
///                        LOWER(REGEXP_REPLACE(LEFT('cleanup', 18), '[^A-Za-z0-9_.:/-]', '_')), '~',
///                        LEFT(SHA2(CONCAT('svc_a', CHAR(0), 'cleanup'), 256), 32)), 10);
/// ```
///
/// ```
/// use distlock::mysql::{lock_name, lock_name_in};
///
/// assert_eq!(lock_name_in("", "cleanup"), lock_name("cleanup"));
/// let a = lock_name_in("svc_a", "cleanup");
/// assert!(a.starts_with("svc_a~cleanup~"), "{a}");
/// assert_ne!(a, lock_name_in("svc_b", "cleanup"));
/// // The namespace and the key cannot be shifted into each other.
/// assert_ne!(lock_name_in("ab", "c"), lock_name_in("a", "bc"));
/// assert!(lock_name_in(&"n".repeat(1000), &"k".repeat(1000)).len() <= 64);
/// ```
pub fn lock_name_in(namespace: &str, key: &str) -> String {
    if namespace.is_empty() {
        return lock_name(key);
    }
    let mut name = readable(namespace, READABLE_NAMESPACE_CHARS);
    name.push('~');
    name.push_str(&readable(key, READABLE_KEY_CHARS));
    name.push('~');
    let mut hashed = Vec::with_capacity(namespace.len() + 1 + key.len());
    hashed.extend_from_slice(namespace.as_bytes());
    hashed.push(0);
    hashed.extend_from_slice(key.as_bytes());
    name.push_str(&sha256_hex128(&hashed));
    name
}

/// The first `chars` characters of `text`, each ASCII letter lowercased and
/// every character outside the plain set replaced by `_`.
fn readable(text: &str, chars: usize) -> String {
    text.chars()
        .take(chars)
        .map(|c| {
            let lower = c.to_ascii_lowercase();
            if lower.is_ascii() && is_plain(lower as u8) {
                lower
            } else {
                '_'
            }
        })
        .collect()
}

/// A lock as the backend handles it: the name taken on the server, and the
/// key the caller named it by.
pub(super) type LockName<'a> = crate::sql::dialect::Lock<'a, String>;

impl<'a> LockName<'a> {
    /// `key`'s lock in `namespace` (see [`lock_name_in`]).
    #[cfg(test)]
    pub(super) fn new(namespace: &str, key: &'a str) -> Self {
        LockName {
            id: lock_name_in(namespace, key),
            key,
        }
    }

    /// The name as a SQL string literal (see [`name_literal`]).
    pub(super) fn literal(&self) -> String {
        name_literal(&self.id)
    }
}

/// A server lock name as a SQL string literal. Safe to inline: a name
/// [`lock_name`] made holds only the plain characters and `~`.
pub(super) fn name_literal(server: &str) -> String {
    debug_assert!(server.bytes().all(|b| is_plain(b) || b == b'~'));
    format!("'{server}'")
}

/// A string as a SQL hex literal (`X'…'`, `X''` when empty): any bytes,
/// nothing to escape, whatever the session's `sql_mode`.
pub(super) fn hex_literal(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(3 + 2 * bytes.len());
    text.push_str("X'");
    crate::util::push_hex(&mut text, bytes);
    text.push('\'');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_keys_pass_through_and_others_are_hashed() {
        assert_eq!(lock_name("a:b/c.d_e-f9"), "a:b/c.d_e-f9");
        let long = "k".repeat(65);
        for key in [
            "Job",
            "JOB",
            "a b",
            "é",
            "naïve-ü",
            &long,
            "with~tilde",
            "it's",
        ] {
            let name = lock_name(key);
            assert!(name.len() <= MAX_NAME_LEN, "{key:?}: {name}");
            assert!(name.contains('~'), "{key:?}: {name}");
            assert!(
                name.bytes().all(|b| is_plain(b) || b == b'~'),
                "{key:?}: {name}"
            );
        }
        assert_eq!(lock_name(&"k".repeat(64)), "k".repeat(64));
        assert_ne!(lock_name("Job"), lock_name("JOB"));
        assert!(lock_name("é").starts_with("_~"));
        assert!(lock_name("Billing Run").starts_with("billing_run~"));
    }

    #[test]
    fn the_derivation_is_pinned() {
        // sha256("Job") = ad617a0fdd57e3f4b8ebb27f6f60470b…; a change here
        // breaks every deployed lock.
        assert_eq!(lock_name("Job"), "job~ad617a0fdd57e3f4b8ebb27f6f60470b");
    }

    #[test]
    fn namespaced_names_are_bounded_and_pinned() {
        let long = "K".repeat(1000);
        for (namespace, key) in [
            ("distlock", "cleanup"),
            ("svc_a", "Job"),
            ("Ünïcode db", "clé/ключ"),
            ("with~tilde", "with~tilde"),
            (long.as_str(), long.as_str()),
        ] {
            let name = lock_name_in(namespace, key);
            assert!(name.len() <= MAX_NAME_LEN, "{namespace:?} {key:?}: {name}");
            // Two `~` (none or one without a namespace): never a name
            // without namespace.
            assert_eq!(name.matches('~').count(), 2, "{name}");
            assert!(name.bytes().all(|b| is_plain(b) || b == b'~'), "{name}");
        }
        assert_eq!(lock_name_in("", "Job"), lock_name("Job"));
        assert_ne!(lock_name_in("a", "bc"), lock_name_in("ab", "c"));
        assert_ne!(lock_name_in("svc_a", "job"), lock_name_in("svc_a", "Job"));
        // sha256("svc_a\0cleanup"); a change here breaks every deployed lock.
        assert_eq!(
            lock_name_in("svc_a", "cleanup"),
            "svc_a~cleanup~fe9a0e2b155922d1d9f43f23d70204ef"
        );
    }

    #[test]
    fn hex_literals_escape_nothing() {
        assert_eq!(hex_literal(b"a'"), "X'6127'");
        assert_eq!(hex_literal(b""), "X''");
    }
}
