//! What the holder knows about its lease, shared by the [`Lease`](super::Lease),
//! its keepalive, every [`LostSignal`] and the backend's [`LostNotifier`]:
//! until when the lock is known held, and, once, why it ended. A lease only
//! ever moves from held to ended; every change goes through this file.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::util;

/// Why a lease stopped being held. Delivered by [`LostSignal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The holder released the lease (or dropped it). Not a failure.
    Released,
    /// The backend says this owner no longer holds the lock: it expired and
    /// may have been taken by somebody else, or somebody released it by token.
    NotHeld,
    /// The ttl ran out before a refresh succeeded (the backend could not be
    /// reached in time). Treat the lock as taken by somebody else.
    Expired,
    /// The keepalive stopped renewing because the lease reached its
    /// [`KeepAlive::max_hold`](crate::KeepAlive::max_hold). The lock is still held (until released, or
    /// until its ttl runs out where locks expire): stop the work, then
    /// release.
    MaxHoldExceeded,
    /// The connection or session carrying the lock died; the server has
    /// dropped the lock.
    ConnectionLost,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Released => "released",
            LostReason::NotHeld => "the backend says this owner no longer holds the lock",
            LostReason::Expired => "the ttl ran out before a refresh succeeded",
            LostReason::MaxHoldExceeded => "the lease reached its maximum hold time",
            LostReason::ConnectionLost => "the connection holding the lock died",
        })
    }
}

/// What the holder currently knows about its lease; shared by the lease, its
/// keepalive task, every [`LostSignal`] and the backend's [`LostNotifier`].
#[derive(Debug, Clone, Copy)]
pub(super) struct LeaseStatus {
    /// Until when the lock is known to be held (client clock, conservative:
    /// measured from before the request that set it). `None` for backends
    /// whose locks do not expire (file, Postgres) while the lease is held;
    /// set by a loss to when the lock may become someone else's.
    pub(super) valid_until: Option<Instant>,
    /// The ttl of the grant or of the last refresh.
    pub(super) ttl: Duration,
    /// When the request behind the grant or the last successful refresh was
    /// sent: the keepalive schedules its next refresh from here.
    pub(super) renewed_at: Instant,
    /// Set once, when the lease is lost or released; never cleared.
    pub(super) lost: Option<LostReason>,
    /// The smallest margin (see [`margin_key`]) with which a [`LostSignal`]
    /// has answered [`LostReason::Expired`], [`NOT_EXPIRED`] until one has:
    /// every signal early by that much or more answers it from then on,
    /// whatever a later refresh says, so no signal says held after it (or
    /// one firing no later) said expired. Zero (the lease's own validity ran
    /// out) also refuses every later refresh. (A `u32` of milliseconds fits
    /// beside `lost` in what would be padding: no byte more per lease.)
    pub(super) expired_early_by: u32,
}

/// [`LeaseStatus::expired_early_by`] while no signal has answered expired.
pub(super) const NOT_EXPIRED: u32 = u32::MAX;

/// A signal's margin as [`LeaseStatus::expired_early_by`] keeps it: whole
/// milliseconds, rounded up so that only a zero margin is zero, saturating
/// below [`NOT_EXPIRED`]. Order-preserving, so "early by as much or more"
/// holds between keys as between margins (up to the rounding: a signal
/// early by less within the same millisecond counts as early by as much).
fn margin_key(margin: Duration) -> u32 {
    u32::try_from(crate::validate::whole_units(
        margin,
        Duration::from_millis(1),
    ))
    .map_or(NOT_EXPIRED - 1, |ms| ms.min(NOT_EXPIRED - 1))
}

/// The state shared by a lease, its keepalive, its lost signals and notifiers.
///
/// One allocation of about 160 bytes per lease: a mutex over the status and
/// a `Notify` that wakes the waiting signals. (A `tokio::sync::watch`
/// channel did the same in about 400, most of it the eight `Notify`s it
/// keeps for its receivers, and a held lease is mostly this.)
pub(super) struct Shared {
    state: Mutex<State>,
    /// Woken (every waiter) whenever the status changes.
    changed: Notify,
    /// How much shorter than its ttl a refresh's validity is (see
    /// [`Lease::with_validity_discount`]); none: the full ttl.
    discount: OnceLock<ValidityDiscount>,
}

