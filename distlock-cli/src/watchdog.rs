//! The watchdog: a small helper process that SIGKILLs CMD's process group if
//! distlock dies, even by SIGKILL.
//!
//! # Why a process
//!
//! `PR_SET_PDEATHSIG` kills CMD's group leader when distlock dies, but not
//! the processes the leader forked: `sh -c 'sleep 1234 & wait'` would leave
//! the `sleep` running after the kernel (file backend) or the server
//! (Postgres) freed the lock, beside the next holder. Nothing inside a
//! SIGKILLed process can react, so another process must: distlock re-executes
//! itself (`/proc/self/exe watchdog ...`, a hidden subcommand) before CMD is
//! spawned.
//!
//! # Protocol
//!
//! Three pipes, every end close-on-exec unless handed on explicitly:
//!
//! - **lifeline**: only distlock holds the write end, the watchdog reads it.
//!   distlock writes one "done" byte once CMD's whole group has exited. EOF
//!   without that byte means distlock died: the watchdog sends SIGKILL to the
//!   group until no process of it is alive, with no time limit, and exits.
//!   Survivors (a member in uninterruptible sleep, such as one frozen by a
//!   cgroup freezer, dies only when it wakes) are named on stderr after 2 s
//!   and every 30 s after that.
//! - **pid**: CMD's child writes its pid (= its new process group id) from
//!   `pre_exec`, before exec.
//! - **go**: CMD's child then blocks in `pre_exec` reading one byte that the
//!   watchdog writes once it knows the group. So CMD cannot run, let alone
//!   fork, before the watchdog watches its group. If the watchdog dies first,
//!   the read sees EOF and the spawn fails (distlock reports it; CMD never
//!   runs).
//!
//! The child, not distlock, hands the pid over because `std`'s spawn returns
//! only after exec, and exec waits for "go": distlock cannot learn the pid
//! before the watchdog needs it.
//!
//! On the file backend the watchdog also holds a duplicate of the lock file's
//! descriptor (`--hold`, from [`distlock::Lease::duplicate_lock_fd`]): a
//! `flock` belongs to the open file, so the lock stays held until the
//! watchdog exits, which it does only after no process of CMD's group is
//! alive (or after distlock said "done"). A SIGKILLed distlock therefore
//! cannot free a file lock while CMD's processes still run, however long
//! they take to die; the kernel frees it when the watchdog, having killed
//! them, exits. (Postgres and Redis locks belong to a connection or expire
//! on the server: nothing can be handed over there. A Postgres lock is
//! freed when distlock's connection closes, a Redis lock lapses at its ttl:
//! for them the watchdog can only keep killing, and report, what survives.)
//!
//! The watchdog ignores the terminal's signals (SIGINT, SIGQUIT, SIGTSTP,
//! SIGHUP, ...) and sits in its own process group, so neither Ctrl-C nor
//! `kill -9 %1` of distlock's job reaches it.
//!
//! # What escapes
//!
//! A process that leaves CMD's group (`setsid`, `setpgid`, a daemonizing
//! double fork that starts a new session) is out of reach of the group
//! signals; a SIGKILL or SIGSTOP of the watchdog itself disables the
//! parent-death guarantee for the rest of the group (the leader still dies by
//! `PR_SET_PDEATHSIG`). Run CMD in a cgroup (systemd `KillMode=control-group`)
//! when that matters.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cli::WatchdogArgs;
use crate::process_group;

/// The byte distlock writes on the lifeline when CMD's group has exited.
const DONE: u8 = b'd';
/// The byte the watchdog writes on the go pipe once it watches the group.
const GO: u8 = b'g';

/// distlock's end of the lifeline: dropping it without [`Lifeline::done`]
/// (or distlock dying) makes the watchdog SIGKILL CMD's group.
pub(crate) struct Lifeline {
    write: File,
    /// The watchdog's pid, so the reaper can tell it from CMD's processes.
    pub(crate) watchdog_pid: u32,
    /// The watchdog holds the lock's open file: it must be gone before the
    /// lock is released, or the release would not free the lock.
    holds_lock: bool,
}

