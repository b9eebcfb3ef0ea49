//! From one run's events to its figures, and from figures to a verdict.
//!
//! Holds are intervals on the shared monotonic clock: from a worker's
//! `Acquired` to its `HoldEnded` (or to its death, for a SIGKILLed holder).
//! Sorted by start, two holds of the same lock overlap when the later starts
//! before the earlier ends. An overlap is *explained* when the earlier hold
//! is one the fault hit and the later was granted after the fault (its ttl
//! expired while it was paused, or its session died); any other overlap is a
//! bug. The fault hits the victim, and a fault of the servers themselves (a
//! restart, a failover, a lost majority, a killed leader) every hold in
//! progress at the fault.
//!
//! In the semaphore workload every permit is a lock: overlaps, fencing
//! (stale writes, rejections) and token order are judged per permit, the
//! orphan time is the victim's permit's, and across the permits **at most N
//! holds may be in progress at once**. A grant that makes more than N is
//! *over the limit*; it is explained when it came after the fault and the
//! holds the fault hit are what make the count exceed N (without them it is
//! N or fewer), and any other is a bug.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::events::{ms_between, Event, EventKind};
use crate::register::RegisterWrite;
use crate::scenario::{Cell, Expect, Fault};

/// What the orchestrator did and saw during one run, besides the events.
#[derive(Debug, Clone)]
pub struct Observed {
    pub events: Vec<Event>,
    pub writes: Vec<RegisterWrite>,
    /// The unfenced counter at the end.
    pub counter: u64,
    /// The holder the fault hit: (worker, grant).
    pub victim: (u32, u64),
    /// When the fault was injected.
    pub fault_at: u64,
    /// When the servers were down (a restart), as (from, to).
    pub down: Vec<(u64, u64)>,
    /// When the run stopped its workers.
    pub ended_at: u64,
    /// The most holders the workload allows at once (the semaphore's N);
    /// `None` for a lock, whose overlaps say it all.
    pub limit: Option<u32>,
    /// The final check: the orchestrator took and released the lock within
    /// the orphan bound (`Err` says why not).
    pub final_check: Result<(), String>,
}

/// One grant's hold.
#[derive(Debug, Clone, Copy)]
struct Hold {
    worker: u32,
    grant: u64,
    token: Option<u64>,
    /// The semaphore permit held: the lock the hold is of.
    permit: Option<u32>,
    start: u64,
    end: u64,
}

impl Hold {
    /// "worker 1 grant 3 (permit 0, token Some(7))".
    fn describe(&self) -> String {
        match self.permit {
            Some(permit) => format!(
                "worker {} grant {} (permit {permit}, token {:?})",
                self.worker, self.grant, self.token
            ),
            None => format!(
                "worker {} grant {} (token {:?})",
                self.worker, self.grant, self.token
            ),
        }
    }
}

/// The figures of one run (or, summed, of several).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    pub grants: u64,
    /// Pairs of overlapping holds of the same lock (permit).
    pub overlaps: u64,
    pub overlaps_explained: u64,
    /// One line per overlap nobody can explain.
    pub unexplained: Vec<String>,
    /// The most holds in progress at one moment, of any permit.
    pub max_holders: u64,
    /// Grants that made more holds than the limit (the semaphore's N) at
    /// once.
    pub over_limit: u64,
    pub over_limit_explained: u64,
    /// One line per grant over the limit that nobody can explain.
    pub over_limit_unexplained: Vec<String>,
    /// Writes the register accepted from a holder after it had accepted one
    /// from a newer grant (or the same token from another grant).
    pub stale_writes_accepted: u64,
    /// Writes the register rejected for a lower token.
    pub fencing_rejections: u64,
    /// Grants whose token was not above every earlier grant's.
    pub token_regressions: u64,
    /// Contention answers to attempts made entirely while the servers were
    /// known down.
    pub outages_as_contention: u64,
    /// Runs whose lock the final check could not take within the bound.
    pub never_released: u64,
    /// Why the final check failed, per such run.
    pub never_released_why: Vec<String>,
    /// Fault to the next grant (ms), the longest over the runs.
    pub orphan_ms: Option<f64>,
    /// Fault to the victim's lost signal (ms), the longest over the runs;
    /// `None` if the victim's hold ended before it fired.
    pub lost_signal_lag_ms: Option<f64>,
    /// Increments of the unfenced counter that a concurrent holder overwrote.
    pub lost_increments: u64,
    /// Attempts that failed as outages (not contention).
    pub outage_errors: u64,
}

