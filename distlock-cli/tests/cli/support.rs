//! Helpers every module of the CLI tests uses: the binary under test and
//! what a test reads from the processes it runs.

use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// The `distlock` binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// The exit code of a process that exited (not killed by a signal).
pub fn code(output: &Output) -> i32 {
    output.status.code().expect("exited normally")
}

/// What a finished process wrote to stderr, lossily decoded.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Polls `child` until it exits and returns its code (-1 if a signal ended
/// it), or panics after `within`.
pub fn wait_for_exit(child: &mut Child, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.code().unwrap_or(-1);
        }
        assert!(
            Instant::now() < deadline,
            "distlock did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `condition` every 10 ms until it holds and returns how long that
/// took, or panics naming `what` once `within` has passed.
pub fn wait_until(what: &str, within: Duration, mut condition: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < within,
            "{what} did not happen within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    started.elapsed()
}

/// True while `pid` names a live (not zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// `distlock run --wait 1s` against `url`, whose server on `port` is cut
/// off: exits 69 (an outage, not contention) within the wait plus 1.5 s,
/// naming the server and `--wait`, and never runs its command.
pub fn assert_outage_within_the_wait(url: &str, port: u16) {
    let started = Instant::now();
    let output = std::process::Command::new(BIN)
        .args([
            "run", "--url", url, "--key", "cut", "--wait", "1s", "--", "echo", "ran",
        ])
        .output()
        .expect("run distlock");
    let took = started.elapsed();
    let said = stderr(&output);
    eprintln!("took {took:?}: {said}");
    assert_eq!(code(&output), 69, "{said}");
    assert!(
        took < Duration::from_millis(2500),
        "took {took:?}, past --wait 1s + 1.5 s: {said}"
    );
    assert!(
        said.contains(&format!("127.0.0.1:{port} did not answer within --wait 1s")),
        "{said}"
    );
    assert!(output.stdout.is_empty(), "the command ran");
}
