//! `distlock cron` end to end: three replica processes on one backend, a
//! schedule every second, a shared log every run appends its scheduled
//! instant to (O_APPEND), and a `kill -9` of one replica in the middle of a
//! run. Each backend's test calls [`three_replicas`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::{code, stderr, wait_for_exit, BIN};

/// How long the replicas run: past 30 ticks with the edges cut off.
const RUN_FOR: Duration = Duration::from_secs(36);
/// The claims' ttl: on Redis a killed replica's claims lapse after this.
const AT_MOST: &str = "3s";

/// Ticks, duplicates and misses of one three-replica run.
#[derive(Debug)]
pub struct Tally {
    pub ticks: usize,
    pub duplicates: Vec<String>,
    pub misses: Vec<String>,
    /// Misses within the window a killed holder's claims may block.
    pub misses_after_kill: Vec<String>,
}

pub fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn replica(url: &str, dir: &Path, id: &str, log: &Path) -> Child {
    let stderr = std::fs::File::create(dir.join(format!("{id}.err"))).unwrap();
    Command::new(BIN)
        .args([
            "cron",
            "--url",
            url,
            "--name",
            "ticker",
            "--schedule",
            "* * * * * *",
            "--at-most",
            AT_MOST,
            "--grace",
            "5s",
            "--replica-id",
            id,
            "--",
            "sh",
            "-c",
            // Appends first, then lasts a while, so a kill can land mid-run.
            "echo \"$DISTLOCK_SCHEDULED_AT $DISTLOCK_REPLICA\" >> \"$LOG\"; sleep 0.4",
        ])
        .env("LOG", log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn distlock cron")
}

fn read_log(log: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (at, who) = line.split_once(' ')?;
            Some((at.to_owned(), who.to_owned()))
        })
        .collect()
}

/// Three replicas for [`RUN_FOR`]; r0 is SIGKILLed in the middle of one of
/// its runs about halfway. Returns the tally over the window that every
/// replica was up for (its first and last two seconds cut: a replica may
/// still be connecting, or already shutting down, then).
pub fn three_replicas(url: &str, backend: &str) -> Tally {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let started = now_secs();
    let mut replicas: Vec<Child> = ["r0", "r1", "r2"]
        .iter()
        .map(|id| replica(url, dir.path(), id, &log))
        .collect();
    let began = Instant::now();
    // Kill r0 while it runs a tick (its line is in the log, its command
    // sleeps), after about half the run.
    let mut seen = 0;
    while began.elapsed() < RUN_FOR / 2 + Duration::from_secs(8) {
        let lines = read_log(&log);
        let fresh = lines.len() > seen && lines.last().is_some_and(|(_, who)| who == "r0");
        seen = lines.len();
        if began.elapsed() >= RUN_FOR / 2 && fresh {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    test_servers::signal(replicas[0].id(), libc::SIGKILL);
    let killed_at = now_secs();
    let killed = replicas.remove(0);
    reap(killed);
    while began.elapsed() < RUN_FOR {
        std::thread::sleep(Duration::from_millis(100));
    }
    let stopped = now_secs();
    for child in &replicas {
        test_servers::signal(child.id(), libc::SIGTERM);
    }
    for (i, child) in replicas.iter_mut().enumerate() {
        let status = wait_for_exit(child, Duration::from_secs(20));
        let err = std::fs::read_to_string(dir.path().join(format!("r{}.err", i + 1))).unwrap();
        assert_eq!(status, 0, "r{} after SIGTERM: {err}", i + 1);
    }
    let window = (started + 2)..=(stopped - 2);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (at, _) in read_log(&log) {
        *counts.entry(at).or_default() += 1;
    }
    let duplicates: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(at, n)| format!("{at} x{n}"))
        .collect();
    let at_most = humantime::parse_duration(AT_MOST).unwrap().as_secs();
    let (mut misses, mut misses_after_kill) = (Vec::new(), Vec::new());
    let mut ticks = 0;
    for secs in window.clone() {
        let at = rfc3339(secs);
        if counts.contains_key(&at) {
            ticks += 1;
        } else if (killed_at.saturating_sub(1)..=killed_at + at_most + 1).contains(&secs) {
            misses_after_kill.push(at);
        } else {
            misses.push(at);
        }
    }
    let tally = Tally {
        ticks,
        duplicates,
        misses,
        misses_after_kill,
    };
    println!(
        "{backend}: three replicas, {} s window, r0 killed at {}: ticks {}, duplicates {}, misses {} (+{} within {AT_MOST} of the kill)",
        window.end() - window.start() + 1,
        rfc3339(killed_at),
        tally.ticks,
        tally.duplicates.len(),
        tally.misses.len(),
        tally.misses_after_kill.len(),
    );
    if !tally.misses_after_kill.is_empty() {
        println!(
            "{backend}: missed near the kill: {:?}",
            tally.misses_after_kill
        );
        for id in ["r1", "r2"] {
            let err = std::fs::read_to_string(dir.path().join(format!("{id}.err"))).unwrap();
            for at in &tally.misses_after_kill {
                for line in err.lines().filter(|l| l.contains(at.as_str())) {
                    println!("  {line}");
                }
            }
        }
    }
    // Every surviving replica logged one line per tick it saw.
    for id in ["r1", "r2"] {
        let err = std::fs::read_to_string(dir.path().join(format!("{id}.err"))).unwrap();
        for secs in (killed_at + at_most + 2)..=(stopped - 2) {
            let at = rfc3339(secs);
            let lines = err
                .lines()
                .filter(|l| l.contains(&format!("tick {at} on {id}:")))
                .count();
            assert_eq!(lines, 1, "{id}: one log line for tick {at}:\n{err}");
        }
    }
    tally
}

fn reap(mut child: Child) {
    let _ = child.wait();
}

/// The assertions every backend's run must pass.
pub fn assert_exactly_once(tally: &Tally) {
    assert!(tally.ticks >= 30, "at least 30 ticks: {tally:?}");
    assert!(tally.duplicates.is_empty(), "duplicates: {tally:?}");
    assert!(
        tally.misses.is_empty(),
        "misses away from the kill: {tally:?}"
    );
}

#[test]
fn three_file_replicas_run_every_second_exactly_once_through_a_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let tally = three_replicas(&url, "file");
    assert_exactly_once(&tally);
    // The kernel frees a dead holder's locks at once: at most the tick it
    // was running is missing (it had appended already, so none).
    assert!(tally.misses_after_kill.len() <= 1, "{tally:?}");
}

