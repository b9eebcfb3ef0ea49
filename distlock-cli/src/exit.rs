//! Exit codes, one place. Where they can, they follow sysexits.h and the
//! shell's conventions for commands that could not run.

use std::process::ExitCode;

use distlock::Error;

/// Release by a non-holder (`distlock release`).
pub(crate) const NOT_HELD: u8 = 1;
/// Bad flags, bad URL, bad key or ttl (EX_USAGE).
pub(crate) const USAGE: u8 = 64;
/// The backend could not be reached or failed (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// distlock itself failed (EX_SOFTWARE).
pub(crate) const SOFTWARE: u8 = 70;
/// The lock is held elsewhere (EX_TEMPFAIL); `--conflict-exit-code` changes it.
pub(crate) const CONFLICT: u8 = 75;
/// The lock was lost while CMD ran; CMD was stopped.
pub(crate) const LOST: u8 = 76;
/// `distlock release` of a lock that only its holding process (file backend:
/// the flock's owner) or session (Postgres, MySQL) can release (EX_NOPERM).
pub(crate) const HELD_BY_ANOTHER_PROCESS: u8 = 77;
/// CMD exists but could not be executed.
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// CMD was not found.
pub(crate) const NOT_FOUND: u8 = 127;

/// The table shown at the end of `--help`.
pub(crate) const TABLE: &str = "\
Exit status of `distlock run`:
  CMD's status    CMD ran; 128+N if it was killed by signal N
  75              the lock is held elsewhere (--conflict-exit-code)
  76              the lock was lost, could not be refreshed in time, or
                  reached --max-hold while CMD ran; CMD's process group was
                  stopped before the lock was released (not started
                  if the lock was lost or about to lapse before it could)
  64              bad usage: flags, URL, key or ttl; --shared on a backend
                  without shared locks
  69              the backend is unreachable or failed
  70              distlock could not set up (signal handlers, watchdog,
                  the --metrics-addr listener)
  126 / 127       CMD could not be executed / was not found
`distlock elect` exits as `distlock run` with --once; without it, it campaigns
again after each term and exits only on SIGINT/SIGTERM (CMD's status if it
was running, else 0), on --wait passing without leading (75), or on an error
that retrying cannot fix (64); an unreachable backend is retried.
`distlock release` exits 0 when released, 1 when the owner does not hold the
lock, 77 when only the holding process or session can release it (file,
Postgres and MySQL backends: the message names the holder).
`distlock release --force` exits 0 when it evicted a holder (printed), 1 when
nothing was held, 77 when the backend cannot force it this way (file; Postgres
and MySQL without --terminate-session), 69 when the backend failed.
`distlock status` exits 0 when the lock is held, 1 when it is free;
`distlock list` exits 0; both 64 for bad usage, 69 when the backend is
unreachable, failed, or cannot inspect (`list`: cannot enumerate). `distlock cron`
exits 0 after a graceful shutdown (SIGINT/SIGTERM), 64 for a bad job or config
file (before anything runs), 69 when the backend is unreachable.";

/// The exit code for an error reaching or using the backend.
pub(crate) fn for_error(error: &Error) -> u8 {
    match error {
        Error::InvalidInput { .. } | Error::Unsupported { .. } => USAGE,
        Error::NotHeld { .. } => NOT_HELD,
        Error::NotAcquired { .. } | Error::Timeout { .. } => CONFLICT,
        _ => UNAVAILABLE,
    }
}

/// Prints a clap error as one line (help and version as clap renders them).
pub(crate) fn usage_error(err: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            ExitCode::SUCCESS
        }
        _ => {
            // clap's message runs up to the first blank line (then usage and
            // hints follow); fold it onto one line.
            let rendered = err.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|line| !line.trim().is_empty())
                .map(str::trim)
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            eprintln!("distlock: {message} (see distlock --help)");
            ExitCode::from(USAGE)
        }
    }
}
