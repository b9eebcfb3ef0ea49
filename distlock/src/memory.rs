//! In-process locks (`memory://`): for tests, single-process programs, and as
//! the reference implementation of the contract.
//!
//! # Semantics
//!
//! - **ttl** is enforced: a lock not refreshed within its ttl is free for the
//!   next caller (checked on access, no background task).
//! - **Holder crash**: not applicable; the locks live and die with the
//!   process, and with every clone of the [`MemoryLocker`].
//! - **Fencing**: one counter per locker shared by all keys, so tokens strictly
//!   increase per key (and across keys), even after [`Locker::forget`].
//! - **Waiting**: a release wakes waiters at once; expiry is found by polling.
//! - **Marks** ([`Locker::advance_mark`]) live as long as the locker: a
//!   scheduler restarted in a new process starts with none.
//! - **Inspection**: [`Locker::inspect`] and [`Locker::list`] report every
//!   field of [`HeldLock`] but `session` (the grant time on this process's
//!   clock); [`Locker::force_release`] supports [`ForceRelease::Lock`].
//! - **Not guaranteed**: anything across processes. Two `connect("memory://")`
//!   calls give two independent lockers; share one by cloning it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;

use crate::inspect::{self, Clock, ForceRelease, GrantTime, HeldLock, Holder};
use crate::util;
use crate::wait::LocalReleases;
use crate::{
    new_owner_token, validate, Capabilities, Error, Lease, LeaseParts, Locker, MarkAdvance,
    ReleaseWatch, Result,
};

/// The in-process backend. Cheap to clone; clones share their locks.
///
/// ```
/// use std::time::Duration;
/// use distlock::{memory::MemoryLocker, Locker};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let locker = MemoryLocker::new();
/// let lease = locker.try_lock("k", Duration::from_secs(1)).await?.unwrap();
/// assert!(locker.try_lock("k", Duration::from_secs(1)).await?.is_none());
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryLocker {
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    locks: Mutex<Table>,
    fencing: AtomicU64,
    releases: LocalReleases,
    marks: Mutex<HashMap<String, i64>>,
    /// The `Arc` every lease of this locker and its clones shares.
    leases: crate::SharedLocker,
}

#[derive(Debug, Default)]
struct Table {
    /// By key, shared with the key's lease (its drop releases by it).
    entries: HashMap<Arc<str>, Entry>,
    /// Expired entries are swept when the table grows past this.
    sweep_at: usize,
}

#[derive(Debug)]
struct Entry {
    owner: String,
    expires_at: Instant,
    fencing_token: u64,
    /// The holder's label, shared with the task or process that set it: the
    /// host and pid of an in-process lock are always this process's, so an
    /// entry keeps no copy of them (copies of host and label cost 214 bytes
    /// per held lease under `distlock bench --url memory:// --workload hold
    /// --keys 100000`, whose label is its 100-byte command line).
    label: Arc<str>,
    granted_at: SystemTime,
    ttl: Duration,
}

impl Entry {
    fn held(&self, key: &str, now: Instant) -> HeldLock {
        HeldLock {
            holder: Some(Holder::this_process(&self.label)),
            granted: Some(GrantTime {
                at: self.granted_at,
                clock: Clock::Holder,
            }),
            ttl: Some(self.ttl),
            ttl_left: Some(self.expires_at.saturating_duration_since(now)),
            fencing_token: Some(self.fencing_token),
            ..HeldLock::new(key)
        }
    }
}

const MIN_SWEEP_AT: usize = 1024;

impl MemoryLocker {
    /// An empty locker.
    pub fn new() -> Self {
        Self::default()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        util::lock(&self.state.locks)
    }

    /// Removes `key` if `owner` holds it (expired or not); true if it was held
    /// and unexpired.
    fn remove_if_owner(&self, key: &str, owner: &str) -> bool {
        let mut table = self.table();
        let held = match table.entries.get(key) {
            Some(entry) if entry.owner == owner => entry.expires_at > Instant::now(),
            _ => return false,
        };
        table.entries.remove(key);
        drop(table);
        self.state.releases.notify(key);
        held
    }
}