fn cron(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("cron")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run distlock cron")
}

#[test]
fn bad_schedules_zones_and_config_files_are_one_clear_error_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let locks = dir.path().join("locks");
    let url = format!("file://{}", locks.display());
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--name".into(),
                "nightly".into(),
                "--schedule".into(),
                "61 * * * *".into(),
            ],
            "invalid cron schedule: job \"nightly\": schedule \"61 * * * *\"",
        ),
        (
            vec![
                "--name".into(),
                "nightly".into(),
                "--schedule".into(),
                "* * * * *".into(),
                "--tz".into(),
                "Mars/Base".into(),
            ],
            "invalid time zone: job \"nightly\": \"Mars/Base\" is not an IANA time zone",
        ),
        (
            vec![
                "--name".into(),
                "a@b".into(),
                "--schedule".into(),
                "* * * * *".into(),
            ],
            "invalid job name",
        ),
    ];
    for (args, message) in cases {
        let mut all: Vec<String> = vec!["--url".into(), url.clone()];
        all.extend(args);
        all.extend(["--".into(), "sh".into(), "-c".into(), touch.clone()]);
        let output = cron(&all.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code(&output), 64, "{}", stderr(&output));
        let err = stderr(&output);
        assert!(err.contains(message), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    let config = dir.path().join("jobs.toml");
    std::fs::write(
        &config,
        format!(
            "[[job]]\nname = \"good\"\nschedule = \"* * * * * *\"\ncommand = [\"sh\", \"-c\", \"{touch}\"]\n\n[[job]]\nname = \"bad\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\nat_least = \"forever\"\n"
        ),
    )
    .unwrap();
    let output = cron(&["--url", &url, "--config", config.to_str().unwrap()]);
    assert_eq!(code(&output), 64, "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("jobs.toml: job \"bad\": at_least:"), "{err}");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!marker.exists(), "nothing ran, not even the good job");
    assert!(!locks.exists(), "the backend was not even opened");
}

