//! What the CLI does with input a new user gets wrong, and the
//! conventions a command-line tool is expected to keep: usage errors
//! exit 64 with the reason and the next step, warnings only for what the
//! user chose, no colour codes in files, set-up failures exit 70.

use std::process::{Command, Output};
use std::time::Duration;

use crate::support::{code, stderr, BIN};

/// `distlock ARGS` on a lock directory of its own, run to completion,
/// with stderr a file (a pipe) and `RUST_LOG` unset.
fn distlock(dir: &tempfile::TempDir, args: &[&str]) -> Output {
    Command::new(BIN)
        .env("DISTLOCK_URL", format!("file://{}", dir.path().display()))
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .args(args)
        .output()
        .expect("run distlock")
}

#[test]
fn a_ttl_too_short_to_run_a_command_is_a_usage_error_naming_the_minimum() {
    let dir = tempfile::tempdir().expect("temp dir");
    for subcommand in ["run", "elect"] {
        let output = distlock(
            &dir,
            &[subcommand, "--key", "k", "--ttl", "100ms", "--", "true"],
        );
        assert_eq!(code(&output), 64, "{subcommand}: {}", stderr(&output));
        let said = stderr(&output);
        assert!(
            said.contains("100ms is too short") && said.contains("250ms"),
            "{subcommand}: {said}"
        );
    }
    let output = distlock(&dir, &["run", "--key", "k", "--ttl", "250ms", "--", "true"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
}

#[test]
fn an_unknown_log_level_is_refused_not_read_as_a_target() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = distlock(
        &dir,
        &["--log-level", "bogus", "run", "--key", "k", "--", "true"],
    );
    assert_eq!(code(&output), 64, "{}", stderr(&output));
    let said = stderr(&output);
    assert!(
        said.contains("unknown level \"bogus\"") && said.contains("distlock=debug"),
        "{said}"
    );
    for accepted in ["INFO", "warn,distlock=debug", "off"] {
        let output = distlock(
            &dir,
            &["--log-level", accepted, "run", "--key", "k", "--", "true"],
        );
        assert_eq!(code(&output), 0, "{accepted}: {}", stderr(&output));
    }
}

#[test]
fn logs_written_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("stderr");
    // `distlock cron` logs an info line once its jobs are scheduled.
    let mut cron = Command::new(BIN)
        .env("DISTLOCK_URL", format!("file://{}", dir.path().display()))
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .args(["--log-level", "info", "cron", "--name", "yearly"])
        .args(["--schedule", "0 0 1 1 *", "--", "true"])
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start distlock cron");
    crate::support::wait_until("the scheduled line", Duration::from_secs(10), || {
        std::fs::read_to_string(&log).is_ok_and(|said| said.contains("scheduled"))
    });
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(cron.id() as i32, libc::SIGTERM) };
    assert_eq!(
        crate::support::wait_for_exit(&mut cron, Duration::from_secs(10)),
        0
    );
    let said = std::fs::read_to_string(&log).expect("read the log");
    assert!(said.contains("INFO"), "{said}");
    assert!(!said.contains('\u{1b}'), "escape codes in a file: {said:?}");
}

#[test]
fn kill_after_is_capped_with_a_warning_only_when_the_user_chose_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = distlock(&dir, &["run", "--key", "k", "--ttl", "2s", "--", "true"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(stderr(&output), "", "the default is capped silently");
    let output = distlock(
        &dir,
        &[
            "run",
            "--key",
            "k",
            "--ttl",
            "2s",
            "--kill-after",
            "10s",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--kill-after 10s is capped at 880ms"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn metrics_addr_takes_a_host_name_and_a_busy_port_is_a_set_up_failure() {
    let dir = tempfile::tempdir().expect("temp dir");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = busy.local_addr().expect("addr").port();
    let output = distlock(
        &dir,
        &[
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "run",
            "--key",
            "k",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&output), 70, "{}", stderr(&output));
    assert!(
        stderr(&output).contains("is the port in use?"),
        "{}",
        stderr(&output)
    );
    drop(busy);

    let port = test_servers::free_port();
    let output = distlock(
        &dir,
        &[
            "--metrics-addr",
            &format!("localhost:{port}"),
            "run",
            "--key",
            "k",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let output = distlock(
        &dir,
        &[
            "--metrics-addr",
            "no-such-host.invalid:9100",
            "run",
            "--key",
            "k",
            "--",
            "true",
        ],
    );
    assert_eq!(code(&output), 64, "{}", stderr(&output));
    assert!(
        stderr(&output).contains("does not resolve"),
        "{}",
        stderr(&output)
    );
}
