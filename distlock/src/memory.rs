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
//! - **Shared locks** ([`Locker::try_lock_shared`]): readers are kept beside
//!   the exclusive entry, each with its own owner token and ttl (refresh,
//!   expiry and release are per reader). A shared lease's fencing token is
//!   the locker's counter as it stands, not advanced: at least the key's
//!   last writer's, below its next writer's. **A waiting writer does not
//!   block new readers**: a writer in [`Locker::lock`] is woken by each
//!   release and gets the key only once no reader holds it, so readers that
//!   keep overlapping can starve it.
//! - **Marks** ([`Locker::advance_mark`]) live as long as the locker: a
//!   scheduler restarted in a new process starts with none.
//! - **Inspection**: [`Locker::inspect`] and [`Locker::list`] report every
//!   field of [`HeldLock`] but `session` (the grant time on this process's
//!   clock); [`Locker::force_release`] supports [`ForceRelease::Lock`]. A
//!   key held shared is reported with [`HeldLock::shared`] set and its
//!   longest-held reader as the holder (`ttl_left`: until the last reader's
//!   ttl runs out); a forced release evicts every reader.
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
    /// The shared holders of each key, by owner token. A key is in at most
    /// one of `entries` (unexpired) and `readers` (non-empty, unexpired):
    /// each grant checks the other map under the one table lock.
    readers: HashMap<Arc<str>, HashMap<String, Entry>>,
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

impl Table {
    /// Whether an unexpired exclusive holder has `key`.
    fn held_exclusive(&self, key: &str, now: Instant) -> bool {
        self.entries.get(key).is_some_and(|e| e.expires_at > now)
    }

    /// Whether an unexpired reader has `key`.
    fn held_shared(&self, key: &str, now: Instant) -> bool {
        self.readers
            .get(key)
            .is_some_and(|readers| readers.values().any(|e| e.expires_at > now))
    }

    /// What inspection reports of `key`'s readers, if any is unexpired:
    /// the longest-held one, lasting until the last one's ttl runs out.
    fn held_readers(&self, key: &str, now: Instant) -> Option<HeldLock> {
        let readers = self.readers.get(key)?;
        let live = || readers.values().filter(|e| e.expires_at > now);
        let first = live().min_by_key(|e| e.granted_at)?;
        let last_expiry = live().map(|e| e.expires_at).max()?;
        Some(HeldLock {
            ttl_left: Some(last_expiry.saturating_duration_since(now)),
            shared: true,
            ..first.held(key, now)
        })
    }

    /// Drops expired entries once the table has grown past `sweep_at`.
    fn sweep(&mut self, now: Instant) {
        let size = self.entries.len() + self.readers.len();
        if size >= self.sweep_at {
            self.entries.retain(|_, e| e.expires_at > now);
            self.readers.retain(|_, readers| {
                readers.retain(|_, e| e.expires_at > now);
                !readers.is_empty()
            });
            let size = self.entries.len() + self.readers.len();
            self.sweep_at = (size * 2).max(MIN_SWEEP_AT);
        }
    }
}

impl MemoryLocker {
    /// One attempt at `key`, exclusive or `shared`: free of writers (and,
    /// for a writer, of readers) at `now`, it records the holder and grants.
    fn grant(&self, key: &str, ttl: Duration, shared: bool) -> Result<Option<Lease>> {
        validate::acquire(key, ttl)?;
        let now = Instant::now();
        let owner = new_owner_token();
        let entry = |fencing_token| Entry {
            owner: owner.clone(),
            expires_at: now + ttl,
            fencing_token,
            label: inspect::current_label(),
            granted_at: SystemTime::now(),
            ttl,
        };
        // The table's key is the lease's drop's too (the lease itself may
        // be renamed by a wrapper: a prefix comes off), one allocation.
        let table_key: Arc<str> = key.into();
        let fencing_token = {
            let mut table = self.table();
            if table.held_exclusive(key, now) || (!shared && table.held_shared(key, now)) {
                return Ok(None);
            }
            table.sweep(now);
            // Under the table lock, so grants of one key get increasing
            // tokens. A reader's is read, not advanced: the next writer's
            // `fetch_add` then gives it a larger token than this reader's.
            let fencing_token = match shared {
                true => self.state.fencing.load(Ordering::Relaxed),
                false => self.state.fencing.fetch_add(1, Ordering::Relaxed) + 1,
            };
            match shared {
                true => {
                    let readers = table.readers.entry(table_key.clone()).or_default();
                    readers.insert(owner.clone(), entry(fencing_token));
                }
                false => {
                    table
                        .entries
                        .insert(table_key.clone(), entry(fencing_token));
                }
            }
            fencing_token
        };
        let parts = LeaseParts {
            key: key.to_owned(),
            owner,
            fencing_token: Some(fencing_token),
            ttl,
            valid_until: Some(now + ttl),
        };
        Ok(Some(self.lease(table_key, parts)))
    }
    /// An empty locker.
    pub fn new() -> Self {
        Self::default()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        util::lock(&self.state.locks)
    }

