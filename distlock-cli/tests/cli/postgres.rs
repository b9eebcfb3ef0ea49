//! `distlock run` against a real PostgreSQL.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use test_servers::{netns, FaultProxy, PostgresServer};

use crate::support::{stderr, wait_for_exit, wait_until, BIN};

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
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
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
    let stderr = stderr(&output);
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("wrong-secret"),
        "password leaked: {stderr}"
    );
}

/// `(pgid, state)` of process `pid` from `/proc/PID/stat`, if it exists.
fn pgid_and_state(pid: u32) -> Option<(u32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp ...`; comm may contain spaces.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgid = fields.nth(1)?.parse().ok()?;
    Some((pgid, state))
}

/// Live (not zombie) processes of process group `pgid` that run with
/// `DISTLOCK_KEY=key` in their environment: a command under `distlock run
/// --key key` and everything it started, whether or not it has a process
/// group of its own (if not, it shares this test's, full of other processes).
fn alive_commands(pgid: u32, key: &str) -> Vec<u32> {
    let marker = format!("DISTLOCK_KEY={key}");
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pgid_and_state(pid).is_some_and(|(g, state)| g == pgid && state != 'Z'))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == marker.as_bytes()))
        })
        .collect()
}

/// The (server pid, client port) of the one session holding an advisory lock.
fn holder_session(server: &PostgresServer) -> (i32, u16) {
    let row = server.psql(
        "SELECT a.pid, a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted",
    );
    let (pid, port) = row.split_once('|').expect("one holder: pid|port");
    (pid.parse().expect("pid"), port.parse().expect("port"))
}

