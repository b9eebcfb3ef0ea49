//! Interop with redis-py's `Lock` (`redis/lock.py` in
//! <https://github.com/redis/redis-py>: `do_acquire` is a plain `SET name
//! token NX PX ttl`, with no holder record): distlock reports such a key as
//! held by an unknown holder, never as free, lists it, and an operator's
//! force release frees it (redis-py's `owned()` then says so).
//!
//! Runs the real redis-py in a `python3` child process; `scripts/test.sh`
//! installs it (`pip install redis`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use distlock::inspect::ForceRelease;
use distlock::Locker;
use test_servers::RedisServer;

/// Takes `argv[2]` with redis-py's `Lock` (ttl 30 s) on the server at port
/// `argv[1]`, says so, then on each line of stdin reports `owned()`.
const PY_HOLDER: &str = r#"
import sys
import redis
client = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
lock = client.lock(sys.argv[2], timeout=30)
assert lock.acquire(blocking=False), "the key is free"
print("acquired", flush=True)
for _ in sys.stdin:
    print("owned" if lock.owned() else "not owned", flush=True)
"#;

struct PyHolder {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl PyHolder {
    fn start(server: &RedisServer, name: &str) -> PyHolder {
        let mut child = Command::new("python3")
            .args(["-c", PY_HOLDER, &server.port().to_string(), name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 is needed for the redis-py interop test (apt-get install python3)");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut holder = PyHolder {
            child,
            stdin,
            stdout,
        };
        let line = holder.read_line();
        assert_eq!(
            line, "acquired",
            "redis-py must take the lock; if it is missing: python3 -m pip install redis \
             (scripts/test.sh does)"
        );
        holder
    }

    fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from python3");
        line.trim().to_owned()
    }

    fn owned(&mut self) -> bool {
        writeln!(self.stdin, "?").expect("write to python3");
        match self.read_line().as_str() {
            "owned" => true,
            "not owned" => false,
            other => panic!("redis-py said {other:?}"),
        }
    }
}

impl Drop for PyHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_key_held_by_redis_py_is_held_by_an_unknown_holder_not_free() {
    let server = RedisServer::start();
    let locker = crate::support::connect(&server).await;
    let key = "py/report";
    let mut py = PyHolder::start(&server, &locker.backend_key(key));
    assert!(py.owned());

    let held = locker
        .inspect(key)
        .await
        .expect("inspect")
        .expect("a key redis-py holds is held, not free");
    assert_eq!(held.key, key);
    assert_eq!(held.holder, None, "redis-py records no holder: {held:?}");
    assert_eq!(
        (held.granted, held.ttl, held.fencing_token, held.session),
        (None, None, None, None)
    );
    let left = held.ttl_left.expect("redis-py's key expires");
    assert!(
        left <= Duration::from_secs(30) && left > Duration::from_secs(20),
        "ttl left from PTTL: {left:?}"
    );

    let listed = locker.list("py/").await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].key.as_str(), &listed[0].holder), (key, &None));
    assert!(
        locker
            .try_lock(key, Duration::from_secs(5))
            .await
            .expect("try_lock")
            .is_none(),
        "contention with redis-py's holder"
    );

    let evicted = locker
        .force_release(key, ForceRelease::Lock)
        .await
        .expect("force release")
        .expect("redis-py's lock was held");
    assert_eq!(evicted.holder, None);
    assert!(!py.owned(), "redis-py sees its lock gone");
    assert_eq!(locker.inspect(key).await.expect("inspect"), None);
    let lease = locker
        .try_lock(key, Duration::from_secs(5))
        .await
        .expect("try_lock")
        .expect("free after the force release");
    let held = locker.inspect(key).await.expect("inspect").expect("held");
    assert_eq!(
        held.holder.expect("distlock's own grant is recorded").pid,
        std::process::id()
    );
    lease.release().await.expect("release");
}
