//! `distlock run --shared` with real processes, on any backend with shared
//! locks: readers overlap, an exclusive run never overlaps a reader, and a
//! writer waiting for readers holds new ones back or not, as the backend
//! orders them.

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::Duration;

use crate::support::{code, stderr, wait_for_exit, wait_until, BIN};

/// `distlock` on `url`, run from the test's environment.
fn distlock(url: &str) -> Command {
    let mut command = Command::new(BIN);
    command.env("DISTLOCK_URL", url).env_remove("RUST_LOG");
    command
}

fn run(url: &str, args: &[&str]) -> Output {
    distlock(url).args(args).output().expect("run distlock")
}

/// A `--shared` run of `report` that, holding its shared lease, touches
/// `started-<me>`, waits (at most 20 s) to see `started-<other>`, then for
/// the file `go`, and logs its end.
fn reader(url: &str, dir: &Path, me: &str, other: &str) -> Child {
    let script = format!(
        "touch {me}; \
         i=0; while [ ! -e {other} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 3; sleep 0.05; done; \
         i=0; while [ ! -e {go} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 4; sleep 0.05; done; \
         echo reader-end >> {log}",
        me = dir.join(format!("started-{me}")).display(),
        other = dir.join(format!("started-{other}")).display(),
        go = dir.join("go").display(),
        log = dir.join("log").display(),
    );
    distlock(url)
        .args([
            "run", "--shared", "--key", "report", "--", "sh", "-c", &script,
        ])
        .spawn()
        .expect("spawn a reader")
}

/// `run --shared`: two readers hold the key at once (each waits, holding
/// it, until it sees the other has started); an exclusive `run` meanwhile
/// exits 75 without running its command, and with `--wait` starts only
/// after both readers have finished. While that writer waits, a third
/// `--shared` run is held back (exits 75) if `fair`
/// (`Capabilities::writer_priority`: readers and writers queue in order), and
/// runs beside the readers otherwise. A `--shared` run while a writer holds
/// the key exits 75 too.
pub fn shared_runs_overlap_and_exclude_an_exclusive_run(url: &str, fair: bool) {
    let fixture = tempfile::tempdir().expect("temp dir");
    let dir = fixture.path();
    let log = dir.join("log");
    let go = dir.join("go");
    let mut readers = [reader(url, dir, "a", "b"), reader(url, dir, "b", "a")];
    wait_until("both readers hold the key", Duration::from_secs(20), || {
        dir.join("started-a").exists() && dir.join("started-b").exists()
    });

    let status = run(url, &["status", "--key", "report"]);
    assert_eq!(code(&status), 0, "{}", stderr(&status));
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(shown.contains("\"report\" is held shared"), "{shown}");

    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let output = run(url, &["run", "--key", "report", "--", "sh", "-c", &touch]);
    assert_eq!(code(&output), 75, "{}", stderr(&output));
    assert!(
        stderr(&output).contains("lock \"report\" is held elsewhere"),
        "{}",
        stderr(&output)
    );
    assert!(!marker.exists(), "the exclusive command must not run");

    let write = format!("echo writer-start >> {}", log.display());
    let mut writer = distlock(url)
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
    let late = dir.join("late-reader-ran");
    let touch_late = format!("touch {}", late.display());
    let output = run(
        url,
        &[
            "run",
            "--shared",
            "--key",
            "report",
            "--",
            "sh",
            "-c",
            &touch_late,
        ],
    );
    if fair {
        assert_eq!(code(&output), 75, "{}", stderr(&output));
        assert!(
            stderr(&output).contains("lock \"report\" is held exclusively elsewhere"),
            "a waiting writer holds a new reader back: {}",
            stderr(&output)
        );
        assert!(!late.exists(), "the late reader's command must not run");
    } else {
        assert_eq!(code(&output), 0, "{}", stderr(&output));
        assert!(late.exists(), "a new reader runs beside a waiting writer");
    }
    std::fs::write(&go, "").expect("go");
    for reader in &mut readers {
        assert_eq!(wait_for_exit(reader, Duration::from_secs(30)), 0);
    }
    assert_eq!(wait_for_exit(&mut writer, Duration::from_secs(30)), 0);
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "reader-end\nreader-end\nwriter-start\n",
        "the writer starts only after both readers finished"
    );

    // And the other way round: a writer holding the key keeps readers out.
    let holds = dir.join("writer-holds");
    let done = dir.join("writer-done");
    let hold = format!(
        "touch {}; i=0; while [ ! -e {} ]; do i=$((i+1)); [ $i -gt 400 ] && exit 4; sleep 0.05; done",
        holds.display(),
        done.display()
    );
    let mut holder = distlock(url)
        .args(["run", "--key", "report", "--", "sh", "-c", &hold])
        .spawn()
        .expect("spawn a holding writer");
    wait_until("the writer holds the key", Duration::from_secs(20), || {
        holds.exists()
    });
    let output = run(
        url,
        &[
            "run", "--shared", "--key", "report", "--", "sh", "-c", &touch,
        ],
    );
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
