//! `distlock elect` with real replicas: three processes campaign for one
//! election, each running a command that writes through a fencing check
//! while it leads; the leader is SIGKILLed or SIGSTOPped, and an observer
//! (`distlock elect --observe --json`) prints every change.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{wait_for_exit, wait_until, BIN};

/// Each leader's command: every 20 ms, a write to a shared resource that
/// keeps the highest term it has seen and rejects a smaller one (the
/// fencing check a real resource makes), logged as
/// `ok|rejected TERM LEADER`.
const FENCED_WRITER: &str = r#"
while :; do
  flock "$RESOURCE.lock" sh -c '
    max=$(cat "$RESOURCE.max" 2>/dev/null || echo 0)
    if [ "$DISTLOCK_TERM" -lt "$max" ]; then
      echo "rejected $DISTLOCK_TERM $DISTLOCK_LEADER" >> "$RESOURCE.log"
    else
      echo "$DISTLOCK_TERM" > "$RESOURCE.max"
      echo "ok $DISTLOCK_TERM $DISTLOCK_LEADER" >> "$RESOURCE.log"
    fi'
  sleep 0.02
done
"#;

/// One write the resource took or refused.
#[derive(Debug, Clone, PartialEq)]
struct Write {
    accepted: bool,
    term: u64,
    leader: String,
}

struct Replicas {
    children: Vec<(String, Child)>,
    resource: PathBuf,
    _dir: tempfile::TempDir,
}

/// A test that fails mid-way still stops its processes, which would
/// otherwise hold the test harness's output pipe open.
impl Drop for Replicas {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ObserverProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replicas {
    /// Three `distlock elect` replicas, `r0`..`r2`, on `url`.
    fn start(url: &str, key: &str, ttl: &str) -> Replicas {
        let dir = tempfile::tempdir().expect("temp dir");
        let resource = dir.path().join("resource");
        let children = (0..3)
            .map(|n| {
                let name = format!("r{n}");
                let child = Command::new(BIN)
                    .args(["elect", "--url", url, "--key", key, "--ttl", ttl])
                    .args(["--proclaim", &name, "--", "sh", "-c", FENCED_WRITER])
                    .env("RESOURCE", &resource)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("start distlock elect");
                (name, child)
            })
            .collect();
        Replicas {
            children,
            resource,
            _dir: dir,
        }
    }

    fn writes(&self) -> Vec<Write> {
        let log = std::fs::read_to_string(self.resource.with_extension("log")).unwrap_or_default();
        log.lines()
            .filter_map(|line| {
                let mut words = line.split(' ');
                let accepted = words.next()? == "ok";
                let term = words.next()?.parse().ok()?;
                let leader = words.next()?.to_owned();
                Some(Write {
                    accepted,
                    term,
                    leader,
                })
            })
            .collect()
    }

    /// Waits until a leader other than `not` has written, and returns it
    /// with its term and how long that took.
    fn await_leader(&self, not: Option<&str>, within: Duration) -> (String, u64, Duration) {
        let mut found = None;
        let took = wait_until("a new leader's first write", within, || {
            found = self
                .writes()
                .into_iter()
                .rev()
                .find(|w| w.accepted && Some(w.leader.as_str()) != not)
                .map(|w| (w.leader, w.term));
            found.is_some()
        });
        let (leader, term) = found.expect("found");
        (leader, term, took)
    }

    fn pid_of(&self, name: &str) -> i32 {
        let (_, child) = self
            .children
            .iter()
            .find(|(n, _)| n == name)
            .expect("a replica of that name");
        i32::try_from(child.id()).expect("pid")
    }

    /// SIGTERMs every replica still running and waits for each.
    fn stop(mut self) {
        for (_, child) in &mut self.children {
            if child.try_wait().expect("try_wait").is_none() {
                signal(i32::try_from(child.id()).expect("pid"), libc::SIGTERM);
                wait_for_exit(child, Duration::from_secs(20));
            }
        }
    }
}

/// Sends `signal` to the child process `pid`.
pub fn signal(pid: i32, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid of a child this test started.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid} {signal}");
}

