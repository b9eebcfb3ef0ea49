//! `distlock run` against a real MariaDB (`mysql://`). One server for the
//! module: its startup is the slow part.

use std::process::{Child, Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use test_servers::MariaDbServer;

use crate::support::{alive, stderr, BIN};

fn server() -> &'static MariaDbServer {
    static SERVER: OnceLock<MariaDbServer> = OnceLock::new();
    SERVER.get_or_init(MariaDbServer::start)
}

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

fn run(key: &str, command: &[&str]) -> Child {
    Command::new(BIN)
        .args(["run", "--url", &server().url(), "--key", key, "--"])
        .args(command)
        .spawn()
        .expect("spawn distlock")
}

/// `distlock run --key KEY -- true`, waited for.
fn try_once(key: &str) -> Output {
    Command::new(BIN)
        .args(["run", "--url", &server().url(), "--key", key, "--", "true"])
        .output()
        .expect("run distlock")
}

/// The connection holding `key`'s lock (its name is the key: a plain key).
fn holder(key: &str) -> Option<u64> {
    server().lock_holder(key)
}

#[test]
fn run_holds_the_lock_while_the_command_runs_and_frees_it_after() {
    let key = format!("cli-job-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    let script = format!(
        "echo \"$DISTLOCK_FENCING_TOKEN\" > {}; sleep 1",
        out.display()
    );
    let mut child = run(&key, &["sh", "-c", &script]);
    wait_until("the lock is granted", Duration::from_secs(10), || {
        holder(&key).is_some()
    });
    let contender = try_once(&key);
    assert_eq!(contender.status.code(), Some(75), "held while CMD runs");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(holder(&key), None, "released after the command exited");
    let token: u64 = std::fs::read_to_string(&out)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(token >= 1);

    // A second run gets a larger fencing token, and CMD's exit code.
    let output = Command::new(BIN)
        .args(["run", "--url", &server().url(), "--key", &key, "--"])
        .args(["sh", "-c", "echo $DISTLOCK_FENCING_TOKEN; exit 3"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let next: u64 = String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(next > token, "token {next} after {token}");
}

#[test]
fn a_sigkilled_holder_frees_its_lock_at_once_and_its_command_is_stopped() {
    let key = format!("cli-crash-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut holder_process = run(&key, &["sh", "-c", &script]);
    wait_until(
        "the holder's lock is granted",
        Duration::from_secs(10),
        || holder(&key).is_some() && pid_file.exists(),
    );
    let command: u32 = wait_until_parsed(&pid_file);
    assert_eq!(
        try_once(&key).status.code(),
        Some(75),
        "held while the holder lives"
    );

    holder_process.kill().unwrap();
    holder_process.wait().unwrap();
    // The kernel closes the dead holder's socket; the server ends its
    // session and frees the lock at once (the documented bound).
    let freed_after = wait_until(
        "the server drops the dead holder's lock",
        Duration::from_secs(2),
        || holder(&key).is_none(),
    );
    eprintln!("lock gone {freed_after:?} after SIGKILL of distlock run");
    // distlock's watchdog stops CMD once distlock is gone.
    wait_until(
        "the orphaned command is stopped",
        Duration::from_secs(10),
        || !alive(command),
    );
    let next = try_once(&key);
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
}

fn wait_until_parsed(path: &std::path::Path) -> u32 {
    let mut pid = None;
    wait_until("the command writes its pid", Duration::from_secs(5), || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse().ok());
        pid.is_some()
    });
    pid.unwrap_or_default()
}

#[test]
fn a_wrong_password_exits_69_without_printing_it() {
    let url = server()
        .url()
        .replace(MariaDbServer::PASSWORD, "wrong-secret");
    assert!(url.contains("wrong-secret"));
    let output = Command::new(BIN)
        .args(["run", "--url", &url, "--key", "k", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    let stderr = stderr(&output);
    assert!(stderr.contains("Access denied"), "{stderr}");
    assert!(
        !stderr.contains("wrong-secret"),
        "password leaked: {stderr}"
    );
}

#[test]
fn the_release_clears_the_holder_columns_of_the_fencing_row() {
    let key = format!("cli-dump-{}", std::process::id());
    let mut child = run(
        &key,
        &["sh", "-c", "sleep 1", "dump-job", "--password=hunter2"],
    );
    wait_until("the lock is granted", Duration::from_secs(10), || {
        holder(&key).is_some()
    });
    let columns = format!(
        "SELECT token, holder_pid IS NULL, holder_host IS NULL, holder_label FROM distlock.distlock_fencing \
         WHERE key_name = '{key}'"
    );
    let row = server().sql(&columns);
    assert!(
        row.ends_with("0\t0\tsh -c sleep 1 dump-job --password=***"),
        "while held: {row:?}"
    );
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(holder(&key), None, "released");
    // The token stays; nothing names the holder any more.
    let row = server().sql(&columns);
    assert!(row.ends_with("\t1\t1\tNULL"), "after release: {row:?}");
}