struct State {
    status: LeaseStatus,
    /// Run once, when the lease ends (see [`Lease::on_end`]).
    on_end: Vec<EndCallback>,
}

type EndCallback = Box<dyn FnOnce(LostReason) + Send>;
type ValidityDiscount = Box<dyn Fn(Duration) -> Duration + Send + Sync>;

impl Shared {
    /// A new lease's state.
    pub(super) fn new(status: LeaseStatus) -> Self {
        Shared {
            state: Mutex::new(State {
                status,
                on_end: Vec::new(),
            }),
            changed: Notify::new(),
            discount: OnceLock::new(),
        }
    }

    /// Sets the validity discount once (later calls are ignored).
    pub(super) fn set_discount(&self, discount: ValidityDiscount) {
        let _ = self.discount.set(discount);
    }

    /// The validity of a refresh for `ttl`: the ttl less the discount.
    fn validity_for(&self, ttl: Duration) -> Duration {
        match self.discount.get() {
            Some(discount) => ttl.saturating_sub(discount(ttl)),
            None => ttl,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        util::lock(&self.state)
    }

    pub(super) fn status(&self) -> LeaseStatus {
        self.state().status
    }

    /// Applies `change` to the status; if it says it changed something,
    /// wakes every waiting signal. Returns what `change` returned.
    fn update(&self, change: impl FnOnce(&mut LeaseStatus) -> bool) -> bool {
        let changed = change(&mut self.state().status);
        if changed {
            self.changed.notify_waiters();
        }
        changed
    }

    /// What a signal firing `margin` before the known validity ends answers
    /// now: `Err` with why the lease is over for it, or until when it is
    /// held for it (`None`: until it ends). An answer of
    /// [`LostReason::Expired`] is recorded (see
    /// [`LeaseStatus::expired_early_by`]): it is final.
    fn check(&self, margin: Duration) -> Result<Option<Instant>, LostReason> {
        let status = &mut self.state().status;
        if let Some(reason) = status.lost {
            return Err(reason);
        }
        let key = margin_key(margin);
        if key >= status.expired_early_by {
            return Err(LostReason::Expired);
        }
        let Some(deadline) = expires_at(status, margin) else {
            return Ok(None);
        };
        // Read under the lock, as `extend_validity` reads it: a refresh
        // cannot slip between this reading and the answer.
        if Instant::now() >= deadline {
            // Smaller than the recorded margin (checked above).
            status.expired_early_by = key;
            return Err(LostReason::Expired);
        }
        Ok(Some(deadline))
    }

    /// A signal following this state.
    pub(super) fn subscribe(self: &Arc<Self>) -> LostSignal {
        LostSignal {
            shared: self.clone(),
            margin: Duration::ZERO,
        }
    }

    /// Runs `callback` once when the lease ends (at once if it has).
    pub(super) fn on_end(&self, callback: impl FnOnce(LostReason) + Send + 'static) {
        let mut state = self.state();
        match state.status.lost {
            Some(reason) => {
                drop(state);
                callback(reason);
            }
            None => state.on_end.push(Box::new(callback)),
        }
    }
}

pub(super) type StatusSender = Arc<Shared>;

/// Lets a backend tell a lease that its lock is gone (for example because the
/// connection that held it died). Cheap to clone; firing twice keeps the first
/// reason.
#[derive(Clone)]
pub struct LostNotifier(pub(super) StatusSender);

impl LostNotifier {
    /// Marks the lease lost with `reason`, waking every [`LostSignal`]. The
    /// lock may be someone else's at once: the lease's
    /// [`valid_until`](crate::Lease::valid_until) becomes now.
    pub fn notify(&self, reason: LostReason) {
        mark_lost_with_grace(&self.0, reason, Duration::ZERO);
    }

