//! Running CMD under a lease: the lock is freed only after CMD's whole
//! process group has exited, and CMD is stopped before the lease can lapse.
//!
//! # Order of events
//!
//! 1. Signal handlers (the forwarded signals and SIGCHLD) are installed and
//!    distlock becomes a child subreaper, before anything is spawned, so no
//!    signal or orphan is missed. (`distlock cron` forwards nothing: SIGINT
//!    and SIGTERM are its own graceful shutdown, which stops the commands
//!    through the `stop` future [`supervise`] takes instead.)
//! 2. The watchdog starts ([`crate::watchdog`]), then CMD is spawned as the
//!    leader of its own process group ([`crate::process_group`]); CMD cannot
//!    exec before the watchdog watches its group.
//! 3. Just before the spawn the lease is checked again: connecting, the
//!    holder record, the keepalive and the watchdog took time since the
//!    grant. If it was lost, or its proactive stop (below) would already be
//!    due, CMD is not started and distlock exits 76.
//! 4. The process's one reaper ([`crate::reaper`], a SIGCHLD-driven
//!    `waitpid(-1)` loop) hands this command's statuses to its supervisor by
//!    pid, so several commands can run at once (`distlock cron`); an
//!    interactive command (`distlock run`) gets SIGINT, SIGTERM, SIGHUP,
//!    SIGQUIT, SIGUSR1 and SIGUSR2 forwarded to its whole group.
//! 5. When the leader exits and members of its group remain, they get
//!    SIGTERM, then SIGKILL after `--kill-after`; distlock returns once the
//!    group is empty, with the leader's status. A member that survives
//!    SIGKILL (in uninterruptible sleep: frozen, blocked in the kernel) is
//!    waited for with no time limit, and named on stderr after 2 s and every
//!    30 s: the lock is released only after the work under it has stopped.
//!    (A lock that expires, as on Redis, cannot be held meanwhile once its
//!    refreshes fail or it is lost: it lapses at its ttl.)
//!
//! # Stop deadlines
//!
//! With `drift = distlock::drift_margin(ttl)`:
//!
//! - **Proactive** (the lease has a known validity, `valid_until`: expiring
//!   backends such as Redis): SIGTERM at `valid_until − (kill_after + drift)`,
//!   SIGKILL at `valid_until − drift`. A refresh moves `valid_until` later; the
//!   deadlines are recomputed from it every time a timer fires, so a refresh
//!   that succeeds in time cancels the stop.
//! - **Loss** (the lost signal fires): SIGTERM now, SIGKILL at
//!   `min(now + kill_after, valid_until − drift)`.
//! - **Max hold** ([`distlock::LostReason::MaxHoldExceeded`]: renewal stopped,
//!   the lock is still held): the same as a loss; the lock is released after
//!   the group exited.
//!
//! A stop once started is not taken back. Losses, proactive stops and max
//! hold make distlock exit 76 whatever CMD's status, because CMD's work was
//! cut short (also when the leader had already exited and only its leftovers
//! were being stopped).
//!
//! # Cancellation
//!
//! [`supervise`] is not meant to be cancelled: dropping its future leaves CMD
//! running without anyone reaping it (the watchdog then SIGKILLs the group,
//! since the lifeline is dropped without its "done" byte).

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use distlock::{Lease, LostReason};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

use crate::exit;
use crate::process_group::{self, LeaseEnv};
use crate::reaper;

/// How often the group is re-checked while distlock waits for it to empty: a
/// member whose parent is alive but outside distlock's reach sends no SIGCHLD
/// to distlock when it exits.
const GROUP_POLL: Duration = Duration::from_millis(50);

/// How long after the first SIGKILL members still alive are named on stderr
/// (a SIGKILLed group is normally gone within milliseconds), and how often
/// after that.
const SURVIVOR_QUIET: Duration = Duration::from_secs(2);
const SURVIVOR_REPORT_EVERY: Duration = Duration::from_secs(30);