impl Lifeline {
    /// Tells the watchdog that CMD's group has exited, so it exits without
    /// signalling anything, and, if it holds the lock's open file, waits
    /// (up to 2 s) until it has exited and so closed it. A failed write is
    /// harmless: the watchdog then sees EOF and signals a group that no
    /// longer exists. The bound frees nothing early: the group is already
    /// empty, and a watchdog that has not exited yet (stopped by a signal)
    /// still holds the file lock until it does, whatever distlock's release
    /// (which closes only distlock's own descriptor) does meanwhile.
    pub(crate) fn done(mut self) {
        let _ = self.write.write_all(&[DONE]);
        if self.holds_lock {
            wait_for_exit(self.watchdog_pid, Duration::from_secs(2));
        }
    }
}

/// Reaps `pid` (distlock's child), polling for at most `within`. A pid
/// already reaped elsewhere (ECHILD) counts as exited.
fn wait_for_exit(pid: u32, within: Duration) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    let started = Instant::now();
    while started.elapsed() < within {
        let mut status = 0;
        // SAFETY: waitpid writes only to `status`.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if reaped != 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The raw descriptors CMD's `pre_exec` uses to hand its pid to the watchdog
/// and wait for it. Dropped (closed in distlock) once CMD is spawned.
pub(crate) struct Handoff {
    pid_write: OwnedFd,
    go_read: OwnedFd,
    /// distlock's lifeline write end, closed in CMD's child before exec.
    lifeline_write: RawFd,
}

impl Handoff {
    /// `(pid_write, go_read, lifeline_write)`, for the async-signal-safe
    /// `pre_exec` code, which must not touch anything that allocates.
    pub(crate) fn raw(&self) -> (RawFd, RawFd, RawFd) {
        (
            self.pid_write.as_raw_fd(),
            self.go_read.as_raw_fd(),
            self.lifeline_write,
        )
    }
}

/// Starts the watchdog, handing it `lock_file` to hold if the lock is an open
/// file. Returns distlock's lifeline and the descriptors CMD's child needs.
/// Fails if the pipes cannot be made or distlock cannot re-execute itself.
pub(crate) fn start(lock_file: Option<OwnedFd>) -> io::Result<(Lifeline, Handoff)> {
    let (lifeline_read, lifeline_write) = pipe()?;
    let (pid_read, pid_write) = pipe()?;
    let (go_read, go_write) = pipe()?;
    let hold = lock_file.as_ref().map(AsRawFd::as_raw_fd);
    let handed = [
        lifeline_read.as_raw_fd(),
        pid_read.as_raw_fd(),
        go_write.as_raw_fd(),
        // -1: nothing to hold (skipped below).
        hold.unwrap_or(-1),
    ];
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0("distlock-watchdog")
        .args(["watchdog", "--lifeline"])
        .arg(handed[0].to_string())
        .arg("--pid")
        .arg(handed[1].to_string())
        .arg("--go")
        .arg(handed[2].to_string());
    if let Some(hold) = hold {
        command.arg("--hold").arg(hold.to_string());
    }
    command
        // It reads and prints nothing but, after distlock died, the members of
        // the group that survive SIGKILL: on distlock's stderr, which it keeps
        // open only as long as it outlives distlock, that is, as long as the
        // command's work (which holds it too) may still run.
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // SAFETY: setpgid and fcntl are async-signal-safe and nothing here
    // allocates.
    unsafe {
        command.pre_exec(move || {
            // Its own group: a signal to distlock's job (kill %1, Ctrl-C)
            // must not take the watchdog down with distlock.
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Exactly these ends survive exec; the lifeline's write end
            // stays close-on-exec so that only distlock holds it.
            for fd in handed {
                if fd >= 0 && libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = command.spawn()?;
    // distlock keeps none of the watchdog's ends: a dead watchdog must mean
    // EOF on "go" for CMD's child.
    drop((lifeline_read, pid_read, go_write));
    let lifeline_raw = lifeline_write.as_raw_fd();
    Ok((
        Lifeline {
            write: File::from(lifeline_write),
            watchdog_pid: child.id(),
            holds_lock: lock_file.is_some(),
        },
        Handoff {
            pid_write,
            go_read,
            lifeline_write: lifeline_raw,
        },
    ))
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The watchdog process (`distlock watchdog`, hidden): waits for CMD's pid,
/// lets it start, then waits on the lifeline. Returns its exit code.
pub(crate) fn main(args: WatchdogArgs) -> u8 {
    for signal in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGPIPE,
    ] {
        // SAFETY: SIG_IGN installs no handler code.
        unsafe {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    // SAFETY: distlock handed these descriptors to this process (see start);
    // nothing else in it uses them.
    let (mut lifeline, mut pid, mut go) = unsafe {
        (
            File::from_raw_fd(args.lifeline),
            File::from_raw_fd(args.pid),
            File::from_raw_fd(args.go),
        )
    };
    // Held until this process exits: the lock stays held while it lives.
    // SAFETY: as above, handed to this process for this purpose only.
    let _lock_file = args.hold.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    let mut raw = [0u8; 4];
    // EOF before a pid: CMD's spawn failed before its child got that far, so
    // there is no group to guard; wait for distlock all the same.
    let group = match pid.read_exact(&mut raw) {
        Ok(()) => Some(i32::from_ne_bytes(raw)),
        Err(_) => None,
    };
    drop(pid);
    if group.is_some() {
        // A child that died meanwhile makes this EPIPE (SIGPIPE is ignored).
        let _ = go.write_all(&[GO]);
    }
    drop(go);
    let mut byte = [0u8; 1];
    let done = loop {
        match lifeline.read(&mut byte) {
            Ok(1) => break byte[0] == DONE,
            Ok(_) => break false,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    if let (false, Some(group)) = (done, group) {
        kill_group(group);
    }
    0
}

/// How long the watchdog kills quietly before it reports survivors, and
/// polls quickly: a SIGKILLed group is normally gone within milliseconds.
const QUIET: Duration = Duration::from_secs(2);
/// How often survivors are reported again after [`QUIET`].
const REPORT_EVERY: Duration = Duration::from_secs(30);

/// SIGKILL to the group until no process of it is alive, however long that
/// takes: the watchdog (and with it a file lock it holds) must not go while
/// the lock's work may still run. A member in uninterruptible sleep (frozen
/// by a cgroup freezer, blocked in the kernel on a dead NFS server) dies
/// only when it wakes up; one that changed its user may be beyond this
/// process's permission. Survivors are reported on stderr after [`QUIET`],
/// then every [`REPORT_EVERY`]. Zombies do not count (see
/// [`process_group::live_members`]); if `/proc` cannot be read, the group is
/// waited for until `kill` finds it empty, zombies included.
fn kill_group(group: libc::pid_t) {
    let Ok(pgid) = u32::try_from(group) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    let started = Instant::now();
    let mut report_at = started.checked_add(QUIET);
    loop {
        // SAFETY: kill has no memory-safety preconditions.
        let gone = unsafe { libc::kill(-group, libc::SIGKILL) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            return;
        }
        let live = process_group::live_members(pgid);
        if live.as_ref().is_ok_and(Vec::is_empty) {
            return;
        }
        if report_at.is_some_and(|at| Instant::now() >= at) {
            let survivors = match &live {
                Ok(live) => process_group::describe(live),
                Err(error) => format!("members (cannot list them: /proc: {error})"),
            };
            eprintln!(
                "distlock watchdog: distlock died; {survivors} of the command's process group {pgid} \
                 survive SIGKILL after {}s (D: uninterruptible sleep, e.g. frozen); a file lock stays \
                 held until they are gone, a lock that expires lapses at its ttl",
                started.elapsed().as_secs()
            );
            report_at = report_at.and_then(|at| at.checked_add(REPORT_EVERY));
        }
        let pause = match started.elapsed() < QUIET {
            true => Duration::from_millis(20),
            false => Duration::from_millis(100),
        };
        std::thread::sleep(pause);
    }
}
