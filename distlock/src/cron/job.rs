//! A job's definition ([`Job`], its policies) and its validated, compiled
//! form the scheduler runs.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

use crate::{validate, Error, Result};

/// Default [`Job::at_most`]: ten minutes.
pub const DEFAULT_AT_MOST: Duration = Duration::from_secs(600);
/// Default [`Job::max_skew`]: five seconds.
pub const DEFAULT_MAX_SKEW: Duration = Duration::from_secs(5);
/// Longest job name accepted, in bytes: its keys stay far below
/// [`validate::MAX_KEY_LEN`].
pub const MAX_JOB_NAME_LEN: usize = 200;

/// What to do with a tick while an earlier run of the same job is still
/// running (on any replica).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overlap {
    /// Skip the tick (Kubernetes CronJob `concurrencyPolicy: Forbid`): runs
    /// of the job never overlap. The scheduler holds the job's key
    /// (`cron:NAME`) for as long as a run lasts, and its fencing token, which
    /// grows with every run, is the one the job gets.
    #[default]
    Forbid,
    /// Run the tick anyway (`concurrencyPolicy: Allow`): each tick still runs
    /// once, but runs of consecutive ticks may overlap. The job gets the
    /// fencing token of the tick's own claim, which is not comparable across
    /// ticks on backends that count per key (file, Redis, Postgres): fence
    /// with [`JobContext::scheduled_at`](super::JobContext::scheduled_at)
    /// instead, which grows with every tick.
    Allow,
}

/// What to do with ticks nobody ran: every replica was down, or a run longer
/// than the period made the next ticks skip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Missed {
    /// Forget them (the default): the job next runs at its next tick.
    #[default]
    Skip,
    /// Run once to catch up: when a replica starts, and when a run on it
    /// ends, the latest tick scheduled within `look_back` before now runs if
    /// no replica has run it or a later tick (the job's mark says so). Only
    /// one catch-up run, however many ticks were missed. Needs a backend
    /// that stores marks ([`crate::Capabilities::marks`]); elsewhere it is
    /// turned off with a warning, since without a record of the last run a
    /// catch-up could repeat a finished tick.
    CatchUp {
        /// How far back a missed tick may lie (at most one year).
        look_back: Duration,
    },
}

/// One scheduled job: a name, a cron schedule in a time zone, and its lock
/// and policy settings. Checked when added to a
/// [`Scheduler`](super::Scheduler) (or by [`Job::validate`]).
///
/// ```
/// use std::time::Duration;
/// use distlock::cron::{Job, Overlap};
///
/// let job = Job::new("nightly-report", "30 2 * * *")
///     .time_zone("Europe/Berlin")
///     .at_most(Duration::from_secs(3600))
///     .at_least(Duration::from_secs(30))
///     .overlap(Overlap::Forbid);
/// job.validate()?;
/// # Ok::<(), distlock::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Job {
    pub(super) name: String,
    pub(super) schedule: String,
    pub(super) time_zone: Option<String>,
    pub(super) at_most: Duration,
    pub(super) at_least: Duration,
    pub(super) overlap: Overlap,
    pub(super) missed: Missed,
    pub(super) max_skew: Duration,
    pub(super) handler_watches_loss: bool,
    pub(super) label: Option<String>,
}

impl Job {
    /// A job `name` on `schedule`: five fields (minute hour day-of-month
    /// month day-of-week), or six with seconds first, or a nickname
    /// (`@hourly`, `@daily`, ...), in croner's syntax
    /// (<https://github.com/hexagon/croner-rust#pattern>). UTC unless
    /// [`time_zone`](Self::time_zone) says otherwise.
    pub fn new(name: impl Into<String>, schedule: impl Into<String>) -> Self {
        Job {
            name: name.into(),
            schedule: schedule.into(),
            time_zone: None,
            at_most: DEFAULT_AT_MOST,
            at_least: Duration::ZERO,
            overlap: Overlap::default(),
            missed: Missed::default(),
            max_skew: DEFAULT_MAX_SKEW,
            handler_watches_loss: false,
            label: None,
        }
    }