/// The longest `--kill-after` for a lease of `ttl`: ttl/2 − drift_margin(ttl).
///
/// The keepalive refreshes every ttl/3, so after a refresh the lease is valid
/// for about a ttl more; the proactive SIGTERM fires `kill_after + drift`
/// before the validity ends. Keeping that lead under ttl/2 means it never
/// fires while refreshes succeed, and leaves at least ttl/6 for a failing
/// refresh to be retried before CMD is told to stop.
pub(crate) fn kill_after_cap(ttl: Duration) -> Duration {
    (ttl / 2).saturating_sub(distlock::drift_margin(ttl))
}

/// What to run under a lease, shared by `distlock run` and `distlock cron`.
pub(crate) struct Command<'a> {
    /// CMD and its arguments (no shell).
    pub(crate) argv: &'a [OsString],
    /// Variables CMD gets beside `DISTLOCK_KEY`, `DISTLOCK_OWNER` and
    /// `DISTLOCK_FENCING_TOKEN`.
    pub(crate) env: Vec<(&'static str, String)>,
    /// SIGTERM to SIGKILL, already capped ([`kill_after_cap`]).
    pub(crate) kill_after: Duration,
    /// `distlock run`: forward distlock's signals to CMD's group and hand it
    /// the terminal. `distlock cron`: neither.
    pub(crate) interactive: bool,
}

/// Runs CMD under `lease` until its whole process group has exited and
/// returns distlock's exit code: the leader's status (128+N if killed by
/// signal N), 76 if the lease was lost, ran low or reached its max hold, 126
/// or 127 if CMD could not be run, 70 if distlock could not set up. When
/// `stop` resolves (`distlock cron`'s shutdown grace is over) CMD's group is
/// stopped as on a lost lease, and the leader's status is returned.
pub(crate) async fn supervise(
    command: &Command<'_>,
    lease: &Lease,
    stop: impl Future<Output = ()>,
) -> u8 {
    // SIGCHLD first: a child that exits early must still wake the reaper.
    if let Err(error) = reaper::start() {
        eprintln!("distlock: cannot install the SIGCHLD handler: {error}");
        return exit::SOFTWARE;
    }
    let mut signals = match command.interactive.then(Forwarded::install).transpose() {
        Ok(signals) => signals,
        Err(error) => {
            eprintln!("distlock: cannot install signal handlers: {error}");
            return exit::SOFTWARE;
        }
    };
    if let Err(error) = process_group::become_subreaper() {
        tracing::warn!(%error, "cannot become a child subreaper; orphans of the command are reaped by init");
    }
    // A file lock stays held by the watchdog until CMD's group is gone, even
    // if distlock dies first.
    let lock_file = match lease.duplicate_lock_fd() {
        Some(Ok(fd)) => Some(fd),
        Some(Err(error)) => {
            tracing::warn!(%error, "cannot hand the lock file to the watchdog; a SIGKILLed distlock would free the lock as the watchdog starts killing the command");
            None
        }
        None => None,
    };
    let started = reaper::spawn_registered(|| {
        crate::watchdog::start(lock_file)
            .map(|(lifeline, handoff)| (lifeline.watchdog_pid, (lifeline, handoff)))
    });
    let (watchdog, (lifeline, handoff)) = match started {
        Ok(started) => started,
        Err(error) => {
            eprintln!("distlock: cannot start the watchdog process: {error}");
            return exit::SOFTWARE;
        }
    };
    let terminal = command
        .interactive
        .then(crate::terminal::foreground_stdin)
        .flatten();
    // Connecting, the holder record, the keepalive and the watchdog all took
    // time since the grant: the lease may be gone or about to lapse.
    if let Some(why) = refuse_to_start(lease, command.kill_after, Instant::now()) {
        eprintln!(
            "distlock: lock {:?} {why}; not starting the command",
            lease.key()
        );
        drop(handoff);
        lifeline.done();
        give_terminal_back(terminal);
        return exit::LOST;
    }
    let env = LeaseEnv {
        key: lease.key(),
        owner: lease.owner(),
        fencing_token: lease.fencing_token(),
        extra: &command.env,
    };
    let spawned = reaper::spawn_registered(|| {
        process_group::spawn(command.argv, &env, &handoff, terminal).map(|pid| (pid, ()))
    });
    drop(handoff);
    let leader = match spawned {
        Ok((leader, ())) => leader,
        Err(error) => {
            // std returns the error only once CMD's child failed for good:
            // nothing runs that the watchdog would have to kill.
            lifeline.done();
            give_terminal_back(terminal);
            return cannot_run(command.argv, &error);
        }
    };
    let mut supervisor = Supervisor {
        key: lease.key(),
        lease,
        leader_pid: leader.pid(),
        leader,
        watchdog,
        terminal,
        kill_after: command.kill_after,
        drift: distlock::drift_margin(lease.ttl()),
        leader_status: None,
        stop: None,
        killed: false,
        survivor_report_at: None,
        cut_short: false,
    };
    let code = supervisor.run(signals.as_mut(), stop).await;
    // The group is empty: nothing is left for the watchdog to kill.
    lifeline.done();
    give_terminal_back(terminal);
    code
}