#[async_trait]
impl Locker for MemoryLocker {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        validate::acquire(key, ttl)?;
        let now = Instant::now();
        let owner = new_owner_token();
        let label = inspect::current_label();
        // The table's key is the lease's drop's too (the lease itself may
        // be renamed by a wrapper: a prefix comes off), one allocation.
        let table_key: Arc<str> = key.into();
        let fencing_token = {
            let mut table = self.table();
            if table.entries.get(key).is_some_and(|e| e.expires_at > now) {
                return Ok(None);
            }
            if table.entries.len() >= table.sweep_at {
                table.entries.retain(|_, e| e.expires_at > now);
                table.sweep_at = (table.entries.len() * 2).max(MIN_SWEEP_AT);
            }
            // Taken under the table lock so grants of one key get increasing tokens.
            let fencing_token = self.state.fencing.fetch_add(1, Ordering::Relaxed) + 1;
            table.entries.insert(
                table_key.clone(),
                Entry {
                    owner: owner.clone(),
                    expires_at: now + ttl,
                    fencing_token,
                    label,
                    granted_at: SystemTime::now(),
                    ttl,
                },
            );
            fencing_token
        };
        let parts = LeaseParts {
            key: key.to_owned(),
            owner,
            fencing_token: Some(fencing_token),
            ttl,
            valid_until: Some(now + ttl),
        };
        let this = self.clone();
        Ok(Some(
            Lease::new(
                parts,
                self.state.leases.get_or_init(|| Arc::new(self.clone())),
            )
            .with_sync_unlock(move |_, owner| {
                this.remove_if_owner(&table_key, owner);
            }),
        ))
    }

    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        validate::key(key)?;
        Error::unless_held(key, self.remove_if_owner(key, owner))
    }

    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        validate::acquire(key, ttl)?;
        let now = Instant::now();
        match self.table().entries.get_mut(key) {
            Some(entry) if entry.owner == owner && entry.expires_at > now => {
                entry.expires_at = now + ttl;
                entry.ttl = ttl;
                Ok(())
            }
            _ => Err(Error::not_held(key)),
        }
    }

    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        Ok(Some(self.state.releases.subscribe(key)))
    }

    /// Drops an expired entry left for `key`. The fencing counter is shared
    /// by every key, so it is not reset: tokens keep increasing. Never waits.
    async fn forget(&self, key: &str) -> Result<()> {
        validate::key(key)?;
        let mut table = self.table();
        if table
            .entries
            .get(key)
            .is_some_and(|e| e.expires_at > Instant::now())
        {
            return Err(Error::not_acquired(key));
        }
        table.entries.remove(key);
        Ok(())
    }

    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        validate::key(key)?;
        let now = Instant::now();
        let table = self.table();
        let entry = table.entries.get(key).filter(|e| e.expires_at > now);
        Ok(entry.map(|entry| entry.held(key, now)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let now = Instant::now();
        let mut held: Vec<HeldLock> = self
            .table()
            .entries
            .iter()
            .filter(|(key, entry)| key.starts_with(prefix) && entry.expires_at > now)
            .map(|(key, entry)| entry.held(key, now))
            .collect();
        held.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(held)
    }

    /// [`ForceRelease::Lock`] only: there is no session to end.
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        let delete = async {
            let now = Instant::now();
            let mut table = self.table();
            let evicted = match table.entries.get(key) {
                Some(entry) if entry.expires_at > now => entry.held(key, now),
                _ => return Ok(None),
            };
            table.entries.remove(key);
            drop(table);
            self.state.releases.notify(key);
            Ok(Some(evicted))
        };
        inspect::release_by_deleting("memory", key, how, "an entry in this process", delete).await
    }

    /// Marks live as long as the locker (and its clones): durable within
    /// this process only.
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        validate::key(name)?;
        let mut marks = util::lock(&self.state.marks);
        match marks.get_mut(name) {
            Some(current) if *current >= value => Ok(MarkAdvance::AlreadyAt { current: *current }),
            Some(current) => {
                let previous = std::mem::replace(current, value);
                Ok(MarkAdvance::Advanced {
                    previous: Some(previous),
                })
            }
            None => {
                marks.insert(name.to_owned(), value);
                Ok(MarkAdvance::Advanced { previous: None })
            }
        }
    }
}
