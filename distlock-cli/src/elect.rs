//! `distlock elect`: campaign, run CMD while leader under `distlock run`'s
//! supervision, campaign again; and `distlock elect --observe`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use distlock::elect::{Election, Leader, Term};
use distlock::{inspect, Locker};
use serde::Serialize;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;

use crate::cli::ElectArgs;
use crate::exit;
use crate::run::{capped_kill_after, fail, open, report_release};
use crate::supervise::{supervise, Command};

/// How long a replica whose term just ended waits before campaigning again,
/// so that a standby already waiting takes over rather than the replica
/// whose command just exited or lost its term.
const STAND_BACK: Duration = Duration::from_millis(500);

/// After a failed campaign (the backend down), the first and the longest
/// pause before the next.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// `distlock elect`: see the exit codes in `exit::TABLE`.
pub(crate) async fn elect(args: ElectArgs) -> u8 {
    let shutdown = match Shutdown::install() {
        Ok(shutdown) => shutdown,
        Err(error) => {
            eprintln!("distlock: cannot install signal handlers: {error}");
            return exit::SOFTWARE;
        }
    };
    let locker = match open(&args.backend).await {
        Ok(locker) => locker,
        Err(error) => return fail(&error),
    };
    if args.observe {
        return observe(locker, &args, &shutdown).await;
    }
    // What the lock records as the holder's label when nothing is
    // proclaimed: the command, its secret-looking values redacted.
    inspect::set_process_label(inspect::command_label(&args.command));
    let mut election = Election::new(locker, args.key.clone()).ttl(args.ttl);
    if let Some(value) = &args.proclaim {
        election = election.proclaim(value.clone());
    }
    let kill_after = capped_kill_after(args.kill_after, args.ttl);
    let leader = args
        .proclaim
        .clone()
        .unwrap_or_else(|| format!("{}:{}", inspect::Holder::current().host, std::process::id()));
    let mut retry = RETRY_FIRST;
    loop {
        let campaign = tokio::select! {
            campaign = election.campaign(args.wait) => campaign,
            () = shutdown.requested() => return 0,
        };
        let term = match campaign {
            Ok(term) => term,
            Err(error) if error.is_contention() => {
                eprintln!(
                    "distlock: election {:?} is led elsewhere{}",
                    args.key,
                    waited(args.wait)
                );
                return args.conflict_exit_code;
            }
            Err(error) if args.once || !error.is_outage() => return fail(&error),
            Err(error) => {
                eprintln!(
                    "distlock: campaigning in {:?} failed: {error}; trying again in {}",
                    args.key,
                    humantime::format_duration(retry)
                );
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    () = shutdown.requested() => return 0,
                }
                retry = (retry * 2).min(RETRY_MAX);
                continue;
            }
        };
        retry = RETRY_FIRST;
        let code = lead(&term, &args, kill_after, &leader).await;
        report_release(term.resign().await, "resigning", &args.key);
        if args.once || shutdown.was_requested() {
            return code;
        }
        eprintln!(
            "distlock: {}; campaigning again in {:?}",
            ended(code),
            args.key
        );
        tokio::select! {
            () = tokio::time::sleep(STAND_BACK) => {}
            () = shutdown.requested() => return code,
        }
    }
}

/// Runs CMD under `term` exactly as `distlock run` does under its lease.
async fn lead(term: &Term, args: &ElectArgs, kill_after: Duration, leader: &str) -> u8 {
    let term_number = term
        .fencing_token()
        .map(|token| token.to_string())
        .unwrap_or_default();
    let command = Command {
        argv: &args.command,
        env: vec![
            ("DISTLOCK_TERM", term_number),
            ("DISTLOCK_LEADER", leader.to_owned()),
        ],
        kill_after,
        interactive: true,
    };
    supervise(&command, term.lease(), std::future::pending()).await
}

/// How a term ended, for the line before campaigning again.
fn ended(code: u8) -> String {
    match code {
        0 => "the command exited".to_owned(),
        exit::LOST => "the term was lost and the command stopped".to_owned(),
        code => format!("the command exited with status {code}"),
    }
}

fn waited(wait: Option<Duration>) -> String {
    wait.map(|w| format!(" after waiting {}", humantime::format_duration(w)))
        .unwrap_or_default()
}