/// Why CMD must not be started under `lease` at `now`, if it must not: the
/// lease is lost (released, taken over, its connection died, its max hold
/// reached), or its known validity ends within `kill_after + drift`, where
/// the proactive stop (see the [module docs](self)) would already be due: a
/// CMD started then would be told to stop at once, and could run past the
/// lease's end before the SIGKILL. Checked after everything that takes time
/// between the grant and the spawn; what remains after the check (the
/// watchdog's hand-over, microseconds) is covered by the supervisor, which
/// checks the lease again as soon as CMD runs.
fn refuse_to_start(lease: &Lease, kill_after: Duration, now: Instant) -> Option<String> {
    if let Some(reason) = lease.lost_signal().reason() {
        return Some(format!(
            "was lost before the command could start ({reason})"
        ));
    }
    let until = lease.valid_until()?;
    let drift = distlock::drift_margin(lease.ttl());
    let lead = kill_after.saturating_add(drift);
    if now < minus(until, lead) {
        return None;
    }
    let left = until.saturating_duration_since(now);
    Some(format!(
        "is valid for only {} more, less than --kill-after {} + drift margin {}",
        humantime::format_duration(round_ms(left)),
        humantime::format_duration(kill_after),
        humantime::format_duration(round_ms(drift)),
    ))
}

fn give_terminal_back(terminal: Option<libc::c_int>) {
    if let Some(tty) = terminal {
        if let Err(error) = crate::terminal::take_back(tty) {
            tracing::warn!(%error, "cannot take the terminal back from the command");
        }
    }
}

fn cannot_run(argv: &[OsString], error: &io::Error) -> u8 {
    let program = argv
        .first()
        .map(|p| p.to_string_lossy())
        .unwrap_or_default();
    match error.raw_os_error() {
        Some(libc::ECHILD) => {
            eprintln!("distlock: cannot run {program:?}: the watchdog process exited before the command started");
            exit::SOFTWARE
        }
        _ => {
            eprintln!("distlock: cannot run {program:?}: {error}");
            match error.kind() {
                io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            }
        }
    }
}

/// A stop in progress: SIGTERM was sent at `since`.
struct Stop {
    since: Instant,
}

struct Supervisor<'a> {
    key: &'a str,
    lease: &'a Lease,
    /// CMD's first process: its pid is the group id.
    leader_pid: u32,
    /// The leader's statuses, from the reaper.
    leader: reaper::Child,
    watchdog: reaper::Child,
    /// The terminal CMD's group was given, to follow its job-control stops.
    terminal: Option<libc::c_int>,
    kill_after: Duration,
    drift: Duration,
    leader_status: Option<ExitStatus>,
    stop: Option<Stop>,
    killed: bool,
    /// When members surviving SIGKILL are next named (set at the first
    /// SIGKILL).
    survivor_report_at: Option<Instant>,
    /// The lease was lost, ran low or reached its max hold: exit 76.
    cut_short: bool,
}

