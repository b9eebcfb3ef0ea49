//! `distlock run` and `distlock bench` against a Redlock of three real
//! redis-servers.

use std::process::Command;
use std::time::Duration;

use test_servers::RedisServer;

use crate::support::{stderr, BIN};

fn start() -> (Vec<RedisServer>, String) {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    (servers, url)
}

#[tokio::test]
async fn run_holds_the_lock_on_a_majority_and_exits_75_when_it_is_held() {
    let (servers, url) = start();
    let probe = "for p in $PORTS; do redis-cli -p $p GET 'lock:{nightly}'; done; \
                 echo \"fencing=${DISTLOCK_FENCING_TOKEN:-none}\"";
    let ports: Vec<String> = servers.iter().map(|s| s.port().to_string()).collect();
    let output = Command::new(BIN)
        .args([
            "run", "--url", &url, "--key", "nightly", "--ttl", "5s", "--", "sh", "-c", probe,
        ])
        .env("PORTS", ports.join(" "))
        .output()
        .expect("run distlock");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    let holders = lines.iter().filter(|l| l.len() == 32).count();
    assert!(
        holders >= 2,
        "a majority holds the owner token while CMD runs: {stdout:?}"
    );
    assert_eq!(
        lines.last(),
        Some(&"fencing=none"),
        "no fencing token: {stdout:?}"
    );
    // The release returns once a majority has released: released there at
    // once. A node outside that majority is released in the background,
    // which the exiting process may cut short; its key then expires at the
    // ttl (5 s), which bounds it.
    let released = |servers: &[RedisServer]| {
        servers
            .iter()
            .filter(|s| s.cli(&["EXISTS", "lock:{nightly}"]) == "0")
            .count()
    };
    assert!(
        released(&servers) >= 2,
        "released on a majority when run exits"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(6);
    while released(&servers) < servers.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "released everywhere within the ttl"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let locker = distlock::connect(&url).await.unwrap();
    let lease = locker
        .try_lock("busy", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let output = Command::new(BIN)
        .args(["run", "--url", &url, "--key", "busy", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    lease.release().await.unwrap();
}

#[test]
fn bench_over_redlock_leaves_no_key_behind() {
    let (servers, url) = start();
    let output = Command::new(BIN)
        .args([
            "bench",
            "--url",
            &url,
            "--duration",
            "200ms",
            "--tasks",
            "1,2",
        ])
        .output()
        .expect("run distlock");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("backend redlock"), "{stdout}");
    for server in &servers {
        assert_eq!(
            server.cli(&["--scan", "--pattern", "*distlock-bench*"]),
            "",
            "bench keys left on a node"
        );
    }
}

/// Redlock has no shared locks: `run --shared` exits 64 with the reason,
/// and never runs the command.
#[test]
fn run_shared_exits_64_with_the_reason_on_redlock() {
    let (_servers, url) = start();
    let output = Command::new(BIN)
        .args([
            "run", "--shared", "--url", &url, "--key", "readers", "--", "false",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("shared locks are not done on Redlock"),
        "{}",
        stderr(&output)
    );
}
