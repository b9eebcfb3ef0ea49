//! The native permit attempt ([`Locker::try_lock_any`] in one script),
//! counted by the server itself: `MONITOR` lists every command a client
//! sends (and, marked `lua`, those its scripts run, which are left out).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::semaphore::Semaphore;
use distlock::Locker;
use test_servers::RedisServer;
use tokio::time::Instant;

use crate::support::connect;

const TTL: Duration = Duration::from_secs(30);

/// `redis-cli MONITOR` on a server, its lines collected by a thread.
struct Monitor<'a> {
    server: &'a RedisServer,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    marks: u32,
}

impl<'a> Monitor<'a> {
    fn start(server: &'a RedisServer) -> Self {
        let mut child = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &server.port().to_string(),
                "MONITOR",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("run redis-cli MONITOR (Debian package redis-tools)");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Monitor {
            server,
            child,
            lines,
            marks: 0,
        }
    }

    /// Sends `ECHO <a new mark>` until the monitor has seen it (it may not
    /// be listening yet): the index of its first line.
    async fn mark(&mut self) -> usize {
        self.marks += 1;
        let mark = format!("mark-{}", self.marks);
        let seen = format!("\"ECHO\" \"{mark}\"");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            self.server.cli(&["ECHO", &mark]);
            for _ in 0..20 {
                let found = self
                    .lines
                    .lock()
                    .unwrap()
                    .iter()
                    .position(|l| l.ends_with(&seen));
                if let Some(at) = found {
                    return at;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(Instant::now() < deadline, "MONITOR never showed {mark}");
        }
    }

    /// Runs `attempt` between two marks: its result and the commands
    /// clients sent meanwhile (not those scripts ran), by name, counted.
    async fn count<T>(
        &mut self,
        attempt: impl std::future::Future<Output = T>,
    ) -> (T, BTreeMap<String, u64>) {
        let start = self.mark().await;
        let result = attempt.await;
        let end = self.mark().await;
        let mut sent = BTreeMap::new();
        for line in &self.lines.lock().unwrap()[start + 1..end] {
            // `<time> [<db> <client address, or lua>] "COMMAND" "arg" ...`
            let Some((client, command)) = line.split_once("] \"") else {
                continue;
            };
            let name = command.split('"').next().unwrap_or_default();
            // Script commands, and the marks (sent again until seen).
            if client.ends_with(" lua") || name == "ECHO" {
                continue;
            }
            *sent.entry(name.to_lowercase()).or_insert(0) += 1;
        }
        (result, sent)
    }
}

impl Drop for Monitor<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn one_evalsha(calls: u64) -> BTreeMap<String, u64> {
    BTreeMap::from([("evalsha".to_owned(), calls)])
}

/// `try_lock_any` over ten keys is one script call (`EVALSHA`) whether the
/// first key is free, only the last is, or none is; and a semaphore's
/// attempt is that call, plus one inspect script when every permit is held
/// (the check for a holder with a larger limit): at most 2 round trips.
#[tokio::test]
async fn a_permit_attempt_is_one_script_call_at_any_occupancy() {
    let server = RedisServer::start();
    let mut monitor = Monitor::start(&server);
    let (locker, other) = (connect(&server).await, connect(&server).await);
    let keys: Vec<String> = (0..10).map(|i| format!("s#{i}")).collect();
    // Loads the script (a first EVALSHA meets NOSCRIPT) and connects both.
    let warm = locker.try_lock_any(&keys, TTL).await.unwrap().unwrap();
    warm.release().await.unwrap();
    assert!(other.inspect("s#0").await.unwrap().is_none());

    let (empty, calls) = monitor.count(locker.try_lock_any(&keys, TTL)).await;
    let empty = empty.unwrap().expect("all free");
    assert_eq!(empty.key(), "s#0");
    assert_eq!(calls, one_evalsha(1), "empty");
    empty.release().await.unwrap();

    let mut held = Vec::new();
    for key in &keys[..9] {
        held.push(other.try_lock(key, TTL).await.unwrap().unwrap());
    }
    let (last, calls) = monitor.count(locker.try_lock_any(&keys, TTL)).await;
    let last = last.unwrap().expect("the last is free");
    assert_eq!(last.key(), "s#9");
    assert_eq!(calls, one_evalsha(1), "nine of ten held");

    let (full, calls) = monitor.count(locker.try_lock_any(&keys, TTL)).await;
    assert!(full.unwrap().is_none(), "all ten held");
    assert_eq!(calls, one_evalsha(1), "full");

    let semaphore = Semaphore::new(std::sync::Arc::new(locker.clone()), "s", 10).unwrap();
    let (refused, calls) = monitor.count(semaphore.try_acquire(TTL)).await;
    assert!(refused.unwrap().is_none(), "the semaphore is full");
    assert_eq!(
        calls,
        one_evalsha(2),
        "the attempt and the inspection of permit 10"
    );
    last.release().await.unwrap();
    let (granted, calls) = monitor.count(semaphore.try_acquire(TTL)).await;
    assert_eq!(granted.unwrap().expect("s#9 is free").key(), "s#9");
    assert_eq!(calls, one_evalsha(1), "a granted permit: the attempt alone");
    for lease in held {
        lease.release().await.unwrap();
    }
}

/// `try_lock` runs the same script with one key: one call, and a grant
/// `try_lock_any` cannot tell from its own (the key is held to it).
#[tokio::test]
async fn try_lock_is_the_same_script_with_one_key() {
    let server = RedisServer::start();
    let mut monitor = Monitor::start(&server);
    let locker = connect(&server).await;
    let warm = locker.try_lock("k", TTL).await.unwrap().unwrap();
    let (any, calls) = monitor
        .count(locker.try_lock_any(&["k".to_owned()], TTL))
        .await;
    assert!(any.unwrap().is_none(), "try_lock's grant holds the key");
    assert_eq!(calls, one_evalsha(1));
    warm.release().await.unwrap();
    let (lease, calls) = monitor.count(locker.try_lock("k", TTL)).await;
    let lease = lease.unwrap().expect("free");
    assert_eq!(calls, one_evalsha(1), "no SCRIPT LOAD: one script for both");
    assert_eq!(lease.fencing_token(), Some(2));
    lease.release().await.unwrap();
}