    /// The IANA time zone the schedule's fields are read in
    /// (`"Europe/Berlin"`, `"America/New_York"`, `"UTC"`). See the
    /// [module docs](super#daylight-saving-time) for DST.
    pub fn time_zone(mut self, zone: impl Into<String>) -> Self {
        self.time_zone = Some(zone.into());
        self
    }

    // Each option that only stores its value, written once.
    crate::config::setters! {
        /// ShedLock's `lockAtMostFor` (default [`DEFAULT_AT_MOST`]): the ttl of
        /// the job's claims and the longest a run may last. The claims are kept
        /// alive while the job runs; a run still going after this long is told
        /// its lock is lost ([`crate::LostReason::MaxHoldExceeded`]) and stopped.
        /// A replica that dies mid-run holds its claim at most this long where
        /// locks expire (Redis); file and Postgres locks end with the process or
        /// session.
        at_most(Duration) => at_most;
        /// ShedLock's `lockAtLeastFor` (default zero): the tick's claim is held
        /// until this long after the tick's scheduled instant, even if the job
        /// finished sooner. At most [`at_most`](Self::at_most).
        at_least(Duration) => at_least;
        /// What to do while an earlier run still runs (default
        /// [`Overlap::Forbid`]).
        overlap(Overlap) => overlap;
        /// What to do with missed ticks (default [`Missed::Skip`]).
        missed(Missed) => missed;
        /// The clock skew between replicas that must not produce a duplicate run
        /// on a backend without marks (default [`DEFAULT_MAX_SKEW`]): there the
        /// tick's claim is held until `max(at_least, max_skew)` after the tick
        /// (capped at `at_most`), so a replica whose clock lags by less finds it
        /// still held. Backends with marks need no bound (see the
        /// [module docs](super#clock-skew)).
        max_skew(Duration) => max_skew;
        /// The handler watches [`JobContext::lost`](super::JobContext::lost) and
        /// [`JobContext::stop_requested`](super::JobContext::stop_requested)
        /// itself and stops its work before the lock can lapse (as `distlock
        /// cron` does, stopping a command's process group with SIGTERM, then
        /// SIGKILL). The scheduler then waits for it to return instead of
        /// dropping its future when the lock is lost. Off by default: a lost
        /// lock drops the handler's future, as [`crate::with_lock`] does.
        handler_watches_loss(bool) => handler_watches_loss;
    }

    /// The holder label its claims record (see [`crate::inspect`]): what
    /// `distlock status` shows as the holder of the job's locks, such as
    /// `cron job report: ./report.sh` (`distlock cron` sets that). Without
    /// it, claims record the label in force where the scheduler was started
    /// (the process label or command line): the scheduler claims ticks on
    /// tasks of its own, which do not see a [`crate::inspect::with_label`]
    /// scope around it.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Checks every field, as [`Scheduler::add`](super::Scheduler::add) does.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] whose `what` names the field (`"job name"`,
    /// `"cron schedule"`, `"time zone"`, `"at_most"`, `"at_least"`,
    /// `"max_skew"`, `"look_back"`) and whose reason names the job.
    pub fn validate(&self) -> Result<()> {
        self.compile().map(drop)
    }

    pub(super) fn compile(&self) -> Result<Compiled> {
        let name = &self.name;
        check_name(name)?;
        let cron = parse_schedule(&self.schedule).map_err(|e| {
            let field = match failing_field(&self.schedule) {
                Some((field, text, range)) => {
                    format!(" in the {field} field {text:?}; the {field} field takes {range}")
                }
                None => String::new(),
            };
            Error::invalid(
                "cron schedule",
                format!("job {name:?}: schedule {:?}: {e}{field}", self.schedule),
            )
        })?;
        let zone = match &self.time_zone {
            None => chrono_tz::UTC,
            Some(zone) => chrono_tz::Tz::from_str(zone).map_err(|_| {
                Error::invalid(
                    "time zone",
                    format!("job {name:?}: {zone:?} is not an IANA time zone name (such as \"Europe/Berlin\" or \"UTC\")"),
                )
            })?,
        };
        check_duration(name, "at_most", self.at_most)?;
        if !self.at_least.is_zero() {
            check_duration(name, "at_least", self.at_least)?;
        }
        if self.at_least > self.at_most {
            return Err(Error::invalid(
                "at_least",
                format!(
                    "job {name:?}: at_least ({:?}) is longer than at_most ({:?})",
                    self.at_least, self.at_most
                ),
            ));
        }
        if !self.max_skew.is_zero() {
            check_duration(name, "max_skew", self.max_skew)?;
        }
        if let Missed::CatchUp { look_back } = self.missed {
            check_duration(name, "look_back", look_back)?;
        }
        let compiled = Compiled {
            job: self.clone(),
            cron,
            zone,
        };
        if let Err(e) = compiled.next_after(Utc::now()) {
            return Err(Error::invalid(
                "cron schedule",
                format!(
                    "job {name:?}: schedule {:?} never fires ({e})",
                    self.schedule
                ),
            ));
        }
        Ok(compiled)
    }
}