impl Supervisor<'_> {
    async fn run(
        &mut self,
        mut signals: Option<&mut Forwarded>,
        stop: impl Future<Output = ()>,
    ) -> u8 {
        let mut lost = Some(self.lease.lost_signal());
        let stop = std::pin::pin!(stop);
        let mut stop = Some(stop);
        loop {
            // Before looking: a child reaped after the look still wakes us.
            let reaped = reaper::any_reaped();
            self.reap();
            if let Some(status) = self.leader_status {
                if !process_group::group_alive(self.leader_pid) {
                    return if self.cut_short {
                        exit::LOST
                    } else {
                        status_code(status)
                    };
                }
                if self.stop.is_none() {
                    eprintln!(
                        "distlock: the command exited and left processes in its group; stopping them before releasing the lock"
                    );
                    self.begin_stop();
                }
            }
            self.check_deadlines();
            let wake = self.next_wake();
            tokio::select! {
                () = reaped => {}
                forwarded = recv_forwarded(&mut signals) => {
                    process_group::signal_group(self.leader_pid, forwarded);
                }
                reason = wait_lost(&mut lost) => {
                    lost = None;
                    self.on_lost(reason);
                }
                () = wait_stop(&mut stop) => {
                    stop = None;
                    eprintln!("distlock: shutting down; stopping the command of lock {:?}", self.key);
                    if self.stop.is_none() {
                        self.begin_stop();
                    }
                }
                () = sleep_until(wake) => {}
            }
        }
    }

    fn reap(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let mut leader_stopped = false;
        while let Some(status) = self.leader.try_status() {
            if status.stopped_signal().is_some() {
                leader_stopped = true;
            } else {
                self.leader_status = Some(status);
            }
        }
        while let Some(status) = self.watchdog.try_status() {
            if status.stopped_signal().is_none() && self.leader_status.is_none() {
                tracing::warn!(
                    ?status,
                    "the watchdog exited early; if distlock is killed now, processes the command forked may outlive it"
                );
            }
        }
        if let (true, None, Some(tty)) = (leader_stopped, self.leader_status, self.terminal) {
            self.follow_stop(tty);
        }
    }

    /// CMD's leader stopped (Ctrl-Z went to its group, the terminal's
    /// foreground): distlock stops too, so the shell sees its job stopped and
    /// gets the terminal back. On `fg` distlock hands the terminal to CMD's
    /// group again; on `fg` or `bg` it continues the group. The lease's
    /// keepalive does not run while distlock is stopped: an expiring lock can
    /// lapse, and CMD is then stopped at once on resume (exit 76). In an
    /// orphaned process group (no job-control shell) the kernel discards the
    /// SIGTSTP and CMD is continued at once.
    fn follow_stop(&self, tty: libc::c_int) {
        crate::terminal::reclaim(tty);
        // SAFETY: raise has no memory-safety preconditions; SIGTSTP has its
        // default action (stop) in distlock.
        unsafe {
            libc::raise(libc::SIGTSTP);
        }
        if crate::terminal::is_foreground(tty) {
            crate::terminal::give_to(tty, self.leader_pid);
        }
        process_group::signal_group(self.leader_pid, libc::SIGCONT);
    }

    fn on_lost(&mut self, reason: LostReason) {
        self.cut_short = true;
        match reason {
            LostReason::MaxHoldExceeded => eprintln!(
                "distlock: lock {:?} reached its maximum hold time; stopping the command, then releasing the lock",
                self.key
            ),
            reason => eprintln!(
                "distlock: lock {:?} lost ({reason}); stopping the command",
                self.key
            ),
        }
        if self.stop.is_none() {
            self.begin_stop();
        }
    }

    /// SIGTERM to the group; SIGKILL follows at [`Self::kill_at`].
    fn begin_stop(&mut self) {
        self.stop = Some(Stop {
            since: Instant::now(),
        });
        process_group::signal_group(self.leader_pid, libc::SIGTERM);
    }

    /// Until when the stop may wait before SIGKILL: `since + kill_after`, and
    /// never past `valid_until − drift` while the lease has a known validity.
    fn kill_at(&self) -> Option<Instant> {
        let by_validity = self
            .lease
            .valid_until()
            .map(|until| minus(until, self.drift));
        let by_grace = self
            .stop
            .as_ref()
            .and_then(|stop| stop.since.checked_add(self.kill_after));
        match (by_validity, by_grace) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The proactive SIGTERM: `valid_until − (kill_after + drift)`, while no
    /// stop is under way.
    fn term_at(&self) -> Option<Instant> {
        if self.stop.is_some() {
            return None;
        }
        let lead = self.kill_after.saturating_add(self.drift);
        self.lease.valid_until().map(|until| minus(until, lead))
    }

    /// Acts on deadlines that have passed, re-reading `valid_until` (a refresh
    /// may have moved it since the timer was armed).
    fn check_deadlines(&mut self) {
        let now = Instant::now();
        if self.term_at().is_some_and(|at| now >= at) {
            let left = self
                .lease
                .valid_until()
                .map(|until| until.saturating_duration_since(now))
                .unwrap_or_default();
            eprintln!(
                "distlock: lock {:?} could not be refreshed and is valid for {} more; stopping the command",
                self.key,
                humantime::format_duration(round_ms(left))
            );
            self.cut_short = true;
            self.begin_stop();
        }
        if self.kill_at().is_some_and(|at| now >= at) {
            if !self.killed {
                self.report_kill(now);
            }
            self.killed = true;
        }
        if self.killed {
            // Repeated on every wake-up until the group is empty: cheap, and it
            // catches nothing new (a SIGKILLed group cannot fork), but it is
            // the one signal that must not be missed.
            process_group::signal_group(self.leader_pid, libc::SIGKILL);
            self.report_survivors(now);
        }
    }

    /// Says why the group gets SIGKILL now: its kill-after grace is over, or
    /// the lease's validity is about to end first (then the grace does not
    /// count: a command still running when the lock lapses would run
    /// beside the next holder).
    fn report_kill(&self, now: Instant) {
        let grace_over = self
            .stop
            .as_ref()
            .is_some_and(|stop| now.saturating_duration_since(stop.since) >= self.kill_after);
        if grace_over {
            eprintln!(
                "distlock: the command's process group did not exit within --kill-after {} of SIGTERM; killing it (SIGKILL)",
                humantime::format_duration(self.kill_after)
            );
            return;
        }
        let left = self
            .lease
            .valid_until()
            .map(|until| until.saturating_duration_since(now))
            .unwrap_or_default();
        let why = if left <= self.drift {
            "the lock may already be someone else's (its validity is over, less its drift margin)"
                .to_owned()
        } else {
            format!(
                "the lock is valid for only {} more and the group must be gone a drift margin ({}) before it can lapse",
                humantime::format_duration(round_ms(left)),
                humantime::format_duration(round_ms(self.drift))
            )
        };
        eprintln!(
            "distlock: killing the command's process group (SIGKILL) without waiting out --kill-after {}: {why}",
            humantime::format_duration(self.kill_after),
        );
    }

    /// Names the members of CMD's group still alive [`SURVIVOR_QUIET`] after
    /// the first SIGKILL, and every [`SURVIVOR_REPORT_EVERY`] after that:
    /// distlock keeps killing and waiting for them, with no time limit, and
    /// releases the lock only once they are gone.
    fn report_survivors(&mut self, now: Instant) {
        let report_at = *self
            .survivor_report_at
            .get_or_insert_with(|| now.checked_add(SURVIVOR_QUIET).unwrap_or(now));
        if now < report_at {
            return;
        }
        self.survivor_report_at = now.checked_add(SURVIVOR_REPORT_EVERY);
        let survivors = match process_group::live_members(self.leader_pid) {
            Ok(live) if live.is_empty() => return,
            Ok(live) => process_group::describe(&live),
            Err(error) => format!("members (cannot list them: /proc: {error})"),
        };
        let expiring = match self.lease.valid_until() {
            Some(_) => {
                "; a lock that expires (as on Redis) lapses at its ttl meanwhile if it cannot be refreshed"
            }
            None => "",
        };
        eprintln!(
            "distlock: {survivors} of the command's process group survive SIGKILL (D: uninterruptible \
             sleep, e.g. frozen); lock {:?} is released only after they are gone{expiring}",
            self.key
        );
    }

    fn next_wake(&self) -> Option<Instant> {
        let mut wake = self.term_at();
        if !self.killed {
            wake = earliest(wake, self.kill_at());
        }
        if self.leader_status.is_some() || self.killed {
            wake = earliest(wake, Instant::now().checked_add(GROUP_POLL));
        }
        wake
    }
}

