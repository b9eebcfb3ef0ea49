//! Handing the controlling terminal to CMD's process group and back.
//!
//! CMD runs in a process group of its own ([`crate::process_group`]). If that
//! group were left in the background, an interactive CMD would stop on
//! SIGTTIN the moment it read the terminal, and Ctrl-C would reach distlock
//! (which forwards it) rather than CMD directly. So when stdin is a terminal
//! and distlock is in its foreground group, CMD's group is made the
//! foreground group before exec, and distlock takes the terminal back once the
//! group has exited.
//!
//! A background process that calls `tcsetpgrp` gets SIGTTOU, so it is ignored
//! around the calls; distlock keeps ignoring it while CMD owns the terminal
//! (its own messages then still print under `stty tostop`), and CMD's child
//! resets it to the default before exec.

use std::io;

/// The terminal on stdin, if distlock is in its foreground process group.
/// Starts ignoring SIGTTOU in distlock (see the module docs); undone by
/// [`take_back`].
pub(crate) fn foreground_stdin() -> Option<libc::c_int> {
    let fd = libc::STDIN_FILENO;
    // SAFETY: isatty, tcgetpgrp and getpgrp have no memory-safety preconditions.
    let ours = unsafe { libc::isatty(fd) == 1 && libc::tcgetpgrp(fd) == libc::getpgrp() };
    if !ours {
        return None;
    }
    // SAFETY: SIG_IGN installs no handler code.
    unsafe {
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    }
    Some(fd)
}

/// In CMD's child, after `setpgid(0, 0)`, before exec: makes the child's
/// group the terminal's foreground group, then restores SIGTTOU's default
/// action. Async-signal-safe; a failure is ignored (CMD then runs in the
/// background, as it would without a terminal).
///
/// # Safety
///
/// Call only in the forked child before exec.
pub(crate) unsafe fn give_to_self_in_child(tty: libc::c_int) {
    // SAFETY: tcsetpgrp, getpgrp and signal are async-signal-safe.
    unsafe {
        libc::tcsetpgrp(tty, libc::getpgrp());
        libc::signal(libc::SIGTTOU, libc::SIG_DFL);
    }
}

/// True if distlock's group is the terminal's foreground group.
pub(crate) fn is_foreground(tty: libc::c_int) -> bool {
    // SAFETY: tcgetpgrp and getpgrp have no memory-safety preconditions.
    unsafe { libc::tcgetpgrp(tty) == libc::getpgrp() }
}

/// Makes `pgid` the terminal's foreground group (SIGTTOU is still ignored
/// from [`foreground_stdin`]). Errors are ignored: the group then runs in the
/// background, as without a terminal.
pub(crate) fn give_to(tty: libc::c_int, pgid: u32) {
    // SAFETY: tcsetpgrp has no memory-safety preconditions.
    unsafe {
        libc::tcsetpgrp(tty, pgid as libc::pid_t);
    }
}

/// Makes distlock's group the foreground group again, keeping SIGTTOU
/// ignored (CMD's group may get the terminal back).
pub(crate) fn reclaim(tty: libc::c_int) {
    // SAFETY: tcsetpgrp and getpgrp have no memory-safety preconditions.
    unsafe {
        libc::tcsetpgrp(tty, libc::getpgrp());
    }
}

/// Makes distlock's group the terminal's foreground group again and restores
/// SIGTTOU's default action.
pub(crate) fn take_back(tty: libc::c_int) -> io::Result<()> {
    // SAFETY: tcsetpgrp, getpgrp and signal have no memory-safety
    // preconditions; SIGTTOU is still ignored from foreground_stdin.
    let result = unsafe { libc::tcsetpgrp(tty, libc::getpgrp()) };
    let error = io::Error::last_os_error();
    // SAFETY: as above.
    unsafe {
        libc::signal(libc::SIGTTOU, libc::SIG_DFL);
    }
    if result != 0 {
        return Err(error);
    }
    Ok(())
}
