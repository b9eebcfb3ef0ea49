//! `distlock bench` end to end on the file backend: every workload, the
//! table and the JSON, the cleanup, and bad flags.

use std::process::{Command, Output};

use serde_json::Value;

use crate::support::{code, stderr, BIN};

/// A private lock directory for one bench.
struct Bench {
    dir: tempfile::TempDir,
}

impl Bench {
    fn new() -> Self {
        Bench {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("bench")
            .args(args)
            .env(
                "DISTLOCK_URL",
                format!("file://{}", self.dir.path().display()),
            )
            .env_remove("RUST_LOG")
            .output()
            .expect("run distlock bench")
    }

    /// Runs with `--json` and returns one object per run.
    fn json(&self, args: &[&str]) -> Vec<Value> {
        let output = self.run(&[args, &["--json"]].concat());
        assert_eq!(code(&output), 0, "{}", stderr(&output));
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
            .collect()
    }

    fn assert_nothing_left(&self) {
        let left: Vec<_> = std::fs::read_dir(self.dir.path())
            .expect("lock directory")
            .map(|entry| entry.expect("directory entry").file_name())
            .collect();
        assert!(left.is_empty(), "bench files left behind: {left:?}");
    }
}

fn number(run: &Value, path: &str) -> f64 {
    run.pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} is a number in {run}"))
}

/// Every latency summary has the same four quantiles, in order.
fn assert_quantiles(run: &Value, field: &str) {
    let p50 = number(run, &format!("/{field}/p50"));
    let p99 = number(run, &format!("/{field}/p99"));
    let p999 = number(run, &format!("/{field}/p999"));
    let max = number(run, &format!("/{field}/max"));
    assert!(
        0.0 < p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
        "{field} quantiles in order: {run}"
    );
}

#[test]
fn uncontended_json_has_cycles_and_both_latencies_per_run() {
    let bench = Bench::new();
    let runs = bench.json(&["--clients", "1,2", "--duration", "300ms"]);
    assert_eq!(runs.len(), 2, "one object per --clients value: {runs:?}");
    for (run, clients) in runs.iter().zip([1, 2]) {
        assert_eq!(run["workload"], "uncontended", "{run}");
        assert_eq!(run["backend"], "file", "{run}");
        assert_eq!(run["clients"], clients, "{run}");
        assert_eq!(run["errors"], 0, "{run}");
        assert_eq!(run["contended"], 0, "own keys are never contended: {run}");
        assert!(number(run, "/cycles") >= 1.0, "{run}");
        assert!(number(run, "/cycles_per_s") > 0.0, "{run}");
        assert_quantiles(run, "acquire_us");
        assert_quantiles(run, "release_us");
    }
    bench.assert_nothing_left();
}

#[test]
fn contended_json_has_handoffs_and_their_gap() {
    let bench = Bench::new();
    let runs = bench.json(&["--workload", "contended", "-c", "3", "-d", "300ms"]);
    let [run] = runs.as_slice() else {
        panic!("one run: {runs:?}")
    };
    assert_eq!(run["workload"], "contended", "{run}");
    assert_eq!(run["errors"], 0, "{run}");
    assert!(number(run, "/handoffs") >= 2.0, "{run}");
    assert!(number(run, "/handoffs_per_s") > 0.0, "{run}");
    assert!(run["timeouts"].is_u64(), "{run}");
    for field in ["handoff_gap_us", "wait_us", "release_us"] {
        for quantile in ["p50", "p99", "p999", "max"] {
            number(run, &format!("/{field}/{quantile}"));
        }
    }
    bench.assert_nothing_left();
}

/// On the file backend a waiter polls (every few milliseconds), so no
/// handoff is instant: each gap runs from a release being sent to the next
/// grant. Pairing a release only after its holder had waited for the next
/// grant made every gap 0.
#[test]
fn contended_gaps_are_timed_from_each_release() {
    let bench = Bench::new();
    let runs = bench.json(&["--workload", "contended", "-c", "3", "-d", "500ms"]);
    let [run] = runs.as_slice() else {
        panic!("one run: {runs:?}")
    };
    assert_eq!(run["errors"], 0, "{run}");
    assert!(number(run, "/handoffs") >= 2.0, "{run}");
    let p50 = number(run, "/handoff_gap_us/p50");
    assert!(
        p50 > 0.0,
        "a polling waiter's handoff gap p50 is above 0: {run}"
    );
    bench.assert_nothing_left();
}

