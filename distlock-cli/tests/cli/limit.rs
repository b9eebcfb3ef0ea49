//! `distlock run --limit N` with real processes: eight loops contending for
//! three permits never run more than three commands at once, and a
//! SIGKILLed holder's permit comes back within the backend's bound.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{stderr, wait_for_exit, wait_until, BIN};

/// Each of eight shell loops runs `distlock run --limit 3` three times;
/// every command logs its start and end (nanoseconds, one clock). The
/// commands' intervals lie inside their permits' holds, so at no instant
/// may more than three be open; and with eight contenders at least two
/// are.
pub fn eight_loops_never_run_more_than_three_commands(url: &str, key: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("log");
    let command = format!(
        "for i in 1 2 3; do {BIN} run --url '{url}' --key {key} --limit 3 --ttl 5s --wait 60s \
         -- sh -c 'echo start $(date +%s%N) >> \"$LOG\"; sleep 0.2; echo end $(date +%s%N) >> \"$LOG\"' \
         || exit 1; done"
    );
    let loops: Vec<Child> = (0..8)
        .map(|_| {
            Command::new("sh")
                .args(["-c", &command])
                .env("LOG", &log)
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a loop")
        })
        .collect();
    for contender in loops {
        let output = contender.wait_with_output().expect("loop");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    let text = std::fs::read_to_string(&log).expect("the log");
    let mut events: Vec<(u128, i32)> = text
        .lines()
        .map(|line| {
            let (what, at) = line.split_once(' ').expect("WHAT NANOS");
            let at: u128 = at.parse().expect("nanoseconds");
            (at, if what == "start" { 1 } else { -1 })
        })
        .collect();
    assert_eq!(events.len(), 8 * 3 * 2, "every run logged: {text}");
    // Ends before starts at the same instant: a handover is not an overlap.
    events.sort_unstable();
    let (mut running, mut most) = (0, 0);
    for (_, change) in events {
        running += change;
        most = most.max(running);
    }
    assert!(most <= 3, "{most} commands ran at once under --limit 3");
    assert!(most >= 2, "eight contenders never ran two commands at once");
}

/// Three holders of a semaphore of three permits; a fourth waits. One
/// holder's `distlock` is SIGKILLed: its command dies with it and its
/// permit comes back, to the waiter, within `bound`.
pub fn a_killed_holders_permit_returns_within(url: &str, key: &str, ttl: &str, bound: Duration) {
    let run = |command: &[&str], wait: &str| {
        Command::new(BIN)
            .args([
                "run", "--url", url, "--key", key, "--limit", "3", "--ttl", ttl,
            ])
            .args(["--wait", wait, "--"])
            .args(command)
            .stderr(Stdio::null())
            .spawn()
            .expect("start distlock run --limit")
    };
    let mut holders: Vec<Child> = (0..3).map(|_| run(&["sleep", "60"], "10s")).collect();
    wait_until("three permits held", Duration::from_secs(20), || {
        permits_held(url, key) == 3
    });
    let mut waiter = run(&["true"], "30s");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        waiter.try_wait().expect("try_wait").is_none(),
        "all three permits are held"
    );
    let killed = Instant::now();
    holders[0].kill().expect("SIGKILL a holder");
    assert_eq!(wait_for_exit(&mut waiter, Duration::from_secs(30)), 0);
    let took = killed.elapsed();
    eprintln!("{url}: the killed holder's permit came back after {took:?}");
    assert!(took < bound, "{took:?}, past {bound:?}");
    for holder in &mut holders {
        let _ = holder.kill();
        let _ = holder.wait();
    }
}

/// How many permits of `key`'s semaphore of three `distlock status` counts.
fn permits_held(url: &str, key: &str) -> usize {
    let output = Command::new(BIN)
        .args([
            "status", "--url", url, "--key", key, "--limit", "3", "--json",
        ])
        .output()
        .expect("distlock status --limit");
    serde_json::from_slice::<Vec<serde_json::Value>>(&output.stdout)
        .map(|held| held.len())
        .unwrap_or(0)
}

/// Both checks on `url`, whose locks outlive a killed holder by `ttl` at
/// most (`bound` for its permit to come back).
pub fn eight_loops_and_a_killed_holder(url: &str, ttl: &str, bound: Duration) {
    eight_loops_never_run_more_than_three_commands(url, "import");
    a_killed_holders_permit_returns_within(url, "killed", ttl, bound);
}

#[test]
fn file_limit_never_runs_more_than_three_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    eight_loops_never_run_more_than_three_commands(&url, "import");
}

#[test]
fn file_killed_holders_permit_returns_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    a_killed_holders_permit_returns_within(&url, "import", "5s", Duration::from_secs(2));
}

/// `distlock status --limit` names every permit holder, and the contention
/// message says the permits are full.
#[test]
fn status_lists_the_permit_holders_and_a_full_semaphore_exits_75() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    let mut holder = Command::new(BIN)
        .args([
            "run", "--url", &url, "--key", "api", "--limit", "1", "--", "sleep", "30",
        ])
        .spawn()
        .expect("a holder");
    wait_until("the permit is held", Duration::from_secs(10), || {
        Command::new(BIN)
            .args(["status", "--url", &url, "--key", "api", "--limit", "1"])
            .output()
            .is_ok_and(|o| o.status.code() == Some(0))
    });
    let status = Command::new(BIN)
        .args(["status", "--url", &url, "--key", "api", "--limit", "1"])
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.starts_with("\"api\": 1 of 1 permits held"), "{text}");
    assert!(text.lines().any(|row| row.starts_with("api#0")), "{text}");
    let refused = Command::new(BIN)
        .args([
            "run", "--url", &url, "--key", "api", "--limit", "1", "--", "true",
        ])
        .output()
        .expect("a second run");
    assert_eq!(refused.status.code(), Some(75));
    assert!(
        stderr(&refused).contains("all 1 permits of \"api\" are held elsewhere"),
        "{}",
        stderr(&refused)
    );
    let _ = holder.kill();
    let _ = holder.wait();
}