/// `schedule` read by croner as every job's is: seconds optional, no year.
fn parse_schedule(schedule: &str) -> std::result::Result<Cron, CronError> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(schedule)
}

/// The fields of a five-field schedule, and what each takes; a six-field
/// one has seconds first.
const FIELDS: [(&str, &str); 5] = [
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31"),
    ("month", "1-12 or JAN-DEC"),
    ("day-of-week", "0-7 or SUN-SAT (0 and 7 are Sunday)"),
];

/// The first field croner refuses in a schedule it cannot read, with its
/// text and what it takes: croner's errors do not say which field they
/// are about, so each field is parsed again alone, every other one `*`.
/// `None` when no single field is refused (a wrong number of fields, or a
/// combination croner refuses).
fn failing_field(schedule: &str) -> Option<(&'static str, &str, &'static str)> {
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    let names: Vec<(&str, &str)> = match fields.len() {
        5 => FIELDS.to_vec(),
        6 => std::iter::once(("second", "0-59")).chain(FIELDS).collect(),
        _ => return None,
    };
    (0..fields.len()).find_map(|i| {
        let alone: Vec<&str> = (0..fields.len())
            .map(|j| if j == i { fields[i] } else { "*" })
            .collect();
        let (name, range) = names[i];
        parse_schedule(&alone.join(" "))
            .is_err()
            .then_some((name, fields[i], range))
    })
}

fn check_name(name: &str) -> Result<()> {
    let bad = |reason: String| Err(Error::invalid("job name", reason));
    if name.is_empty() {
        return bad("the job name is empty".into());
    }
    if name.len() > MAX_JOB_NAME_LEN {
        return bad(format!(
            "job name {:?}... is {} bytes long; the maximum is {MAX_JOB_NAME_LEN}",
            name.chars().take(20).collect::<String>(),
            name.len()
        ));
    }
    // '@' separates the name from the instant in a tick's key; whitespace and
    // control characters make log lines ambiguous.
    if let Some(c) = name
        .chars()
        .find(|c| *c == '@' || c.is_whitespace() || c.is_control())
    {
        return bad(format!(
            "job {name:?}: the name contains {c:?}; use letters, digits and punctuation other than '@'"
        ));
    }
    validate::key(&job_key(name))
}

fn check_duration(job: &str, what: &'static str, value: Duration) -> Result<()> {
    validate::ttl(value).map_err(|_| {
        Error::invalid(
            what,
            format!("job {job:?}: {what} is {value:?}; it must be between 1ms and one year"),
        )
    })
}

/// The key held while a run of job `name` lasts (overlap [`Overlap::Forbid`]),
/// and the name of the job's mark.
pub(super) fn job_key(name: &str) -> String {
    format!("cron:{name}")
}

/// The key claimed for the tick of job `name` scheduled at `at`:
/// `cron:NAME@2026-12-01T10:00:00Z`.
pub(super) fn tick_key(name: &str, at: DateTime<Utc>) -> String {
    format!(
        "cron:{name}@{}",
        at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
    )
}

/// A job as the scheduler runs it: parsed and checked. Its settings are
/// the checked [`Job`]'s, read through `Deref` (`compiled.at_most`), so
/// they are declared once.
#[derive(Debug, Clone)]
pub(super) struct Compiled {
    job: Job,
    cron: Cron,
    zone: chrono_tz::Tz,
}

