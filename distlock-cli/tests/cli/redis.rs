//! `distlock run` against a real Redis.

use std::process::Command;
use std::time::Duration;

use distlock::Locker;
use test_servers::{RedisCluster, RedisSentinelSet, RedisServer};

use crate::support::{alive, code, stderr, wait_for_exit, wait_until, BIN};

#[tokio::test]
async fn run_holds_the_redis_lock_while_the_command_runs_and_frees_it_after() {
    let server = RedisServer::start();
    let url = server.url();
    let probe =
        "redis-cli -p \"$PORT\" GET 'lock:{nightly}'; redis-cli -p \"$PORT\" PTTL 'lock:{nightly}'";
    let output = Command::new(BIN)
        .args([
            "run", "--url", &url, "--key", "nightly", "--ttl", "5s", "--", "sh", "-c", probe,
        ])
        .env("PORT", server.port().to_string())
        .output()
        .expect("run distlock");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    // The lock's value, one field per line (owner token, ttl, grant time
    // (empty until a refresh), pid, host, label: the command), then PTTL.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 7, "{stdout:?}");
    assert_eq!(
        lines[0].len(),
        32,
        "the lock key holds the owner token while CMD runs: {stdout:?}"
    );
    assert_eq!(lines[1], "5000", "the ttl: {stdout:?}");
    assert!(lines[5].starts_with("sh -c"), "the command: {stdout:?}");
    let pttl: u64 = lines[6].parse().unwrap();
    assert!(pttl > 0 && pttl <= 5000, "ttl {pttl} ms");
    assert_eq!(
        server.cli(&["EXISTS", "lock:{nightly}"]),
        "0",
        "released after CMD exited"
    );
    assert_eq!(server.cli(&["GET", "lock:{nightly}:fence"]), "1");
}

/// `distlock run --url redis+cluster://...` and `redis+sentinel://...`: the
/// command runs while the lock key holds the owner token on the node that
/// serves it, and the key is gone afterwards.
#[test]
fn run_works_on_a_redis_cluster_and_behind_sentinel() {
    let cluster = RedisCluster::start();
    let sentinels = RedisSentinelSet::start();
    let seed = cluster.ports()[0];
    let master = sentinels.master_port();
    // `redis-cli -c` follows MOVED to the key's node.
    for (url, probe_port, cluster_mode) in
        [(cluster.url(), seed, "-c"), (sentinels.url(), master, "")]
    {
        let probe = format!("redis-cli {cluster_mode} -p {probe_port} GET 'lock:{{deployed}}'");
        let output = Command::new(BIN)
            .args([
                "run", "--url", &url, "--key", "deployed", "--ttl", "5s", "--", "sh", "-c", &probe,
            ])
            .output()
            .expect("run distlock");
        assert_eq!(output.status.code(), Some(0), "{url}: {}", stderr(&output));
        let value = String::from_utf8(output.stdout).unwrap();
        let token = value.lines().next().unwrap_or_default();
        assert_eq!(
            token.len(),
            32,
            "{url}: the owner token while CMD runs: {token:?}"
        );
    }
    let owner = cluster.owner_of(cluster.slot_of("lock:{deployed}"));
    assert_eq!(cluster.cli(owner, &["EXISTS", "lock:{deployed}"]), "0");
    assert_eq!(
        sentinels.server(master).cli(&["EXISTS", "lock:{deployed}"]),
        "0"
    );
}

