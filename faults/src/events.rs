//! The event log: what every worker did and when, on one clock.
//!
//! Every process of a run stamps its events with `CLOCK_MONOTONIC`
//! (clock_gettime(2)), which all processes on one machine share, so the
//! orchestrator can sort the holds of several processes on one time line and
//! find overlaps exactly. Workers print one JSON object per line on stdout
//! (a line is one `write(2)`, so a SIGKILL loses no event already printed);
//! the orchestrator reads each worker's pipe on a thread of its own.

use std::io::{BufRead, BufReader, Write};
use std::process::ChildStdout;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock every process of a run shares.
pub fn now_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail (clock_gettime(2)).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Milliseconds between two [`now_ns`] stamps (0 if `to` is earlier).
pub fn ms_between(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

/// One thing a worker did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// When, in [`now_ns`].
    pub at: u64,
    /// The worker's index in its run.
    pub worker: u32,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What a worker did. A grant is named by (worker, `grant`), `grant` counting
/// the worker's grants from 1.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// The worker connected its locker and the register and starts its loop.
    Ready,
    /// `lock()` granted the lock; the attempt started at `attempt`.
    Acquired {
        grant: u64,
        token: Option<u64>,
        attempt: u64,
        /// The semaphore permit granted (`name#permit`), in the semaphore
        /// workload; `None` in the others, whose grants are of one lock.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permit: Option<u32>,
    },
    /// `lock()` failed; the attempt started at `attempt`.
    Refused {
        attempt: u64,
        /// `Error::is_contention`: the backend said the lock is held.
        contention: bool,
        /// `Error::is_outage`: the backend could not be reached or failed.
        outage: bool,
        kind: String,
        message: String,
    },
    /// The worker was asked (SIGUSR1) to keep this grant until it loses it.
    Lingering { grant: u64 },
    /// A write to the fenced register and the register's answer.
    Wrote {
        grant: u64,
        token: Option<u64>,
        accepted: bool,
    },
    /// The unfenced counter's read-sleep-write: read `read`, wrote `read + 1`.
    Incremented { grant: u64, read: u64 },
    /// The lease's lost signal fired (for any reason but the worker's own
    /// release).
    Lost { grant: u64, reason: String },
    /// The worker stopped the work of this grant: its hold ends here. `lost`
    /// is the lost signal's reason when it stopped the work early.
    HoldEnded { grant: u64, lost: Option<String> },
    /// `release()` returned.
    Released { grant: u64, error: Option<String> },
    /// The worker could not start or went wrong; it exits.
    Failed { message: String },
}

/// Prints events as JSON lines on stdout (the worker's side).
#[derive(Debug, Clone, Copy)]
pub struct Emitter {
    worker: u32,
}

impl Emitter {
    /// An emitter for worker `worker`.
    pub fn new(worker: u32) -> Self {
        Emitter { worker }
    }

    /// The worker (contender) it stamps events for.
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// Stamps `kind` now and prints it as one line.
    pub fn emit(&self, kind: EventKind) {
        let event = Event {
            at: now_ns(),
            worker: self.worker,
            kind,
        };
        if let Ok(mut line) = serde_json::to_vec(&event) {
            line.push(b'\n');
            // One write per line: a worker killed right after it keeps the
            // line. If the orchestrator is gone there is nobody to tell.
            let _ = std::io::stdout().lock().write_all(&line);
        }
    }
}

/// Every event of a run's workers, collected as they arrive (the
/// orchestrator's side); waiters are woken on each new event.
#[derive(Debug, Clone, Default)]
pub struct EventLog {
    inner: Arc<(Mutex<Vec<Event>>, Condvar)>,
}

impl EventLog {
    /// Reads `stdout` of a worker on a thread until it closes.
    pub fn collect(&self, stdout: ChildStdout) {
        let log = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Event>(&line) {
                    Ok(event) => log.push(event),
                    Err(err) => eprintln!("distlock-faults: a worker printed {line:?}: {err}"),
                }
            }
        });
    }

    fn push(&self, event: Event) {
        let (events, changed) = &*self.inner;
        events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
        changed.notify_all();
    }

    /// A copy of every event so far.
    pub fn snapshot(&self) -> Vec<Event> {
        self.inner
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits up to `timeout` for an event for which `found` returns `Some`,
    /// looking at every event (old ones too); returns its answer.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        mut found: impl FnMut(&Event) -> Option<T>,
    ) -> Option<T> {
        let deadline = std::time::Instant::now().checked_add(timeout)?;
        let (events, changed) = &*self.inner;
        let mut guard = events.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = 0;
        loop {
            if let Some(answer) = guard[seen..].iter().find_map(&mut found) {
                return Some(answer);
            }
            seen = guard.len();
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            guard = changed
                .wait_timeout(guard, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