    /// Marks the lease lost with `reason`, where the backend knows the lock
    /// cannot be granted to anyone else for `grace` yet (Postgres: the holder
    /// detects a dead connection before the server does). The lease's
    /// [`valid_until`](crate::Lease::valid_until) becomes now + `grace` (or stays
    /// earlier), so a holder such as `distlock run` can finish stopping its
    /// work within it.
    pub fn notify_with_grace(&self, reason: LostReason, grace: Duration) {
        mark_lost_with_grace(&self.0, reason, grace);
    }

    /// Fires `lost`, the signals of the leases a server session held when
    /// it ended ([`LostReason::ConnectionLost`]), each with `grace`: how
    /// long the server may still hold their locks. One warning first, if
    /// any: `backend`, the `session` where its id means something to an
    /// operator, how many leases, `why`, and `message` (what became of the
    /// locks). Written once for every backend that holds locks on server
    /// sessions. Call it outside any lock: a lost signal may run callbacks.
    #[cfg(any(
        feature = "postgres",
        feature = "etcd",
        feature = "mysql",
        feature = "zookeeper"
    ))]
    pub(crate) fn session_ended(
        lost: Vec<LostNotifier>,
        backend: &'static str,
        session: Option<fmt::Arguments<'_>>,
        why: &str,
        grace: Duration,
        message: &str,
    ) {
        if !lost.is_empty() {
            tracing::warn!(
                component = "distlock",
                backend,
                session,
                leases = lost.len(),
                why,
                grace_ms = grace.as_millis() as u64,
                "{message}"
            );
        }
        for notifier in lost {
            notifier.notify_with_grace(LostReason::ConnectionLost, grace);
        }
    }
}

impl fmt::Debug for LostNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostNotifier").finish_non_exhaustive()
    }
}

/// Ends the lease with `reason` without touching its validity (a release, or
/// a max hold: the lock is still held until released or expired).
pub(super) fn mark_lost(shared: &StatusSender, reason: LostReason) {
    mark_ended(shared, reason, None);
}

/// Ends the lease with `reason`: a loss, after which the lock stays ours for
/// at most `grace` more.
pub(super) fn mark_lost_with_grace(shared: &StatusSender, reason: LostReason, grace: Duration) {
    mark_ended(shared, reason, Some(grace));
}

fn mark_ended(shared: &StatusSender, reason: LostReason, grace: Option<Duration>) {
    let now = Instant::now();
    let ended = shared.update(|s| {
        if s.lost.is_some() {
            return false;
        }
        s.lost = Some(reason);
        if let Some(grace) = grace {
            let limit = crate::deadline::checked_deadline(now, grace);
            s.valid_until = match (s.valid_until, limit) {
                (Some(until), Some(limit)) => Some(until.min(limit)),
                (until, None) => until,
                (None, limit) => limit,
            };
        }
        true
    });
    if ended {
        let callbacks = std::mem::take(&mut shared.state().on_end);
        for callback in callbacks {
            callback(reason);
        }
    }
}

/// Resolves when a lease is lost, released, or outlives its known validity.
///
/// Obtained from [`Lease::lost_signal`](crate::Lease::lost_signal); clone it into the tasks doing the
/// guarded work so they can stop when the lock is gone. It needs no task of
/// its own: for expiring backends it sleeps until the lease's known validity
/// runs out and re-arms whenever a refresh extends it.
///
/// ```
/// # async fn demo(lease: distlock::Lease) {
/// let mut lost = lease.lost_signal();
/// tokio::select! {
///     reason = lost.wait() => eprintln!("stopping: {reason}"),
///     _ = do_work() => {}
/// }
/// # }
/// # async fn do_work() {}
/// ```
#[derive(Clone)]
pub struct LostSignal {
    shared: StatusSender,
    /// Fire this long before the known validity ends (see [`LostSignal::early_by`]).
    margin: Duration,
}