/// `run --shared` on Redis: two readers hold the key at once (each waits,
/// holding it, until it sees the other has started), and the lock key
/// holds the shared marker meanwhile; `status` says held shared; an
/// exclusive `run` exits 75 without running its command, and with `--wait`
/// starts only after both readers have finished (woken by the last one's
/// release); a `--shared` run while a writer holds the key exits 75 too,
/// and the readers carry the last writer's fencing token.
#[test]
fn shared_runs_overlap_and_exclude_an_exclusive_run_on_redis() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name);
    let distlock = || {
        let mut command = Command::new(BIN);
        command.env("DISTLOCK_URL", server.url());
        command
    };
    let run = |args: &[&str]| distlock().args(args).output().expect("run distlock");
    let (log, go) = (path("log"), path("go"));
    let started = |name: &str| path(&format!("started-{name}"));
    let reader = |me: &str, other: &str| {
        // Holding its shared lease, a reader waits (at most 20 s) to see the
        // other one started, then for the test's go, then logs its end and
        // its fencing token.
        let script = format!(
            "touch {me}; \
             i=0; while [ ! -e {other} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 3; sleep 0.05; done; \
             i=0; while [ ! -e {go} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 4; sleep 0.05; done; \
             echo reader-end-$DISTLOCK_FENCING_TOKEN >> {log}",
            me = started(me).display(),
            other = started(other).display(),
            go = go.display(),
            log = log.display(),
        );
        distlock()
            .args([
                "run", "--shared", "--key", "report", "--", "sh", "-c", &script,
            ])
            .spawn()
            .expect("spawn a reader")
    };
    // One writer first: the readers carry its fencing token.
    assert_eq!(code(&run(&["run", "--key", "report", "--", "true"])), 0);
    let mut readers = [reader("a", "b"), reader("b", "a")];
    wait_until("both readers hold the key", Duration::from_secs(20), || {
        started("a").exists() && started("b").exists()
    });
    assert_eq!(server.cli(&["GET", "lock:{report}"]), "shared:readers");
    assert_eq!(server.cli(&["ZCARD", "lock:{report}:readers"]), "2");

    let status = run(&["status", "--key", "report"]);
    assert_eq!(code(&status), 0, "{}", stderr(&status));
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(shown.contains("\"report\" is held shared"), "{shown}");

    let marker = path("ran");
    let touch = format!("touch {}", marker.display());
    let output = run(&["run", "--key", "report", "--", "sh", "-c", &touch]);
    assert_eq!(code(&output), 75, "{}", stderr(&output));
    assert!(
        stderr(&output).contains("lock \"report\" is held elsewhere"),
        "{}",
        stderr(&output)
    );
    assert!(!marker.exists(), "the exclusive command must not run");

    let write = format!(
        "echo writer-start-$DISTLOCK_FENCING_TOKEN >> {}",
        log.display()
    );
    let mut writer = distlock()
        .args([
            "run", "--key", "report", "--wait", "30s", "--", "sh", "-c", &write,
        ])
        .spawn()
        .expect("spawn the writer");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        writer.try_wait().expect("try_wait").is_none(),
        "the writer waits while readers hold the key"
    );
    std::fs::write(&go, "").expect("go");
    for reader in &mut readers {
        assert_eq!(wait_for_exit(reader, Duration::from_secs(30)), 0);
    }
    assert_eq!(wait_for_exit(&mut writer, Duration::from_secs(30)), 0);
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "reader-end-1\nreader-end-1\nwriter-start-2\n",
        "the writer starts only after both readers finished, with a larger token"
    );
    for redis_key in ["lock:{report}", "lock:{report}:readers"] {
        assert_eq!(server.cli(&["EXISTS", redis_key]), "0", "{redis_key}");
    }

    // And the other way round: a writer holding the key keeps readers out.
    let (holds, done) = (path("writer-holds"), path("writer-done"));
    let hold = format!(
        "touch {}; i=0; while [ ! -e {} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 4; sleep 0.05; done",
        holds.display(),
        done.display()
    );
    let mut holder = distlock()
        .args(["run", "--key", "report", "--", "sh", "-c", &hold])
        .spawn()
        .expect("spawn a holding writer");
    wait_until("the writer holds the key", Duration::from_secs(20), || {
        holds.exists()
    });
    let output = run(&[
        "run", "--shared", "--key", "report", "--", "sh", "-c", &touch,
    ]);
    assert_eq!(code(&output), 75, "{}", stderr(&output));
    assert!(
        stderr(&output).contains("lock \"report\" is held exclusively elsewhere"),
        "{}",
        stderr(&output)
    );
    assert!(!marker.exists(), "the shared command must not run");
    std::fs::write(&done, "").expect("done");
    assert_eq!(wait_for_exit(&mut holder, Duration::from_secs(30)), 0);
}