/// `distlock elect --observe`: one line per leader change until SIGINT or
/// SIGTERM (exit 0); 69 if the first look fails.
async fn observe(locker: Arc<dyn Locker>, args: &ElectArgs, shutdown: &Shutdown) -> u8 {
    let mut observer = Election::new(locker, args.key.clone()).observe();
    let mut looked = false;
    loop {
        let change = tokio::select! {
            change = observer.changed() => change,
            () = shutdown.requested() => return 0,
        };
        match change {
            Ok(leader) => {
                looked = true;
                let line = match args.json {
                    true => json_line(&args.key, leader.as_ref()),
                    false => text_line(leader.as_ref()),
                };
                println!("{line}");
            }
            Err(error) if !looked || !error.is_outage() => return fail(&error),
            Err(error) => {
                eprintln!("distlock: observing {:?}: {error}; looking again", args.key);
                tokio::select! {
                    () = tokio::time::sleep(RETRY_FIRST) => {}
                    () = shutdown.requested() => return 0,
                }
            }
        }
    }
}

fn text_line(leader: Option<&Leader>) -> String {
    let Some(leader) = leader else {
        return "no leader".to_owned();
    };
    let mut line = String::from("leader");
    if let Some(term) = leader.term {
        line.push_str(&format!(" term={term}"));
    }
    if let Some(holder) = &leader.holder {
        line.push_str(&format!(" host={} pid={}", holder.host, holder.pid));
    }
    if let Some(value) = &leader.proclaimed {
        line.push_str(&format!(" proclaimed={value:?}"));
    }
    if let Some(since) = leader.since {
        line.push_str(&format!(
            " since={}",
            humantime::format_rfc3339_millis(since)
        ));
    }
    line
}

/// One leader change as `--json` prints it: one object per line.
#[derive(Debug, Serialize)]
struct ChangeReport<'a> {
    election: &'a str,
    /// `null` when nobody leads.
    leader: Option<LeaderReport<'a>>,
}

#[derive(Debug, Serialize)]
struct LeaderReport<'a> {
    term: Option<u64>,
    host: Option<&'a str>,
    pid: Option<u32>,
    proclaimed: Option<&'a str>,
    since_unix_ms: Option<u64>,
    ttl_left_ms: Option<u64>,
}

fn json_line(election: &str, leader: Option<&Leader>) -> String {
    let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    let report = ChangeReport {
        election,
        leader: leader.map(|leader| LeaderReport {
            term: leader.term,
            host: leader.holder.as_ref().map(|holder| holder.host.as_str()),
            pid: leader.holder.as_ref().map(|holder| holder.pid),
            proclaimed: leader.proclaimed.as_deref(),
            since_unix_ms: leader
                .since
                .and_then(|since| since.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(millis),
            ttl_left_ms: leader.ttl_left.map(millis),
        }),
    };
    // Plain strings and numbers: serializing cannot fail.
    serde_json::to_string(&report).unwrap_or_default()
}

/// SIGINT or SIGTERM, seen by `distlock elect` itself. While CMD runs,
/// `supervise` forwards them to CMD's group as `distlock run` does; this
/// only decides that no new campaign follows.
struct Shutdown {
    requested: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl Shutdown {
    fn install() -> std::io::Result<Self> {
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let requested = Arc::new(AtomicBool::new(false));
        let notify = Arc::new(Notify::new());
        let (flag, wake) = (requested.clone(), notify.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
            flag.store(true, Ordering::SeqCst);
            wake.notify_waiters();
        });
        Ok(Shutdown { requested, notify })
    }

    fn was_requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Resolves once a shutdown was requested (at once if it already was).
    async fn requested(&self) {
        let notified = self.notify.notified();
        if self.was_requested() {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::inspect::Holder;

    fn leader() -> Leader {
        Leader {
            term: Some(7),
            holder: Some(Holder {
                host: "web-2".into(),
                pid: 4121,
                label: "10.0.0.7:8080".into(),
            }),
            proclaimed: Some("10.0.0.7:8080".into()),
            since: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_780_000_123)),
            ttl_left: Some(Duration::from_millis(14_250)),
        }
    }

    #[test]
    fn a_change_prints_as_one_text_line() {
        assert_eq!(
            text_line(Some(&leader())),
            "leader term=7 host=web-2 pid=4121 proclaimed=\"10.0.0.7:8080\" since=2025-12-03T16:40:00.123Z"
        );
        assert_eq!(text_line(None), "no leader");
    }

    #[test]
    fn a_change_prints_as_one_json_object() {
        assert_eq!(
            json_line("scheduler", Some(&leader())),
            r#"{"election":"scheduler","leader":{"term":7,"host":"web-2","pid":4121,"proclaimed":"10.0.0.7:8080","since_unix_ms":1764780000123,"ttl_left_ms":14250}}"#
        );
        assert_eq!(
            json_line("scheduler", None),
            r#"{"election":"scheduler","leader":null}"#
        );
    }
}
