//! `distlock-faults`: distlock's fault suite. It measures what each backend's
//! locks do when the holder is killed, paused past its ttl, partitioned or
//! reset, when the server ends its session or restarts, and prints a table
//! (see `RELIABILITY.md` for the latest and what it means).
//!
//! ```text
//! distlock-faults run [--profile quick|full] [--backend file,postgres,..] [--fault kill,pause,..]
//!                     [--workload lock,election,semaphore] [--permits N] [--json FILE]
//! ```
//!
//! The run re-executes itself in a private network namespace (`unshare
//! -n`), so its servers, its workers and the nftables rules that partition
//! them see only loopback there; it needs root. Exit status: 0 if every
//! invariant held, 1 if one failed, 64 for bad usage.
//!
//! - `main.rs`: the command line.
//! - `scenario.rs`: the registry (backend × fault × expectation) and one run.
//! - `deploy/`: each backend's servers and its own fault injectors.
//! - `worker.rs`: the worker process (the hidden `worker` subcommand).
//! - `register.rs`: the fenced register and unfenced counter the workers write.
//! - `events.rs`: the event log on the shared monotonic clock.
//! - `analysis.rs`: overlaps, invariants, figures.
//! - `report.rs`: the table and the JSON file.

mod analysis;
mod deploy;
mod events;
mod register;
mod report;
mod scenario;
mod worker;

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::report::{CellSummary, Report};
use crate::scenario::{Backend, Cell, Fault, Profile, Workload};

/// The name of the network namespace re-run (see `test_servers::netns`).
const NETNS: &str = "distlock-faults";

#[derive(Debug, Parser)]
#[command(name = "distlock-faults", about = "distlock's fault suite")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the suite and prints the table.
    Run(RunArgs),
    /// One worker process (started by `run`).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// `quick`: one short run of each cell (CI, a few minutes); `full`: more
    /// workers, longer holds, three runs of each cell.
    #[arg(long, value_enum, default_value_t = ProfileName::Quick)]
    profile: ProfileName,
    /// Only these backends (comma-separated).
    #[arg(long, value_delimiter = ',')]
    backend: Vec<String>,
    /// Only these faults (comma-separated).
    #[arg(long, value_delimiter = ',')]
    fault: Vec<String>,
    /// Only these workloads (comma-separated: `lock`, the lock in a loop;
    /// `election`, leader terms of an election on it; `semaphore`, permits
    /// of a semaphore of `--permits` on it). Default: all on every cell in
    /// `full`; in `quick`, `lock` everywhere and the others on a few cells.
    #[arg(long, value_delimiter = ',')]
    workload: Vec<String>,
    /// The semaphore workload's permits (N), fewer than the profile's
    /// workers (quick 3, full 5) so that someone always waits for a permit.
    /// Default: 2.
    #[arg(long)]
    permits: Option<u32>,
    /// Also write the results to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ProfileName {
    Quick,
    Full,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Worker(args) => ExitCode::from(u8::try_from(worker::main(&args)).unwrap_or(1)),
        Command::Run(args) => run(&args),
    }
}

