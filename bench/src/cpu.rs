//! CPU time from `/proc` (proc(5)): the machine's busy time, this process's,
//! and the server processes' (with their children: Postgres serves each
//! connection from a forked backend), so a round during which something
//! else used the CPU can be told apart and dropped.

use std::collections::{HashMap, HashSet};

/// Clock ticks per second of the `/proc` counters.
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// A reading of the three counters, in clock ticks.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    machine_busy: u64,
    this_process: u64,
    servers: u64,
    at: std::time::Instant,
}

/// What happened between two samples.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// Cores' worth of CPU the harness (client) used.
    pub client_cores: f64,
    /// Cores' worth the servers under test used.
    pub server_cores: f64,
    /// Cores' worth everything else on the machine used.
    pub other_cores: f64,
}

impl Sample {
    pub fn now(server_pids: &[u32]) -> Sample {
        Sample {
            machine_busy: machine_busy().unwrap_or(0),
            this_process: process_ticks("self").unwrap_or(0),
            servers: tree_ticks(server_pids),
            at: std::time::Instant::now(),
        }
    }

    pub fn usage_since(&self, earlier: &Sample) -> Usage {
        let seconds = self.at.duration_since(earlier.at).as_secs_f64().max(1e-3);
        let ticks = ticks_per_second() * seconds;
        let busy = self.machine_busy.saturating_sub(earlier.machine_busy);
        let client = self.this_process.saturating_sub(earlier.this_process);
        let servers = self.servers.saturating_sub(earlier.servers);
        Usage {
            client_cores: client as f64 / ticks,
            server_cores: servers as f64 / ticks,
            other_cores: busy.saturating_sub(client + servers) as f64 / ticks,
        }
    }
}

/// user + nice + system + irq + softirq of the first line of `/proc/stat`
/// (idle, iowait and steal are not this machine's work).
fn machine_busy() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    Some(
        [0usize, 1, 2, 5, 6]
            .iter()
            .filter_map(|&i| fields.get(i))
            .sum(),
    )
}

/// Fields after the command name of `/proc/PID/stat` (the name may hold
/// spaces and parentheses, so split after the last `)`).
fn stat_fields(pid: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// utime + stime of a process (all its threads).
fn process_ticks(pid: &str) -> Option<u64> {
    let fields = stat_fields(pid)?;
    // After the name: state(0) ppid(1) ... utime(11) stime(12).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// utime + stime of the given processes and all their descendants.
fn tree_ticks(roots: &[u32]) -> u64 {
    if roots.is_empty() {
        return 0;
    }
    let mut parent_of: HashMap<u32, u32> = HashMap::new();
    let mut ticks_of: HashMap<u32, u64> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Some(fields) = stat_fields(&pid.to_string()) else {
            continue;
        };
        let ppid = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        let utime: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
        let stime: u64 = fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
        parent_of.insert(pid, ppid);
        ticks_of.insert(pid, utime + stime);
    }
    let roots: HashSet<u32> = roots.iter().copied().collect();
    let in_tree = |mut pid: u32| {
        // Walk up at most 64 levels (a cycle cannot happen in /proc, but bound it).
        for _ in 0..64 {
            if roots.contains(&pid) {
                return true;
            }
            match parent_of.get(&pid) {
                Some(&parent) if parent != 0 => pid = parent,
                _ => return false,
            }
        }
        false
    };
    ticks_of
        .iter()
        .filter(|(&pid, _)| in_tree(pid))
        .map(|(_, &ticks)| ticks)
        .sum()
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_loop_is_counted_as_the_client() {
        let before = Sample::now(&[]);
        // Spin until this process has used 10 ticks of CPU, however busy the
        // machine is (bounded, so a broken counter fails instead of hanging).
        let start = process_ticks("self").expect("/proc/self/stat");
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut x = 0u64;
        while process_ticks("self").unwrap_or(0) < start + 10 {
            assert!(std::time::Instant::now() < give_up, "no CPU time counted");
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        let usage = Sample::now(&[]).usage_since(&before);
        assert!(usage.client_cores > 0.0, "{usage:?}");
        assert!(usage.other_cores >= 0.0, "{usage:?}");
    }
}