impl std::ops::Deref for Compiled {
    type Target = Job;

    fn deref(&self) -> &Job {
        &self.job
    }
}

impl Compiled {
    /// The first tick strictly after `after`.
    ///
    /// # Errors
    ///
    /// croner's, for a search it cannot finish: one that has to move past
    /// its limit (year 5000: a clock that reads nonsense), or that exceeds
    /// its iteration bound. A checked schedule always fires again before
    /// the limit, so the error depends on `after`: the caller retries from
    /// a later instant.
    pub(super) fn next_after(&self, after: DateTime<Utc>) -> Result<DateTime<Utc>, CronError> {
        // The instant carries its UTC offset into the zone, so croner knows
        // which pass of a repeated (fall-back) hour it is on.
        let local = after.with_timezone(&self.zone);
        self.cron
            .find_next_occurrence(&local, false)
            .map(|next| next.with_timezone(&Utc))
    }

    /// The latest tick at or before `at`.
    pub(super) fn latest_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = at.with_timezone(&self.zone);
        self.cron
            .find_previous_occurrence(&local, true)
            .ok()
            .map(|previous| previous.with_timezone(&Utc))
    }

    /// How long after the tick its claim is held on a backend without marks.
    pub(super) fn fallback_hold(&self) -> Duration {
        self.at_least.max(self.max_skew).min(self.at_most)
    }
}

/// `later − earlier` as a [`Duration`], zero if `later` is not later.
pub(super) fn since(later: DateTime<Utc>, earlier: DateTime<Utc>) -> Duration {
    later
        .signed_duration_since(earlier)
        .to_std()
        .unwrap_or(Duration::ZERO)
}