    /// Removes `key` if `owner` holds it (expired or not), exclusively or
    /// as a reader; true if it was held and unexpired.
    fn remove_if_owner(&self, key: &str, owner: &str) -> bool {
        let mut table = self.table();
        let now = Instant::now();
        let held = match table.entries.get(key) {
            Some(entry) if entry.owner == owner => {
                let held = entry.expires_at > now;
                table.entries.remove(key);
                held
            }
            _ => {
                let Some(readers) = table.readers.get_mut(key) else {
                    return false;
                };
                let Some(reader) = readers.remove(owner) else {
                    return false;
                };
                if readers.is_empty() {
                    table.readers.remove(key);
                }
                reader.expires_at > now
            }
        };
        drop(table);
        // A reader's release may be the last one a waiting writer needs.
        self.state.releases.notify(key);
        held
    }

    /// Builds the lease of a grant recorded under `table_key`.
    fn lease(&self, table_key: Arc<str>, parts: LeaseParts) -> Lease {
        let this = self.clone();
        Lease::new(
            parts,
            self.state.leases.get_or_init(|| Arc::new(self.clone())),
        )
        .with_sync_unlock(move |_, owner| {
            this.remove_if_owner(&table_key, owner);
        })
    }
}

#[async_trait]
impl Locker for MemoryLocker {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // A waiting writer polls (woken by releases) beside new readers.
            writer_priority: false,
            ..Capabilities::ALL
        }
    }

    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.grant(key, ttl, false)
    }

    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.grant(key, ttl, true)
    }

    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        validate::key(key)?;
        Error::unless_held(key, self.remove_if_owner(key, owner))
    }

    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        validate::acquire(key, ttl)?;
        let now = Instant::now();
        let mut table = self.table();
        let entry = match table.entries.get_mut(key) {
            Some(entry) if entry.owner == owner => Some(entry),
            _ => table
                .readers
                .get_mut(key)
                .and_then(|readers| readers.get_mut(owner)),
        };
        match entry {
            Some(entry) if entry.expires_at > now => {
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
        let now = Instant::now();
        if table.held_exclusive(key, now) || table.held_shared(key, now) {
            return Err(Error::not_acquired(key));
        }
        table.entries.remove(key);
        table.readers.remove(key);
        Ok(())
    }

    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        validate::key(key)?;
        let now = Instant::now();
        let table = self.table();
        let entry = table.entries.get(key).filter(|e| e.expires_at > now);
        Ok(entry
            .map(|entry| entry.held(key, now))
            .or_else(|| table.held_readers(key, now)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let now = Instant::now();
        let table = self.table();
        let mut held: Vec<HeldLock> = table
            .entries
            .iter()
            .filter(|(key, entry)| key.starts_with(prefix) && entry.expires_at > now)
            .map(|(key, entry)| entry.held(key, now))
            .chain(
                table
                    .readers
                    .keys()
                    .filter(|key| key.starts_with(prefix))
                    .filter_map(|key| table.held_readers(key, now)),
            )
            .collect();
        drop(table);
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
                // Held shared: every reader goes.
                _ => match table.held_readers(key, now) {
                    Some(readers) => readers,
                    None => return Ok(None),
                },
            };
            table.entries.remove(key);
            table.readers.remove(key);
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
