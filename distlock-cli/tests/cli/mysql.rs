//! `distlock run` against a real MariaDB (`mysql://`). One server for the
//! module: its startup is the slow part.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use distlock::mysql::lock_name_in;
use test_servers::{MariaDbOptions, MariaDbServer};

use crate::cron::{now_secs, rfc3339};
use crate::support::{alive, stderr, wait_for_exit, wait_until, BIN};

/// `distlock run --key KEY -- COMMAND` against the shared server.
fn distlock_run(key: &str, command: &[&str]) -> Command {
    let url = MariaDbServer::shared().url();
    let mut run = Command::new(BIN);
    run.args(["run", "--url", &url, "--key", key, "--"])
        .args(command);
    run
}

fn run(key: &str, command: &[&str]) -> Child {
    distlock_run(key, command).spawn().expect("spawn distlock")
}

/// `distlock run --key KEY -- true`, waited for.
fn try_once(key: &str) -> Output {
    distlock_run(key, &["true"]).output().expect("run distlock")
}

/// The connection holding `key`'s lock (named in the namespace of the URL's
/// database).
fn holder(key: &str) -> Option<u64> {
    MariaDbServer::shared().lock_holder(&lock_name_in(MariaDbServer::DATABASE, key))
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
        .args([
            "run",
            "--url",
            &MariaDbServer::shared().url(),
            "--key",
            &key,
            "--",
        ])
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
    let url = MariaDbServer::shared()
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

/// The two services on one server: databases `svc_a…` and `svc_b…`,
/// each with a `distlock cron` job `cleanup` every second. Lock names are
/// server-wide, so without a namespace the two claimed one lock per tick
/// and each ran about half its ticks ("held elsewhere" for the rest).
#[test]
fn two_services_on_one_server_each_run_every_tick_of_their_own_cron_job() {
    let dir = tempfile::tempdir().unwrap();
    let services = ["svc_a", "svc_b"].map(|service| {
        let database = format!("{service}_{}", std::process::id());
        MariaDbServer::shared().sql(&format!(
            "CREATE DATABASE {database}; GRANT ALL ON {database}.* TO '{}'@'%'",
            MariaDbServer::USER
        ));
        let url = MariaDbServer::shared().url().replacen(
            &format!("/{}?", MariaDbServer::DATABASE),
            &format!("/{database}?"),
            1,
        );
        (service, url)
    });
    let started = now_secs();
    let mut crons: Vec<Child> = services
        .iter()
        .map(|(service, url)| {
            Command::new(BIN)
                .args(["cron", "--url", url, "--name", "cleanup"])
                .args(["--schedule", "* * * * * *", "--"])
                .args(["sh", "-c", "echo \"$DISTLOCK_SCHEDULED_AT\" >> \"$LOG\""])
                .env("LOG", dir.path().join(format!("{service}.log")))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.path().join(format!("{service}.err"))).unwrap())
                .spawn()
                .expect("spawn distlock cron")
        })
        .collect();
    std::thread::sleep(Duration::from_secs(9));
    let stopped = now_secs();
    for child in &crons {
        test_servers::signal(child.id(), libc::SIGTERM);
    }
    for child in &mut crons {
        wait_for_exit(child, Duration::from_secs(20));
    }
    // The ticks both were surely up for: the first two seconds may go to
    // connecting, the last two to shutting down.
    let window: Vec<String> = ((started + 2)..=(stopped - 2)).map(rfc3339).collect();
    assert!(window.len() >= 5, "{window:?}");
    for (service, _) in &services {
        let log =
            std::fs::read_to_string(dir.path().join(format!("{service}.log"))).unwrap_or_default();
        let err = std::fs::read_to_string(dir.path().join(format!("{service}.err"))).unwrap();
        let missed: Vec<&String> = window
            .iter()
            .filter(|tick| log.lines().filter(|line| line == tick).count() != 1)
            .collect();
        assert!(
            missed.is_empty(),
            "{service} did not run exactly once at {missed:?}; its log:\n{log}\nits stderr:\n{err}"
        );
    }
}

/// `url` without its `ssl-mode`: the CLI's default applies.
fn without_ssl_mode(url: &str) -> String {
    let url = url
        .replace("?ssl-mode=DISABLED", "?")
        .replace("?ssl-mode=PREFERRED", "?");
    url.trim_end_matches('?').to_owned()
}

#[test]
fn lock_urls_without_ssl_mode_refuse_a_server_without_tls_saying_how_to_connect_anyway() {
    let url = without_ssl_mode(&MariaDbServer::shared().url());
    assert!(!url.contains("ssl-mode"), "{url}");
    let key = format!("cli-no-tls-{}", std::process::id());
    let output = Command::new(BIN)
        .args(["run", "--url", &url, "--key", &key, "--", "true"])
        .output()
        .unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(69), "{err}");
    assert!(
        err.contains("the server offers no TLS") && err.contains("pass ssl-mode=DISABLED"),
        "{err}"
    );
    assert!(!err.contains(MariaDbServer::PASSWORD), "{err}");
    // The URL's own ssl-mode wins.
    let output = Command::new(BIN)
        .args(["run", "--url", &format!("{url}?ssl-mode=DISABLED")])
        .args(["--key", &key, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn lock_urls_without_ssl_mode_verify_the_server_certificate_and_name() {
    let tls = MariaDbServer::start_with(MariaDbOptions {
        tls: true,
        ..MariaDbOptions::default()
    });
    let ca = tls.ca_cert().display().to_string();
    let url_for = |host: &str| {
        let url = without_ssl_mode(&tls.url()).replace("127.0.0.1", host);
        format!("{url}?ssl-ca={ca}")
    };
    let run = |url: &str| {
        Command::new(BIN)
            .args(["run", "--url", url, "--key", "cli-verify", "--", "true"])
            .output()
            .unwrap()
    };
    // The certificate, from the given CA, names localhost.
    let output = run(&url_for("localhost"));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // Not 127.0.0.1: checked, so refused (PREFERRED would have gone ahead).
    let output = run(&url_for("127.0.0.1"));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    // Nor is it trusted without the CA.
    let output = run(&without_ssl_mode(&tls.url()).replace("127.0.0.1", "localhost"));
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
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
    let row = MariaDbServer::shared().sql(&columns);
    assert!(
        row.ends_with("0\t0\tsh -c sleep 1 dump-job --password=***"),
        "while held: {row:?}"
    );
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(holder(&key), None, "released");
    // The token stays; nothing names the holder any more.
    let row = MariaDbServer::shared().sql(&columns);
    assert!(row.ends_with("\t1\t1\tNULL"), "after release: {row:?}");
}

/// Three `distlock elect` replicas on MariaDB: the SIGKILLed leader's
/// connection dies with it, so another replica leads at once.
#[test]
fn elect_fails_over_after_kill_9_at_once_without_overlap() {
    let url = MariaDbServer::shared().url();
    let why = "a dead session frees the election at once";
    crate::elect::failover_after_kill_9(&url, "elect-failover", "15s", Duration::from_secs(3), why);
}