/// `distlock elect --observe --json`, its lines collected as they come.
struct ObserverProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ObserverProcess {
    fn start(url: &str, key: &str) -> ObserverProcess {
        let mut child = Command::new(BIN)
            .args(["elect", "--observe", "--json", "--url", url, "--key", key])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start distlock elect --observe");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                collected.lock().expect("lines").push(line);
            }
        });
        ObserverProcess { child, lines }
    }

    /// The proclaimed value and term of every leader printed, in order
    /// (`None` for "no leader").
    fn leaders(&self) -> Vec<Option<(String, u64)>> {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .map(|line| {
                let change: serde_json::Value = serde_json::from_str(line).expect("JSON line");
                let leader = &change["leader"];
                (!leader.is_null()).then(|| {
                    (
                        leader["proclaimed"]
                            .as_str()
                            .unwrap_or_else(|| panic!("a proclaimed value in {line}"))
                            .to_owned(),
                        leader["term"]
                            .as_u64()
                            .unwrap_or_else(|| panic!("a term in {line}")),
                    )
                })
            })
            .collect()
    }

    fn stop(mut self) -> i32 {
        signal(i32::try_from(self.child.id()).expect("pid"), libc::SIGINT);
        wait_for_exit(&mut self.child, Duration::from_secs(10))
    }
}

/// Accepted writes never go back to an older term: no two leaders' writes
/// interleave.
fn assert_terms_never_go_back(writes: &[Write]) {
    let accepted: Vec<u64> = writes
        .iter()
        .filter(|w| w.accepted)
        .map(|w| w.term)
        .collect();
    assert!(
        accepted.windows(2).all(|pair| pair[0] <= pair[1]),
        "two leaders' writes interleaved: {writes:?}"
    );
}

/// The leader is SIGKILLed: its command dies with it (the watchdog kills
/// the group), another replica is elected in a later term, and no write of
/// the old term follows the new leader's, so none had to be rejected. The
/// observer prints both leaders in order. The failover (kill to the new
/// leader's first write) must take less than `bound`, which `why` explains.
pub fn failover_after_kill_9(url: &str, key: &str, ttl: &str, bound: Duration, why: &str) {
    let observer = ObserverProcess::start(url, key);
    let replicas = Replicas::start(url, key, ttl);
    let (first, first_term, _) = replicas.await_leader(None, Duration::from_secs(30));
    // A polling observer (every 250 ms where the backend sends no release
    // notification) sees a term only if it outlives one poll: the kill
    // waits until the observer has printed the first leader.
    wait_until(
        "the observer printing the first leader",
        Duration::from_secs(10),
        || {
            observer
                .leaders()
                .contains(&Some((first.clone(), first_term)))
        },
    );
    let killed = Instant::now();
    signal(replicas.pid_of(&first), libc::SIGKILL);
    let (second, second_term, _) = replicas.await_leader(Some(&first), Duration::from_secs(30));
    let failover = killed.elapsed();
    eprintln!("{url}: {first} (term {first_term}) killed, {second} (term {second_term}) writing after {failover:?}");
    assert!(second_term > first_term, "{second_term} after {first_term}");
    // Let the new leader write a while, and the observer catch up.
    std::thread::sleep(Duration::from_millis(500));
    let writes = replicas.writes();
    assert_terms_never_go_back(&writes);
    assert!(
        writes.iter().all(|w| w.accepted),
        "the killed leader's command died with it; nothing was rejected: {writes:?}"
    );
    let leaders = observer.leaders();
    let led: Vec<&(String, u64)> = leaders.iter().flatten().collect();
    assert!(
        led.first() == Some(&&(first.clone(), first_term))
            && led.contains(&&(second.clone(), second_term)),
        "the observer printed {first} (term {first_term}) then {second} (term {second_term}): {leaders:?}"
    );
    replicas.stop();
    assert_eq!(observer.stop(), 0, "--observe exits 0 on SIGINT");
    assert!(failover < bound, "failover took {failover:?}: {why}");
}