/// A real partition of a `distlock run` holder (nftables drops its
/// connection's segments in a private network namespace): its lost signal
/// carries the grace the keepalives leave (6 s by default), and `distlock
/// run` must have killed a TERM-ignoring command's whole process group
/// before the server frees the lock for the next client. Needs root and
/// `nft`.
#[test]
fn a_partitioned_holder_kills_its_command_before_anyone_else_is_granted_the_lock() {
    // The test's path in this binary, as `--exact` matches it.
    const NAME: &str =
        "postgres::a_partitioned_holder_kills_its_command_before_anyone_else_is_granted_the_lock";
    if !netns::inside(NAME) {
        return netns::rerun_inside(NAME);
    }
    let server = PostgresServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("cmd.pid");
    let script = format!(
        "echo $$ > {}; trap '' TERM; while :; do sleep 0.1; done",
        pid_file.display()
    );
    let mut holder = Command::new(BIN)
        .args([
            "run",
            "--url",
            &url,
            "--key",
            "pg-partition",
            "--ttl",
            "30s",
        ])
        .args(["--kill-after", "10s", "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn distlock");
    let (lines, stderr) = mpsc::channel();
    let reader = BufReader::new(holder.stderr.take().expect("stderr"));
    std::thread::spawn(move || {
        for line in reader.lines().map_while(Result::ok) {
            eprintln!("holder: {line}");
            let _ = lines.send((Instant::now(), line));
        }
    });
    wait_until("CMD runs under the lock", Duration::from_secs(10), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
            && server.advisory_locks().len() == 1
    });
    let cmd: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (cmd_group, _) = pgid_and_state(cmd).expect("CMD runs");
    let (server_pid, port) = holder_session(&server);
    // Let both ends' keepalive timers reach their steady state.
    std::thread::sleep(Duration::from_secs(3));

    let cut = Instant::now();
    netns::cut_port(port);
    let (mut cmd_dead, mut freed) = (None, None);
    while cmd_dead.is_none() || freed.is_none() {
        assert!(
            cut.elapsed() < Duration::from_secs(60),
            "cmd dead {cmd_dead:?}, freed {freed:?}"
        );
        if cmd_dead.is_none() && alive_commands(cmd_group, "pg-partition").is_empty() {
            cmd_dead = Some(cut.elapsed());
        }
        if freed.is_none()
            && !server
                .advisory_locks()
                .iter()
                .any(|(pid, _)| *pid == server_pid)
        {
            freed = Some(cut.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (cmd_dead, freed) = (cmd_dead.unwrap(), freed.unwrap());
    let told = stderr
        .try_iter()
        .find(|(_, line)| line.contains("lost"))
        .map(|(at, _)| at - cut);
    eprintln!(
        "cut → holder told {told:?} → CMD's group dead {cmd_dead:?} → server frees {freed:?}"
    );
    // The next client can be granted the lock from `freed` on.
    let next = try_once(&url, "pg-partition");
    assert_eq!(
        next.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert!(
        cmd_dead < freed,
        "CMD's process group outlived the lock: dead {cmd_dead:?} after the cut, the server freed \
         the lock {freed:?} after it"
    );
    assert_eq!(
        holder.wait().unwrap().code(),
        Some(76),
        "exit code for a lost lock"
    );
}

/// The deployment users run and the fault suite once missed: `distlock run`
/// reaches Postgres through a local hop (an auth proxy, a sidecar, a
/// tunnel), and the hop's upstream is cut while the hop stays up. The
/// holder's kernel keeps hearing the hop, so only its pings can tell it.
/// A second `distlock run --wait` straight to the server is granted the
/// lock once the server frees it; the first command must have stopped
/// before the second starts (their lines never interleave).
#[test]
fn a_holder_behind_a_hop_stops_before_a_direct_waiter_is_granted_the_lock() {
    const NAME: &str =
        "postgres::a_holder_behind_a_hop_stops_before_a_direct_waiter_is_granted_the_lock";
    if !netns::inside(NAME) {
        return netns::rerun_inside(NAME);
    }
    let server = PostgresServer::start();
    let hop = FaultProxy::start(server.port());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("writes.log");
    // Each command appends "<who> <monotonic ns>" every 50 ms.
    let writer = |who: &str| {
        format!(
            "trap '' TERM; while :; do echo \"{who} $(cat /proc/uptime | cut -d' ' -f1)\" >> {}; sleep 0.05; done",
            log.display()
        )
    };
    let mut first = Command::new(BIN)
        .args([
            "run",
            "--url",
            &hop.proxied_url(&server.url()),
            "--key",
            "hop-job",
            "--ttl",
            "3s",
        ])
        .args(["--", "sh", "-c", &writer("first")])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the first distlock");
    wait_until("the first command writes", Duration::from_secs(10), || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("first"))
    });
    let (_, upstream) = holder_session(&server);
    let mut second = Command::new(BIN)
        .args([
            "run",
            "--url",
            &server.url(),
            "--key",
            "hop-job",
            "--ttl",
            "3s",
            "--wait",
            "60s",
        ])
        .args(["--", "sh", "-c", &writer("second")])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the second distlock");
    std::thread::sleep(Duration::from_secs(2));

    let cut = Instant::now();
    netns::cut_port(upstream);
    let code = crate::support::wait_for_exit(&mut first, Duration::from_secs(30));
    let first_exited = cut.elapsed();
    wait_until("the second command writes", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("second"))
    });
    let second_started = cut.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let _ = second.kill();
    let _ = second.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    let stamp = |line: &str| {
        line.split_once(' ')
            .map(|(_, t)| t.parse::<f64>().expect("uptime"))
    };
    let last_first = text
        .lines()
        .filter(|l| l.starts_with("first"))
        .filter_map(stamp)
        .fold(0.0, f64::max);
    let first_second = text
        .lines()
        .filter(|l| l.starts_with("second"))
        .filter_map(stamp)
        .fold(f64::INFINITY, f64::min);
    eprintln!(
        "cut → first distlock exited {first_exited:?} (code {code}) → second command runs {second_started:?}"
    );
    assert_eq!(code, 76, "the first holder exits with the lost-lock code");
    assert!(
        last_first < first_second,
        "the first command wrote at {last_first} after the second started at {first_second}"
    );
}

#[test]
fn three_postgres_cron_replicas_run_every_second_exactly_once_through_a_kill_9() {
    let server = PostgresServer::start();
    let tally = crate::cron::three_replicas(&server.url(), "postgres");
    crate::cron::assert_exactly_once(&tally);
}

/// A server whose URL carries a password, and that URL.
fn server_with_password(password: &str) -> (PostgresServer, String) {
    let server = PostgresServer::start_with(test_servers::PostgresOptions {
        password: Some(password.into()),
        ..Default::default()
    });
    let url = server.url();
    assert!(
        url.contains(password),
        "the URL carries the password: {url}"
    );
    (server, url)
}