/// Runs `distlock cron` with `args` until `until` holds for its stderr (or
/// 20 s pass), then SIGTERMs it and returns its exit code and stderr.
pub fn cron_until(
    args: &[&str],
    until: impl Fn(&str) -> bool,
) -> (i32, String, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("err");
    let out = dir.path().join("out");
    let mut child = Command::new(BIN)
        .arg("cron")
        .args(args)
        .env("OUT", &out)
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if until(&std::fs::read_to_string(&err_path).unwrap_or_default()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    test_servers::signal(child.id(), libc::SIGTERM);
    let status = wait_for_exit(&mut child, Duration::from_secs(30));
    (
        status,
        std::fs::read_to_string(&err_path).unwrap(),
        out,
        dir,
    )
}

#[test]
fn each_run_gets_the_job_the_instant_the_key_and_a_fencing_token() {
    let locks = tempfile::tempdir().unwrap();
    let url = format!("file://{}", locks.path().display());
    let script = "echo \"$DISTLOCK_JOB|$DISTLOCK_SCHEDULED_AT|$DISTLOCK_KEY|$DISTLOCK_TICK_KEY|$DISTLOCK_FENCING_TOKEN|${#DISTLOCK_OWNER}|$DISTLOCK_REPLICA\" >> \"$OUT\"";
    let (status, err, out, _dir) = cron_until(
        &[
            "--url",
            &url,
            "--name",
            "envy",
            "--schedule",
            "* * * * * *",
            "--replica-id",
            "box-1",
            "--",
            "sh",
            "-c",
            script,
        ],
        |err| err.matches("ran: exit code 0").count() >= 2,
    );
    assert_eq!(status, 0, "{err}");
    let lines: Vec<Vec<String>> = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| l.split('|').map(str::to_owned).collect())
        .collect();
    assert!(lines.len() >= 2, "{lines:?}");
    for fields in &lines {
        assert_eq!(fields[0], "envy");
        assert!(
            fields[1].ends_with('Z') && fields[1].len() == 20,
            "RFC 3339 UTC: {fields:?}"
        );
        assert_eq!(fields[2], "cron:envy");
        assert_eq!(fields[3], format!("cron:envy@{}", fields[1]));
        assert_eq!(fields[5], "32", "the owner token: {fields:?}");
        assert_eq!(fields[6], "box-1");
    }
    let tokens: Vec<u64> = lines.iter().map(|f| f[4].parse().unwrap()).collect();
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "fencing tokens grow: {tokens:?}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("ran: exit code 0"))
        .unwrap();
    assert!(
        line.starts_with("distlock: cron job \"envy\" tick 20"),
        "{line}"
    );
    assert!(line.contains(" on box-1: ran: exit code 0 in "), "{line}");
}

#[test]
fn sigterm_lets_a_running_command_finish_within_the_grace_and_stops_one_that_outlasts_it() {
    let locks = tempfile::tempdir().unwrap();
    let url = format!("file://{}", locks.path().display());
    // Finishes within the grace: exit code 0, and no tick starts after SIGTERM.
    let script = "echo start >> \"$OUT\"; sleep 2; echo done >> \"$OUT\"";
    let started = Instant::now();
    let (status, err, out, _dir) = cron_until(
        &[
            "--url",
            &url,
            "--name",
            "slow",
            "--schedule",
            "* * * * * *",
            "--grace",
            "10s",
            "--",
            "sh",
            "-c",
            script,
        ],
        |_| started.elapsed() > Duration::from_millis(1500),
    );
    assert_eq!(status, 0, "{err}");
    let out = std::fs::read_to_string(out).unwrap();
    assert_eq!(out, "start\ndone\n", "{err}");
    assert!(err.contains("ran: exit code 0"), "{err}");
    // Outlasts a 1 s grace: SIGTERM to its group after the grace, exit 143.
    let started = Instant::now();
    let (status, err, out, _dir) = cron_until(
        &[
            "--url",
            &url,
            "--name",
            "stuck",
            "--schedule",
            "* * * * * *",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
            "echo start >> \"$OUT\"; exec sleep 60",
        ],
        |_| started.elapsed() > Duration::from_millis(1500),
    );
    assert_eq!(status, 0, "{err}");
    assert_eq!(std::fs::read_to_string(out).unwrap(), "start\n", "{err}");
    assert!(
        err.contains("ran: exit code 143 (killed by signal 15)"),
        "{err}"
    );
}

#[test]
fn jobs_from_a_config_file_run_side_by_side_and_each_gets_its_own_exit_code() {
    let locks = tempfile::tempdir().unwrap();
    let url = format!("file://{}", locks.path().display());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("jobs.toml");
    // Both run every second for 0.5 s: their runs overlap in time, so one
    // reaper must hand each its own status.
    std::fs::write(
        &config,
        "[[job]]\nname = \"ok\"\nschedule = \"* * * * * *\"\ncommand = [\"sh\", \"-c\", \"sleep 0.5; exit 0\"]\n\n\
         [[job]]\nname = \"three\"\nschedule = \"* * * * * *\"\ncommand = [\"sh\", \"-c\", \"sleep 0.5; exit 3\"]\noverlap = \"allow\"\nat_most = \"5s\"\n",
    )
    .unwrap();
    let (status, err, _out, _dir) = cron_until(
        &["--url", &url, "--config", config.to_str().unwrap()],
        |err| err.matches("job \"ok\"").count() >= 3 && err.matches("job \"three\"").count() >= 3,
    );
    assert_eq!(status, 0, "{err}");
    let ok: Vec<&str> = err.lines().filter(|l| l.contains("job \"ok\"")).collect();
    let three: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("job \"three\""))
        .collect();
    // "ok" forbids overlap: on a loaded machine a run can outlast the
    // second to the next tick, which is then skipped, never run twice.
    assert!(
        ok.iter().all(|l| l.contains("ran: exit code 0 in")
            || l.contains("skipped: previous run still running")),
        "{err}"
    );
    assert!(
        ok.iter().any(|l| l.contains("ran: exit code 0 in")),
        "{err}"
    );
    assert!(
        three.iter().all(|l| l.contains("ran: exit code 3 after")),
        "{err}"
    );
}
