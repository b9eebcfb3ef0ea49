//! Our locks and `etcdctl lock` (etcd's `concurrency.Mutex`) exclude each
//! other on the same name: the distlock key `K` is the etcd name `lock:K`.
//! Shared (reader) locks too: a reader's key is in the queue `etcdctl lock`
//! waits on, and to a reader an `etcdctl lock` key is a writer's.

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock::Locker;
use test_servers::EtcdServer;

const TTL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_etcdctl_holds_the_lock_try_lock_is_contention() {
    let server = EtcdServer::start();
    let locker = distlock::connect(&server.url()).await.unwrap();
    let mut etcdctl = server
        .etcdctl_command(&["lock", "lock:K", "--", "sleep", "3"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn etcdctl lock");
    // Wait until etcdctl's key is there.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server
        .etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:K/"])
        .is_empty()
    {
        assert!(Instant::now() < deadline, "etcdctl never took lock:K");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        locker.try_lock("K", TTL).await.unwrap().is_none(),
        "etcdctl holds lock:K"
    );
    // Our waiter queues behind etcdctl and gets it when `sleep 3` ends.
    let started = Instant::now();
    let lease = locker
        .lock("K", TTL, Duration::from_secs(10))
        .await
        .expect("granted once etcdctl released");
    eprintln!("granted {:?} after etcdctl's hold", started.elapsed());
    assert!(
        etcdctl.try_wait().unwrap().is_some() || {
            // etcdctl deletes its key before exiting.
            let _ = etcdctl.wait();
            true
        }
    );
    let keys = server.etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:K/"]);
    assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 1, "{keys}");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_we_hold_the_lock_etcdctl_waits_until_we_release() {
    let server = EtcdServer::start();
    let locker = distlock::connect(&server.url()).await.unwrap();
    let lease = locker.try_lock("K", TTL).await.unwrap().unwrap();
    let mut etcdctl = server
        .etcdctl_command(&["lock", "lock:K", "--", "echo", "got-it"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn etcdctl lock");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        etcdctl.try_wait().unwrap().is_none(),
        "etcdctl got lock:K while we held it"
    );
    let released_at = Instant::now();
    lease.release().await.unwrap();
    let output = tokio::task::spawn_blocking(move || etcdctl.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "etcdctl ran its command {:?} after our release",
        released_at.elapsed()
    );
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "got-it");
}

/// The keys etcd has under `prefix`.
fn keys_under(server: &EtcdServer, prefix: &str) -> Vec<String> {
    server
        .etcdctl_ok(&["get", "--prefix", "--keys-only", prefix])
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Waits until `etcdctl` has a key under `lock:K/`, or panics.
async fn wait_for_a_key_of_k(server: &EtcdServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys_under(server, "lock:K/").is_empty() {
        assert!(Instant::now() < deadline, "etcdctl never took lock:K");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `etcdctl lock` holding `lock:K` keeps readers out: `try_lock_shared` is
/// contention, `lock_shared` waits and is granted once etcdctl released,
/// and then a second reader joins it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_etcdctl_holds_the_lock_readers_wait_for_it() {
    let server = EtcdServer::start();
    let (a, b) = (
        distlock::connect(&server.url()).await.unwrap(),
        distlock::connect(&server.url()).await.unwrap(),
    );
    let mut etcdctl = server
        .etcdctl_command(&["lock", "lock:K", "--", "sleep", "3"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn etcdctl lock");
    wait_for_a_key_of_k(&server).await;
    assert!(
        a.try_lock_shared("K", TTL).await.unwrap().is_none(),
        "etcdctl holds lock:K: a reader is contention"
    );
    assert!(
        keys_under(&server, "lock:K/").len() == 1,
        "the contended reader left no key"
    );
    let started = Instant::now();
    let reader = a
        .lock_shared("K", TTL, Duration::from_secs(10))
        .await
        .expect("granted once etcdctl released");
    eprintln!(
        "reader granted {:?} after etcdctl's hold began",
        started.elapsed()
    );
    let status = tokio::task::spawn_blocking(move || etcdctl.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "etcdctl ran its command: {status}");
    let second = b
        .try_lock_shared("K", TTL)
        .await
        .unwrap()
        .expect("a second reader joins the first");
    let keys = keys_under(&server, "lock:K/");
    assert!(
        keys.len() == 2 && keys.iter().all(|k| k.starts_with("lock:K/read-")),
        "only the two readers' keys: {keys:?}"
    );
    reader.release().await.unwrap();
    second.release().await.unwrap();
    assert!(keys_under(&server, "lock:K/").is_empty());
}

/// A distlock reader holding `K` keeps `etcdctl lock lock:K` waiting until
/// it releases; and while etcdctl waits, it is a writer queued ahead of
/// any new reader, which is contention (etcd's order, not memory's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_reader_holds_the_lock_etcdctl_waits_until_it_releases() {
    let server = EtcdServer::start();
    let (a, b) = (
        distlock::connect(&server.url()).await.unwrap(),
        distlock::connect(&server.url()).await.unwrap(),
    );
    let reader = a.try_lock_shared("K", TTL).await.unwrap().unwrap();
    let mut etcdctl = server
        .etcdctl_command(&["lock", "lock:K", "--", "echo", "got-it"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn etcdctl lock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys_under(&server, "lock:K/").len() < 2 {
        assert!(Instant::now() < deadline, "etcdctl never queued for lock:K");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        etcdctl.try_wait().unwrap().is_none(),
        "etcdctl got lock:K while a reader held it"
    );
    assert!(
        b.try_lock_shared("K", TTL).await.unwrap().is_none(),
        "etcdctl's waiting key is a writer ahead of a new reader"
    );
    let released_at = Instant::now();
    reader.release().await.unwrap();
    let output = tokio::task::spawn_blocking(move || etcdctl.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "etcdctl ran its command {:?} after the reader's release",
        released_at.elapsed()
    );
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "got-it");
    b.try_lock_shared("K", TTL)
        .await
        .unwrap()
        .expect("free for readers once etcdctl is done")
        .release()
        .await
        .unwrap();
}

/// The election `E` is the etcd name `lock:E`, whose candidates' keys are
/// `lock:E/<lease>`: the layout of Go's `concurrency.Election`, which is
/// its `Mutex`'s.
mod election {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Stdio};
    use std::sync::mpsc;
    use std::time::Duration;

    use distlock::elect::Election;
    use distlock::Error;
    use test_servers::EtcdServer;

    const WAIT: Option<Duration> = Some(Duration::from_secs(10));

    /// `etcdctl elect lock:E PROPOSAL`, with a channel that receives its
    /// first line of output: it prints once elected.
    fn etcdctl_elect(server: &EtcdServer, proposal: &str) -> (Child, mpsc::Receiver<String>) {
        let mut child = server
            .etcdctl_command(&["elect", "lock:E", proposal])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn etcdctl elect");
        let stdout = child.stdout.take().expect("stdout");
        let (lines, elected) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        (child, elected)
    }

    /// SIGINT: `etcdctl elect` resigns (deletes its key) and exits.
    fn interrupt(child: &mut Child) {
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: kill(2) on a child this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        child.wait().expect("etcdctl exits");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcdctl_elect_and_a_distlock_candidate_exclude_each_other() {
        let server = EtcdServer::start();
        let election = Election::new(distlock::connect(&server.url()).await.unwrap(), "E")
            .proclaim("distlock-candidate");

        // etcdctl leads: distlock waits, its observer sees a leader with
        // no distlock record.
        let (mut etcdctl, elected) = etcdctl_elect(&server, "etcdctl-candidate");
        let first = elected
            .recv_timeout(Duration::from_secs(10))
            .expect("etcdctl is elected on a free election");
        assert!(first.starts_with("lock:E/"), "{first}");
        let refused = election
            .campaign(Some(Duration::from_millis(300)))
            .await
            .expect_err("etcdctl leads");
        assert!(matches!(refused, Error::Timeout { .. }), "{refused:?}");
        let leader = election
            .observe()
            .leader()
            .await
            .expect("observe")
            .expect("the distlock observer sees etcdctl's leadership");
        assert_eq!(leader.holder, None, "etcdctl records no holder: {leader:?}");
        assert_eq!(
            leader.proclaimed.as_deref(),
            Some("etcdctl-candidate"),
            "its proposal is what it proclaims"
        );
        interrupt(&mut etcdctl);
        let term = election
            .campaign(WAIT)
            .await
            .expect("elected once etcdctl resigned");

        // distlock leads: etcdctl waits until it resigns.
        let (mut etcdctl, elected) = etcdctl_elect(&server, "etcdctl-candidate");
        assert!(
            elected.recv_timeout(Duration::from_millis(1000)).is_err(),
            "etcdctl must not be elected while distlock leads"
        );
        term.resign().await.expect("resign");
        let line = elected
            .recv_timeout(Duration::from_secs(10))
            .expect("etcdctl is elected once distlock resigned");
        assert!(line.starts_with("lock:E/"), "{line}");
        interrupt(&mut etcdctl);
    }

    /// `etcdctl elect -l NAME`, running: each leader it prints, as the
    /// pair of lines it prints for it (`<key>\n<value>\n`).
    struct Listener {
        child: Child,
        lines: mpsc::Receiver<String>,
    }

    impl Listener {
        fn start(server: &EtcdServer, name: &str) -> Listener {
            let mut child = server
                .etcdctl_command(&["elect", "-l", name])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn etcdctl elect -l");
            let stdout = child.stdout.take().expect("stdout");
            let (sender, lines) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = sender.send(line);
                }
            });
            Listener { child, lines }
        }

        /// The next leader it prints: its key and its value.
        fn next_leader(&self) -> (String, String) {
            let line = || {
                self.lines
                    .recv_timeout(Duration::from_secs(10))
                    .expect("etcdctl elect -l prints the leader")
            };
            (line(), line())
        }

        /// Whatever it printed meanwhile, waiting `quiet` for more.
        fn printed_within(&self, quiet: Duration) -> Vec<String> {
            std::iter::from_fn(|| self.lines.recv_timeout(quiet).ok()).collect()
        }
    }

    impl Drop for Listener {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// `etcdctl elect -l` prints exactly a distlock leader's proclaimed
    /// value, as it prints an `etcdctl elect` leader's proposal (the
    /// secret and holder record are in the candidate's owner key, outside
    /// the election's prefix), and the next leader's once the first
    /// resigns: distlock has no `Proclaim` within a term, so a new value
    /// comes with a new term. A candidate waiting meanwhile prints nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcdctl_elect_listen_prints_a_distlock_leaders_proclaimed_value() {
        let server = EtcdServer::start();
        let node_a =
            Election::new(distlock::connect(&server.url()).await.unwrap(), "E").proclaim("node-a");
        let node_b =
            Election::new(distlock::connect(&server.url()).await.unwrap(), "E").proclaim("node-b");
        let term = node_a.campaign(WAIT).await.expect("node-a is elected");
        let listener = Listener::start(&server, "lock:E");
        let (key_a, value) = listener.next_leader();
        assert!(key_a.starts_with("lock:E/"), "{key_a}");
        assert_eq!(value, "node-a", "exactly the proclaimed value");

        let waiting = tokio::spawn(async move { node_b.campaign(WAIT).await });
        let keys = || server.etcdctl_ok(&["get", "--prefix", "--keys-only", "lock:E/"]);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while keys().lines().filter(|line| !line.is_empty()).count() < 2 {
            assert!(std::time::Instant::now() < deadline, "node-b never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!waiting.is_finished(), "node-b waits while node-a leads");
        assert_eq!(
            listener.printed_within(Duration::from_millis(300)),
            Vec::<String>::new(),
            "a waiting candidate is no leader"
        );

        term.resign().await.expect("node-a resigns");
        let next = waiting
            .await
            .expect("candidate task")
            .expect("node-b is elected once node-a resigned");
        let (key_b, value) = listener.next_leader();
        assert!(key_b.starts_with("lock:E/") && key_b != key_a, "{key_b}");
        assert_eq!(value, "node-b", "the new leader's proclaimed value");
        assert_eq!(
            server.etcdctl_ok(&["get", "--print-value-only", &key_b]),
            "node-b"
        );
        next.resign().await.expect("node-b resigns");
    }

    /// A candidate that proclaims nothing publishes the label in force
    /// (here a `with_label` scope's), what the distlock observer reports as
    /// its proclaimed value; `etcdctl elect -l` prints that.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_a_proclaimed_value_the_leader_publishes_its_label() {
        let server = EtcdServer::start();
        let election = Election::new(distlock::connect(&server.url()).await.unwrap(), "E");
        let term = distlock::inspect::with_label("nightly-runner", election.campaign(WAIT))
            .await
            .expect("elected");
        let (_, value) = Listener::start(&server, "lock:E").next_leader();
        assert_eq!(value, "nightly-runner");
        let leader = election
            .observe()
            .leader()
            .await
            .expect("observe")
            .expect("a leader");
        assert_eq!(leader.proclaimed.as_deref(), Some("nightly-runner"));
        term.resign().await.expect("resign");
    }
}
