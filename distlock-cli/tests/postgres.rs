//! `distlock run` against a real PostgreSQL.
#![cfg(feature = "postgres")]

use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use test_servers::PostgresServer;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn wait_until(what: &str, within: Duration, mut condition: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < within,
            "{what} did not happen within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    started.elapsed()
}

fn run(url: &str, key: &str, command: &[&str]) -> Child {
    Command::new(BIN)
        .args(["run", "--url", url, "--key", key, "--"])
        .args(command)
        .spawn()
        .expect("spawn distlock")
}

/// `distlock run --key KEY -- true`, waited for.
fn try_once(url: &str, key: &str) -> Output {
    Command::new(BIN)
        .args(["run", "--url", url, "--key", key, "--", "true"])
        .output()
        .expect("run distlock")
}

#[test]
fn run_holds_an_advisory_lock_while_the_command_runs_and_frees_it_after() {
    let server = PostgresServer::start();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    let script = format!(
        "echo \"$DISTLOCK_FENCING_TOKEN\" > {}; sleep 1",
        out.display()
    );
    let mut child = run(&server.url(), "pg-job", &["sh", "-c", &script]);
    wait_until(
        "the advisory lock is granted",
        Duration::from_secs(10),
        || !server.advisory_locks().is_empty(),
    );
    assert_eq!(server.advisory_locks().len(), 1);
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(
        server.advisory_locks().is_empty(),
        "released after the command exited"
    );
    let token: u64 = std::fs::read_to_string(&out)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(token >= 1);

    // A second run gets a larger fencing token.
    let output = Command::new(BIN)
        .args([
            "run",
            "--url",
            &server.url(),
            "--key",
            "pg-job",
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_FENCING_TOKEN",
        ])
        .output()
        .unwrap();
    let next: u64 = String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(next > token, "token {next} after {token}");
}

#[test]
fn a_sigkilled_holder_frees_its_lock_within_a_second_or_two() {
    let server = PostgresServer::start();
    let mut holder = run(&server.url(), "pg-crash", &["sleep", "60"]);
    wait_until(
        "the holder's lock is granted",
        Duration::from_secs(10),
        || server.advisory_locks().len() == 1,
    );

    let contender = try_once(&server.url(), "pg-crash");
    assert_eq!(
        contender.status.code(),
        Some(75),
        "held while the holder lives"
    );

    holder.kill().unwrap();
    holder.wait().unwrap();
    let freed_after = wait_until(
        "the server drops the dead holder's lock",
        Duration::from_secs(2),
        || server.advisory_locks().is_empty(),
    );
    eprintln!("advisory lock gone {freed_after:?} after SIGKILL");
    let next = try_once(&server.url(), "pg-crash");
    assert_eq!(
        next.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
}

#[test]
fn a_wrong_password_exits_69_without_printing_it() {
    let server = PostgresServer::start_with(test_servers::PostgresOptions {
        password: Some("right-one".into()),
        ..Default::default()
    });
    let url = server.url().replace("right-one", "wrong-secret");
    assert!(
        url.contains("wrong-secret"),
        "the URL carries the password: {url}"
    );
    let output = Command::new(BIN)
        .args(["run", "--url", &url, "--key", "k", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("wrong-secret"),
        "password leaked: {stderr}"
    );
}
