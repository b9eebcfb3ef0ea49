//! Interop with kazoo's `Lock` (`kazoo/recipe/lock.py`: contender nodes
//! `<uuid4 hex>__lock__<sequence>`; contenders are the children matching
//! `(?:__lock__|<extra_lock_patterns>)(-?\d{10})$`) on the same lock path:
//! a kazoo holder excludes distlock and hands it the lock on release; a
//! distlock holder (Curator's naming, `_c_<uuid>-lock-<sequence>`)
//! excludes a kazoo `Lock` given `extra_lock_patterns=["-lock-"]`, and is
//! invisible to one without it (the documented limit).
//!
//! And with kazoo's read-write lock (`ReadLock`: nodes `..__rlock__<seq>`,
//! waits for `__lock__`; `WriteLock`: nodes `..__lock__<seq>`, waits for
//! `__lock__` and `__rlock__`): readers of both coexist, a writer of
//! either excludes the other's readers and writers (kazoo told distlock's
//! names by `extra_lock_patterns`), and a waiting writer of either holds
//! the other's later readers back.
//!
//! Runs the real kazoo in a `python3` child process; the test installs it
//! if it is missing (`pip install kazoo`), as `scripts/test.sh` does.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Once;
use std::time::Duration;

use distlock::zookeeper::ZooKeeperLocker;
use distlock::Locker;
use test_servers::{unique_key, ZooKeeperServer};

/// Connects to `argv[1]`; each stdin line is a command on the lock path
/// `argv[2]`: `try [PATTERN..]` (one non-blocking attempt with a new
/// `Lock`, `extra_lock_patterns=[PATTERN..]`: `acquired` or `busy`),
/// `read [PATTERN..]` and `write [PATTERN..]` (the same with a `ReadLock`,
/// a `WriteLock`), any of those after `wait` (a blocking acquire, up to
/// 20 s: `acquired` or `busy`), `release`.
const PY_KAZOO: &str = r#"
import sys
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout
from kazoo.recipe.lock import Lock, ReadLock, WriteLock
zk = KazooClient(hosts=sys.argv[1], timeout=10)
zk.start(timeout=20)
path = sys.argv[2]
held = None
kinds = {"try": Lock, "read": ReadLock, "write": WriteLock}
print("ready", flush=True)
for line in sys.stdin:
    words = line.split()
    blocking = words[0] == "wait"
    if blocking:
        words = words[1:]
    if words[0] in kinds:
        lock = kinds[words[0]](zk, path, "kazoo-holder", extra_lock_patterns=words[1:])
        try:
            got = lock.acquire(blocking=blocking, timeout=20 if blocking else None)
        except LockTimeout:
            got = False
        if got:
            held = lock
            print("acquired", flush=True)
        else:
            print("busy", flush=True)
    elif words[0] == "release":
        held.release()
        held = None
        print("released", flush=True)
"#;

/// kazoo, installed once per test binary if `import kazoo` fails.
fn ensure_kazoo() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let present = Command::new("python3")
            .args(["-c", "import kazoo"])
            .status()
            .expect("python3 is needed for the kazoo interop test (apt-get install python3)")
            .success();
        if present {
            return;
        }
        // Debian's python3 refuses user installs without
        // --break-system-packages (PEP 668).
        let installed = ["--user", "--user --break-system-packages"]
            .iter()
            .any(|flags| {
                Command::new("python3")
                    .args(["-m", "pip", "install", "--quiet"])
                    .args(flags.split(' '))
                    .arg("kazoo")
                    .status()
                    .is_ok_and(|status| status.success())
            });
        assert!(
            installed,
            "could not install kazoo: python3 -m pip install kazoo (scripts/test.sh does)"
        );
    });
}

struct Kazoo {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Kazoo {
    fn start(server: &ZooKeeperServer, path: &str) -> Kazoo {
        ensure_kazoo();
        let mut child = Command::new("python3")
            .args(["-c", PY_KAZOO, &server.connect_string(), path])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 is needed for the kazoo interop test (apt-get install python3)");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut kazoo = Kazoo {
            child,
            stdin,
            stdout,
        };
        assert_eq!(kazoo.read_line(), "ready", "kazoo connects");
        kazoo
    }

    fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from python3");
        line.trim().to_owned()
    }

    /// Sends `command` and returns kazoo's answer (on a blocking thread:
    /// kazoo may wait).
    async fn ask(&mut self, command: &str) -> String {
        self.send(command);
        self.answer().await
    }

    /// Sends `command` without waiting for the answer (a `wait ...` that
    /// blocks in kazoo); [`answer`](Self::answer) reads it later.
    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("write to python3");
    }

    /// The next answer (on a blocking thread: kazoo may still wait).
    async fn answer(&mut self) -> String {
        tokio::task::block_in_place(|| self.read_line())
    }
}