impl Figures {
    /// Adds `other`'s counts to these; keeps the longest times.
    pub fn absorb(&mut self, other: &Figures) {
        self.grants += other.grants;
        self.overlaps += other.overlaps;
        self.overlaps_explained += other.overlaps_explained;
        self.unexplained.extend(other.unexplained.iter().cloned());
        self.max_holders = self.max_holders.max(other.max_holders);
        self.over_limit += other.over_limit;
        self.over_limit_explained += other.over_limit_explained;
        self.over_limit_unexplained
            .extend(other.over_limit_unexplained.iter().cloned());
        self.stale_writes_accepted += other.stale_writes_accepted;
        self.fencing_rejections += other.fencing_rejections;
        self.token_regressions += other.token_regressions;
        self.outages_as_contention += other.outages_as_contention;
        self.never_released += other.never_released;
        self.never_released_why
            .extend(other.never_released_why.iter().cloned());
        self.orphan_ms = max_option(self.orphan_ms, other.orphan_ms);
        self.lost_signal_lag_ms = max_option(self.lost_signal_lag_ms, other.lost_signal_lag_ms);
        self.lost_increments += other.lost_increments;
        self.outage_errors += other.outage_errors;
    }
}

fn max_option(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Computes the figures of one run.
pub fn figures(observed: &Observed, fault: Fault) -> Figures {
    let holds = holds(observed, fault);
    let mut figures = Figures {
        grants: holds.len() as u64,
        ..Figures::default()
    };
    overlaps(&holds, observed, fault, &mut figures);
    holders_at_once(&holds, observed, fault, &mut figures);
    register_writes(&holds, &observed.writes, &mut figures);
    figures.token_regressions = token_regressions(&holds);
    figures.outages_as_contention = outages_as_contention(observed);
    figures.outage_errors = observed
        .events
        .iter()
        .filter(|event| matches!(event.kind, EventKind::Refused { outage: true, .. }))
        .count() as u64;
    figures.never_released = u64::from(observed.final_check.is_err());
    figures.never_released_why = observed.final_check.clone().err().into_iter().collect();
    let orphaned_from = orphaned_from(observed, fault);
    // The victim's lock: its permit (the others' grants go on meanwhile).
    let victim_permit = holds
        .iter()
        .find(|hold| (hold.worker, hold.grant) == observed.victim)
        .map(|hold| hold.permit);
    figures.orphan_ms = holds
        .iter()
        .filter(|hold| {
            hold.start > observed.fault_at
                && (hold.worker, hold.grant) != observed.victim
                && victim_permit.is_none_or(|permit| hold.permit == permit)
        })
        .map(|hold| hold.start)
        .min()
        .map(|next| ms_between(orphaned_from, next));
    // The first sign the victim had: its lost signal firing, or its work
    // stopped by the (earlier-firing, margined) signal it watches.
    figures.lost_signal_lag_ms = observed
        .events
        .iter()
        .filter(|event| match &event.kind {
            EventKind::Lost { grant, .. }
            | EventKind::HoldEnded {
                grant,
                lost: Some(_),
            } => (event.worker, *grant) == observed.victim,
            _ => false,
        })
        .map(|event| event.at)
        .min()
        .map(|at| ms_between(observed.fault_at, at));
    let increments = observed
        .events
        .iter()
        .filter(|event| matches!(event.kind, EventKind::Incremented { .. }))
        .count() as u64;
    figures.lost_increments = increments.saturating_sub(observed.counter);
    figures
}

/// When the lock stopped being useful to anyone: at the fault, except where
/// a running holder kept it through the fault and released it normally (a
/// Redis connection reset: the lock lives on the server, the holder
/// reconnects and goes on); then from that release.
fn orphaned_from(observed: &Observed, fault: Fault) -> u64 {
    if matches!(fault, Fault::Kill | Fault::Pause) {
        return observed.fault_at;
    }
    observed
        .events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::Released { grant, error: None }
                if (event.worker, *grant) == observed.victim =>
            {
                Some(event.at.max(observed.fault_at))
            }
            _ => None,
        })
        .unwrap_or(observed.fault_at)
}