#[tokio::test]
async fn run_exits_75_when_another_client_holds_the_redis_lock() {
    let server = RedisServer::start();
    let locker = distlock::connect(&server.url()).await.unwrap();
    let lease = locker
        .try_lock("busy", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let output = Command::new(BIN)
        .args(["run", "--url", &server.url(), "--key", "busy", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(75));
    // A release by owner token works from another process on Redis.
    let output = Command::new(BIN)
        .args([
            "release",
            "--url",
            &server.url(),
            "--key",
            "busy",
            "--owner",
            lease.owner(),
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(matches!(
        lease.release().await,
        Err(distlock::Error::NotHeld { .. })
    ));
}

#[test]
fn bench_leaves_no_key_behind() {
    let server = RedisServer::start();
    let output = Command::new(BIN)
        .args([
            "bench",
            "--url",
            &server.url(),
            "--duration",
            "200ms",
            "--tasks",
            "1,2",
        ])
        .output()
        .expect("run distlock");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.lines().count(),
        4,
        "header and one line per run: {stdout}"
    );
    assert_eq!(
        server.cli(&["--scan", "--pattern", "*distlock-bench*"]),
        "",
        "bench keys left on the server"
    );
}

#[test]
fn bench_every_workload_on_redis_reports_and_cleans_up() {
    let server = RedisServer::start();
    let bench = |args: &[&str]| -> Vec<serde_json::Value> {
        let output = Command::new(BIN)
            .args(["bench", "--url", &server.url(), "--json"])
            .args(args)
            .output()
            .expect("run distlock bench");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
            .collect()
    };
    let uncontended = bench(&["-c", "2", "-d", "300ms"]);
    assert_eq!(uncontended[0]["backend"], "redis", "{uncontended:?}");
    assert!(
        uncontended[0]["cycles"].as_u64() > Some(0),
        "{uncontended:?}"
    );
    let contended = bench(&["-w", "contended", "-c", "4", "-d", "300ms"]);
    assert!(contended[0]["handoffs"].as_u64() > Some(1), "{contended:?}");
    assert_eq!(contended[0]["errors"], 0, "{contended:?}");
    let hold = bench(&[
        "-w", "hold", "-k", "200", "-c", "4", "--ttl", "600ms", "-d", "500ms",
    ]);
    let run = &hold[0];
    assert_eq!(run["leases"], 200, "{run}");
    assert_eq!(run["lost"], 0, "{run}");
    // Refreshes every 200ms: at least one per lease in 500ms.
    assert!(run["refreshes"].as_u64() >= Some(200), "{run}");
    // The locker's connection (and its pub/sub one) to the server, no more.
    let connections = run["tcp_connections"].as_u64().expect("counted");
    assert!((1..=4).contains(&connections), "{run}");
    assert_eq!(
        server.cli(&["--scan", "--pattern", "*distlock-bench*"]),
        "",
        "bench keys left on the server"
    );
}

#[test]
fn an_unreachable_server_exits_69_naming_it() {
    let port = test_servers::free_port();
    let output = Command::new(BIN)
        .args([
            "run",
            "--url",
            &format!("redis://127.0.0.1:{port}"),
            "--key",
            "k",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(69));
    let stderr = stderr(&output);
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
}

#[test]
fn a_wrong_password_exits_69_naming_authentication_and_hiding_the_password() {
    let server = RedisServer::start_with(test_servers::RedisOptions {
        password: Some("right".into()),
        ..Default::default()
    });
    let url = format!("redis://:wrong-secret@127.0.0.1:{}", server.port());
    let output = Command::new(BIN)
        .args(["run", "--url", &url, "--key", "k", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(69));
    let stderr = stderr(&output);
    assert!(stderr.contains("authentication"), "{stderr}");
    assert!(
        !stderr.contains("wrong-secret"),
        "password leaked: {stderr}"
    );
}

#[test]
fn a_dead_server_stops_the_command_once_the_lease_expires() {
    let mut server = RedisServer::start();
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--url",
            &server.url(),
            "--key",
            "doomed",
            "--ttl",
            "1500ms",
            "--kill-after",
            "1s",
            "--",
        ])
        .args(["sleep", "60"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while server.cli(&["EXISTS", "lock:{doomed}"]) != "1" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the lock was never taken"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.kill();
    let killed_at = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(10),
            "the command ran on without the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // The keepalive cannot refresh; the lease runs out at most one ttl after
    // the last refresh, and the command is stopped before then: SIGTERM
    // kill-after + drift margin ahead of it.
    assert_eq!(status.code(), Some(76));
    assert!(
        killed_at.elapsed() <= Duration::from_millis(1500 + 1000),
        "stopped after {:?}",
        killed_at.elapsed()
    );
    let output = child.wait_with_output().unwrap();
    let stderr = stderr(&output);
    assert!(
        stderr.contains("lock \"doomed\" could not be refreshed and is valid for"),
        "{stderr}"
    );
}

#[test]
fn a_term_ignoring_command_is_killed_before_a_paused_servers_lease_could_expire() {
    use std::time::{Instant, SystemTime, UNIX_EPOCH};
    const TTL_MS: u64 = 2000;
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let term_file = dir.path().join("term");
    // Traps SIGTERM (so ignores it, noting when it came); only SIGKILL stops it.
    let script = format!(
        "trap 'date +%s%N > {term}' TERM; echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; \
         while :; do sleep 0.05; done",
        term = term_file.display(),
        pid = pid_file.display()
    );
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--url",
            &server.url(),
            "--key",
            "paused",
            "--ttl",
            "2s",
            "--kill-after",
            "5s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let pid: u32 = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            break text.trim().parse().unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "CMD never ran");
        std::thread::sleep(Duration::from_millis(10));
    };
    // Pause right after a refresh (refreshes come every ttl/3), so none can
    // slip in between the PTTL probe and the pause. The key cannot expire on
    // the server before `asked + pttl`: a lower bound of its expiry.
    let (asked, pttl) = loop {
        let asked = Instant::now();
        let pttl: u64 = server.cli(&["PTTL", "lock:{paused}"]).parse().unwrap();
        if pttl >= TTL_MS - 60 {
            break (asked, Duration::from_millis(pttl));
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no refresh seen"
        );
    };
    server.pause();
    let expires_no_earlier_than = asked + pttl;
    while alive(pid) {
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "CMD ran on while the lease could not be refreshed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let dead_at = Instant::now();
    let dead_at_wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    assert!(
        dead_at < expires_no_earlier_than,
        "CMD died {:?} after the server could expire the key",
        dead_at - expires_no_earlier_than
    );
    println!(
        "CMD's group was SIGKILLed at least {:?} before the server could expire the key \
         (ttl {TTL_MS} ms, drift margin 120 ms; poll resolution 5 ms)",
        expires_no_earlier_than - dead_at
    );
    // SIGTERM came first, one capped kill-after (880 ms, not 5 s) before SIGKILL.
    let term_nanos: u128 = std::fs::read_to_string(&term_file)
        .expect("CMD got SIGTERM before SIGKILL")
        .trim()
        .parse()
        .unwrap();
    let term_to_kill = dead_at_wall
        .as_nanos()
        .checked_sub(term_nanos)
        .expect("SIGTERM before the kill");
    println!(
        "SIGTERM to death: {:?}",
        Duration::from_nanos(term_to_kill as u64)
    );
    assert!(
        term_to_kill < Duration::from_secs(3).as_nanos(),
        "SIGKILL followed SIGTERM after {term_to_kill} ns: the uncapped 5s, not the cap"
    );
    // Past the ttl, thaw the server: the key has expired, nobody released it
    // early, and distlock (whose release waited on the paused server) exits 76.
    std::thread::sleep(
        (asked + Duration::from_millis(TTL_MS + 100)).saturating_duration_since(Instant::now()),
    );
    server.resume();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(15),
            "distlock did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(76));
    let output = child.wait_with_output().unwrap();
    let stderr = stderr(&output);
    assert!(
        stderr.contains("--kill-after 5s is capped at 880ms"),
        "{stderr}"
    );
    assert!(stderr.contains("could not be refreshed"), "{stderr}");
    assert_eq!(server.cli(&["EXISTS", "lock:{paused}"]), "0");
}

#[test]
fn three_redis_cron_replicas_run_every_second_exactly_once_through_a_kill_9() {
    let server = RedisServer::start();
    let tally = crate::cron::three_replicas(&server.url(), "redis");
    crate::cron::assert_exactly_once(&tally);
}

/// `distlock cron` on a Redis that does not persist (`--appendonly no`, as
/// the test servers run): a restart would forget which ticks ran and reset
/// fencing tokens, and the command says so once, when it starts, not per
/// tick. A server with `appendonly yes` gets no such warning.
#[test]
fn cron_warns_once_at_start_about_a_redis_that_does_not_persist_its_marks() {
    let args = |url: &str| {
        [
            "--url",
            url,
            "--name",
            "durable",
            "--schedule",
            "* * * * * *",
            "--",
            "true",
        ]
        .map(str::to_owned)
    };
    let server = RedisServer::start();
    let url = server.url();
    let args_vec = args(&url);
    let argv: Vec<&str> = args_vec.iter().map(String::as_str).collect();
    let (status, err, _out, _dir) =
        crate::cron::cron_until(&argv, |err| err.matches("ran: exit code 0").count() >= 3);
    assert_eq!(status, 0, "{err}");
    assert_eq!(err.matches("appendonly is no").count(), 1, "{err}");
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!(
            "distlock: warning: redis://127.0.0.1:{}/0: appendonly is no",
            server.port()
        )) && first.contains("a restart forgets which cron ticks ran")
            && first.contains("resets fencing tokens to 1"),
        "printed first, before any tick: {err}"
    );

    let durable = RedisServer::start_with(test_servers::RedisOptions {
        appendonly: true,
        ..test_servers::RedisOptions::default()
    });
    let url = durable.url();
    let args_vec = args(&url);
    let argv: Vec<&str> = args_vec.iter().map(String::as_str).collect();
    let (status, err, _out, _dir) =
        crate::cron::cron_until(&argv, |err| err.matches("ran: exit code 0").count() >= 2);
    assert_eq!(status, 0, "{err}");
    assert!(!err.contains("appendonly"), "{err}");
}

#[test]
fn the_lock_value_and_list_show_the_command_without_its_secrets() {
    let server = RedisServer::start();
    let url = server.url();
    // CMD reads its own lock's value and `distlock list` while it holds the
    // lock; its arguments carry an option's secret and a URL's password.
    let probe = "redis-cli -p \"$PORT\" GET 'lock:{dump}'; \"$BIN\" list --url \"$URL\"";
    let output = Command::new(BIN)
        .args([
            "run",
            "--url",
            &url,
            "--key",
            "dump",
            "--",
            "sh",
            "-c",
            probe,
            "dump-job",
            "--password=hunter2",
            "redis://:hunter2@cache:6379",
        ])
        .env("PORT", server.port().to_string())
        .env("BIN", BIN)
        .env("URL", &url)
        .output()
        .expect("run distlock");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    eprintln!("{stdout}");
    assert!(!stdout.contains("hunter2"), "secret stored: {stdout}");
    let label = "dump-job --password=*** redis://:***@cache:6379";
    let lines: Vec<&str> = stdout.lines().collect();
    // The value's fields (owner, ttl, grant, pid, host, label), then the
    // list: a header and the lock.
    assert_eq!(lines.len(), 8, "{stdout:?}");
    assert!(
        lines[5].starts_with("sh -c redis-cli") && lines[5].ends_with(label),
        "the value's label: {stdout:?}"
    );
    assert!(
        lines[7].starts_with("dump ") && lines[7].contains("sh -c redis-cli"),
        "listed with its command: {stdout:?}"
    );
}

/// `distlock run --wait 1s` against a Redis whose port drops every segment:
/// an outage (69) within the wait and its grace. (Before: 2.2 s.) Needs
/// root and `nft`.
#[test]
fn run_with_wait_against_a_cut_off_server_is_an_outage_within_the_wait() {
    const NAME: &str = "redis::run_with_wait_against_a_cut_off_server_is_an_outage_within_the_wait";
    if !test_servers::netns::inside(NAME) {
        return test_servers::netns::rerun_inside(NAME);
    }
    let server = RedisServer::start();
    let _cut = test_servers::netns::Partition::start(
        &[server.port()],
        test_servers::netns::Direction::Both,
    );
    crate::support::assert_outage_within_the_wait(&server.url(), server.port());
}

/// Three `distlock elect` replicas on Redis: the SIGKILLed leader's term
/// lapses at its ttl (2 s) and another replica leads, its writes never
/// interleaved with the dead leader's.
#[test]
fn elect_fails_over_after_kill_9_within_the_ttl_without_overlap() {
    let server = RedisServer::start();
    let why = "past the 2 s ttl plus a refresh-free margin";
    crate::elect::failover_after_kill_9(&server.url(), "leader", "2s", Duration::from_secs(4), why);
}

/// A leader whose `distlock` is SIGSTOPped past its ttl cannot stop its
/// command: the next leader's term number makes the resource reject the
/// late writes.
#[test]
fn elect_a_paused_leaders_late_writes_are_rejected_by_the_next_term() {
    let server = RedisServer::start();
    crate::elect::a_paused_leaders_late_writes_are_fenced(&server.url(), "paused-leader");
}

/// `distlock run --limit 3` on Redis: eight contending loops, never more
/// than three commands at once; a SIGKILLed holder's permit returns when
/// its ttl (2 s) runs out.
#[test]
fn limit_never_runs_more_than_three_and_a_killed_permit_returns_at_its_ttl() {
    let server = RedisServer::start();
    crate::limit::eight_loops_and_a_killed_holder(&server.url(), "2s", Duration::from_secs(4));
}
