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

/// `distlock completions bash` is a script bash loads, and its function
/// completes a subcommand from a prefix; zsh's and fish's are generated too.
#[test]
fn the_bash_completion_loads_and_completes_a_subcommand() {
    let script = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .expect("run distlock completions");
    assert_eq!(code(&script), 0, "{}", stderr(&script));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("distlock.bash");
    std::fs::write(&path, &script.stdout).expect("write the script");
    // What bash does when the user types `distlock ru<TAB>`.
    let completed = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_WORDS=(distlock ru); COMP_CWORD=1; COMP_LINE='distlock ru'; \
             COMP_POINT=11; _distlock distlock ru distlock; echo \"${{COMPREPLY[@]}}\"",
            path.display()
        ))
        .output()
        .expect("run bash");
    assert_eq!(code(&completed), 0, "{}", stderr(&completed));
    assert_eq!(String::from_utf8_lossy(&completed.stdout).trim(), "run");
    for (shell, first_line) in [("zsh", "#compdef distlock"), ("fish", "# Print an optspec")] {
        let output = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .expect("run distlock completions");
        assert_eq!(code(&output), 0, "{shell}: {}", stderr(&output));
        assert!(
            String::from_utf8_lossy(&output.stdout).starts_with(first_line),
            "{shell}"
        );
    }
}

/// `distlock man` and `distlock man run` are roff pages `man -l` renders.
#[test]
fn man_renders_the_pages_of_distlock_and_its_subcommands() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (args, page, says) in [
        (&["man"][..], "distlock.1", "flock(1) for a fleet"),
        (&["man", "run"][..], "distlock-run.1", "--kill-after"),
    ] {
        let roff = Command::new(BIN)
            .args(args)
            .output()
            .expect("run distlock man");
        assert_eq!(code(&roff), 0, "{args:?}: {}", stderr(&roff));
        let path = dir.path().join(page);
        std::fs::write(&path, &roff.stdout).expect("write the page");
        let rendered = Command::new("man")
            .arg("-l")
            .arg(&path)
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .expect("man -l (Debian: apt-get install man-db)");
        assert_eq!(code(&rendered), 0, "{args:?}: {}", stderr(&rendered));
        let text = String::from_utf8_lossy(&rendered.stdout);
        let title = page.trim_end_matches(".1");
        assert!(
            text.starts_with(&format!("{title}(1)")) && text.contains(says),
            "{args:?}: {text}"
        );
    }
    let output = Command::new(BIN)
        .args(["man", "nope"])
        .output()
        .expect("run");
    assert_eq!(code(&output), 64);
    assert!(
        stderr(&output).contains("pages exist for: run, release, elect"),
        "{}",
        stderr(&output)
    );
}
