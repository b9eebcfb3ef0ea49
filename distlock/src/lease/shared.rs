//! The one `Arc<dyn Locker>` the leases of a locker share, and owner tokens.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::Locker;

/// The one `Arc<dyn Locker>` that every lease of a locker (and of its clones)
/// releases and refreshes through, built on the first grant and kept while
/// any lease holds it.
///
/// **Wrapper implementors need it.** A wrapper that re-homes its leases
/// ([`Lease::rebind`](crate::Lease::rebind)) must give all of them the same `Arc`: the keepalive
/// runs one scheduler per `Arc`, which sends the refreshes due together as
/// one [`Locker::refresh_many`] batch. `lease.rebind(Arc::new(self.clone()))`
/// gives every lease an `Arc` of its own, hence a scheduler of its own and
/// a round trip per lease per refresh: 10,000 held Postgres leases then
/// make 10,000 statements per interval instead of one per session, and
/// their refreshes time out. Sharing it also saves an allocation and a copy
/// of the wrapper per lease.
///
/// Keep one in the wrapper's shared state (clones share it: it is an `Arc`
/// inside) and rebind through [`get_or_init`](SharedLocker::get_or_init).
/// Only a weak reference is kept, so there is no cycle: once no lease holds
/// the `Arc`, the next grant makes a new one.
///
/// ```
/// use std::sync::Arc;
/// use distlock::{memory::MemoryLocker, Locker, SharedLocker};
///
/// let leases = SharedLocker::default();
/// // In a wrapper's `try_lock`:
/// // `lease.rebind(self.leases.get_or_init(|| Arc::new(self.clone())))`.
/// let first: Arc<dyn Locker> = leases.get_or_init(|| Arc::new(MemoryLocker::new()));
/// let again = leases.get_or_init(|| Arc::new(MemoryLocker::new()));
/// assert!(Arc::ptr_eq(&first, &again), "one Arc while a lease holds it");
/// ```
#[derive(Clone, Default)]
pub struct SharedLocker(Arc<std::sync::Mutex<Option<std::sync::Weak<dyn Locker>>>>);

impl SharedLocker {
    /// The shared `Arc`, made by `make` if no lease holds it now (`make`
    /// runs at most once while one does). Never fails; a poisoned mutex is
    /// taken over, as the cached reference is valid whatever panicked.
    pub fn get_or_init(&self, make: impl FnOnce() -> Arc<dyn Locker>) -> Arc<dyn Locker> {
        let mut cached = crate::util::lock(&self.0);
        if let Some(locker) = cached.as_ref().and_then(std::sync::Weak::upgrade) {
            return locker;
        }
        let locker = make();
        *cached = Some(Arc::downgrade(&locker));
        locker
    }
}

/// `locker` as the `Arc<dyn Locker>` the primitives keep: boxed once, or,
/// when it already is an `Arc<dyn Locker>`, that `Arc` itself (not an `Arc`
/// of an `Arc`, which would work but add an indirection to every call). What
/// lets `Scheduler::new`, `Election::new` and `Semaphore::new` take any
/// locker, wrapped or not, without the caller's `.shared()`.
pub(crate) fn into_shared<L: Locker>(locker: L) -> Arc<dyn Locker> {
    match (&locker as &dyn Any).downcast_ref::<Arc<dyn Locker>>() {
        Some(shared) => shared.clone(),
        None => Arc::new(locker),
    }
}

impl fmt::Debug for SharedLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedLocker").finish_non_exhaustive()
    }
}

/// A fresh owner token: 128 random bits as 32 lowercase hex digits.
pub fn new_owner_token() -> String {
    // Every acquire makes one: `push_hex` rather than `format!("{:032x}")`,
    // whose formatting machinery cost about 1,200 instructions a token.
    let mut token = String::with_capacity(32);
    crate::util::push_hex(&mut token, &rand::random::<u128>().to_be_bytes());
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryLocker;
    use crate::LockerExt;

    #[test]
    fn an_owner_token_is_32_lowercase_hex_digits_of_fresh_bits() {
        let token = new_owner_token();
        assert_eq!(token.len(), 32, "{token}");
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{token}"
        );
        assert_ne!(token, new_owner_token());
        // The digits are the bits, most significant first, as `{:032x}`.
        let parsed = u128::from_str_radix(&token, 16).unwrap();
        assert_eq!(format!("{parsed:032x}"), token);
    }

    #[test]
    fn an_arc_dyn_locker_is_kept_and_anything_else_boxed_once() {
        let shared: Arc<dyn Locker> = Arc::new(MemoryLocker::new());
        let kept = into_shared(shared.clone());
        assert!(Arc::ptr_eq(&kept, &shared), "not an Arc of the Arc");
        let wrapped = into_shared(MemoryLocker::new().with_prefix("jobs/"));
        assert_eq!(wrapped.backend_key("a"), "jobs/a", "the wrapper, boxed");
    }
}
