//! Input rules every backend applies, so bad input is rejected the same way
//! everywhere with an error that names what was wrong.

use std::time::Duration;

use crate::{Error, Result};

/// Longest key accepted, in bytes. Backends with shorter native limits (file
/// names, MySQL lock names, Postgres' 64-bit advisory keys) hash keys
/// internally, so every backend accepts the same keys.
pub const MAX_KEY_LEN: usize = 1024;

/// Longest ttl accepted: one year. Longer is almost certainly a unit mistake,
/// and it keeps every backend's millisecond arithmetic far from overflow.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Checks a key: non-empty and at most [`MAX_KEY_LEN`] bytes.
///
/// ```
/// assert!(distlock::validate::key("jobs/nightly").is_ok());
/// assert!(distlock::validate::key("").is_err());
/// ```
pub fn key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("key", "the key is empty"));
    }
    no_longer_than_a_key("key", key)
}

/// Most keys one attempt may try ([`Locker::try_lock_any`](crate::Locker::try_lock_any)):
/// a semaphore's permits ([`MAX_PERMITS`](crate::semaphore::MAX_PERMITS)).
pub const MAX_KEYS_PER_ATTEMPT: usize = 1024;

/// Checks the keys of one attempt over several: at least one, at most
/// [`MAX_KEYS_PER_ATTEMPT`], each a valid [`key`].
///
/// ```
/// assert!(distlock::validate::keys(&["a#0".to_owned(), "a#1".to_owned()]).is_ok());
/// assert!(distlock::validate::keys(&[]).is_err());
/// ```
pub fn keys(keys: &[String]) -> Result<()> {
    if keys.is_empty() {
        return Err(Error::invalid("keys", "no keys to try"));
    }
    if keys.len() > MAX_KEYS_PER_ATTEMPT {
        return Err(Error::invalid(
            "keys",
            format!(
                "{} keys to try; one attempt tries at most {MAX_KEYS_PER_ATTEMPT}",
                keys.len()
            ),
        ));
    }
    keys.iter().try_for_each(|k| key(k))
}

/// Refuses `value`, a `what`, if it is longer than [`MAX_KEY_LEN`] bytes.
fn no_longer_than_a_key(what: &'static str, value: &str) -> Result<()> {
    if value.len() > MAX_KEY_LEN {
        return Err(Error::invalid(
            what,
            format!(
                "the {what} is {} bytes long; the maximum is {MAX_KEY_LEN}",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Checks a key namespace (a prefix that backends hash together with each
/// key, such as Postgres' `namespace` and MySQL's `prefix`): no zero byte
/// (the separator between it and the key), and no longer than a key.
///
/// ```
/// assert!(distlock::validate::namespace("billing").is_ok());
/// assert!(distlock::validate::namespace("bill\0ing").is_err());
/// ```
pub fn namespace(namespace: &str) -> Result<()> {
    if namespace.contains('\0') {
        return Err(Error::invalid(
            "namespace",
            "the namespace contains a zero byte, which separates it from the key",
        ));
    }
    no_longer_than_a_key("namespace", namespace)
}

/// Checks a ttl: at least one millisecond and at most [`MAX_TTL`].
///
/// ```
/// use std::time::Duration;
/// assert!(distlock::validate::ttl(Duration::from_secs(30)).is_ok());
/// assert!(distlock::validate::ttl(Duration::ZERO).is_err());
/// ```
pub fn ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_millis(1) {
        return Err(Error::invalid(
            "ttl",
            format!("the ttl is {ttl:?}; it must be at least 1ms"),
        ));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(
            "ttl",
            format!("the ttl is {ttl:?}; the maximum is one year"),
        ));
    }
    Ok(())
}

/// `duration` in whole `unit`s, rounded up so that only zero is zero,
/// saturating at `u64::MAX`: a ttl sent in a backend's unit is never
/// shorter than the one the lease believes in.
pub(crate) fn whole_units(duration: Duration, unit: Duration) -> u64 {
    u64::try_from(duration.as_nanos().div_ceil(unit.as_nanos())).unwrap_or(u64::MAX)
}

/// Checks the arguments of an acquire: [`key`] and [`ttl`].
pub fn acquire(k: &str, t: Duration) -> Result<()> {
    key(k)?;
    ttl(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_keys_naming_the_problem() {
        let err = key("").unwrap_err().to_string();
        assert_eq!(err, "invalid key: the key is empty");
        let long = "x".repeat(MAX_KEY_LEN + 1);
        let err = key(&long).unwrap_err().to_string();
        assert!(err.contains("1025 bytes"), "{err}");
        assert!(key(&"x".repeat(MAX_KEY_LEN)).is_ok());
    }

    #[test]
    fn rejects_bad_ttls() {
        assert!(ttl(Duration::from_micros(999)).is_err());
        assert!(ttl(Duration::from_millis(1)).is_ok());
        assert!(ttl(MAX_TTL + Duration::from_secs(1)).is_err());
    }

    #[test]
    fn ttls_round_up_to_whole_units() {
        let (ms, s) = (Duration::from_millis(1), Duration::from_secs(1));
        for (ttl, unit, whole) in [
            (Duration::from_millis(1), ms, 1),
            (Duration::from_micros(1500), ms, 2),
            (Duration::from_secs(30), ms, 30_000),
            (MAX_TTL, ms, 365 * 24 * 3600 * 1000),
            (Duration::from_millis(1), s, 1),
            (Duration::from_millis(400), s, 1),
            (Duration::from_secs(1), s, 1),
            (Duration::from_millis(1200), s, 2),
            (Duration::from_secs(30), s, 30),
            (MAX_TTL, s, 365 * 24 * 3600),
        ] {
            assert_eq!(whole_units(ttl, unit), whole, "{ttl:?} in {unit:?}");
        }
    }
}