/// Every grant's hold, sorted by start.
fn holds(observed: &Observed, fault: Fault) -> Vec<Hold> {
    let mut holds: Vec<Hold> = observed
        .events
        .iter()
        .filter_map(|event| match event.kind {
            EventKind::Acquired {
                grant,
                token,
                permit,
                ..
            } => Some(Hold {
                worker: event.worker,
                grant,
                token,
                permit,
                start: event.at,
                end: observed.ended_at,
            }),
            _ => None,
        })
        .collect();
    for hold in &mut holds {
        let ended = observed.events.iter().find_map(|event| match event.kind {
            EventKind::HoldEnded { grant, .. }
                if event.worker == hold.worker && grant == hold.grant =>
            {
                Some(event.at)
            }
            _ => None,
        });
        let killed = fault == Fault::Kill && (hold.worker, hold.grant) == observed.victim;
        hold.end = match (ended, killed) {
            (Some(end), _) => end,
            (None, true) => observed.fault_at,
            (None, false) => observed.ended_at,
        };
    }
    holds.sort_by_key(|hold| hold.start);
    holds
}

/// Whether the fault hit `hold`: it is the victim's, or the fault hit the
/// servers (every holder at once) while it was in progress.
fn hit_by_fault(hold: &Hold, observed: &Observed, fault: Fault) -> bool {
    (hold.worker, hold.grant) == observed.victim
        || (fault.hits_every_holder()
            && hold.start <= observed.fault_at
            && hold.end > observed.fault_at)
}

fn overlaps(holds: &[Hold], observed: &Observed, fault: Fault, figures: &mut Figures) {
    for (index, earlier) in holds.iter().enumerate() {
        for later in holds[index + 1..]
            .iter()
            .take_while(|later| later.start < earlier.end)
            .filter(|later| later.permit == earlier.permit)
        {
            figures.overlaps += 1;
            // Without a fault, the deployment itself grants twice (PgBouncer
            // handing two clients one session): that is what the cell shows.
            let explained = fault == Fault::None
                || (hit_by_fault(earlier, observed, fault) && later.start >= observed.fault_at);
            if explained {
                figures.overlaps_explained += 1;
            } else {
                figures.unexplained.push(format!(
                    "{} overlaps {} by {:.1} ms",
                    earlier.describe(),
                    later.describe(),
                    ms_between(later.start, earlier.end.min(later.end)),
                ));
            }
        }
    }
}

/// The most holds in progress at once, and the grants that made more than
/// the limit (see the module docs).
fn holders_at_once(holds: &[Hold], observed: &Observed, fault: Fault, figures: &mut Figures) {
    for (index, hold) in holds.iter().enumerate() {
        // Sorted by start: the holds in progress when this one started are
        // earlier ones that had not ended, and itself.
        let during: Vec<&Hold> = holds[..index]
            .iter()
            .filter(|earlier| earlier.end > hold.start)
            .chain(std::iter::once(hold))
            .collect();
        let holders = during.len() as u64;
        figures.max_holders = figures.max_holders.max(holders);
        let Some(limit) = observed.limit.map(u64::from) else {
            continue;
        };
        if holders <= limit {
            continue;
        }
        figures.over_limit += 1;
        let hit = during
            .iter()
            .filter(|held| hit_by_fault(held, observed, fault))
            .count() as u64;
        let explained = fault == Fault::None
            || (hold.start >= observed.fault_at && holders.saturating_sub(hit) <= limit);
        if explained {
            figures.over_limit_explained += 1;
        } else {
            let others: Vec<String> = during[..during.len() - 1]
                .iter()
                .map(|held| held.describe())
                .collect();
            figures.over_limit_unexplained.push(format!(
                "{} made {holders} holders at once (limit {limit}) beside {}",
                hold.describe(),
                others.join(", ")
            ));
        }
    }
}