fn run(args: &RunArgs) -> ExitCode {
    let profile = match profile(args) {
        Ok(profile) => profile,
        Err(message) => {
            eprintln!("distlock-faults: {message}");
            return ExitCode::from(64);
        }
    };
    let backends = match select(&profile, args) {
        Ok(backends) => backends,
        Err(message) => {
            eprintln!("distlock-faults: {message}");
            return ExitCode::from(64);
        }
    };
    if !test_servers::netns::inside(NETNS) {
        let rerun: Vec<_> = std::env::args_os().skip(1).collect();
        let status = test_servers::netns::reexec_inside(NETNS, &rerun);
        return ExitCode::from(
            status
                .code()
                .and_then(|code| u8::try_from(code).ok())
                .unwrap_or(1),
        );
    }
    let report = orchestrate(&profile, &backends);
    print!("{}", report.table());
    println!(
        "distlock-faults: profile {} took {:.0} s on {} CPUs",
        profile.name, report.seconds, report.cpus
    );
    if let Some(path) = &args.json {
        if let Err(message) = report.write_json(path) {
            eprintln!("distlock-faults: {message}");
            return ExitCode::from(1);
        }
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The profile `--profile` names, with `--permits` if given (1 to one fewer
/// than its workers).
fn profile(args: &RunArgs) -> Result<Profile, String> {
    let profile = match args.profile {
        ProfileName::Quick => Profile::QUICK,
        ProfileName::Full => Profile::FULL,
    };
    let Some(permits) = args.permits else {
        return Ok(profile);
    };
    if !(1..profile.workers).contains(&permits) {
        return Err(format!(
            "--permits {permits}: the {} profile's {} workers need 1 to {} permits, \
             so that someone always waits for one",
            profile.name,
            profile.workers,
            profile.workers - 1
        ));
    }
    Ok(Profile { permits, ..profile })
}

/// The registry filtered by `--backend` and `--fault`, each cell repeated
/// per workload (`--workload`, or the profile's default); an unknown name
/// is an error naming it and the known ones.
fn select(profile: &Profile, args: &RunArgs) -> Result<Vec<Backend>, String> {
    let mut backends = scenario::registry(profile);
    let known: Vec<&str> = backends.iter().map(|backend| backend.name).collect();
    if let Some(unknown) = args
        .backend
        .iter()
        .find(|name| !known.contains(&name.as_str()))
    {
        return Err(format!(
            "unknown backend {unknown:?} (known: {})",
            known.join(", ")
        ));
    }
    let faults: Vec<&str> = Fault::ALL.iter().map(|fault| fault.name()).collect();
    if let Some(unknown) = args
        .fault
        .iter()
        .find(|name| !faults.contains(&name.as_str()))
    {
        return Err(format!(
            "unknown fault {unknown:?} (known: {})",
            faults.join(", ")
        ));
    }
    let workloads: Vec<&str> = Workload::ALL
        .iter()
        .map(|workload| workload.name())
        .collect();
    if let Some(unknown) = args
        .workload
        .iter()
        .find(|name| !workloads.contains(&name.as_str()))
    {
        return Err(format!(
            "unknown workload {unknown:?} (known: {})",
            workloads.join(", ")
        ));
    }
    backends.retain(|backend| {
        args.backend.is_empty() || args.backend.iter().any(|name| name == backend.name)
    });
    for backend in &mut backends {
        backend.cells.retain(|cell| {
            args.fault.is_empty() || args.fault.iter().any(|name| name == cell.fault.name())
        });
        let cells: Vec<Cell> = backend
            .cells
            .iter()
            .flat_map(|cell| {
                let chosen = if args.workload.is_empty() {
                    profile.default_workloads(backend, cell.fault)
                } else {
                    Workload::ALL
                        .into_iter()
                        .filter(|workload| args.workload.iter().any(|name| name == workload.name()))
                        .filter(|workload| workload.runs_on(backend))
                        .collect()
                };
                // Next to each other, so a cell that must come last (a
                // failover leaves its deployment spent) still does.
                chosen
                    .into_iter()
                    .map(|workload| Cell { workload, ..*cell })
            })
            .collect();
        backend.cells = cells;
    }
    backends.retain(|backend| !backend.cells.is_empty());
    if backends.is_empty() {
        return Err("no backend has any of the selected faults".to_owned());
    }
    Ok(backends)
}

/// Runs every selected cell, backend by backend (one deployment each).
fn orchestrate(profile: &Profile, backends: &[Backend]) -> Report {
    let started = events::now_ns();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let mut cells = Vec::new();
    let mut runs = Vec::new();
    for backend in backends {
        let deployment = std::panic::catch_unwind(backend.start)
            .map_err(panic_message)
            .and_then(|started| started);
        let mut deployment = match deployment {
            Ok(deployment) => deployment,
            Err(message) => {
                for cell in &backend.cells {
                    let failed = scenario::RunResult {
                        backend: backend.name,
                        fault: cell.fault,
                        workload: cell.workload,
                        expect: cell.expect,
                        repetition: 1,
                        figures: analysis::Figures::default(),
                        failures: vec![format!("cannot start the deployment: {message}")],
                        seconds: 0.0,
                        events: Vec::new(),
                    };
                    cells.extend(CellSummary::of(
                        std::slice::from_ref(&failed),
                        bound_ms(cell),
                    ));
                    runs.push(failed);
                }
                continue;
            }
        };
        for cell in &backend.cells {
            let mut cell_runs = Vec::new();
            for repetition in 1..=profile.repetitions {
                if deployment.spent() {
                    match std::panic::catch_unwind(backend.start)
                        .map_err(panic_message)
                        .and_then(|started| started)
                    {
                        Ok(fresh) => deployment = fresh,
                        Err(message) => eprintln!(
                            "distlock-faults: cannot start {} again: {message}",
                            backend.name
                        ),
                    }
                }
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    scenario::run_cell(backend, &mut *deployment, cell, profile, repetition)
                }))
                .unwrap_or_else(|panic| scenario::RunResult {
                    backend: backend.name,
                    fault: cell.fault,
                    workload: cell.workload,
                    expect: cell.expect,
                    repetition,
                    figures: analysis::Figures::default(),
                    failures: vec![format!("the run panicked: {}", panic_message(panic))],
                    seconds: 0.0,
                    events: Vec::new(),
                });
                eprintln!(
                    "distlock-faults: {} {} {} run {}: {} ({:.1} s)",
                    backend.name,
                    cell.fault.name(),
                    cell.workload.name(),
                    repetition,
                    if result.failures.is_empty() {
                        "ok".to_owned()
                    } else {
                        result.failures.join("; ")
                    },
                    result.seconds
                );
                cell_runs.push(result);
            }
            cells.extend(CellSummary::of(&cell_runs, bound_ms(cell)));
            runs.extend(cell_runs);
        }
    }
    Report {
        profile: *profile,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_unix,
        cpus: std::thread::available_parallelism().map_or(1, usize::from),
        seconds: events::ms_between(started, events::now_ns()) / 1e3,
        cells,
        runs,
    }
}