#[test]
fn a_forced_release_logs_its_operator_without_the_urls_password() {
    let (server, url) = server_with_password("pg-hunter2");
    let mut holder = run(&url, "forced", &["sleep", "60"]);
    wait_until(
        "the holder's lock is granted",
        Duration::from_secs(10),
        || server.advisory_locks().len() == 1,
    );
    let output = Command::new(BIN)
        .args([
            "release",
            "--url",
            &url,
            "--key",
            "forced",
            "--force",
            "--terminate-session",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let log = stderr(&output);
    eprintln!("{log}");
    assert!(!log.contains("pg-hunter2"), "password logged: {log}");
    // Still says who forced it, and with what: the command line, the URL's
    // user and server, its password replaced.
    // (The log's field names are coloured: the values are matched.)
    let operator = format!(
        "\"{BIN} release --url postgres://postgres:***@127.0.0.1:{}/postgres?sslmode=disable --key forced --force --terminate-session\"",
        server.port()
    );
    assert!(log.contains("lock force-released by an operator"), "{log}");
    assert!(log.contains(&operator), "{log}");
    assert!(log.contains("\"sleep 60\""), "the evicted holder: {log}");
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn no_secret_of_a_commands_argv_is_stored_and_the_release_clears_the_holder() {
    let (server, url) = server_with_password("pg-hunter2");
    // The command's own arguments carry secrets: an option's value and a
    // URL's password.
    let mut holder = run(
        &url,
        "dump",
        &[
            "sh",
            "-c",
            "sleep 2",
            "dump-job",
            "--password=hunter2",
            "postgres://u:hunter2@db/x",
        ],
    );
    wait_until(
        "the holder's lock is granted",
        Duration::from_secs(10),
        || server.advisory_locks().len() == 1,
    );
    let status = Command::new(BIN)
        .args(["status", "--url", &url, "--key", "dump", "--json"])
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        json["holder"]["label"], "sh -c sleep 2 dump-job --password=*** postgres://u:***@db/x",
        "a useful label, without the secrets: {json}"
    );
    let row = server.psql("SELECT f::text FROM distlock_fencing f");
    assert!(!row.contains("hunter2"), "while held: {row}");
    assert_eq!(holder.wait().unwrap().code(), Some(0));

    // After the release no column names the holder any more; the token and
    // the grant stay.
    let row = server.psql("SELECT f::text FROM distlock_fencing f");
    assert!(!row.contains("hunter2"), "after release: {row}");
    assert_eq!(
        server
            .psql(
                "SELECT token, key_name, holder_host IS NULL, holder_pid IS NULL, \
             holder_label IS NULL, granted_at IS NOT NULL FROM distlock_fencing"
            )
            .trim(),
        "1|dump|t|t|t|t"
    );
}

/// `distlock run --wait 1s` against a server whose port drops every
/// segment: connecting is bounded by the wait too, and it is an outage
/// (69, naming the server and --wait), never contention. (Before: 5 s, the
/// connect timeout.) Needs root and `nft`.
#[test]
fn run_with_wait_against_a_cut_off_server_is_an_outage_within_the_wait() {
    const NAME: &str =
        "postgres::run_with_wait_against_a_cut_off_server_is_an_outage_within_the_wait";
    if !netns::inside(NAME) {
        return netns::rerun_inside(NAME);
    }
    let server = PostgresServer::start();
    let _cut = netns::Partition::start(&[server.port()], netns::Direction::Both);
    crate::support::assert_outage_within_the_wait(&server.url(), server.port());
}

/// Three `distlock elect` replicas on Postgres: the SIGKILLed leader's
/// session dies with it, so another replica leads at once, not after the
/// ttl, and no write of the old term follows the new leader's.
#[test]
fn elect_fails_over_after_kill_9_at_once_without_overlap() {
    let server = PostgresServer::start();
    let why = "a dead session frees the election at once";
    crate::elect::failover_after_kill_9(
        &server.url(),
        "leader",
        "15s",
        Duration::from_secs(3),
        why,
    );
}

/// `distlock run --limit 3` on Postgres: eight contending loops, never more
/// than three commands at once; a SIGKILLed holder's session dies with it
/// and its permit returns at once.
#[test]
fn limit_never_runs_more_than_three_and_a_killed_permit_returns_at_once() {
    let server = PostgresServer::start();
    crate::limit::eight_loops_and_a_killed_holder(&server.url(), "15s", Duration::from_secs(2));
}

/// `run --shared` on Postgres: two readers hold the key at once (each
/// waits, holding it, until it sees the other has started); an exclusive
/// `run` meanwhile exits 75 without running its command; a writer with
/// `--wait` queues on the server, and holds back a reader that comes after
/// it (a `--shared` run exits 75, one with `--wait` runs after the writer),
/// so that, in the log every run appends to, the writer's run overlaps no
/// reader's; and a `--shared` run while a writer holds the key exits 75.
#[test]
fn shared_runs_overlap_and_an_exclusive_run_never_overlaps_a_reader() {
    let server = PostgresServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    let (log, go) = (path("log"), path("go"));
    let distlock = |args: &[&str], command: &str| {
        Command::new(BIN)
            .args(["run", "--url", &url, "--key", "report"])
            .args(args)
            .args(["--", "sh", "-c", command])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn distlock")
    };
    let reader = |me: &str, other: &str| {
        // Holding its shared lease, a reader waits (at most 20 s) to see the
        // other one started, then for the test's go, then logs its end.
        let script = format!(
            "echo {me}-start >> {log}; touch {started}; \
             i=0; while [ ! -e {other} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 3; sleep 0.05; done; \
             i=0; while [ ! -e {go} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 4; sleep 0.05; done; \
             echo {me}-end >> {log}",
            started = path(&format!("started-{me}")).display(),
            other = path(&format!("started-{other}")).display(),
            go = go.display(),
            log = log.display(),
        );
        distlock(&["--shared"], &script)
    };
    let mut readers = [reader("a", "b"), reader("b", "a")];
    wait_until("both readers hold the key", Duration::from_secs(20), || {
        path("started-a").exists() && path("started-b").exists()
    });
    let modes = || {
        server.psql(
            "SELECT string_agg(mode || ':' || granted, ',' ORDER BY granted DESC, mode) \
             FROM pg_locks WHERE locktype = 'advisory'",
        )
    };
    assert_eq!(modes(), "ShareLock:true,ShareLock:true", "two readers");

    let status = Command::new(BIN)
        .args(["status", "--url", &url, "--key", "report"])
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(shown.contains("\"report\" is held shared"), "{shown}");

    let marker = path("ran");
    let touch = format!("touch {}", marker.display());
    let output = distlock(&[], &touch).wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("lock \"report\" is held elsewhere"),
        "{}",
        stderr(&output)
    );
    assert!(!marker.exists(), "the exclusive command must not run");

    let write = format!(
        "echo writer-start >> {log}; sleep 0.3; echo writer-end >> {log}",
        log = log.display()
    );
    let mut writer = distlock(&["--wait", "30s"], &write);
    wait_until(
        "the writer waits on the server",
        Duration::from_secs(20),
        || modes().contains("ExclusiveLock:false"),
    );
    // A reader after the writer: refused at once, or queued behind it.
    let output = distlock(&["--shared"], &touch).wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(
            "lock \"report\" is held exclusively elsewhere, or an exclusive run waits for it"
        ),
        "{}",
        stderr(&output)
    );
    assert!(!marker.exists(), "the late reader's command must not run");
    let late = format!(
        "echo late-start >> {log}; echo late-end >> {log}",
        log = log.display()
    );
    let mut late = distlock(&["--shared", "--wait", "30s"], &late);
    wait_until("the late reader queues", Duration::from_secs(20), || {
        modes().contains("ShareLock:false")
    });
    assert!(
        writer.try_wait().unwrap().is_none(),
        "the writer waits while readers hold the key"
    );

    std::fs::write(&go, "").expect("go");
    for reader in &mut readers {
        assert_eq!(wait_for_exit(reader, Duration::from_secs(30)), 0);
    }
    assert_eq!(wait_for_exit(&mut writer, Duration::from_secs(30)), 0);
    assert_eq!(wait_for_exit(&mut late, Duration::from_secs(30)), 0);
    let order = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = order.lines().collect();
    assert_eq!(lines.len(), 8, "{order}");
    assert_eq!(
        &lines[4..],
        ["writer-start", "writer-end", "late-start", "late-end"],
        "the writer runs after both readers ended, alone, then the late reader: {order}"
    );
    assert!(
        lines[..4].iter().all(|line| line.starts_with(['a', 'b'])),
        "{order}"
    );

    // And the other way round: a writer holding the key keeps readers out.
    let (holds, done) = (path("writer-holds"), path("writer-done"));
    let hold = format!(
        "touch {}; i=0; while [ ! -e {} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 4; sleep 0.05; done",
        holds.display(),
        done.display()
    );
    let mut holder = distlock(&[], &hold);
    wait_until("the writer holds the key", Duration::from_secs(20), || {
        holds.exists()
    });
    let output = distlock(&["--shared"], &touch).wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert!(!marker.exists(), "the shared command must not run");
    std::fs::write(&done, "").expect("done");
    assert_eq!(wait_for_exit(&mut holder, Duration::from_secs(30)), 0);
    assert!(server.advisory_locks().is_empty(), "all released");
}
