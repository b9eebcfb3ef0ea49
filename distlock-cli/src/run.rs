//! `distlock run` and `distlock release`.

use std::sync::Arc;
use std::time::Duration;

use distlock::semaphore::Semaphore;
use distlock::{inspect, Error, KeepAlive, Lease, Locker, LockerExt};

use crate::cli::{Backend, ReleaseArgs, RunArgs};
use crate::exit;
use crate::supervise::{kill_after_cap, supervise, Command};

/// How far past `--wait` connecting may run before the backend counts as
/// unreachable (exit 69), and the margin allowed past the library's own
/// bound on the acquire (`--wait` left after connecting, plus
/// [`distlock::DEADLINE_GRACE`]).
pub(crate) const WAIT_GRACE: Duration = Duration::from_millis(500);

/// Durations past this are "forever": far beyond any real wait or hold, yet
/// small enough that no deadline computed from them can overflow an `Instant`
/// (`--wait 300000000000y` would).
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Acquires the lock, runs CMD under it, and returns the exit code.
pub(crate) async fn run(args: RunArgs) -> u8 {
    // What `distlock status` shows as the holder's label: the command, its
    // secret-looking values redacted (it is stored beside the lock).
    inspect::set_process_label(inspect::command_label(&args.command));
    let wait = effective_wait(args.wait);
    // Whether a refused reader may have met a waiting writer rather than a
    // holder (Postgres queues a writer's wait ahead of later readers).
    let mut writer_priority = false;
    let acquired = match args.wait {
        // With --wait, one deadline bounds connecting and acquiring: a
        // server that does not answer is an outage once the wait is over,
        // not a reason to sit out the backend's connect timeout (5 s on
        // Postgres); and the acquire waits only for what connecting left.
        Some(_) => {
            let started = tokio::time::Instant::now();
            let unanswered = |stage: &str| {
                let url = args.backend.url.as_deref().unwrap_or("file://");
                eprintln!(
                    "distlock: {} did not answer within --wait {} (+ {} grace) for lock {:?} \
                     ({stage}): the backend is unreachable or too slow",
                    server_of(url),
                    humantime::format_duration(wait),
                    humantime::format_duration(WAIT_GRACE),
                    args.key
                );
                exit::UNAVAILABLE
            };
            let locker =
                match tokio::time::timeout(wait.saturating_add(WAIT_GRACE), open(&args.backend))
                    .await
                {
                    Ok(Ok(locker)) => locker,
                    Ok(Err(error)) => return fail(&error),
                    Err(_) => return unanswered("connecting; nothing was acquired"),
                };
            writer_priority = locker.capabilities().writer_priority;
            let left = wait.saturating_sub(started.elapsed());
            // The library returns within `left + DEADLINE_GRACE` whatever the
            // server does; this only guards against a backend that does not.
            let bound = left
                .saturating_add(distlock::DEADLINE_GRACE)
                .saturating_add(WAIT_GRACE);
            match tokio::time::timeout(bound, acquire(&locker, &args, left)).await {
                Ok(acquired) => acquired.map(|lease| (locker, lease)),
                Err(_) => {
                    return unanswered(
                        "acquiring; an attempt in flight may have taken the lock, which then \
                         expires at its ttl or with its session",
                    )
                }
            }
        }
        None => {
            async {
                let locker = open(&args.backend).await?;
                writer_priority = locker.capabilities().writer_priority;
                let lease = acquire(&locker, &args, wait).await?;
                Ok::<_, Error>((locker, lease))
            }
            .await
        }
    };
    // `locker` is kept for as long as the lease: it is what the lease
    // refreshes and releases through.
    let (_locker, mut lease) = match acquired {
        Ok(acquired) => acquired,
        Err(error) if error.is_contention() => {
            let waited = args
                .wait
                .map(|w| format!(" after waiting {}", humantime::format_duration(w)))
                .unwrap_or_default();
            match args.limit {
                Some(permits) => eprintln!(
                    "distlock: all {permits} permits of {:?} are held elsewhere{waited}",
                    args.key
                ),
                None => {
                    let (how, or) = match (args.shared, writer_priority) {
                        (true, true) => (" exclusively", ", or an exclusive run waits for it"),
                        (true, false) => (" exclusively", ""),
                        (false, _) => ("", ""),
                    };
                    eprintln!(
                        "distlock: lock {:?} is held{how} elsewhere{or}{waited}",
                        args.key
                    );
                }
            }
            return args.conflict_exit_code;
        }
        Err(error) => return fail(&error),
    };
    let mut keepalive = KeepAlive::default();
    if let Some(max_hold) = effective_max_hold(args.max_hold) {
        keepalive = keepalive.max_hold(max_hold);
    }
    if let Err(error) = lease.keep_alive(keepalive) {
        return fail(&error);
    }
    let kill_after = capped_kill_after(args.kill_after, lease.ttl());
    let command = Command {
        argv: &args.command,
        env: Vec::new(),
        kill_after,
        interactive: true,
    };
    let code = supervise(&command, &lease, std::future::pending()).await;
    report_release(lease.release().await, "releasing", &args.key);
    code
}

/// Says on stderr why a release after CMD (`doing`: "releasing",
/// "resigning") failed; a lock already gone (`NotHeld`) is no failure.
pub(crate) fn report_release(outcome: distlock::Result<()>, doing: &str, key: &str) {
    match outcome {
        Ok(()) | Err(Error::NotHeld { .. }) => {}
        Err(error) => eprintln!(
            "distlock: {doing} {key:?} failed: {error}; it is freed when its ttl runs out"
        ),
    }
}