#[test]
fn hold_json_has_memory_connections_and_keepalive_traffic() {
    let bench = Bench::new();
    // ttl 300ms: every lease is refreshed every 100ms while held for 600ms.
    let runs = bench.json(&[
        "-w", "hold", "--keys", "40", "-c", "2", "--ttl", "300ms", "-d", "600ms",
    ]);
    let [run] = runs.as_slice() else {
        panic!("one run: {runs:?}")
    };
    assert_eq!(run["workload"], "hold", "{run}");
    assert_eq!(run["leases"], 40, "{run}");
    assert_eq!(run["not_acquired"], 0, "{run}");
    assert_eq!(run["lost"], 0, "no lease lost while refreshed: {run}");
    assert_eq!(run["errors"], 0, "{run}");
    assert_eq!(run["refresh_failures"], 0, "{run}");
    // At least two refreshes per lease (at 100ms and 200ms), whatever the load.
    assert!(number(run, "/refreshes") >= 80.0, "{run}");
    assert!(number(run, "/refreshes_per_s") > 0.0, "{run}");
    // The 40 leases share one keepalive scheduler, which sends the refreshes
    // due together as one batch: a few batches per interval, not one per
    // lease (which a wrapper re-homing each lease to an `Arc` of its own
    // would make).
    let batches = number(run, "/refresh_batches");
    assert!(
        batches > 0.0 && batches * 4.0 <= number(run, "/refreshes"),
        "refreshes reach the backend in batches, not one call per lease: {run}"
    );
    assert!(run["bytes_per_lease"].is_number(), "{run}");
    assert!(run["bytes_per_lease_with_keepalive"].is_number(), "{run}");
    // A held lease is at least its own struct and its shared status, live
    // on the heap (glibc's count, whatever pages the allocator keeps).
    assert!(number(run, "/heap_bytes_per_lease") >= 100.0, "{run}");
    assert!(
        number(run, "/heap_bytes_per_lease_with_keepalive") >= 100.0,
        "{run}"
    );
    assert_eq!(run["tcp_connections"], 0, "lock files use no socket: {run}");
    // Each held lease keeps its lock file open.
    assert!(
        number(run, "/open_descriptors") >= number(run, "/open_descriptors_before") + 40.0,
        "{run}"
    );
    assert_quantiles(run, "acquire_us");
    assert_quantiles(run, "release_us");
    bench.assert_nothing_left();
}

/// The election workloads, a few runs each: every handoff and failover is
/// counted and summarized (the figures themselves are for
/// BENCHMARKS.md, not for a test on a shared machine).
#[test]
fn election_workloads_report_handoffs_and_failovers() {
    let bench = Bench::new();
    let runs = bench.json(&["-w", "handoff", "--runs", "3", "--ttl", "2s"]);
    let [run] = runs.as_slice() else {
        panic!("one run: {runs:?}")
    };
    assert_eq!(run["workload"], "handoff", "{run}");
    assert_eq!(run["clients"], 2, "two candidates: {run}");
    assert_eq!(run["errors"], 0, "{run}");
    assert_eq!(run["handoffs"], 3, "{run}");
    for field in ["handoff_us", "resign_us", "cycle_us", "inspect_us"] {
        assert_quantiles(run, field);
    }
    assert!(number(run, "/handoff_per_cycle") > 0.0, "{run}");

    let runs = bench.json(&["-w", "failover", "--runs", "2", "--ttl", "2s"]);
    let [run] = runs.as_slice() else {
        panic!("one run: {runs:?}")
    };
    assert_eq!(run["workload"], "failover", "{run}");
    assert_eq!(run["clients"], 3, "three replicas: {run}");
    assert_eq!(run["errors"], 0, "{run}");
    assert_eq!(run["failovers"], 2, "{run}");
    assert_quantiles(run, "failover_us");
    bench.assert_nothing_left();

    let output = bench.run(&["-w", "failover", "--runs", "1"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "description, header, 1 row: {stdout}");
    assert!(
        lines[0].contains("failover") && lines[0].contains("ttl 10s"),
        "{stdout}"
    );
    assert!(
        lines[1].contains("failovers") && lines[1].contains("p99"),
        "{stdout}"
    );
    bench.assert_nothing_left();
}

#[test]
fn each_workload_prints_a_table_with_a_row_per_run() {
    let bench = Bench::new();
    for (workload, column) in [
        ("uncontended", "cycles/s"),
        ("contended", "handoffs/s"),
        ("hold", "refresh/s"),
    ] {
        let output = bench.run(&["-w", workload, "-c", "1,2", "-d", "200ms", "-k", "5"]);
        assert_eq!(code(&output), 0, "{workload}: {}", stderr(&output));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 4, "description, header, 2 rows: {stdout}");
        assert!(lines[0].contains(workload), "{stdout}");
        assert!(lines[1].contains(column), "{stdout}");
        assert!(lines[2].trim_start().starts_with('1'), "{stdout}");
        assert!(lines[3].trim_start().starts_with('2'), "{stdout}");
    }
    bench.assert_nothing_left();
}

