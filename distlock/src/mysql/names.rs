//! From string keys to `GET_LOCK` names.
//!
//! MySQL caps lock names at 64 characters (MariaDB 10.11 at 192) and has
//! compared them case-insensitively in some versions, so a key is never
//! passed through as typed unless that is safe everywhere. The derivation is
//! stable: changing it would let two versions of one service hold "the same"
//! lock at once.

use sha2::{Digest, Sha256};

/// The longest lock name MySQL accepts.
pub const MAX_NAME_LEN: usize = 64;

/// How many characters of the key a hashed name keeps, for people reading
/// `SHOW PROCESSLIST` or `performance_schema.metadata_locks`.
const READABLE_CHARS: usize = 24;

/// Characters a name passed through unchanged may contain: lowercase ASCII
/// letters, digits and `_ . : / -`. Never `~`, which only hashed names
/// contain, so a plain name can never equal a hashed one.
fn is_plain(byte: u8) -> bool {
    matches!(byte, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b':' | b'/' | b'-')
}

/// The `GET_LOCK` name distlock takes for `key`.
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
    let readable: String = key
        .chars()
        .take(READABLE_CHARS)
        .map(|c| {
            let lower = c.to_ascii_lowercase();
            if lower.is_ascii() && is_plain(lower as u8) {
                lower
            } else {
                '_'
            }
        })
        .collect();
    let digest = Sha256::digest(key.as_bytes());
    let mut name = readable;
    name.push('~');
    for byte in &digest[..16] {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

/// A lock as the backend handles it: the name taken on the server, and the
/// key the caller used (for errors and the lease).
#[derive(Debug, Clone)]
pub(super) struct LockName<'a> {
    pub(super) server: String,
    pub(super) key: &'a str,
}

impl<'a> LockName<'a> {
    pub(super) fn new(key: &'a str) -> Self {
        LockName {
            server: lock_name(key),
            key,
        }
    }

    /// The name as a SQL string literal (see [`name_literal`]).
    pub(super) fn literal(&self) -> String {
        name_literal(&self.server)
    }
}

/// A server lock name as a SQL string literal. Safe to inline: a name
/// [`lock_name`] made holds only the plain characters and `~`.
pub(super) fn name_literal(server: &str) -> String {
    debug_assert!(server.bytes().all(|b| is_plain(b) || b == b'~'));
    format!("'{server}'")
}

/// Hex of the first 128 bits of SHA-256 of an owner token: what the fencing
/// table records about the holder, never the token itself.
pub(super) fn owner_digest(owner: &str) -> String {
    crate::util::sha256_hex128(owner.as_bytes())
}

/// A string as a SQL hex literal (`X'…'`, `X''` when empty): any bytes,
/// nothing to escape, whatever the session's `sql_mode`.
pub(super) fn hex_literal(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(3 + 2 * bytes.len());
    text.push_str("X'");
    for byte in bytes {
        text.push_str(&format!("{byte:02x}"));
    }
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
    fn hex_literals_escape_nothing() {
        assert_eq!(hex_literal(b"a'"), "X'6127'");
        assert_eq!(hex_literal(b""), "X''");
    }
}
