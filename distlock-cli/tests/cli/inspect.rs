//! `distlock status`, `distlock list` and `distlock release --force` end to
//! end: a `distlock run` in another process holds the lock, and the
//! inspecting commands see that process's pid and command.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_servers::RedisServer;

use crate::support::{code, stderr, wait_for_exit, BIN};

/// `distlock ARGS`, run to completion.
fn distlock(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run distlock")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `distlock run --url URL --key KEY --ttl TTL -- sleep 60` in the
/// background, once `distlock status` reports the lock held.
fn hold(url: &str, key: &str, ttl: &str) -> Child {
    let child = Command::new(BIN)
        .args([
            "run", "--url", url, "--key", key, "--ttl", ttl, "--", "sleep", "60",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("start distlock run");
    let deadline = Instant::now() + Duration::from_secs(10);
    while code(&distlock(&["status", "--url", url, "--key", key])) != 0 {
        assert!(Instant::now() < deadline, "distlock run never took {key:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// What every backend's `status` must show of a `distlock run` holder.
fn assert_status_shows_the_holder(url: &str, key: &str, holder: &Child) {
    let pid = holder.id();
    let output = distlock(&["status", "--url", url, "--key", key]);
    assert_eq!(code(&output), 0, "held: {}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains(&format!("{key:?} is held")), "{text}");
    assert!(text.contains(&format!("pid       {pid}\n")), "{text}");
    assert!(text.contains("label     sleep 60\n"), "{text}");

    let output = distlock(&["status", "--url", url, "--key", key, "--json"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("status --json");
    assert_eq!(json["key"], key);
    assert_eq!(json["held"], true);
    assert_eq!(json["holder"]["pid"], pid);
    assert_eq!(json["holder"]["label"], "sleep 60");
    assert!(json["granted_unix_ms"].as_u64().is_some(), "{json}");
    assert!(
        json["granted"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{json}"
    );
}

#[test]
fn status_list_and_force_release_of_a_redis_lock_held_by_distlock_run() {
    let server = RedisServer::start();
    let url = server.url();
    let key = "jobs/nightly";
    let mut holder = hold(&url, key, "3s");
    assert_status_shows_the_holder(&url, key, &holder);
    let pid = holder.id();

    let json: serde_json::Value = serde_json::from_slice(
        &distlock(&["status", "--url", &url, "--key", key, "--json"]).stdout,
    )
    .expect("status --json");
    assert_eq!(json["ttl_ms"], 3000);
    assert_eq!(json["fencing_token"], 1);
    assert_eq!(json["granted_clock"], "server");
    assert!(
        json["ttl_left_ms"].as_u64().is_some_and(|ms| ms <= 3000),
        "{json}"
    );
    assert_eq!(json["session"], serde_json::Value::Null);

    // A lock outside the prefix, and one held by a client without a record.
    let other = hold(&url, "other", "30s");
    server.cli(&["SET", "lock:{jobs/py}", "foreign", "PX", "30000"]);
    let output = distlock(&["list", "--url", &url, "--prefix", "jobs/"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let table = stdout(&output);
    eprintln!("distlock list:\n{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two locks: {table}");
    assert!(lines[0].starts_with("KEY"), "{table}");
    assert!(lines[1].starts_with("jobs/nightly"), "sorted: {table}");
    assert!(lines[1].contains(&format!(" {pid} ")), "{table}");
    assert!(lines[1].contains("sleep 60"), "{table}");
    assert!(
        lines[2].starts_with("jobs/py") && lines[2].contains("(unknown holder)"),
        "{table}"
    );
    let output = distlock(&["list", "--url", &url, "--json"]);
    let listed: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).expect("list --json");
    let keys: Vec<&str> = listed.iter().filter_map(|l| l["key"].as_str()).collect();
    assert_eq!(keys, ["jobs/nightly", "jobs/py", "other"]);
    assert_eq!(listed[1]["holder"], serde_json::Value::Null);
    stop(other);

    // --terminate-session is not a Redis thing: 77, nothing freed.
    let output = distlock(&[
        "release",
        "--url",
        &url,
        "--key",
        key,
        "--force",
        "--terminate-session",
    ]);
    assert_eq!(code(&output), 77, "{}", stderr(&output));
    assert_eq!(code(&distlock(&["status", "--url", &url, "--key", key])), 0);

    let output = distlock(&["release", "--url", &url, "--key", key, "--force"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let said = stdout(&output);
    assert!(
        said.contains(&format!("pid {pid}: sleep 60")) && said.contains("fencing token 1"),
        "names whom it evicted: {said}"
    );
    // The evicted `distlock run` notices at its next refresh (every ttl/3)
    // and stops its command: exit 76.
    assert_eq!(wait_for_exit(&mut holder, Duration::from_secs(10)), 76);

    let output = distlock(&["status", "--url", &url, "--key", key]);
    assert_eq!(code(&output), 1, "free: {}", stderr(&output));
    assert_eq!(stdout(&output), format!("{key:?} is free\n"));
    let json: serde_json::Value = serde_json::from_slice(
        &distlock(&["status", "--url", &url, "--key", key, "--json"]).stdout,
    )
    .expect("status --json of a free key");
    assert_eq!(json["held"], false);
    let output = distlock(&["release", "--url", &url, "--key", key, "--force"]);
    assert_eq!(code(&output), 1, "nothing held: {}", stderr(&output));
}

#[test]
fn status_of_a_file_lock_held_by_distlock_run_and_why_it_cannot_be_forced() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("file://{}", dir.path().display());
    let key = "backup";
    let holder = hold(&url, key, "30s");
    assert_status_shows_the_holder(&url, key, &holder);
    let output = distlock(&["release", "--url", &url, "--key", key, "--force"]);
    assert_eq!(code(&output), 77, "{}", stderr(&output));
    assert!(
        stderr(&output).contains(&holder.id().to_string()),
        "names the process to stop: {}",
        stderr(&output)
    );
    stop(holder);
}

#[test]
fn exit_codes_for_bad_usage_and_an_unreachable_backend() {
    for args in [
        &["status"][..],
        &["status", "--key", ""],
        &["release", "--key", "k", "--force", "--owner", "x"],
        &[
            "release",
            "--key",
            "k",
            "--terminate-session",
            "--owner",
            "x",
        ],
        &["list", "--bogus"],
    ] {
        let output = distlock(args);
        assert_eq!(code(&output), 64, "{args:?}: {}", stderr(&output));
    }
    // Nothing listens on port 1.
    for args in [
        &["status", "--key", "k"][..],
        &["list"],
        &["release", "--key", "k", "--force"],
    ] {
        let mut args = args.to_vec();
        args.extend(["--url", "redis://127.0.0.1:1"]);
        let output = distlock(&args);
        assert_eq!(code(&output), 69, "{args:?}: {}", stderr(&output));
    }
}

#[test]
fn status_names_a_cron_jobs_claims_by_job_and_command() {
    let server = RedisServer::start();
    let url = server.url();
    let mut cron = Command::new(BIN)
        .args([
            "cron",
            "--url",
            &url,
            "--name",
            "report",
            "--schedule",
            "* * * * * *",
            "--at-most",
            "30s",
            "--",
            "sleep",
            "5",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start distlock cron");
    // The job's key is held while a run lasts (overlap forbidden).
    let deadline = Instant::now() + Duration::from_secs(10);
    let json = loop {
        let output = distlock(&["status", "--url", &url, "--key", "cron:report", "--json"]);
        if code(&output) == 0 {
            break serde_json::from_slice::<serde_json::Value>(&output.stdout).expect("json");
        }
        assert!(Instant::now() < deadline, "no run of the job started");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        json["holder"]["label"], "cron job report: sleep 5",
        "{json}"
    );
    assert_eq!(json["holder"]["pid"], cron.id());
    // SIGTERM: a graceful shutdown.
    // SAFETY: a plain kill(2) of our own child.
    unsafe { libc::kill(cron.id() as i32, libc::SIGTERM) };
    let _ = wait_for_exit(&mut cron, Duration::from_secs(40));
}

/// A holder force-released while its command ignores SIGTERM: the lock's
/// validity is over, so the group is SIGKILLed at once whatever
/// `--kill-after` says, and distlock says that is why (not that the
/// command "did not exit after SIGTERM").
#[test]
fn a_forced_release_says_why_the_command_was_killed_before_kill_after() {
    let server = RedisServer::start();
    let url = server.url();
    let key = "stubborn";
    let mut holder = Command::new(BIN)
        .args([
            "run",
            "--url",
            &url,
            "--key",
            key,
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            "trap '' TERM; sleep 60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start distlock run");
    let deadline = Instant::now() + Duration::from_secs(10);
    while code(&distlock(&["status", "--url", &url, "--key", key])) != 0 {
        assert!(Instant::now() < deadline, "distlock run never took {key:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = distlock(&["release", "--url", &url, "--key", key, "--force"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(wait_for_exit(&mut holder, Duration::from_secs(10)), 76);
    let mut said = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().expect("piped"), &mut said)
        .expect("read stderr");
    assert!(
        said.contains("without waiting out --kill-after 1s")
            && said.contains("the lock may already be someone else's"),
        "{said}"
    );
    assert!(!said.contains("did not exit within"), "{said}");
}