impl Drop for Kazoo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn locker(server: &ZooKeeperServer) -> ZooKeeperLocker {
    ZooKeeperLocker::from_url(&server.url()).await.unwrap()
}

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_holder_excludes_distlock_and_hands_it_the_lock() {
    let server = ZooKeeperServer::shared();
    let locker = locker(server).await;
    let key = unique_key("kazoo-holds");
    let mut kazoo = Kazoo::start(server, &locker.backend_key(&key));
    assert_eq!(kazoo.ask("try").await, "acquired");
    assert!(
        locker.try_lock(&key, TTL).await.unwrap().is_none(),
        "kazoo's node is a contender ahead of ours"
    );
    let held = locker.inspect(&key).await.unwrap().expect("held by kazoo");
    assert_eq!(held.holder, None, "kazoo records no distlock holder");
    assert_eq!(held.value.as_deref(), Some("kazoo-holder"));
    // A distlock waiter queues behind kazoo's node and is woken by its
    // deletion.
    let waiter = {
        let locker = locker.clone();
        let key = key.clone();
        tokio::spawn(async move { locker.lock(&key, TTL, Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "waits while kazoo holds");
    assert_eq!(kazoo.ask("release").await, "released");
    let lease = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by kazoo's release")
        .unwrap()
        .expect("granted");
    // Now distlock holds: kazoo told to look for Curator-style nodes waits.
    assert_eq!(kazoo.ask("try -lock-").await, "busy");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distlock_holder_excludes_kazoo_given_curators_lock_pattern() {
    let server = ZooKeeperServer::shared();
    let locker = locker(server).await;
    let key = unique_key("distlock-holds");
    let mut kazoo = Kazoo::start(server, &locker.backend_key(&key));
    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("free");
    assert_eq!(
        kazoo.ask("try -lock-").await,
        "busy",
        "kazoo with extra_lock_patterns=['-lock-'] sees distlock's node"
    );
    lease.release().await.unwrap();
    assert_eq!(kazoo.ask("try -lock-").await, "acquired");
    assert!(locker.try_lock(&key, TTL).await.unwrap().is_none());
    assert_eq!(kazoo.ask("release").await, "released");
}

/// The limit the module docs state, measured: kazoo's default pattern
/// (`__lock__` only) does not see a Curator-named node, so a kazoo `Lock`
/// without `extra_lock_patterns` is granted the lock distlock holds. If this
/// starts failing, kazoo learned Curator's naming and the docs can say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_lock_without_the_pattern_does_not_see_distlock() {
    let server = ZooKeeperServer::shared();
    let locker = locker(server).await;
    let key = unique_key("default-kazoo");
    let mut kazoo = Kazoo::start(server, &locker.backend_key(&key));
    let lease = locker.try_lock(&key, TTL).await.unwrap().expect("free");
    assert_eq!(kazoo.ask("try").await, "acquired");
    assert_eq!(kazoo.ask("release").await, "released");
    lease.release().await.unwrap();
}

/// kazoo's read-write lock told distlock's names: `ReadLock` must wait for
/// distlock's writers (`-lock-`), `WriteLock` for its writers and readers
/// (`__READ__`).
const KAZOO_READ: &str = "read -lock-";
const KAZOO_WRITE: &str = "write -lock- __READ__";

/// Until `kazoo`'s waiting node is in `key`'s queue: a distlock reader is
/// then held back by it (with nothing else ahead but readers).
async fn until_queued_writer_holds_readers_back(locker: &ZooKeeperLocker, key: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Some(reader) = locker.try_lock_shared(key, TTL).await.unwrap() {
        reader.release().await.unwrap();
        assert!(
            tokio::time::Instant::now() < deadline,
            "kazoo's waiting writer never queued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// kazoo's readers and distlock's coexist; a kazoo `WriteLock` excludes
/// distlock's readers (a distlock `lock_shared` waits for it and is woken
/// by its release) and its writers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_readers_coexist_with_distlock_readers_and_its_writers_exclude_them() {
    let server = ZooKeeperServer::shared();
    let locker = locker(server).await;
    let key = unique_key("kazoo-rw");
    let mut kazoo = Kazoo::start(server, &locker.backend_key(&key));
    assert_eq!(kazoo.ask("read").await, "acquired");
    let reader = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("a distlock reader beside kazoo's");
    assert!(
        locker.try_lock(&key, TTL).await.unwrap().is_none(),
        "kazoo's __rlock__ node is a reader ahead of a distlock writer"
    );
    let held = locker.inspect(&key).await.unwrap().expect("held");
    assert!(held.shared, "kazoo's reader is first: held shared {held:?}");
    assert_eq!(held.value.as_deref(), Some("kazoo-holder"));
    assert_eq!(kazoo.ask("release").await, "released");
    reader.release().await.unwrap();

    assert_eq!(kazoo.ask("write").await, "acquired");
    assert!(
        locker.try_lock_shared(&key, TTL).await.unwrap().is_none(),
        "kazoo's writer excludes a distlock reader"
    );
    assert!(locker.try_lock(&key, TTL).await.unwrap().is_none());
    let held = locker.inspect(&key).await.unwrap().expect("held");
    assert!(!held.shared, "held by kazoo's writer: {held:?}");
    let waiting = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.lock_shared(&key, TTL, Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "waits while kazoo's writer holds");
    assert_eq!(kazoo.ask("release").await, "released");
    let reader = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken by kazoo's release")
        .unwrap()
        .expect("granted");
    reader.release().await.unwrap();
}

/// distlock's readers coexist with kazoo's `ReadLock` and exclude a kazoo
/// `WriteLock` told their name; distlock's writer excludes both. A kazoo
/// `WriteLock` without the patterns does not see a distlock reader (the
/// documented limit, measured).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_readers_and_writers_exclude_kazoo_given_their_names() {
    let server = ZooKeeperServer::shared();
    let locker = locker(server).await;
    let key = unique_key("distlock-rw");
    let mut kazoo = Kazoo::start(server, &locker.backend_key(&key));
    let reader = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(kazoo.ask(KAZOO_READ).await, "acquired", "readers coexist");
    assert_eq!(kazoo.ask("release").await, "released");
    assert_eq!(
        kazoo.ask(KAZOO_WRITE).await,
        "busy",
        "kazoo's writer sees distlock's __READ__ reader"
    );
    assert_eq!(
        kazoo.ask("write").await,
        "acquired",
        "a WriteLock without the patterns does not see distlock's reader"
    );
    assert_eq!(kazoo.ask("release").await, "released");
    reader.release().await.unwrap();

    let writer = locker.try_lock(&key, TTL).await.unwrap().expect("free");
    assert_eq!(kazoo.ask(KAZOO_READ).await, "busy");
    assert_eq!(kazoo.ask(KAZOO_WRITE).await, "busy");
    writer.release().await.unwrap();
    assert_eq!(kazoo.ask(KAZOO_WRITE).await, "acquired");
    assert_eq!(kazoo.ask("release").await, "released");
}

/// Writer priority across clients: a kazoo `WriteLock` waiting for a
/// distlock reader holds a later distlock reader back, and a distlock
/// writer waiting for a kazoo reader holds a later kazoo `ReadLock` back;
/// each waiting writer gets the lock when the reader ahead leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_of_either_holds_the_others_later_readers_back() {
    let server = ZooKeeperServer::shared();
    let locker = locker(server).await;
    let key = unique_key("rw-priority");
    let mut waiting_kazoo = Kazoo::start(server, &locker.backend_key(&key));
    let mut kazoo = Kazoo::start(server, &locker.backend_key(&key));

    let first = locker
        .try_lock_shared(&key, TTL)
        .await
        .unwrap()
        .expect("free");
    waiting_kazoo.send(&format!("wait {KAZOO_WRITE}"));
    until_queued_writer_holds_readers_back(&locker, &key).await;
    assert!(
        locker.try_lock_shared(&key, TTL).await.unwrap().is_none(),
        "a later distlock reader waits behind kazoo's queued writer"
    );
    first.release().await.unwrap();
    assert_eq!(waiting_kazoo.answer().await, "acquired");
    assert!(locker.try_lock_shared(&key, TTL).await.unwrap().is_none());
    assert_eq!(waiting_kazoo.ask("release").await, "released");

    assert_eq!(kazoo.ask("read").await, "acquired");
    let writer = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.lock(&key, TTL, Duration::from_secs(20)).await })
    };
    until_queued_writer_holds_readers_back(&locker, &key).await;
    assert!(
        !writer.is_finished(),
        "the distlock writer waits for kazoo's reader"
    );
    assert_eq!(
        waiting_kazoo.ask(KAZOO_READ).await,
        "busy",
        "a later kazoo reader waits behind distlock's queued writer"
    );
    assert_eq!(kazoo.ask("release").await, "released");
    let lease = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("woken by kazoo's release")
        .unwrap()
        .expect("granted");
    assert_eq!(waiting_kazoo.ask(KAZOO_READ).await, "busy");
    lease.release().await.unwrap();
    assert_eq!(waiting_kazoo.ask(KAZOO_READ).await, "acquired");
    assert_eq!(waiting_kazoo.ask("release").await, "released");
}
