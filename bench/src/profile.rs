//! `profile`: one uncontended contender, one client, a fixed number of
//! cycles, then exit; for counting the client's instructions per cycle
//! under callgrind (`valgrind --tool=callgrind`), which this machine's
//! virtual CPUs leave to software (`perf stat` has no hardware counters
//! here). Two runs with different `--cycles` differ only by the cycles, so
//! their difference in instructions over the difference in cycles is one
//! cycle's cost, with start-up (servers, connections, the first cycles'
//! allocations) taken out:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/a distlock-bench profile \
//!   --backends redis --contender distlock --cycles 500
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/b distlock-bench profile \
//!   --backends redis --contender distlock --cycles 2500
//! ```
//!
//! It also prints the process's CPU time per cycle (`getrusage`), which
//! is meaningful without valgrind.

use std::time::Instant;

use crate::harness::{Group, Job};

/// Runs `cycles` cycles of the contender named `name` of `group` (an
/// uncontended group of one client) and prints what they cost.
pub async fn run(group: &Group, name: &str, cycles: u64) -> Result<(), String> {
    let contender = group
        .contenders
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = group.contenders.iter().map(|c| c.name.as_str()).collect();
            format!(
                "no contender {name:?} on {}; there are {names:?}",
                group.backend
            )
        })?;
    let Job::Cycle(cycle) = &contender.job else {
        return Err(format!("{name:?} is not an uncontended cycle"));
    };
    let cpu_before = process_cpu_us();
    let started = Instant::now();
    for _ in 0..cycles {
        cycle(0).await?;
    }
    let elapsed = started.elapsed();
    let cpu = process_cpu_us().saturating_sub(cpu_before);
    println!(
        "{} {name:?}: {cycles} cycles in {:.3} s, {:.1} µs wall and {:.1} µs of client CPU a cycle",
        group.backend,
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e6 / cycles.max(1) as f64,
        cpu as f64 / cycles.max(1) as f64,
    );
    Ok(())
}

/// This process's user + system CPU time so far, in µs (getrusage(2)).
fn process_cpu_us() -> u64 {
    // SAFETY: getrusage writes the struct it is given; RUSAGE_SELF is valid.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0;
        }
        usage
    };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(usage.ru_utime) + us(usage.ru_stime)
}
