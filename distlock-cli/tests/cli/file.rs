//! `distlock run` / `distlock release` end to end on the file backend: real
//! processes, real signals.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use distlock::file::FileLocker;
use distlock::Locker;

use crate::support::{alive, code, stderr, wait_for_exit, BIN};

/// A private lock directory and the `distlock` command pointed at it.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn lock_dir(&self) -> PathBuf {
        self.dir.path().join("locks")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn distlock(&self) -> Command {
        let mut command = Command::new(BIN);
        command
            .env(
                "DISTLOCK_URL",
                format!("file://{}", self.lock_dir().display()),
            )
            .env_remove("RUST_LOG");
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.distlock().args(args).output().expect("run distlock")
    }

    fn locker(&self) -> FileLocker {
        FileLocker::new(self.lock_dir()).expect("lock dir")
    }
}

fn wait_for_file(path: &Path, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {within:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn assert_free(fixture: &Fixture, key: &str) {
    let lease = fixture
        .locker()
        .lock(key, Duration::from_secs(5), Duration::from_secs(3))
        .await
        .expect("the lock is free again");
    lease.release().await.expect("release");
}

#[test]
fn eight_processes_increment_a_shared_counter_exactly() {
    let fixture = Fixture::new();
    let counter = fixture.path("counter");
    std::fs::write(&counter, "0\n").unwrap();
    let script = format!(
        "n=$(cat {0}); sleep 0.05; echo $((n + 1)) > {0}",
        counter.display()
    );
    let children: Vec<Child> = (0..8)
        .map(|_| {
            fixture
                .distlock()
                .args([
                    "run", "--key", "counter", "--wait", "60s", "--", "sh", "-c", &script,
                ])
                .spawn()
                .expect("spawn distlock")
        })
        .collect();
    for mut child in children {
        assert_eq!(wait_for_exit(&mut child, Duration::from_secs(90)), 0);
    }
    assert_eq!(std::fs::read_to_string(&counter).unwrap().trim(), "8");
}

#[tokio::test]
async fn a_held_lock_exits_with_the_conflict_code_without_running_the_command() {
    let fixture = Fixture::new();
    let lease = fixture
        .locker()
        .try_lock("busy", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    let marker = fixture.path("ran");
    let touch = format!("touch {}", marker.display());

    let output = fixture.run(&["run", "--key", "busy", "--", "sh", "-c", &touch]);
    assert_eq!(code(&output), 75);
    assert!(
        stderr(&output).contains("lock \"busy\" is held elsewhere"),
        "{}",
        stderr(&output)
    );

    let output = fixture.run(&[
        "run",
        "--key",
        "busy",
        "--conflict-exit-code",
        "0",
        "--wait",
        "300ms",
        "--",
        "sh",
        "-c",
        &touch,
    ]);
    assert_eq!(code(&output), 0);
    assert!(
        stderr(&output).contains("after waiting 300ms"),
        "{}",
        stderr(&output)
    );
    assert!(!marker.exists(), "the command ran without the lock");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn wait_acquires_once_the_holder_releases() {
    let fixture = Fixture::new();
    let lease = fixture
        .locker()
        .try_lock("queue", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("free");
    let mut child = fixture
        .distlock()
        .args(["run", "--key", "queue", "--wait", "10s", "--", "true"])
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "distlock must still be waiting"
    );
    lease.release().await.unwrap();
    assert_eq!(wait_for_exit(&mut child, Duration::from_secs(5)), 0);
}

#[test]
fn the_commands_exit_code_is_propagated() {
    let fixture = Fixture::new();
    for expected in [0, 3, 42] {
        let output = fixture.run(&[
            "run",
            "--key",
            "exit",
            "--",
            "sh",
            "-c",
            &format!("exit {expected}"),
        ]);
        assert_eq!(code(&output), expected);
    }
    let output = fixture.run(&["run", "--key", "exit", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(code(&output), 128 + 9, "killed by SIGKILL is 128+9");
    let output = fixture.run(&["run", "--key", "exit", "--", "/nonexistent/command"]);
    assert_eq!(code(&output), 127);
}

#[test]
fn the_child_sees_key_owner_and_increasing_fencing_tokens() {
    let fixture = Fixture::new();
    let print = "echo \"$DISTLOCK_KEY $DISTLOCK_OWNER $DISTLOCK_FENCING_TOKEN\"";
    let mut previous = 0u64;
    for _ in 0..3 {
        let output = fixture.run(&["run", "--key", "fenced", "--", "sh", "-c", print]);
        assert_eq!(code(&output), 0, "{}", stderr(&output));
        let stdout = String::from_utf8(output.stdout).unwrap();
        let fields: Vec<&str> = stdout.split_whitespace().collect();
        assert_eq!(fields.len(), 3, "{stdout:?}");
        assert_eq!(fields[0], "fenced");
        assert!(fields[1].len() == 32 && fields[1].chars().all(|c| c.is_ascii_hexdigit()));
        let token: u64 = fields[2].parse().unwrap();
        assert!(token > previous, "token {token} after {previous}");
        previous = token;
    }
}

#[tokio::test]
async fn sigterm_is_forwarded_and_the_lock_released() {
    let fixture = Fixture::new();
    let marker = fixture.path("got-term");
    let ready = fixture.path("ready");
    let script = format!(
        "trap 'echo term > {}; exit 42' TERM; echo up > {}; while :; do sleep 0.05; done",
        marker.display(),
        ready.display()
    );
    let mut child = fixture
        .distlock()
        .args(["run", "--key", "signals", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_for_file(&ready, Duration::from_secs(5));
    test_servers::signal(child.id(), libc::SIGTERM);
    assert_eq!(wait_for_exit(&mut child, Duration::from_secs(5)), 42);
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "term\n");
    assert_free(&fixture, "signals").await;
}

#[tokio::test]
async fn the_command_dies_with_distlock_even_on_sigkill() {
    let fixture = Fixture::new();
    let pid_file = fixture.path("pid");
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let mut child = fixture
        .distlock()
        .args(["run", "--key", "orphan", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let pid: u32 = wait_for_file(&pid_file, Duration::from_secs(5))
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid));
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the command outlived distlock's SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_free(&fixture, "orphan").await;
}

#[test]
fn the_command_inherits_no_lock_file_descriptor() {
    let fixture = Fixture::new();
    let list = "for fd in /proc/$$/fd/*; do readlink \"$fd\" || true; done";
    let output = fixture.run(&["run", "--key", "fds", "--", "sh", "-c", list]);
    assert_eq!(code(&output), 0);
    let fds = String::from_utf8(output.stdout).unwrap();
    assert!(!fds.contains(".lock"), "lock file inherited: {fds}");
    assert!(!fds.contains("socket:"), "socket inherited: {fds}");
}

#[tokio::test]
async fn losing_the_lock_stops_the_command_with_the_lost_code() {
    let fixture = Fixture::new();
    let ready = fixture.path("ready");
    let script = format!("echo up > {}; exec sleep 30", ready.display());
    let mut child = fixture
        .distlock()
        .args([
            "run",
            "--key",
            "lost",
            "--ttl",
            "300ms",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&ready, Duration::from_secs(5));
    // Deleting the lock file is how a flock is lost: another process can now
    // lock a new file under the same name. The keepalive must notice.
    std::fs::remove_file(fixture.locker().path_for("lost")).unwrap();
    assert_eq!(wait_for_exit(&mut child, Duration::from_secs(5)), 76);
    let output = child.wait_with_output().unwrap();
    assert!(
        stderr(&output).contains("lock \"lost\" lost"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn max_hold_stops_the_command() {
    let fixture = Fixture::new();
    let started = Instant::now();
    let output = fixture.run(&[
        "run",
        "--key",
        "bounded",
        "--ttl",
        "300ms",
        "--max-hold",
        "700ms",
        "--",
        "sleep",
        "30",
    ]);
    assert_eq!(code(&output), 76);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        stderr(&output).contains("maximum hold time"),
        "{}",
        stderr(&output)
    );
    assert_free(&fixture, "bounded").await;
}

#[tokio::test]
async fn release_by_owner_token_explains_what_happened() {
    let fixture = Fixture::new();
    let output = fixture.run(&["release", "--key", "nobody", "--owner", "0123"]);
    assert_eq!(code(&output), 1);
    assert!(
        stderr(&output).contains("not held by that owner"),
        "{}",
        stderr(&output)
    );

    // A flock held by another process (this test) cannot be freed from the CLI.
    let lease = fixture
        .locker()
        .try_lock("mine", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let output = fixture.run(&["release", "--key", "mine", "--owner", lease.owner()]);
    assert_eq!(code(&output), 77, "its own code, not 64 (bad usage)");
    let message = stderr(&output);
    assert!(
        message.contains(&format!("held by process {}", std::process::id())),
        "{message}"
    );
    assert!(
        message.contains("can only be released by the process or session holding it"),
        "{message}"
    );
    assert_eq!(message.lines().count(), 1, "{message}");
    lease.release().await.unwrap();
}

#[test]
fn bench_leaves_no_lock_file_behind() {
    let fixture = Fixture::new();
    let output = fixture.run(&["bench", "--duration", "200ms", "--tasks", "1,2"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let runs: Vec<&str> = stdout.lines().skip(2).collect();
    assert_eq!(runs.len(), 2, "one line per run: {stdout}");
    let left: Vec<String> = std::fs::read_dir(fixture.lock_dir())
        .expect("the bench used the lock directory")
        .map(|entry| {
            entry
                .expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert!(
        left.is_empty(),
        "bench files left in the lock directory: {left:?}"
    );
}

#[test]
fn bad_input_is_one_clear_line() {
    let fixture = Fixture::new();
    let cases: [(&[&str], &str); 6] = [
        (
            &["run", "--key", "k", "--ttl", "banana", "--", "true"],
            "--ttl",
        ),
        (
            &["run", "--key", "k", "--ttl", "0s", "--", "true"],
            "0s is too short",
        ),
        (&["run", "--key", "", "--", "true"], "invalid key"),
        (
            &[
                "run",
                "--key",
                "k",
                "--url",
                "consul://consul",
                "--",
                "true",
            ],
            "unsupported scheme",
        ),
        (
            &["run", "--key", "k", "--url", "not a url", "--", "true"],
            "invalid url",
        ),
        (&["run", "--key", "k"], "CMD"),
    ];
    for (args, expected) in cases {
        let output = fixture.run(args);
        assert_eq!(code(&output), 64, "{args:?}");
        let message = stderr(&output);
        assert_eq!(message.lines().count(), 1, "{args:?}: {message}");
        assert!(
            message.starts_with("distlock: ") && message.contains(expected),
            "{args:?}: {message}"
        );
        assert!(!message.contains("panicked"), "{message}");
    }
}

/// A lock directory its group can write was accepted (only writable by
/// every user was refused): the group's members could replace lock files.
#[test]
fn a_lock_directory_others_can_write_is_refused_naming_it_and_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let fixture = Fixture::new();
    std::fs::create_dir(fixture.lock_dir()).expect("create");
    std::fs::set_permissions(fixture.lock_dir(), std::fs::Permissions::from_mode(0o770))
        .expect("chmod");
    let ran = fixture.path("ran");
    let output = fixture.run(&["run", "--key", "k", "--", "touch", ran.to_str().unwrap()]);
    let message = stderr(&output);
    assert_eq!(code(&output), 64, "{message}");
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(
        message.contains(&format!(
            "{} is writable by its group",
            fixture.lock_dir().display()
        )) && message.contains("chmod go-w"),
        "{message}"
    );
    assert!(!ran.exists(), "the command must not run");
}

#[test]
fn metrics_are_served_in_prometheus_format_while_the_command_runs() {
    use std::io::{Read, Write};
    let fixture = Fixture::new();
    let port = test_servers::free_port();
    let ready = fixture.path("ready");
    let script = format!("echo up > {}; sleep 3", ready.display());
    let mut child = fixture
        .distlock()
        .args([
            "run",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--key",
            "observed",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .unwrap();
    wait_for_file(&ready, Duration::from_secs(5));
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics listener");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200"),
        "{response}"
    );
    assert!(
        response.contains("distlock_acquired_total{backend=\"file\",operation=\"lock\"} 1"),
        "{response}"
    );
    assert!(
        response.contains("# TYPE distlock_operation_duration_seconds histogram"),
        "histograms, which aggregate across replicas, not summaries: {response}"
    );
    assert!(
        response.contains("distlock_operation_duration_seconds_bucket{")
            && response.contains("le=\"0.0005\"")
            && response.contains("le=\"+Inf\""),
        "{response}"
    );
}

/// Reads `count` pids, one a line, from a file the command writes.
fn read_pids(path: &Path, count: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            let pids: Vec<u32> = text
                .lines()
                .filter_map(|line| line.trim().parse().ok())
                .collect();
            if pids.len() >= count && text.ends_with('\n') {
                return pids;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} did not list {count} pids",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until none of `pids` is alive, or panics naming the survivors.
fn wait_until_dead(pids: &[u32], within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|pid| alive(*pid)).collect();
        if alive.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {alive:?} still running after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A shell command for a second holder: exit 9 if any of `pids` still runs
/// (a zombie does not run), 0 otherwise.
fn none_running(pids: &[u32]) -> String {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!(
        "for p in {}; do if [ -r /proc/$p/stat ]; then read -r _ _ state _ < /proc/$p/stat; \
         [ \"$state\" = Z ] || {{ echo \"$p still runs\" >&2; exit 9; }}; fi; done",
        list.join(" ")
    )
}

/// Kills leftovers of a failed test so they do not outlive it.
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            if alive(*pid) {
                test_servers::signal(*pid, libc::SIGKILL);
            }
        }
    }
}

#[test]
fn kill_9_of_distlock_kills_every_process_of_a_forking_command_before_anyone_else_runs() {
    // A command that forks and waits, and one whose first process exits at
    // once, leaving a TERM-ignoring sleeper that distlock is still stopping
    // (kill-after 10s) when it is SIGKILLed.
    let scripts = [
        "echo $$ > {pids}; sleep 1234 & echo $! >> {pids}; wait",
        "sh -c 'trap \"\" TERM; echo $$ > {pids}.tmp; mv {pids}.tmp {pids}; exec sleep 1234' & \
         while [ ! -e {pids} ]; do sleep 0.01; done; exit 0",
    ];
    for (round, script) in scripts.iter().enumerate() {
        let fixture = Fixture::new();
        let pid_file = fixture.path("pids");
        let script = script.replace("{pids}", &pid_file.display().to_string());
        let mut holder = fixture
            .distlock()
            .args(["run", "--key", "tree", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        let pids = read_pids(&pid_file, 2 - round);
        let _cleanup = KillOnDrop(pids.clone());
        assert!(pids.iter().all(|pid| alive(*pid)), "{pids:?} run");
        // The next holder is already waiting when the first one dies.
        let next = fixture
            .distlock()
            .args(["run", "--key", "tree", "--wait", "10s", "--", "sh", "-c"])
            .arg(none_running(&pids))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        holder.kill().unwrap();
        holder.wait().unwrap();
        wait_until_dead(&pids, Duration::from_secs(3), "after kill -9 of distlock");
        let output = next.wait_with_output().unwrap();
        assert_eq!(
            code(&output),
            0,
            "round {round}: the next holder ran beside the first one's processes: {}",
            stderr(&output)
        );
    }
}

/// The watchdog of the distlock process `parent`: its child whose command
/// line starts with `distlock-watchdog`.
fn watchdog_of(parent: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1));
            if cmdline.starts_with(b"distlock-watchdog") && ppid == Some(&parent.to_string()) {
                return pid;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no watchdog under distlock {parent}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Set, to the test's name, in the re-run of a test as a child subreaper.
const ADOPTER_VAR: &str = "DISTLOCK_TEST_SUBREAPER_SCENARIO";

/// True in the re-run of `test` (then this process is a child subreaper); in
/// the outer run, re-runs `test` alone in a new process of this binary that
/// adopts the orphans of the processes it starts, and checks it passed.
/// A subreaper adopting them keeps their process groups from becoming
/// "orphaned", which would make the kernel SIGCONT their stopped members.
fn as_subreaper(test: &str) -> bool {
    if std::env::var(ADOPTER_VAR).as_deref() == Ok(test) {
        // SAFETY: prctl with these arguments only sets a process attribute.
        let set = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
        assert_eq!(
            set,
            0,
            "PR_SET_CHILD_SUBREAPER: {}",
            std::io::Error::last_os_error()
        );
        return true;
    }
    let output = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ADOPTER_VAR, test)
        .output()
        .expect("re-run the test");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{test} failed:\n{stdout}{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "{test} did not run (is the name exact?)"
    );
    false
}

/// The file lock outlives a SIGKILLed distlock for exactly as long as the
/// command's group does: the watchdog holds the lock file's open file. With
/// the watchdog stopped, the group's sleeper survives distlock, and the lock
/// must still be held; once the watchdog runs, it kills the group and exits,
/// and only then is the lock free. (Before, the kernel freed the lock the
/// moment distlock died, and a next holder could start beside the sleeper.)
#[tokio::test]
async fn a_sigkilled_distlock_keeps_a_file_lock_held_until_its_command_group_is_dead() {
    const NAME: &str =
        "file::a_sigkilled_distlock_keeps_a_file_lock_held_until_its_command_group_is_dead";
    if !as_subreaper(NAME) {
        return;
    }
    let fixture = Fixture::new();
    let pid_file = fixture.path("sleeper");
    let script = format!("sleep 1234 & echo $! > {}; wait", pid_file.display());
    let mut holder = fixture
        .distlock()
        .args(["run", "--key", "held", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let sleeper = read_pids(&pid_file, 1)[0];
    let watchdog = watchdog_of(holder.id());
    let _cleanup = KillOnDrop(vec![sleeper, watchdog]);
    test_servers::signal(watchdog, libc::SIGSTOP);
    holder.kill().unwrap();
    holder.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(alive(sleeper), "the stopped watchdog cannot have killed it");
    let contender = fixture.locker();
    assert!(
        contender
            .try_lock("held", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none(),
        "distlock is dead but its command's sleeper runs: the lock must still be held"
    );
    test_servers::signal(watchdog, libc::SIGCONT);
    wait_until_dead(
        &[sleeper],
        Duration::from_secs(3),
        "after the watchdog resumed",
    );
    assert_free(&fixture, "held").await;
}

#[test]
fn a_leader_that_exits_first_has_its_leftovers_stopped_before_the_lock_is_released() {
    let fixture = Fixture::new();
    let pid_file = fixture.path("pid");
    // The leftover takes half a second to exit after SIGTERM. The leader
    // exits once the leftover has set its trap and written its pid.
    let script = format!(
        "sh -c 'trap \"sleep 0.5; exit 0\" TERM; echo $$ > {0}.tmp; mv {0}.tmp {0}; \
         while :; do sleep 0.05; done' & while [ ! -e {0} ]; do sleep 0.01; done; exit 0",
        pid_file.display()
    );
    let started = Instant::now();
    let mut first = fixture
        .distlock()
        .args(["run", "--key", "leftover", "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = read_pids(&pid_file, 1);
    let _cleanup = KillOnDrop(pids.clone());
    let second = fixture.run(&[
        "run",
        "--key",
        "leftover",
        "--wait",
        "10s",
        "--",
        "sh",
        "-c",
        &none_running(&pids),
    ]);
    assert_eq!(
        code(&second),
        0,
        "the second holder started while the leftover ran: {}",
        stderr(&second)
    );
    assert_eq!(
        wait_for_exit(&mut first, Duration::from_secs(5)),
        0,
        "distlock exits with the leader's status"
    );
    assert!(!alive(pids[0]));
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the leftover's SIGTERM handler ran to its end"
    );
    let output = first.wait_with_output().unwrap();
    assert!(
        stderr(&output).contains("left processes in its group"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn forwarded_signals_reach_every_process_of_the_group() {
    let fixture = Fixture::new();
    let log = fixture.path("log");
    let ready = fixture.path("ready");
    let inner = format!(
        "trap \"echo inner-usr1 >> {log}\" USR1; trap \"echo inner-term >> {log}; exit 0\" TERM; \
         echo $$ > {ready}; while :; do sleep 0.05; done",
        log = log.display(),
        ready = ready.display()
    );
    // The outer shell traps both too (a trapped signal is reset in its
    // children, an ignored one would be inherited), so the grandchild's traps
    // are its own.
    let outer = format!(
        "trap 'echo outer-usr1 >> {log}' USR1; trap 'wait; exit 7' TERM; sh -c '{inner}' & \
         while :; do sleep 0.05; done",
        log = log.display(),
        inner = inner.replace('\'', "'\\''")
    );
    let mut child = fixture
        .distlock()
        .args(["run", "--key", "group-signals", "--", "sh", "-c", &outer])
        .spawn()
        .unwrap();
    let grandchild = read_pids(&ready, 1);
    let _cleanup = KillOnDrop(vec![child.id(), grandchild[0]]);
    test_servers::signal(child.id(), libc::SIGUSR1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("inner-usr1")
    {
        assert!(
            Instant::now() < deadline,
            "the grandchild never got SIGUSR1: {:?}",
            std::fs::read_to_string(&log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    test_servers::signal(child.id(), libc::SIGTERM);
    assert_eq!(wait_for_exit(&mut child, Duration::from_secs(5)), 7);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("outer-usr1"), "{log}");
    assert!(log.contains("inner-term"), "{log}");
    assert_free(&fixture, "group-signals").await;
}

#[test]
fn a_term_ignoring_command_past_max_hold_keeps_the_lock_until_it_exits() {
    let fixture = Fixture::new();
    let ready = fixture.path("ready");
    let script = format!("trap '' TERM; echo up > {}; sleep 4", ready.display());
    let started = Instant::now();
    let mut first = fixture
        .distlock()
        .args([
            "run",
            "--key",
            "mh",
            "--max-hold",
            "1s",
            "--kill-after",
            "5s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&ready, Duration::from_secs(5));
    // Past the max hold, while the command (TERM ignored) still runs.
    for at in [Duration::from_millis(1600), Duration::from_millis(3000)] {
        if let Some(wait) = at.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        if first.try_wait().unwrap().is_some() {
            break;
        }
        let output = fixture.run(&["run", "--key", "mh", "--", "true"]);
        assert_eq!(
            code(&output),
            75,
            "a second holder got the lock {:?} after the start while the command ran",
            started.elapsed()
        );
    }
    assert_eq!(wait_for_exit(&mut first, Duration::from_secs(10)), 76);
    let output = first.wait_with_output().unwrap();
    assert!(
        stderr(&output).contains("maximum hold time"),
        "{}",
        stderr(&output)
    );
    let output = fixture.run(&["run", "--key", "mh", "--", "true"]);
    assert_eq!(code(&output), 0, "free once the command exited");
}

#[test]
fn kill_after_is_capped_at_half_the_ttl_minus_the_drift_margin() {
    let fixture = Fixture::new();
    let pid_file = fixture.path("pid");
    // The leader exits at once; its leftover ignores SIGTERM.
    let script = format!(
        "sh -c 'trap \"\" TERM; echo $$ > {0}.tmp; mv {0}.tmp {0}; exec sleep 30' & \
         while [ ! -e {0} ]; do sleep 0.01; done; exit 0",
        pid_file.display()
    );
    let started = Instant::now();
    let output = fixture.run(&[
        "run",
        "--key",
        "capped",
        "--ttl",
        "2s",
        "--kill-after",
        "10s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let elapsed = started.elapsed();
    let pids = read_pids(&pid_file, 1);
    let _cleanup = KillOnDrop(pids.clone());
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    // ttl/2 - (ttl/100 + 100ms) = 1s - 120ms.
    assert!(
        stderr(&output).contains("--kill-after 10s is capped at 880ms"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        stderr(&output).matches("is capped at").count(),
        1,
        "warned once"
    );
    assert!(!alive(pids[0]), "the leftover was SIGKILLed");
    assert!(
        elapsed < Duration::from_secs(8),
        "SIGKILL came after {elapsed:?}: the uncapped 10s grace, not the 880ms cap"
    );
}

#[test]
fn huge_waits_and_max_holds_run_the_command_without_panicking() {
    let fixture = Fixture::new();
    for flags in [
        &["--wait", "300000000000y"][..],
        &["--max-hold", "300000000000y"][..],
        &["--wait", "300000000000y", "--max-hold", "300000000000y"][..],
    ] {
        let mut args = vec!["run", "--key", "huge"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", "echo ran"]);
        let output = fixture.run(&args);
        assert!(
            !stderr(&output).contains("panicked"),
            "{flags:?}: {}",
            stderr(&output)
        );
        assert_eq!(code(&output), 0, "{flags:?}: {}", stderr(&output));
        assert_eq!(String::from_utf8_lossy(&output.stdout), "ran\n");
    }
}

#[test]
fn an_interactive_command_owns_the_terminal_while_it_runs() {
    use std::io::Write;
    let fixture = Fixture::new();
    // script(1) runs distlock on a fresh pseudo-terminal, in its foreground
    // group. CMD's group must become the foreground group, or its read of the
    // terminal would stop it with SIGTTIN.
    let script = test_servers::find_binary("script", "bsdutils");
    let inner = format!(
        "{BIN} run --key tty -- sh -c 'read line; echo \"got $line\"; \
         [ \"$(ps -o tpgid= -p $$)\" -eq \"$(ps -o pgid= -p $$)\" ] && echo foreground'"
    );
    let mut child = Command::new(script)
        .args(["-qec", &inner, "/dev/null"])
        .env(
            "DISTLOCK_URL",
            format!("file://{}", fixture.lock_dir().display()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the command hung reading the terminal (stopped by SIGTTIN?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("got hello"), "{stdout}");
    assert!(stdout.contains("foreground"), "{stdout}");
}

/// A ttl at or under the 100 ms the drift margin adds would give a lease
/// whose validity ends within its drift margin when CMD is spawned: CMD
/// must not start. (At first CMD was spawned and stopped at once; then
/// distlock exited 76 after the grant; now such a ttl is refused before
/// anything is acquired, a usage error naming the minimum.)
#[test]
fn a_lease_already_within_its_drift_margin_never_starts_the_command() {
    let fixture = Fixture::new();
    let marker = fixture.path("started");
    let output = fixture
        .distlock()
        .args([
            "run",
            "--url",
            "memory://",
            "--key",
            "short",
            "--ttl",
            "50ms",
        ])
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(code(&output), 64, "{}", stderr(&output));
    let said = stderr(&output);
    assert!(
        said.contains("50ms is too short for a command run under the lock")
            && said.contains("250ms"),
        "{said}"
    );
    assert!(!marker.exists(), "the command ran: {said}");
}

/// A cgroup-v1 freezer cgroup of this test's own: its processes stop in
/// uninterruptible sleep (state D) and a SIGKILL stays pending until they
/// are thawed, as under `docker pause` or a process blocked on a dead NFS
/// server: a member that survives SIGKILL for as long as it is frozen.
struct Freezer(PathBuf);

impl Freezer {
    fn new(name: &str) -> Self {
        let root = Path::new("/sys/fs/cgroup/freezer");
        assert!(
            root.join("freezer.state").exists() || root.join("tasks").exists(),
            "this test needs the cgroup-v1 freezer hierarchy at {} (and root)",
            root.display()
        );
        let dir = root.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a freezer cgroup");
        Freezer(dir)
    }

    fn freeze(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("move into the cgroup");
        std::fs::write(self.0.join("freezer.state"), "FROZEN").expect("freeze");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(self.0.join("freezer.state"))
            .unwrap_or_default()
            .trim()
            != "FROZEN"
        {
            assert!(Instant::now() < deadline, "the cgroup never froze");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn thaw(&self) {
        let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        self.thaw();
        // Empty once its processes are gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.0).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// distlock is SIGKILLed while a member of its command's group is frozen:
/// the watchdog's SIGKILL cannot end that member until it is thawed. The
/// watchdog must keep the file lock held (and say which pid survives) for
/// as long as that takes, not give up after 2 s: a waiting `distlock run`
/// gets the lock only once the member is gone.
#[test]
fn the_watchdog_keeps_a_file_lock_until_a_member_that_survives_sigkill_is_gone() {
    let fixture = Fixture::new();
    let pid_file = fixture.path("sleeper");
    let script = format!("sleep 1234 & echo $! > {}; wait", pid_file.display());
    let mut holder = fixture
        .distlock()
        .args(["run", "--key", "frozen", "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // What distlock's stderr receives, the watchdog's included, line by line.
    let (lines, said) = std::sync::mpsc::channel();
    let holder_stderr = holder.stderr.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(holder_stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines.send(line);
        }
    });
    let sleeper = read_pids(&pid_file, 1)[0];
    let watchdog = watchdog_of(holder.id());
    let _cleanup = KillOnDrop(vec![sleeper, watchdog]);
    let freezer = Freezer::new("distlock-test-frozen-member");
    freezer.freeze(sleeper);

    holder.kill().unwrap();
    holder.wait().unwrap();
    let mut next = fixture
        .distlock()
        .args(["run", "--key", "frozen", "--wait", "30s", "--", "sh", "-c"])
        .arg(none_running(&[sleeper]))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Past the watchdog's old 2 s limit, and then some.
    std::thread::sleep(Duration::from_millis(3500));
    assert!(alive(sleeper), "frozen, it cannot have died");
    assert!(
        next.try_wait().unwrap().is_none(),
        "the next holder got the lock while the frozen member lives"
    );
    let report: Vec<String> = said.try_iter().collect();
    assert!(
        report.iter().any(
            |line| line.starts_with("distlock watchdog: distlock died; ")
                && line.contains(&format!("pid {sleeper} (D)"))
                && line.contains("survive SIGKILL")
        ),
        "the watchdog names the survivor: {report:?}"
    );

    freezer.thaw();
    wait_until_dead(&[sleeper], Duration::from_secs(5), "after the thaw");
    let output = wait_with_timeout(next, Duration::from_secs(10));
    assert_eq!(
        code(&output),
        0,
        "the next holder runs once the member is gone: {}",
        stderr(&output)
    );
}

/// `child`'s output once it exits, or a panic after `within`.
fn wait_with_timeout(mut child: Child, within: Duration) -> Output {
    wait_for_exit(&mut child, within);
    child.wait_with_output().unwrap()
}

/// The same member frozen while distlock lives and stops its command (max
/// hold reached): distlock keeps the lock, names the survivor, and releases
/// only after the thaw let the SIGKILL end it.
#[test]
fn run_names_a_member_that_survives_sigkill_and_keeps_the_lock_until_it_is_gone() {
    let fixture = Fixture::new();
    let pid_file = fixture.path("sleeper");
    let script = format!(
        "sleep 1234 & echo $! > {}.tmp; mv {0}.tmp {0}; wait",
        pid_file.display()
    );
    let mut holder = fixture
        .distlock()
        .args([
            "run",
            "--key",
            "frozen-run",
            "--max-hold",
            "1s",
            "--kill-after",
            "100ms",
        ])
        .args(["--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, said) = std::sync::mpsc::channel();
    let holder_stderr = holder.stderr.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(holder_stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines.send(line);
        }
    });
    let sleeper = read_pids(&pid_file, 1)[0];
    let _cleanup = KillOnDrop(vec![sleeper, holder.id()]);
    let freezer = Freezer::new("distlock-test-frozen-run");
    freezer.freeze(sleeper);
    // Max hold at 1 s, SIGKILL 100 ms later, the report 2 s after that.
    std::thread::sleep(Duration::from_millis(4000));
    assert!(
        holder.try_wait().unwrap().is_none(),
        "distlock waits for the survivor"
    );
    let contender = fixture.run(&["run", "--key", "frozen-run", "--", "true"]);
    assert_eq!(code(&contender), 75, "still held: {}", stderr(&contender));
    let report: Vec<String> = said.try_iter().collect();
    assert!(
        report
            .iter()
            .any(|line| line.contains(&format!("pid {sleeper} (D)"))
                && line.contains("survive SIGKILL")
                && line.contains("lock \"frozen-run\" is released only after they are gone")),
        "distlock names the survivor: {report:?}"
    );
    freezer.thaw();
    assert_eq!(wait_for_exit(&mut holder, Duration::from_secs(5)), 76);
    let next = fixture.run(&["run", "--key", "frozen-run", "--", "true"]);
    assert_eq!(
        code(&next),
        0,
        "free after the survivor died: {}",
        stderr(&next)
    );
}

/// `run --shared` on files: readers overlap, an exclusive run never
/// overlaps them, and a waiting writer does not hold new readers back.
#[test]
fn shared_runs_overlap_and_exclude_an_exclusive_run() {
    let fixture = Fixture::new();
    let url = format!("file://{}", fixture.lock_dir().display());
    crate::shared::shared_runs_overlap_and_exclude_an_exclusive_run(&url, false);
}