impl LostSignal {
    /// The same signal, firing with [`LostReason::Expired`] `margin` before
    /// the lease's known validity ends instead of at its end, so that work
    /// stopped when it fires has stopped before the lock can be anyone
    /// else's. [`crate::drift_margin`] is the margin distlock itself keeps
    /// ([`Lease::run_while_held`](crate::Lease::run_while_held), [`crate::with_lock`]).
    pub fn early_by(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// Until when the lease is known to be held, as [`Lease::valid_until`](crate::Lease::valid_until)
    /// says (without this signal's margin): for code that holds only the
    /// signal, such as a cron job's context, and plans its own stop before the
    /// lock can lapse. `None` where locks do not expire, while held.
    pub fn valid_until(&self) -> Option<Instant> {
        self.shared.status().valid_until
    }

    /// Waits until the lease is lost and says why. Returns at once if it
    /// already is.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future loses nothing; wait again.
    pub async fn wait(&mut self) -> LostReason {
        loop {
            // Registered before the status is read: a change made after the
            // read wakes it.
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.shared.check(self.margin) {
                Err(reason) => return reason,
                Ok(Some(deadline)) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                Ok(None) => changed.await,
            }
        }
    }

    /// The reason the lease is lost, or `None` while it is still believed
    /// held. Once it has said the lease is lost it never says held again, nor
    /// do its clones: a refresh that arrives after the known validity ended
    /// does not revive the lease (see [`Lease::refresh`](crate::Lease::refresh)),
    /// and one that arrives after an [`early_by`](LostSignal::early_by)
    /// signal fired extends the lease but not that signal, nor any other
    /// early by as much or more (they would have fired too).
    pub fn reason(&self) -> Option<LostReason> {
        self.shared.check(self.margin).err()
    }

    /// True once the lease is lost, released or expired.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }
}

/// When a signal early by `margin` fires by expiry: `margin` before the known
/// validity ends (saturating at "already").
fn expires_at(status: &LeaseStatus, margin: Duration) -> Option<Instant> {
    status.valid_until.map(|until| {
        until
            .checked_sub(margin)
            .unwrap_or(status.renewed_at.min(until))
    })
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("reason", &self.reason())
            .field("margin", &self.margin)
            .finish()
    }
}

/// Records a successful refresh sent at `from` for `ttl`: the lease is held
/// until `from + ttl` less the backend's validity discount (if it expires at
/// all). A lease whose known validity had
/// already ended is not revived (its signal may have fired: work was told to
/// stop): it is marked expired and `Err(reason)` returned.
pub(super) fn extend_validity(
    shared: &StatusSender,
    from: Instant,
    ttl: Duration,
) -> Result<(), LostReason> {
    let validity = shared.validity_for(ttl);
    let mut refused = None;
    shared.update(|s| {
        // Read under the lock, as a signal's answer reads it (`check`).
        let now = Instant::now();
        if let Some(reason) = s.lost {
            refused = Some(reason);
            return false;
        }
        if s.expired_early_by == 0 || s.valid_until.is_some_and(|until| now >= until) {
            refused = Some(LostReason::Expired);
            return false;
        }
        s.ttl = ttl;
        s.renewed_at = from;
        if s.valid_until.is_some() {
            // A validity too far away for an Instant is "until released".
            s.valid_until = crate::deadline::checked_deadline(from, validity);
        }
        true
    });
    match refused {
        None => Ok(()),
        Some(LostReason::Expired) => {
            mark_lost(shared, LostReason::Expired);
            Err(LostReason::Expired)
        }
        Some(reason) => Err(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margin_keys_keep_the_order_and_only_zero_is_zero() {
        assert_eq!(margin_key(Duration::ZERO), 0);
        assert_eq!(margin_key(Duration::from_nanos(1)), 1);
        assert_eq!(margin_key(Duration::from_millis(400)), 400);
        assert_eq!(margin_key(Duration::from_micros(400_001)), 401);
        assert_eq!(margin_key(Duration::MAX), NOT_EXPIRED - 1);
    }
}
