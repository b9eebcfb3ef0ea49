//! `distlock run` against a real Redis.
#![cfg(feature = "redis")]

use std::process::Command;
use std::time::Duration;

use distlock::Locker;
use test_servers::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

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
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout:?}");
    assert_eq!(
        lines[0].len(),
        32,
        "the lock key holds the owner token while CMD runs: {stdout:?}"
    );
    let pttl: u64 = lines[1].parse().unwrap();
    assert!(pttl > 0 && pttl <= 5000, "ttl {pttl} ms");
    assert_eq!(
        server.cli(&["EXISTS", "lock:{nightly}"]),
        "0",
        "released after CMD exited"
    );
    assert_eq!(server.cli(&["GET", "lock:{nightly}:fence"]), "1");
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
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
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
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
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
    let stderr = String::from_utf8_lossy(&output.stderr);
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
    let stderr = String::from_utf8_lossy(&output.stderr);
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
    // the last refresh, and the command is stopped then.
    assert_eq!(status.code(), Some(76));
    assert!(
        killed_at.elapsed() <= Duration::from_millis(1500 + 1000),
        "stopped after {:?}",
        killed_at.elapsed()
    );
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the ttl ran out before a refresh succeeded"),
        "{stderr}"
    );
}