/// Stale writes and fencing rejections, in the order the register saw them:
/// a write is stale when the register already accepted one for the same
/// permit from a newer grant (later acquisition) of it.
fn register_writes(holds: &[Hold], writes: &[RegisterWrite], figures: &mut Figures) {
    let rank = |worker: u32, grant: u64| {
        holds
            .iter()
            .position(|hold| hold.worker == worker && hold.grant == grant)
    };
    let mut newest_written: BTreeMap<Option<u32>, usize> = BTreeMap::new();
    for write in writes {
        if !write.accepted {
            figures.fencing_rejections += 1;
            continue;
        }
        let Some(rank) = rank(write.worker, write.grant) else {
            continue;
        };
        let newest = newest_written.entry(write.permit).or_insert(rank);
        if rank < *newest {
            figures.stale_writes_accepted += 1;
        }
        *newest = rank.max(*newest);
    }
}

/// Grants whose token was not above every earlier grant's of the same
/// permit (tokens increase per permit, not across a semaphore).
fn token_regressions(holds: &[Hold]) -> u64 {
    let mut highest: BTreeMap<Option<u32>, u64> = BTreeMap::new();
    let mut regressions = 0;
    for hold in holds {
        let Some(token) = hold.token else { continue };
        if highest
            .get(&hold.permit)
            .is_some_and(|&highest| token <= highest)
        {
            regressions += 1;
        }
        let highest = highest.entry(hold.permit).or_insert(token);
        *highest = token.max(*highest);
    }
    regressions
}

fn outages_as_contention(observed: &Observed) -> u64 {
    observed
        .events
        .iter()
        .filter(|event| match event.kind {
            EventKind::Refused {
                attempt,
                contention: true,
                ..
            } => observed
                .down
                .iter()
                .any(|&(from, to)| from <= attempt && event.at <= to),
            _ => false,
        })
        .count() as u64
}

