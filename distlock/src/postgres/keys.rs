//! From string keys to Postgres' 64-bit advisory keys.
//!
//! The derivation is stable (it never changes between releases: changing it
//! would let two versions of one service hold "the same" lock at once) and
//! easy to reproduce in any language or in SQL, so other programs can take or
//! inspect the same locks.

use sha2::{Digest, Sha256};

use crate::{validate, Error, Result};

/// The 64-bit advisory key distlock locks for `key` in `namespace`.
///
/// The first 8 bytes, read as a big-endian two's-complement `i64`, of the
/// SHA-256 digest of:
///
/// - the UTF-8 bytes of `key`, when `namespace` is empty and `key` has no
///   zero byte;
/// - otherwise the UTF-8 bytes of `namespace` (possibly none), one zero
///   byte, then the UTF-8 bytes of `key`.
///
/// `namespace` must not contain a zero byte (a locker refuses such a
/// namespace): the first zero byte is where the namespace ends, so no two
/// (namespace, key) pairs hash the same bytes. A key with a zero byte always
/// gets the separator, even without a namespace: hashed alone, the key
/// `"billing\0k"` would be the key `"k"` of namespace `billing`. Keys without
/// a zero byte hash as they always have; a distlock older than this rule
/// hashed a key with a zero byte and no namespace without the separator, so
/// it and a newer one do not exclude each other on such a key.
///
/// The same in SQL (PostgreSQL 11 or later), for an empty namespace:
///
/// ```sql
/// SELECT ('x' || encode(substr(sha256(convert_to('nightly-report', 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint;
/// ```
///
/// and with namespace `billing`:
///
/// ```sql
/// SELECT ('x' || encode(substr(sha256(convert_to('billing', 'UTF8') || '\x00'::bytea
///         || convert_to('nightly-report', 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint;
/// ```
///
/// A key with a zero byte cannot be Postgres `text`: hash its bytes as
/// `bytea`, after the separator. For the key `"a\0b"` without a namespace:
///
/// ```sql
/// SELECT ('x' || encode(substr(sha256('\x00'::bytea || '\x610062'::bytea), 1, 8), 'hex'))::bit(64)::bigint;
/// ```
///
/// # Collisions
///
/// Two different keys collide (and then exclude each other, which is safe but
/// surprising) with probability 2⁻⁶⁴ per pair. Among `n` keys in use the
/// chance of any collision is about n² / 2⁶⁵ (birthday bound): 3·10⁻⁸ for a
/// million keys, 3·10⁻² for a billion. Postgres' own `hashtext` is 32-bit and
/// reaches the same odds at about 100,000 keys, which is why it is not used.
///
/// ```
/// use distlock::postgres::advisory_key;
///
/// assert_eq!(advisory_key("", "nightly-report"), advisory_key("", "nightly-report"));
/// assert_ne!(advisory_key("billing", "nightly-report"), advisory_key("", "nightly-report"));
/// assert_ne!(advisory_key("", "billing\0nightly-report"), advisory_key("billing", "nightly-report"));
/// ```
pub fn advisory_key(namespace: &str, key: &str) -> i64 {
    let mut hasher = Sha256::new();
    // The separator only where it was always written, or where the key
    // itself has a zero byte (see above): every other key keeps its digest,
    // which running holders of older versions lock.
    if !namespace.is_empty() || key.contains('\0') {
        hasher.update(namespace.as_bytes());
        hasher.update([0u8]);
    }
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// Checks a namespace: no zero byte (the separator), and no longer than a key.
pub(super) fn validate_namespace(namespace: &str) -> Result<()> {
    if namespace.contains('\0') {
        return Err(Error::invalid(
            "namespace",
            "the namespace contains a zero byte, which separates it from the key",
        ));
    }
    if namespace.len() > validate::MAX_KEY_LEN {
        return Err(Error::invalid(
            "namespace",
            format!(
                "the namespace is {} bytes long; the maximum is {}",
                namespace.len(),
                validate::MAX_KEY_LEN
            ),
        ));
    }
    Ok(())
}

/// A lock as the backend handles it: the advisory key taken on the server,
/// and the key the caller named it by.
pub(super) type LockKey<'a> = crate::sql::dialect::Lock<'a, i64>;

/// Parses the key of a raw-key lock: a decimal `i64`.
pub(super) fn parse_raw(name: &str) -> Result<i64> {
    validate::key(name)?;
    name.parse().map_err(|_| {
        Error::invalid(
            "key",
            format!("{name:?} is not a raw advisory key (a decimal 64-bit integer)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::fencing::owner_digest;

    #[test]
    fn the_derivation_is_pinned() {
        // Computed independently (Python's hashlib; the SQL in the docs is
        // checked against a real server in tests/postgres.rs). A change here
        // breaks every deployed lock, so it must never happen.
        assert_eq!(advisory_key("", "nightly-report"), 7440995589958059143);
        assert_eq!(
            advisory_key("billing", "nightly-report"),
            8192123173007030350
        );
        // Checked against a real server's sha256 of the bytea '\x00610062'
        // (tests/postgres/behaviour.rs).
        assert_eq!(advisory_key("", "a\0b"), 4423714668093431729);
    }

    #[test]
    fn namespace_and_key_cannot_be_shifted_into_each_other() {
        assert_ne!(advisory_key("ab", "c"), advisory_key("a", "bc"));
    }

    #[test]
    fn a_zero_byte_in_a_key_cannot_pose_as_the_namespace_separator() {
        // Without a namespace the key's bytes were hashed alone, so the key
        // "a\0b" hashed exactly as the key "b" in namespace "a".
        assert_ne!(advisory_key("", "a\0b"), advisory_key("a", "b"));
        assert_ne!(advisory_key("", "\0b"), advisory_key("", "b"));
        assert_ne!(advisory_key("a", "\0b"), advisory_key("a", "b"));
    }

    #[test]
    fn namespaces_with_the_separator_are_rejected() {
        assert!(validate_namespace("billing").is_ok());
        let err = validate_namespace("bill\0ing").unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidInput {
                what: "namespace",
                ..
            }
        ));
    }

    #[test]
    fn raw_keys_are_decimal_integers() {
        assert_eq!(parse_raw("-42").unwrap(), -42);
        assert_eq!(parse_raw(&i64::MAX.to_string()).unwrap(), i64::MAX);
        for bad in ["", "0x10", "12a", "99999999999999999999"] {
            assert!(parse_raw(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn owner_digests_are_128_bit_hex() {
        let digest = owner_digest("0123456789abcdef0123456789abcdef");
        assert_eq!(digest.len(), 32);
        assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