/// `at + by`, saturating.
pub(super) fn plus(at: DateTime<Utc>, by: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(by)
        .ok()
        .and_then(|by| at.checked_add_signed(by))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    #[test]
    fn five_and_six_fields_and_nicknames_parse() {
        let now = utc(2026, 1, 1, 10, 0, 30);
        for (schedule, next) in [
            ("* * * * *", utc(2026, 1, 1, 10, 1, 0)),
            ("* * * * * *", utc(2026, 1, 1, 10, 0, 31)),
            ("@daily", utc(2026, 1, 2, 0, 0, 0)),
        ] {
            let compiled = Job::new("a", schedule).compile().unwrap();
            assert_eq!(compiled.next_after(now).ok(), Some(next), "{schedule}");
        }
        let every_second = Job::new("b", "* * * * * *").compile().unwrap();
        assert_eq!(every_second.latest_at_or_before(now), Some(now));
    }

    #[test]
    fn bad_fields_are_one_clear_error_naming_the_job_and_the_field() {
        let cases: Vec<(Job, &str, &str)> = vec![
            (
                Job::new("r", "61 * * * *"),
                "cron schedule",
                "job \"r\": schedule \"61 * * * *\": Component error: Number out of bounds. \
                 in the minute field \"61\"; the minute field takes 0-59",
            ),
            (
                Job::new("r", "0 0 * 13 *"),
                "cron schedule",
                "in the month field \"13\"; the month field takes 1-12 or JAN-DEC",
            ),
            (
                Job::new("r", "0 0 0 * * 8"),
                "cron schedule",
                "in the day-of-week field \"8\"; the day-of-week field takes 0-7",
            ),
            (
                Job::new("r", "60 0 0 * * *"),
                "cron schedule",
                "in the second field \"60\"; the second field takes 0-59",
            ),
            (Job::new("r", "* * * *"), "cron schedule", "job \"r\""),
            (Job::new("r", "* * * * * * *"), "cron schedule", "job \"r\""),
            (Job::new("r", "0 0 31 2 *"), "cron schedule", "never fires"),
            (
                Job::new("r", "* * * * *").time_zone("Mars/Olympus"),
                "time zone",
                "\"Mars/Olympus\" is not an IANA",
            ),
            (Job::new("", "* * * * *"), "job name", "empty"),
            (Job::new("a@b", "* * * * *"), "job name", "'@'"),
            (
                Job::new("r", "* * * * *").at_most(Duration::ZERO),
                "at_most",
                "job \"r\"",
            ),
            (
                Job::new("r", "* * * * *")
                    .at_most(Duration::from_secs(1))
                    .at_least(Duration::from_secs(2)),
                "at_least",
                "longer than at_most",
            ),
            (
                Job::new("r", "* * * * *").missed(Missed::CatchUp {
                    look_back: Duration::MAX,
                }),
                "look_back",
                "one year",
            ),
        ];
        for (job, field, needle) in cases {
            match job.validate() {
                Err(Error::InvalidInput { what, reason }) => {
                    assert_eq!(what, field, "{job:?}: {reason}");
                    assert!(reason.contains(needle), "{job:?}: {reason}");
                }
                other => panic!("{job:?}: expected InvalidInput, got {other:?}"),
            }
        }
    }

    #[test]
    fn tick_keys_name_the_job_and_the_utc_instant() {
        assert_eq!(
            tick_key("report", utc(2026, 12, 1, 10, 0, 0)),
            "cron:report@2026-12-01T10:00:00Z"
        );
        assert_eq!(job_key("report"), "cron:report");
    }

    /// Europe/Berlin springs forward on 2026-03-29 (02:00 CET → 03:00 CEST)
    /// and falls back on 2026-10-25 (03:00 CEST → 02:00 CET).
    #[test]
    fn dst_gaps_run_fixed_jobs_after_the_gap_and_overlaps_run_them_once() {
        let fixed = Job::new("fixed", "30 2 * * *")
            .time_zone("Europe/Berlin")
            .compile()
            .unwrap();
        // 02:30 does not exist on the 29th: the job runs at 03:00 CEST (01:00 UTC).
        assert_eq!(
            fixed.next_after(utc(2026, 3, 28, 12, 0, 0)).ok(),
            Some(utc(2026, 3, 29, 1, 0, 0))
        );
        // 02:30 happens twice on 25 October: once, at the first (CEST, 00:30 UTC).
        let first = fixed.next_after(utc(2026, 10, 24, 12, 0, 0)).unwrap();
        assert_eq!(first, utc(2026, 10, 25, 0, 30, 0));
        assert_eq!(
            fixed.next_after(first).ok(),
            Some(utc(2026, 10, 26, 1, 30, 0)),
            "not again in the repeated hour"
        );
        // An interval job skips the gap and runs in both passes of the overlap.
        let hourly = Job::new("interval", "*/30 * * * *")
            .time_zone("Europe/Berlin")
            .compile()
            .unwrap();
        // Its ticks after `from` up to the first at or past `until`.
        let ticks = |from: DateTime<Utc>, until: DateTime<Utc>| {
            let (mut at, mut ticks) = (from, Vec::new());
            while at < until {
                at = hourly.next_after(at).unwrap();
                ticks.push(at);
            }
            ticks
        };
        assert_eq!(
            // From 01:50 CEST.
            ticks(utc(2026, 10, 24, 23, 50, 0), utc(2026, 10, 25, 2, 0, 0)),
            [
                utc(2026, 10, 25, 0, 0, 0),  // 02:00 CEST
                utc(2026, 10, 25, 0, 30, 0), // 02:30 CEST
                utc(2026, 10, 25, 1, 0, 0),  // 02:00 CET
                utc(2026, 10, 25, 1, 30, 0), // 02:30 CET
                utc(2026, 10, 25, 2, 0, 0),  // 03:00 CET
            ]
        );
        assert_eq!(
            // From 01:10 CET.
            ticks(utc(2026, 3, 29, 0, 10, 0), utc(2026, 3, 29, 2, 0, 0)),
            [
                utc(2026, 3, 29, 0, 30, 0), // 01:30 CET
                utc(2026, 3, 29, 1, 0, 0),  // 03:00 CEST: 02:00 and 02:30 do not exist
                utc(2026, 3, 29, 1, 30, 0), // 03:30 CEST
                utc(2026, 3, 29, 2, 0, 0),
            ]
        );
    }
}