/// The permits workload: a run per --permits value, each naming its N, its
/// permit cycles, acquire latency, full fraction and calls per attempt, for
/// the locker's own `try_lock_any` (top level) and the trait's default
/// (`generic`), beside the lock's own cycle; the figures themselves are for
/// BENCHMARKS.md. The file backend has no native attempt: its own
/// `try_lock_any` is one call to the locker, the generic one a `try_lock`
/// per key tried.
#[test]
fn permits_report_each_n_beside_the_lock_cycle() {
    let bench = Bench::new();
    let runs = bench.json(&[
        "-w",
        "permits",
        "--permits",
        "1,3",
        "-c",
        "2",
        "-d",
        "200ms",
    ]);
    assert_eq!(runs.len(), 2, "one object per --permits value: {runs:?}");
    for (run, permits) in runs.iter().zip([1, 3]) {
        assert_eq!(run["workload"], "permits", "{run}");
        assert_eq!(run["backend"], "file", "{run}");
        assert_eq!(run["clients"], 2, "{run}");
        assert_eq!(run["permits"], permits, "{run}");
        assert_eq!(run["errors"], 0, "{run}");
        assert_eq!(
            run["lock_contended"], 0,
            "own keys are never contended: {run}"
        );
        assert!(number(run, "/cycles") >= 1.0, "{run}");
        assert!(number(run, "/cycles_per_s") > 0.0, "{run}");
        assert!(number(run, "/lock_cycles") >= 1.0, "{run}");
        assert!(number(run, "/lock_cycles_per_s") > 0.0, "{run}");
        assert!(number(run, "/permit_per_lock") > 0.0, "{run}");
        let fraction = number(run, "/full_fraction");
        assert!((0.0..1.0).contains(&fraction), "{run}");
        assert!(
            number(run, "/attempts") >= number(run, "/cycles") + number(run, "/full"),
            "{run}"
        );
        assert_quantiles(run, "acquire_us");
        assert_quantiles(run, "release_us");
        assert_quantiles(run, "lock_acquire_us");
        assert_quantiles(run, "lock_release_us");
        for quantile in ["p50", "p99", "max"] {
            number(run, &format!("/full_attempt_us/{quantile}"));
        }
        assert_eq!(
            number(run, "/calls_per_acquire"),
            1.0,
            "one try_lock_any: {run}"
        );
        assert!(number(run, "/generic/cycles") >= 1.0, "{run}");
        assert!(number(run, "/generic/cycles_per_s") > 0.0, "{run}");
        assert!(number(run, "/generic/permit_per_lock") > 0.0, "{run}");
        assert_quantiles(&run["generic"], "acquire_us");
        let generic_calls = number(run, "/generic/calls_per_acquire");
        assert!(
            (1.0..=f64::from(permits)).contains(&generic_calls),
            "a try_lock per key tried, at most N: {run}"
        );
        assert!(
            number(run, "/generic/most_calls") <= f64::from(permits) + 1.0,
            "N try_locks and the check of permit N at most: {run}"
        );
    }
    bench.assert_nothing_left();

    let output = bench.run(&[
        "-w",
        "permits",
        "--permits",
        "1,10",
        "-c",
        "2",
        "-d",
        "200ms",
    ]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        6,
        "description, header, a row per N and path: {stdout}"
    );
    assert!(lines[0].contains("permits"), "{stdout}");
    for column in [
        "permits",
        "cycles/s",
        "acq p50",
        "acq p99",
        "full %",
        "calls/acq",
        "lock cyc/s",
    ] {
        assert!(lines[1].contains(column), "{column}: {stdout}");
    }
    let field = |line: &str, i| line.split_whitespace().nth(i).map(str::to_owned);
    for (line, n, path) in [
        (lines[2], "1", "native"),
        (lines[3], "1", "generic"),
        (lines[4], "10", "native"),
        (lines[5], "10", "generic"),
    ] {
        assert_eq!(field(line, 1).as_deref(), Some(n), "{stdout}");
        assert_eq!(field(line, 2).as_deref(), Some(path), "{stdout}");
    }
    bench.assert_nothing_left();
}