/// The invariants a cell's figures must meet; each failure is one line.
pub fn verdict(cell: &Cell, fencing: bool, figures: &Figures) -> Vec<String> {
    let mut failures = Vec::new();
    let mut check = |ok: bool, failure: String| {
        if !ok {
            failures.push(failure);
        }
    };
    if fencing && cell.expect != Expect::BreaksFencing {
        check(
            figures.stale_writes_accepted == 0,
            format!(
                "{} stale writes accepted despite fencing",
                figures.stale_writes_accepted
            ),
        );
        check(
            figures.token_regressions == 0,
            format!("{} token regressions", figures.token_regressions),
        );
    }
    check(
        figures.outages_as_contention == 0,
        format!(
            "{} outages reported as contention",
            figures.outages_as_contention
        ),
    );
    check(
        figures.never_released == 0,
        format!(
            "{} locks never released ({})",
            figures.never_released,
            figures.never_released_why.join("; ")
        ),
    );
    check(
        figures.unexplained.is_empty(),
        format!("unexplained overlaps: {}", figures.unexplained.join("; ")),
    );
    check(
        figures.over_limit_unexplained.is_empty(),
        format!(
            "more holders than the limit: {}",
            figures.over_limit_unexplained.join("; ")
        ),
    );
    let bound_ms = cell.orphan_bound.as_secs_f64() * 1e3;
    match figures.orphan_ms {
        _ if cell.fault == Fault::None => {}
        Some(orphan) => check(
            orphan <= bound_ms,
            format!("orphaned {orphan:.0} ms, above the bound of {bound_ms:.0} ms"),
        ),
        None => check(false, "no grant after the fault".to_owned()),
    }
    match cell.expect {
        Expect::Exclusive => {
            check(
                figures.overlaps == 0,
                format!("{} overlapping holds", figures.overlaps),
            );
            check(
                figures.over_limit == 0,
                format!(
                    "{} grants over the limit (most holders at once: {})",
                    figures.over_limit, figures.max_holders
                ),
            );
        }
        // Overlaps are allowed when explained; unexplained ones and stale
        // writes are checked above.
        Expect::Races => {}
        Expect::BreaksFencing => {
            check(
                figures.token_regressions > 0,
                "expected a reused fencing token (a known break) but saw none".to_owned(),
            );
        }
        Expect::Breaks => {
            check(
                figures.overlaps > 0,
                "expected overlapping holds (a known break) but saw none".to_owned(),
            );
            if fencing {
                check(
                    figures.fencing_rejections > 0,
                    "expected the register to reject the stale holder's writes, it rejected none"
                        .to_owned(),
                );
            }
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(at: u64, worker: u32, kind: EventKind) -> Event {
        Event { at, worker, kind }
    }

    fn acquired(at: u64, worker: u32, grant: u64, token: u64) -> Event {
        permit_acquired(at, worker, grant, token, None)
    }

    fn permit_acquired(at: u64, worker: u32, grant: u64, token: u64, permit: Option<u32>) -> Event {
        event(
            at,
            worker,
            EventKind::Acquired {
                grant,
                token: Some(token),
                attempt: at,
                permit,
            },
        )
    }

    fn ended(at: u64, worker: u32, grant: u64) -> Event {
        event(at, worker, EventKind::HoldEnded { grant, lost: None })
    }

    fn write(at: u64, worker: u32, grant: u64, token: u64, accepted: bool) -> RegisterWrite {
        permit_write(at, worker, grant, token, None, accepted)
    }

    fn permit_write(
        at: u64,
        worker: u32,
        grant: u64,
        token: u64,
        permit: Option<u32>,
        accepted: bool,
    ) -> RegisterWrite {
        RegisterWrite {
            at,
            worker,
            grant,
            token: Some(token),
            permit,
            accepted,
        }
    }

    fn observed(events: Vec<Event>, writes: Vec<RegisterWrite>) -> Observed {
        Observed {
            events,
            writes,
            counter: 0,
            victim: (0, 1),
            fault_at: 100,
            down: Vec::new(),
            ended_at: 10_000,
            limit: None,
            final_check: Ok(()),
        }
    }

    /// `observed` of a semaphore of two permits.
    fn two_permits(events: Vec<Event>, writes: Vec<RegisterWrite>) -> Observed {
        Observed {
            limit: Some(2),
            ..observed(events, writes)
        }
    }

    fn cell(fault: Fault, expect: Expect) -> Cell {
        Cell {
            fault,
            workload: crate::scenario::Workload::Semaphore,
            expect,
            orphan_bound: std::time::Duration::from_secs(5),
        }
    }

    #[test]
    fn a_paused_victims_overlap_is_explained_and_its_late_write_rejected() {
        let events = vec![
            acquired(50, 0, 1, 1),
            acquired(1_200, 1, 1, 2),
            ended(1_400, 1, 1),
            ended(2_100, 0, 1),
        ];
        let writes = vec![
            write(60, 0, 1, 1, true),
            write(1_300, 1, 1, 2, true),
            write(2_050, 0, 1, 1, false),
        ];
        let figures = figures(&observed(events, writes), Fault::Pause);
        assert_eq!(figures.grants, 2);
        assert_eq!((figures.overlaps, figures.overlaps_explained), (1, 1));
        assert!(figures.unexplained.is_empty(), "{:?}", figures.unexplained);
        assert_eq!(figures.fencing_rejections, 1);
        assert_eq!(figures.stale_writes_accepted, 0);
        assert_eq!(figures.orphan_ms, Some(ms_between(100, 1_200)));
    }

    #[test]
    fn an_overlap_the_fault_did_not_cause_is_unexplained() {
        // Worker 1 is granted before the fault, while worker 0 holds.
        let events = vec![
            acquired(50, 0, 1, 1),
            acquired(80, 1, 1, 2),
            ended(90, 1, 1),
            ended(300, 0, 1),
        ];
        let figures = figures(&observed(events, Vec::new()), Fault::Kill);
        assert_eq!(figures.overlaps, 1);
        assert_eq!(figures.overlaps_explained, 0);
        assert_eq!(figures.unexplained.len(), 1);
    }

    #[test]
    fn a_duplicate_token_is_a_regression_and_its_writes_are_stale() {
        // A failover lost the fence counter: the second grant got token 1 again.
        let events = vec![
            acquired(50, 0, 1, 1),
            acquired(500, 1, 1, 1),
            ended(600, 1, 1),
            ended(700, 0, 1),
        ];
        let writes = vec![write(550, 1, 1, 1, true), write(650, 0, 1, 1, true)];
        let figures = figures(&observed(events, writes), Fault::Pause);
        assert_eq!(figures.token_regressions, 1);
        assert_eq!(figures.stale_writes_accepted, 1);
    }

    #[test]
    fn contention_while_the_server_is_down_is_counted() {
        let mut observed = observed(
            vec![
                event(
                    400,
                    2,
                    EventKind::Refused {
                        attempt: 300,
                        contention: true,
                        outage: false,
                        kind: "timeout".into(),
                        message: String::new(),
                    },
                ),
                event(
                    450,
                    1,
                    EventKind::Refused {
                        attempt: 420,
                        contention: false,
                        outage: true,
                        kind: "backend_error".into(),
                        message: String::new(),
                    },
                ),
            ],
            Vec::new(),
        );
        observed.down = vec![(200, 500)];
        let figures = figures(&observed, Fault::Restart);
        assert_eq!(figures.outages_as_contention, 1);
        assert_eq!(figures.outage_errors, 1);
    }

    #[test]
    fn two_permits_held_at_once_are_within_the_limit_and_fenced_apart() {
        // Permit 1's tokens are its own: its token 3 after permit 0's 5 is
        // no regression, and its write no stale one.
        let events = vec![
            permit_acquired(50, 0, 1, 5, Some(0)),
            permit_acquired(60, 1, 1, 3, Some(1)),
            ended(90, 0, 1),
            ended(95, 1, 1),
            permit_acquired(200, 2, 1, 6, Some(0)),
            ended(300, 2, 1),
        ];
        let writes = vec![
            permit_write(70, 0, 1, 5, Some(0), true),
            permit_write(80, 1, 1, 3, Some(1), true),
            permit_write(250, 2, 1, 6, Some(0), true),
        ];
        let figures = figures(&two_permits(events, writes), Fault::Kill);
        assert_eq!(figures.max_holders, 2);
        assert_eq!((figures.over_limit, figures.overlaps), (0, 0));
        assert_eq!(figures.token_regressions, 0);
        assert_eq!(figures.stale_writes_accepted, 0);
        assert_eq!(
            figures.orphan_ms,
            Some(ms_between(100, 200)),
            "the next grant of the victim's permit 0"
        );
        assert!(verdict(&cell(Fault::Kill, Expect::Exclusive), true, &figures).is_empty());
    }

    #[test]
    fn a_third_holder_at_once_is_over_a_limit_of_two() {
        // Three permits' keys held at once (a holder with a larger limit):
        // no permit overlaps itself, but three hold at once, before the
        // fault.
        let events = vec![
            permit_acquired(50, 0, 1, 1, Some(0)),
            permit_acquired(60, 1, 1, 1, Some(1)),
            permit_acquired(70, 2, 1, 1, Some(2)),
            ended(80, 2, 1),
            ended(90, 1, 1),
            permit_acquired(200, 1, 2, 2, Some(0)),
            ended(300, 1, 2),
        ];
        let figures = figures(&two_permits(events, Vec::new()), Fault::Kill);
        assert_eq!(figures.overlaps, 0);
        assert_eq!(figures.max_holders, 3);
        assert_eq!((figures.over_limit, figures.over_limit_explained), (1, 0));
        assert_eq!(figures.over_limit_unexplained.len(), 1);
        assert!(
            figures.over_limit_unexplained[0].contains("worker 2 grant 1 (permit 2"),
            "{:?}",
            figures.over_limit_unexplained
        );
        let failures = verdict(&cell(Fault::Kill, Expect::Exclusive), true, &figures);
        assert!(
            failures
                .iter()
                .any(|failure| failure.starts_with("more holders than the limit")),
            "{failures:?}"
        );
        assert!(failures
            .iter()
            .any(|failure| failure.starts_with("1 grants over the limit")));
    }

    #[test]
    fn a_paused_permit_holders_successor_is_one_over_the_limit_and_explained() {
        // Worker 0 holds permit 0 and is paused at 100; its permit lapses
        // and worker 2 takes it at 1200 while worker 1 holds permit 1:
        // three holders, the paused one's the fault's doing.
        let events = vec![
            permit_acquired(50, 0, 1, 1, Some(0)),
            permit_acquired(60, 1, 1, 1, Some(1)),
            ended(140, 1, 1),
            permit_acquired(150, 1, 2, 2, Some(1)),
            permit_acquired(1_200, 2, 1, 2, Some(0)),
            ended(1_400, 2, 1),
            ended(2_100, 0, 1),
            ended(3_000, 1, 2),
        ];
        let writes = vec![
            permit_write(60, 0, 1, 1, Some(0), true),
            permit_write(1_300, 2, 1, 2, Some(0), true),
            // Permit 1's older grant, after permit 0's newer one: not stale.
            permit_write(1_350, 1, 2, 2, Some(1), true),
            permit_write(2_050, 0, 1, 1, Some(0), false),
        ];
        let figures = figures(&two_permits(events, writes), Fault::Pause);
        assert_eq!((figures.overlaps, figures.overlaps_explained), (1, 1));
        assert_eq!(figures.max_holders, 3);
        assert_eq!((figures.over_limit, figures.over_limit_explained), (1, 1));
        assert_eq!(figures.stale_writes_accepted, 0);
        assert_eq!(figures.fencing_rejections, 1);
        assert_eq!(
            figures.orphan_ms,
            Some(ms_between(100, 1_200)),
            "permit 1's grant at 150 is no return of permit 0"
        );
        assert!(verdict(&cell(Fault::Pause, Expect::Breaks), true, &figures).is_empty());
        assert!(!verdict(&cell(Fault::Pause, Expect::Exclusive), true, &figures).is_empty());
    }

    #[test]
    fn a_server_fault_explains_every_holders_overlap_a_holder_fault_only_the_victims() {
        // Both permits' holders lose their locks at 100 and both permits
        // are granted again while they still work.
        let events = vec![
            permit_acquired(50, 0, 1, 1, Some(0)),
            permit_acquired(60, 1, 1, 1, Some(1)),
            permit_acquired(200, 2, 1, 2, Some(0)),
            permit_acquired(210, 3, 1, 2, Some(1)),
            ended(250, 0, 1),
            ended(260, 1, 1),
            ended(400, 2, 1),
            ended(410, 3, 1),
        ];
        let restart = figures(&two_permits(events.clone(), Vec::new()), Fault::Restart);
        assert_eq!((restart.overlaps, restart.overlaps_explained), (2, 2));
        assert_eq!(restart.max_holders, 4);
        assert_eq!((restart.over_limit, restart.over_limit_explained), (2, 2));
        let end_session = figures(&two_permits(events, Vec::new()), Fault::EndSession);
        assert_eq!(
            (end_session.overlaps, end_session.overlaps_explained),
            (2, 1),
            "worker 1 was not the victim"
        );
        assert_eq!(
            (end_session.over_limit, end_session.over_limit_explained),
            (2, 1)
        );
    }
}