/// `at − by`, or now if that is before the clock's earliest instant (it is in
/// the past either way).
fn minus(at: Instant, by: Duration) -> Instant {
    at.checked_sub(by).unwrap_or_else(Instant::now)
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn round_ms(duration: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A signal to forward, where signals are forwarded; pending otherwise.
async fn recv_forwarded(signals: &mut Option<&mut Forwarded>) -> libc::c_int {
    match signals {
        Some(signals) => signals.recv().await,
        None => std::future::pending().await,
    }
}

/// The stop request, once; pending forever after it came.
async fn wait_stop<F: Future<Output = ()>>(stop: &mut Option<std::pin::Pin<&mut F>>) {
    match stop {
        Some(stop) => stop.as_mut().await,
        None => std::future::pending().await,
    }
}

/// The lost signal's reason, once; pending forever after it fired.
async fn wait_lost(lost: &mut Option<distlock::LostSignal>) -> LostReason {
    match lost {
        Some(signal) => signal.wait().await,
        None => std::future::pending().await,
    }
}

/// CMD's exit status as distlock's: its code, or 128 + the signal that killed it.
fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        (None, None) => exit::SOFTWARE,
    }
}

/// The signals distlock passes on to CMD's group.
struct Forwarded {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    quit: Signal,
    user1: Signal,
    user2: Signal,
}

