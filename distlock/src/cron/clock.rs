//! Where the scheduler reads the wall-clock time from: injectable, so tests
//! can skew one replica or run on tokio's paused clock.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

/// The wall clock a [`Scheduler`](super::Scheduler) computes ticks with.
///
/// Ticks are wall-clock instants (a cron schedule names times of day), so
/// replicas whose clocks disagree disagree about when a tick is due. The
/// scheduler never lets that produce a duplicate run where the backend stores
/// marks (see the [module docs](super#clock-skew)); a clock here only decides
/// *when* this replica tries a tick.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time, UTC.
    fn now(&self) -> DateTime<Utc>;
}

/// The operating system's clock ([`Utc::now`]): what production uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A wall clock that advances with tokio's clock, from a chosen start.
///
/// tokio's paused test clock (`#[tokio::test(start_paused = true)]`) does not
/// move [`std::time::SystemTime`]; this clock does move with it, so a test
/// can run days of ticks in milliseconds, or start just before a DST
/// transition.
///
/// ```
/// use distlock::cron::{chrono::{TimeZone, Utc}, Clock, TokioClock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let start = Utc.with_ymd_and_hms(2026, 3, 29, 0, 59, 0).unwrap();
/// let clock = TokioClock::starting_at(start);
/// assert!(clock.now() >= start);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin_wall: DateTime<Utc>,
    origin: Instant,
}

impl TokioClock {
    /// A clock that reads `start` now and advances with [`Instant::now`].
    /// Call it inside a tokio runtime whose clock the test controls.
    pub fn starting_at(start: DateTime<Utc>) -> Self {
        TokioClock {
            origin_wall: start,
            origin: Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = TimeDelta::from_std(self.origin.elapsed()).unwrap_or(TimeDelta::MAX);
        self.origin_wall
            .checked_add_signed(elapsed)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

/// Another clock, off by a fixed amount: a replica whose clock runs ahead
/// (positive skew) or behind (negative).
///
/// ```
/// use std::time::Duration;
/// use distlock::cron::{Clock, SkewedClock, SystemClock};
///
/// let behind = SkewedClock::behind(SystemClock, Duration::from_secs(3));
/// assert!(behind.now() < SystemClock.now());
/// ```
#[derive(Debug, Clone)]
pub struct SkewedClock<C> {
    inner: C,
    skew: TimeDelta,
}

impl<C: Clock> SkewedClock<C> {
    /// `inner`, running `by` ahead.
    pub fn ahead(inner: C, by: Duration) -> Self {
        SkewedClock {
            inner,
            skew: TimeDelta::from_std(by).unwrap_or(TimeDelta::MAX),
        }
    }

    /// `inner`, running `by` behind.
    pub fn behind(inner: C, by: Duration) -> Self {
        SkewedClock {
            inner,
            skew: -TimeDelta::from_std(by).unwrap_or(TimeDelta::MAX),
        }
    }
}

impl<C: Clock> Clock for SkewedClock<C> {
    fn now(&self) -> DateTime<Utc> {
        let now = self.inner.now();
        now.checked_add_signed(self.skew).unwrap_or(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_moves_with_paused_time_and_skew_is_constant() {
        let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let clock = TokioClock::starting_at(start);
        let behind = SkewedClock::behind(clock.clone(), Duration::from_secs(3));
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(clock.now(), start + TimeDelta::seconds(90));
        assert_eq!(behind.now(), start + TimeDelta::seconds(87));
        let huge = SkewedClock::ahead(clock, Duration::MAX);
        assert!(huge.now() >= start, "saturates instead of panicking");
    }
}