fn bound_ms(cell: &scenario::Cell) -> f64 {
    cell.orphan_bound.as_secs_f64() * 1e3
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(workload: &[&str]) -> RunArgs {
        RunArgs {
            profile: ProfileName::Quick,
            backend: Vec::new(),
            fault: Vec::new(),
            workload: workload.iter().map(|name| (*name).to_owned()).collect(),
            permits: None,
            json: None,
        }
    }

    /// Every selected (backend, fault, workload), in run order.
    fn selected(profile: &Profile, workload: &[&str]) -> Vec<(&'static str, Fault, Workload)> {
        select(profile, &args(workload))
            .unwrap_or_default()
            .iter()
            .flat_map(|backend| {
                backend
                    .cells
                    .iter()
                    .map(|cell| (backend.name, cell.fault, cell.workload))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The (backend, fault) cells `workload` runs on.
    fn cells_of(
        cells: &[(&'static str, Fault, Workload)],
        workload: Workload,
    ) -> Vec<(&'static str, Fault)> {
        cells
            .iter()
            .filter(|(_, _, of)| *of == workload)
            .map(|(backend, fault, _)| (*backend, *fault))
            .collect()
    }

    #[test]
    fn quick_runs_the_election_and_the_semaphore_on_their_few_cells_only() {
        let cells = selected(&Profile::QUICK, &[]);
        let elections = cells_of(&cells, Workload::Election);
        assert_eq!(Some(elections.as_slice()), Profile::QUICK.election_cells);
        let semaphores = cells_of(&cells, Workload::Semaphore);
        assert_eq!(Some(semaphores.as_slice()), Profile::QUICK.semaphore_cells);
        assert!(
            semaphores.len() < elections.len(),
            "quick stays quick: {} semaphore cells",
            semaphores.len()
        );
        let locks = cells.len() - elections.len() - semaphores.len();
        assert_eq!(locks, selected(&Profile::QUICK, &["lock"]).len());
    }

    #[test]
    fn full_runs_every_workload_beside_every_lock_cell_but_the_transaction_one() {
        let cells = selected(&Profile::FULL, &[]);
        let mut index = 0;
        while let Some(&(backend, fault, workload)) = cells.get(index) {
            assert_eq!(workload, Workload::Lock, "{backend} {}", fault.name());
            let expected: &[Workload] = if backend == "pgbouncer-xact" {
                &[Workload::Lock]
            } else {
                &Workload::ALL
            };
            for (offset, workload) in expected.iter().enumerate() {
                assert_eq!(
                    cells.get(index + offset),
                    Some(&(backend, fault, *workload)),
                    "the cell's workloads follow each other in table order"
                );
            }
            index += expected.len();
        }
        assert!(cells_of(&cells, Workload::Semaphore).len() > 40);
    }

    #[test]
    fn the_semaphore_workload_alone_skips_the_transaction_cell() {
        let cells = selected(&Profile::FULL, &["semaphore"]);
        assert!(cells
            .iter()
            .all(|(backend, _, workload)| *workload == Workload::Semaphore
                && *backend != "pgbouncer-xact"));
        assert_eq!(
            cells.len(),
            selected(&Profile::FULL, &["election"]).len(),
            "the same cells as the election"
        );
    }

    #[test]
    fn an_unknown_workload_is_refused() {
        let refused = select(&Profile::QUICK, &args(&["lease"]));
        assert!(refused.is_err_and(|message| message.contains("lock, election, semaphore")));
    }

    #[test]
    fn permits_must_leave_a_worker_waiting() {
        let with = |permits| RunArgs {
            permits: Some(permits),
            ..args(&[])
        };
        assert_eq!(profile(&args(&[])).map(|profile| profile.permits), Ok(2));
        assert_eq!(profile(&with(1)).map(|profile| profile.permits), Ok(1));
        for refused in [0, Profile::QUICK.workers] {
            let message = profile(&with(refused)).map(|profile| profile.permits);
            assert!(
                message
                    .as_ref()
                    .is_err_and(|message| message.contains("1 to 2 permits")),
                "{message:?}"
            );
        }
    }
}
