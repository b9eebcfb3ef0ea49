//! CMD as a process group: spawning it into a group of its own, signalling
//! the whole group, and reaping every child distlock inherits.
//!
//! CMD's first process calls `setpgid(0, 0)` before exec, so it leads a new
//! group that every process it forks joins unless it leaves on purpose
//! (`setsid`, `setpgid`: those escape, see [`crate::watchdog`]). distlock
//! signals the group (`kill(-pgid, sig)`), never just the leader, and counts
//! the lock's work as finished only when `kill(-pgid, 0)` says the group is
//! empty.
//!
//! distlock makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so
//! processes orphaned inside CMD's tree are re-parented to distlock instead of
//! init: it reaps them itself ([`reap`], `waitpid(-1)`, called by the
//! process's one [`crate::reaper`]), which is why CMD is not run through
//! `tokio::process` (its per-child waiting would race that loop).

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

use crate::watchdog::Handoff;

/// Makes distlock the reaper of every orphan in its process tree (Linux
/// 3.4+). Failing is not fatal: orphans then go to init, and the group
/// signals and the watchdog still reach them.
pub(crate) fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments has no memory-safety preconditions.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What CMD's child is told about the lease, as environment variables.
pub(crate) struct LeaseEnv<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) fencing_token: Option<u64>,
    /// More variables (`distlock cron`: `DISTLOCK_JOB`, ...).
    pub(crate) extra: &'a [(&'static str, String)],
}

/// Spawns CMD as the leader of a new process group and returns its pid (which
/// is also the group id). Its `pre_exec` blocks until the watchdog watches the
/// group (see [`crate::watchdog`]); the leader also gets `PR_SET_PDEATHSIG`
/// (SIGKILL), so it dies with distlock even before the watchdog acts.
///
/// Fails with the exec error (`NotFound` for a missing CMD), or with
/// `ECHILD` if the watchdog died before letting CMD start, `ESRCH` if
/// distlock's parent-death signal could not be armed in time.
pub(crate) fn spawn(
    command: &[OsString],
    lease: &LeaseEnv<'_>,
    handoff: &Handoff,
    take_terminal: Option<libc::c_int>,
) -> io::Result<u32> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command given"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("DISTLOCK_KEY", lease.key)
        .env("DISTLOCK_OWNER", lease.owner);
    match lease.fencing_token {
        Some(token) => cmd.env("DISTLOCK_FENCING_TOKEN", token.to_string()),
        None => cmd.env_remove("DISTLOCK_FENCING_TOKEN"),
    };
    for (name, value) in lease.extra {
        cmd.env(name, value);
    }
    let parent = std::process::id();
    let (pid_write, go_read, lifeline_write) = handoff.raw();
    // SAFETY: the closure runs in the forked child before exec. It only makes
    // async-signal-safe system calls (setpgid, prctl, getppid, getpid, write,
    // read, close, tcsetpgrp, signal) and allocates nothing: its errors are
    // raw OS errors.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // If distlock dies, even by SIGKILL, the leader must not run on
            // without the lock (the watchdog takes the rest of the group).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // distlock died between fork and prctl: the signal will never come.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            // Only distlock may hold the lifeline's write end.
            libc::close(lifeline_write);
            let pid = libc::getpid().to_ne_bytes();
            // std has reset SIGPIPE to its default by now: a dead watchdog
            // must be an error here, not a silent death (which std's spawn
            // would take for a successful exec).
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            let written = libc::write(pid_write, pid.as_ptr().cast(), pid.len());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            if written != pid.len() as isize {
                return Err(io::Error::from_raw_os_error(libc::ECHILD));
            }
            let mut go = 0u8;
            loop {
                match libc::read(go_read, (&raw mut go).cast(), 1) {
                    1 => break,
                    -1 if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
                    // EOF: the watchdog died before it watched the group.
                    _ => return Err(io::Error::from_raw_os_error(libc::ECHILD)),
                }
            }
            if let Some(tty) = take_terminal {
                crate::terminal::give_to_self_in_child(tty);
            }
            Ok(())
        });
    }
    // Lock files and sockets are opened close-on-exec, so CMD inherits none.
    let child = cmd.spawn()?;
    Ok(child.id())
}

/// Sends `signal` to every process of the group `pgid`. Returns false if the
/// group is empty.
pub(crate) fn signal_group(pgid: u32, signal: libc::c_int) -> bool {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(-(pgid as libc::pid_t), signal) == 0 }
}

/// True while any process (a zombie included) is in the group `pgid`.
/// EPERM (a member that changed its user) counts as alive.
pub(crate) fn group_alive(pgid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let result = unsafe { libc::kill(-(pgid as libc::pid_t), 0) };
    result == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The processes of group `pgid` that are alive, not zombies, each with
/// its state letter from `/proc/PID/stat` (`D`: in uninterruptible sleep,
/// such as a process frozen by a cgroup freezer or blocked on a dead NFS
/// server, which a SIGKILL ends only once it wakes up). Zombies are left
/// out: their work is over, and they stay in the group until whoever
/// inherited them reaps them, which an init that does not reap (a
/// container's) never does. Fails if `/proc` cannot be read.
pub(crate) fn live_members(pgid: u32) -> io::Result<Vec<(u32, char)>> {
    let mut live = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // Gone since the listing: not a member any more.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`: comm may hold spaces and `)`.
        let mut fields = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace();
        let state = fields.next().and_then(|s| s.chars().next());
        let pgrp = fields.nth(1).and_then(|g| g.parse::<u32>().ok());
        match (state, pgrp) {
            (Some('Z' | 'X'), _) => {}
            (Some(state), Some(group)) if group == pgid => live.push((pid, state)),
            _ => {}
        }
    }
    Ok(live)
}

/// `pid 12 (D), pid 13 (S)`: live members for a message.
pub(crate) fn describe(members: &[(u32, char)]) -> String {
    let words: Vec<String> = members
        .iter()
        .map(|(pid, state)| format!("pid {pid} ({state})"))
        .collect();
    words.join(", ")
}

/// Reaps every child that has exited, without blocking: CMD's leader, the
/// orphans distlock inherited as subreaper, the watchdog. Children that
/// stopped (job control) are reported too, once per stop
/// (`ExitStatus::stopped_signal`), and stay children.
pub(crate) fn reap() -> Vec<(u32, ExitStatus)> {
    let mut reaped = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: status is a valid place for waitpid to write.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::WUNTRACED) };
        match pid {
            // 0: children remain, none exited; -1: none left (ECHILD) or EINTR,
            // and the next SIGCHLD brings us back.
            0 | -1 => return reaped,
            pid => reaped.push((pid as u32, ExitStatus::from_raw(status))),
        }
    }
}