/// The lock `--key` (a shared lease of it with `--shared`), or with
/// `--limit N` one of its N permits, waiting up to `timeout`.
async fn acquire(
    locker: &Arc<dyn Locker>,
    args: &RunArgs,
    timeout: Duration,
) -> distlock::Result<Lease> {
    match args.limit {
        Some(permits) => {
            Semaphore::new(locker.clone(), args.key.clone(), permits)?
                .acquire(args.ttl, timeout)
                .await
        }
        None if args.shared => locker.lock_shared(&args.key, args.ttl, timeout).await,
        None => locker.lock(&args.key, args.ttl, timeout).await,
    }
}

/// Releases a lock by owner token, from any process where the backend allows it.
pub(crate) async fn release(args: ReleaseArgs) -> u8 {
    let locker = match open(&args.backend).await {
        Ok(locker) => locker,
        Err(error) => return fail(&error),
    };
    let owner = args.owner.as_deref().unwrap_or_default();
    match locker.unlock(&args.key, owner).await {
        Ok(()) => 0,
        Err(Error::Unsupported {
            operation: "release",
            reason,
            ..
        }) => {
            eprintln!(
                "distlock: lock {:?} can only be released by the process or session holding it: {reason}",
                args.key
            );
            exit::HELD_BY_ANOTHER_PROCESS
        }
        Err(Error::NotHeld { key }) => {
            eprintln!("distlock: lock {key:?} is not held by that owner (released, expired or taken over); nothing was released");
            exit::NOT_HELD
        }
        Err(error) => fail(&error),
    }
}

/// The backend the URL names, observed: metrics (served with --metrics-addr)
/// and spans (logged at --log-level info and above).
pub(crate) async fn open(backend: &Backend) -> distlock::Result<Arc<dyn Locker>> {
    let locker = distlock::connect(&backend.url()).await?;
    Ok(locker.with_metrics().with_tracing().shared())
}

/// The server part of a backend URL for messages: its scheme and
/// authority without the user or password (`postgres://db1:5432`), or the
/// file backend's path.
pub(crate) fn server_of(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "the backend".to_owned();
    };
    if scheme == "file" {
        return url.to_owned();
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    format!("{scheme}://{hosts}")
}

pub(crate) fn fail(error: &Error) -> u8 {
    eprintln!("distlock: {error}");
    exit::for_error(error)
}

/// `--wait` as the library gets it: none is one attempt, beyond [`FOREVER`]
/// is [`FOREVER`].
fn effective_wait(wait: Option<Duration>) -> Duration {
    wait.unwrap_or(Duration::ZERO).min(FOREVER)
}

/// `--max-hold` as the keepalive gets it: a max hold that no clock can reach
/// (beyond [`FOREVER`]) is no max hold.
fn effective_max_hold(max_hold: Option<Duration>) -> Option<Duration> {
    max_hold.filter(|hold| *hold <= FOREVER)
}

/// SIGTERM to SIGKILL when `--kill-after` is not given (capped for short
/// ttls without a word: the user chose nothing that could be overridden).
const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(10);

/// The kill-after grace for a lease of `ttl`: `--kill-after` if given,
/// else [`DEFAULT_KILL_AFTER`], capped at [`kill_after_cap`]; a chosen
/// value that is capped gets a warning (once).
pub(crate) fn capped_kill_after(chosen: Option<Duration>, ttl: Duration) -> Duration {
    let cap = kill_after_cap(ttl);
    let Some(kill_after) = chosen else {
        return DEFAULT_KILL_AFTER.min(cap);
    };
    if kill_after <= cap {
        return kill_after;
    }
    eprintln!(
        "distlock: --kill-after {} is capped at {} (ttl/2 - drift margin for --ttl {}), so the command is stopped before the lease can lapse",
        humantime::format_duration(kill_after),
        humantime::format_duration(cap),
        humantime::format_duration(ttl)
    );
    cap
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn no_flag_value_makes_a_deadline_overflow(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
            let huge = Duration::new(secs, nanos);
            let now = tokio::time::Instant::now();
            prop_assert!(now.checked_add(effective_wait(Some(huge))).is_some());
            if let Some(hold) = effective_max_hold(Some(huge)) {
                prop_assert!(now.checked_add(hold).is_some());
                prop_assert_eq!(hold, huge);
            }
            let cap = kill_after_cap(huge);
            prop_assert!(cap <= huge / 2);
            prop_assert!(capped_kill_after(Some(huge), huge) <= cap);
        }
    }

    #[test]
    fn messages_name_the_server_without_its_credentials() {
        for (url, server) in [
            (
                "postgres://app:hunter2@db1:5432/app?sslmode=disable",
                "postgres://db1:5432",
            ),
            (
                "redis://:hunter2@127.0.0.1:6379/0",
                "redis://127.0.0.1:6379",
            ),
            ("redis+cluster://u:p@a:1,b:2", "redis+cluster://a:1,b:2"),
            ("etcd://10.0.0.1:2379", "etcd://10.0.0.1:2379"),
            ("memory://", "memory://"),
            ("not a url", "the backend"),
        ] {
            assert_eq!(server_of(url), server, "{url}");
        }
    }

    #[test]
    fn only_unreachable_max_holds_are_dropped() {
        let hour = Duration::from_secs(3600);
        assert_eq!(effective_max_hold(Some(hour)), Some(hour));
        assert_eq!(effective_max_hold(Some(Duration::MAX)), None);
        assert_eq!(effective_wait(None), Duration::ZERO);
        assert_eq!(effective_wait(Some(Duration::MAX)), FOREVER);
    }
}