impl Forwarded {
    fn install() -> io::Result<Self> {
        Ok(Forwarded {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            user1: signal(SignalKind::user_defined1())?,
            user2: signal(SignalKind::user_defined2())?,
        })
    }

    async fn recv(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
            _ = self.user1.recv() => libc::SIGUSR1,
            _ = self.user2.recv() => libc::SIGUSR2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::memory::MemoryLocker;
    use distlock::Locker;

    const SECOND: Duration = Duration::from_secs(1);

    async fn lease(ttl: Duration) -> Lease {
        let locker = MemoryLocker::new();
        let lease = locker.try_lock("job", ttl).await.unwrap();
        lease.expect("a fresh memory locker has the key free")
    }

    #[tokio::test]
    async fn a_fresh_lease_lets_the_command_start() {
        let lease = lease(30 * SECOND).await;
        assert_eq!(refuse_to_start(&lease, 10 * SECOND, Instant::now()), None);
    }

    #[tokio::test]
    async fn a_lost_lease_does_not() {
        let lease = lease(30 * SECOND).await;
        lease.lost_notifier().notify(LostReason::NotHeld);
        let why = refuse_to_start(&lease, SECOND, Instant::now()).expect("refused");
        assert!(
            why.starts_with("was lost before the command could start"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_lease_whose_proactive_stop_is_due_does_not() {
        let ttl = 30 * SECOND;
        let lease = lease(ttl).await;
        let until = lease.valid_until().expect("memory leases expire");
        let lead = 10 * SECOND + distlock::drift_margin(ttl);
        // Just before the stop would be due: starts; from then on: refused.
        let before = until - lead - Duration::from_millis(1);
        assert_eq!(refuse_to_start(&lease, 10 * SECOND, before), None);
        let why = refuse_to_start(&lease, 10 * SECOND, until - lead).expect("refused");
        assert!(why.starts_with("is valid for only 10s"), "{why}");
        assert!(
            refuse_to_start(&lease, Duration::ZERO, until).is_some(),
            "expired"
        );
    }
}