/// The leader's `distlock` is SIGSTOPped past its ttl (its command keeps
/// running: nothing local can stop it while distlock is frozen). Another
/// replica is elected; the frozen leader's late writes carry the older
/// term and the resource rejects them; once resumed, the old distlock
/// stops its command and campaigns again.
pub fn a_paused_leaders_late_writes_are_fenced(url: &str, key: &str) {
    let replicas = Replicas::start(url, key, "1s");
    let (first, first_term, _) = replicas.await_leader(None, Duration::from_secs(30));
    let paused = replicas.pid_of(&first);
    signal(paused, libc::SIGSTOP);
    let (_, second_term, _) = replicas.await_leader(Some(&first), Duration::from_secs(30));
    assert!(second_term > first_term);
    wait_until(
        "a rejected write from the paused leader's command",
        Duration::from_secs(10),
        || {
            replicas
                .writes()
                .iter()
                .any(|w| !w.accepted && w.term == first_term)
        },
    );
    signal(paused, libc::SIGCONT);
    // Resumed, it finds its term gone and stops its command: the old term's
    // writes stop coming.
    let old_term_writes = || {
        replicas
            .writes()
            .iter()
            .filter(|w| w.term == first_term)
            .count()
    };
    let mut seen = old_term_writes();
    wait_until(
        "the resumed leader's command stopped writing",
        Duration::from_secs(10),
        || {
            std::thread::sleep(Duration::from_millis(300));
            let now = old_term_writes();
            std::mem::replace(&mut seen, now) == now
        },
    );
    assert_terms_never_go_back(&replicas.writes());
    replicas.stop();
}

/// Failover on the file backend: the kernel frees the killed leader's lock
/// once the watchdog has killed its command.
#[test]
fn file_failover_after_kill_9_elects_another_replica_without_overlap() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    let why = "the kernel frees a dead leader's flock at once";
    failover_after_kill_9(&url, "leader", "5s", Duration::from_secs(1), why);
}

/// `--once`: the replica exits with its command's status instead of
/// campaigning again, and says which variables the command got.
#[test]
fn once_exits_with_the_commands_status_and_passes_the_term() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    let output = Command::new(BIN)
        .args([
            "elect",
            "--once",
            "--url",
            &url,
            "--key",
            "k",
            "--proclaim",
            "me",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_TERM $DISTLOCK_LEADER $DISTLOCK_KEY; exit 3",
        ])
        .output()
        .expect("run distlock elect");
    assert_eq!(output.status.code(), Some(3));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let words: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(words.len(), 3, "{stdout:?}");
    assert!(words[0].parse::<u64>().is_ok(), "a term number: {stdout:?}");
    assert_eq!(&words[1..], ["me", "k"]);
}

/// A standby gives up after `--wait` with the conflict code.
#[test]
fn wait_gives_up_with_75_while_another_leads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    let mut leader = Command::new(BIN)
        .args(["elect", "--url", &url, "--key", "k", "--", "sleep", "30"])
        .spawn()
        .expect("start the leader");
    wait_until("the leader is elected", Duration::from_secs(10), || {
        is_held(&url, "k")
    });
    let output = Command::new(BIN)
        .args([
            "elect", "--url", &url, "--key", "k", "--wait", "200ms", "--", "true",
        ])
        .output()
        .expect("run a standby");
    assert_eq!(output.status.code(), Some(75));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("is led elsewhere after waiting 200ms"),
        "{said}"
    );
    signal(i32::try_from(leader.id()).expect("pid"), libc::SIGTERM);
    // SIGTERM reaches `sleep`, which dies of it: 128 + 15.
    assert_eq!(wait_for_exit(&mut leader, Duration::from_secs(10)), 143);
}

fn is_held(url: &str, key: &str) -> bool {
    Command::new(BIN)
        .args(["status", "--url", url, "--key", key])
        .output()
        .map(|o| o.status.code() == Some(0))
        .unwrap_or(false)
}