#[test]
fn the_old_flags_still_work() {
    let bench = Bench::new();
    let output = bench.run(&["--shared-key", "--tasks", "2", "-d", "200ms"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout
            .lines()
            .next()
            .is_some_and(|l| l.contains("contended")),
        "--shared-key is the contended workload: {stdout}"
    );
    bench.assert_nothing_left();
}

#[test]
fn bad_flags_exit_64_naming_the_flag() {
    let bench = Bench::new();
    let cases: [(&[&str], &str); 10] = [
        (&["--clients", "0"], "--clients 0"),
        (&["-w", "failover", "--runs", "0"], "--runs 0"),
        (&["--clients", "1,x"], "--clients"),
        (&["--keys", "0"], "--keys 0"),
        (&["--workload", "sideways"], "--workload"),
        (&["--duration", "0s"], "--duration"),
        (&["--duration", "2days"], "--duration"),
        (&["--shared-key", "--workload", "hold"], "--shared-key"),
        (&["-w", "permits", "--permits", "0"], "--permits 0"),
        (&["-w", "permits", "--permits", "1,1025"], "--permits 1025"),
    ];
    for (args, named) in cases {
        let output = bench.run(args);
        let message = stderr(&output);
        assert_eq!(code(&output), 64, "{args:?}: {message}");
        assert!(message.contains(named), "{args:?} names {named}: {message}");
        assert_eq!(message.lines().count(), 1, "{args:?}: {message}");
        assert!(output.stdout.is_empty(), "{args:?} measured nothing");
    }
}

/// On a terminal the hold workload shows its acquiring phase (minutes for
/// 100,000 leases on a server backend) and then its hold; piped, stderr
/// gets no progress line at all.
#[test]
fn the_hold_workload_shows_progress_on_a_terminal_and_nothing_when_piped() {
    let bench = Bench::new();
    // The memory backend: 20,000 lock files would need as many descriptors.
    let args = "--url memory:// -w hold --keys 20000 -c 2 --ttl 30s -d 1500ms";
    let script = test_servers::find_binary("script", "bsdutils");
    let output = Command::new(script)
        .args(["-qec", &format!("{BIN} bench {args}"), "/dev/null"])
        .env(
            "DISTLOCK_URL",
            format!("file://{}", bench.dir.path().display()),
        )
        .env_remove("RUST_LOG")
        .output()
        .expect("run script");
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    // script(1) merges the terminal's output into its stdout.
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains("hold with 2 clients: ") && shown.contains(" of 20000 leases acquired"),
        "{shown}"
    );
    assert!(
        shown.contains("\r\x1b[2K"),
        "the line is erased before the table: {shown:?}"
    );

    let piped = bench.run(&args.split(' ').collect::<Vec<_>>());
    assert_eq!(code(&piped), 0, "{}", stderr(&piped));
    assert!(!stderr(&piped).contains('\r'), "{}", stderr(&piped));
    bench.assert_nothing_left();
}
