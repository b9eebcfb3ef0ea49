//! Small helpers shared by backends and the URL dispatcher. A leaf module:
//! it uses nothing else of the crate but the plain [`MarkAdvance`] type, so
//! any module may import it (as object_store's `util.rs`).

use std::sync::{Mutex, MutexGuard, PoisonError};

use sha2::{Digest, Sha256};

use crate::MarkAdvance;

/// The one short digest distlock derives from strings: lock-file names and
/// the owner digests Postgres records both use it.
///
/// Lowercase hex of the first 128 bits of SHA-256 of `data` (32 characters).
/// 128 bits keep accidental collisions out of reach (about n² / 2¹²⁹ for n
/// inputs) in half the length of the full digest.
pub(crate) fn sha256_hex128(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    let mut hex = String::with_capacity(32);
    push_hex(&mut hex, &digest[..16]);
    hex
}

/// Appends `bytes` to `out` as lowercase hex, two digits a byte. The one
/// hex encoder of the crate: acquires run it on every grant (owner tokens,
/// owner digests, the SQL backends' hex literals), where a `format!` or
/// `write!` per byte cost an allocation or the formatting machinery per
/// byte (on MariaDB about 150,000 instructions a fenced cycle for the
/// holder record's literals; docs/perf-notes.md).
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(2 * bytes.len());
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

/// A std mutex guard, recovering from poisoning, as every std mutex of the
/// crate is locked: they guard state updated in single assignments, inserts
/// and removes, which a panic elsewhere cannot leave torn, and a poisoned
/// mutex must not turn every later lock or release into a panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `Debug` of a server session a backend keeps itself (etcd's lease,
/// ZooKeeper's session), one shape for all: `id`, the name and value that
/// identify it on the server (in hex, as the server's tools print it);
/// `span`, the name and length of its lifetime without the client; whether
/// it has ended.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
pub(crate) fn fmt_session(
    f: &mut std::fmt::Formatter<'_>,
    id: (&str, std::fmt::Arguments<'_>),
    span: (&str, std::time::Duration),
    closed: bool,
) -> std::fmt::Result {
    f.debug_struct("Session")
        .field(id.0, &id.1)
        .field(span.0, &span.1)
        .field("closed", &closed)
        .finish()
}

/// A mark ([`crate::Locker::advance_mark`]) as servers store it: `value +
/// 2^63` as 20 zero-padded decimal digits, so that byte order is integer
/// order across the whole `i64` range. Redis compares marks in Lua, whose
/// numbers are doubles (they cannot tell 2^53 from 2^53 + 1), and etcd
/// compares values as bytes: both compare this encoding exactly.
#[cfg_attr(not(any(feature = "redis", feature = "etcd")), allow(dead_code))]
pub(crate) fn encode_mark(value: i64) -> String {
    // Flipping the sign bit maps i64 order onto u64 order.
    format!("{:020}", (value as u64) ^ (1 << 63))
}

/// The inverse of [`encode_mark`]; `None` for anything it did not write.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) fn decode_mark(stored: &str) -> Option<i64> {
    if stored.len() != 20 || !stored.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let offset: u64 = stored.parse().ok()?;
    Some((offset ^ (1 << 63)) as i64)
}

/// What a compare-and-set of a mark stored as text (etcd's key, ZooKeeper's
/// node) found, values still as stored.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StoredMark {
    Advanced { previous: Option<String> },
    AlreadyAt { current: String },
}

#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
impl StoredMark {
    /// The advance with its values decoded, or why not: `key` (where the
    /// mark is stored) holds a value distlock did not write.
    pub(crate) fn decode(self, key: &str) -> std::result::Result<MarkAdvance, String> {
        let decode = |stored: &str| {
            decode_mark(stored)
                .ok_or_else(|| format!("{key} holds {stored:?}, which distlock did not write"))
        };
        Ok(match self {
            StoredMark::Advanced { previous: None } => MarkAdvance::Advanced { previous: None },
            StoredMark::Advanced {
                previous: Some(previous),
            } => MarkAdvance::Advanced {
                previous: Some(decode(&previous)?),
            },
            StoredMark::AlreadyAt { current } => MarkAdvance::AlreadyAt {
                current: decode(&current)?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn push_hex_writes_what_format_writes(bytes: Vec<u8>) {
            let mut hex = String::from("x");
            push_hex(&mut hex, &bytes);
            let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            prop_assert_eq!(hex, format!("x{expected}"));
        }

        #[test]
        fn the_mark_encoding_orders_like_the_integers(a: i64, b: i64) {
            let (ea, eb) = (encode_mark(a), encode_mark(b));
            prop_assert_eq!(ea.len(), 20);
            prop_assert_eq!(decode_mark(&ea), Some(a));
            prop_assert_eq!(ea.cmp(&eb), a.cmp(&b));
        }
    }

    #[test]
    fn foreign_mark_values_are_refused() {
        for stored in ["", "42", "-0000000000000000001", "1000000000000000000x"] {
            assert_eq!(decode_mark(stored), None, "{stored:?}");
        }
    }

    #[test]
    fn is_the_leading_half_of_the_sha256_hex() {
        // sha256("abc") = ba7816bf8f01cfea414140de5dae2223 b00361a396177a9cb410ff61f20015ad
        assert_eq!(sha256_hex128(b"abc"), "ba7816bf8f01cfea414140de5dae2223");
    }
}
