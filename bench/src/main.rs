//! distlock beside each backend's raw floor and the peer crates, measured in
//! interleaved rounds on the same private servers (test-servers spawns them
//! on free loopback ports), with the results as JSON, SVG plots and the
//! tables of BENCHMARKS.md.
//!
//! ```text
//! cargo run --release --manifest-path bench/Cargo.toml -- all --out bench/results
//! cargo run --release --manifest-path bench/Cargo.toml -- render --out bench/results
//! ```
//!
//! `all` measures everything and renders; `profile --backends B --contender
//! NAME --cycles N` runs one uncontended contender for N cycles on one
//! client (for callgrind; see `profile.rs`); `render` re-makes the plots and
//! BENCHMARKS.md's generated section from `results.json`; `sweep` measures
//! distlock's `sessions` setting (1, 2, 4, 8, 16, 32) on Postgres and MySQL
//! at the largest `--clients` (16) and prints a table per backend (nothing
//! written; `all` runs it too and writes it). Options:
//! `--rounds N` (5), `--seconds S` per measurement (5), `--warmup S` (1),
//! `--backends redis,postgres,etcd,mysql,zookeeper`, `--clients 1,16`,
//! `--hold-leases N,M` (100000; 0 to skip), `--max-other-cores X` (0.1),
//! `--sweep on|off` (on: `all` runs the sweep too, after the other groups),
//! `--markdown PATH` (BENCHMARKS.md), `--section NAME` (write the section
//! between markers of that name instead of the main ones, for a group of
//! backends measured apart), `--distlock PATH` (the CLI binary the hold
//! workload runs; default: built with cargo from the repository).

mod backends;
mod cpu;
mod harness;
mod hold;
mod plot;
mod profile;
mod report;
mod sweep;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::harness::{GroupResult, Settings};

/// Every backend the harness knows, in the order `all` measures them.
const BACKENDS: [&str; 5] = ["redis", "postgres", "etcd", "mysql", "zookeeper"];

/// Everything one `all` run measured.
#[derive(Debug, Serialize, Deserialize)]
pub struct Results {
    pub date: String,
    pub command: String,
    /// The repository's commit (`git describe --always --dirty`), empty in
    /// results written before it was recorded.
    #[serde(default)]
    pub commit: String,
    pub machine: Machine,
    pub settings: Settings,
    pub groups: Vec<GroupResult>,
    pub holds: Vec<hold::HoldResult>,
    /// The `sessions` sweeps (empty in results written before `all` ran
    /// them, or with `--sweep off`).
    #[serde(default)]
    pub sweeps: Vec<sweep::SweepResult>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub kernel: String,
    pub load_average_start: Option<[f64; 3]>,
    pub load_average_end: Option<[f64; 3]>,
}

struct Options {
    command: String,
    out: PathBuf,
    markdown: PathBuf,
    /// The name of the generated section's markers; `None`: the main ones.
    section: Option<String>,
    settings: Settings,
    backends: Vec<String>,
    clients: Vec<usize>,
    hold_leases: Vec<usize>,
    distlock: Option<PathBuf>,
    /// Whether `all` runs the `sessions` sweep (`--sweep on|off`).
    sweep: bool,
    /// `profile`: the contender and how many cycles.
    contender: Option<String>,
    cycles: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("distlock-bench: {message}");
            eprintln!("usage: distlock-bench all|render|sweep|profile [--out DIR] [--rounds N] [--seconds S] [--warmup S] [--backends LIST] [--clients LIST] [--hold-leases N] [--max-other-cores X] [--markdown PATH] [--section NAME] [--distlock PATH] [--sweep on|off] [--contender NAME --cycles N]");
            std::process::exit(64);
        }
    };
    if options.command == "sweep" {
        sweep(&options);
        return;
    }
    if options.command == "profile" {
        if let Err(error) = runtime().block_on(profile(&options)) {
            eprintln!("distlock-bench: profile: {error}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(error) = std::fs::create_dir_all(&options.out) {
        eprintln!(
            "distlock-bench: cannot create {}: {error}",
            options.out.display()
        );
        std::process::exit(73);
    }
    let results_path = options.out.join("results.json");
    let results = if options.command == "all" {
        let results = measure(&options);
        let json = serde_json::to_string_pretty(&results).expect("results serialize");
        std::fs::write(&results_path, json).expect("write results.json");
        eprintln!("wrote {}", results_path.display());
        results
    } else {
        let text = std::fs::read_to_string(&results_path)
            .unwrap_or_else(|e| panic!("read {}: {e}", results_path.display()));
        serde_json::from_str(&text).expect("results.json parses")
    };
    plot::all(&results, &options.out);
    report::write_markdown(
        &results,
        &options.markdown,
        &options.out,
        options.section.as_deref(),
    );
    eprintln!(
        "wrote the plots in {} and {}",
        options.out.display(),
        options.markdown.display()
    );
}

fn parse(args: &[String]) -> Result<Options, String> {
    let (command, rest) = args.split_first().ok_or("no command")?;
    if !["all", "render", "sweep", "profile"].contains(&command.as_str()) {
        return Err(format!("unknown command {command:?}"));
    }
    let mut options = Options {
        command: command.clone(),
        out: PathBuf::from("bench/results"),
        markdown: PathBuf::from("BENCHMARKS.md"),
        section: None,
        settings: Settings {
            rounds: 5,
            warmup_s: 1.0,
            measure_s: 5.0,
            max_other_cores: 0.1,
        },
        backends: BACKENDS.map(String::from).to_vec(),
        clients: vec![1, 16],
        hold_leases: vec![100_000],
        distlock: None,
        sweep: true,
        contender: None,
        cycles: 1000,
    };
    let mut rest = rest.iter();
    while let Some(flag) = rest.next() {
        let mut value = || rest.next().cloned().ok_or(format!("{flag} needs a value"));
        let number = |text: String| -> Result<f64, String> {
            text.parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .ok_or(format!("{flag} {text}: not a number"))
        };
        match flag.as_str() {
            "--out" => options.out = PathBuf::from(value()?),
            "--markdown" => options.markdown = PathBuf::from(value()?),
            "--section" => {
                let name = value()?;
                if name.is_empty() || name.contains("--") || name.contains('>') {
                    return Err(format!("--section {name:?}: a name for an HTML comment"));
                }
                options.section = Some(name);
            }
            "--rounds" => options.settings.rounds = number(value()?)?.max(1.0) as usize,
            "--seconds" => options.settings.measure_s = number(value()?)?.max(0.1),
            "--warmup" => options.settings.warmup_s = number(value()?)?,
            "--max-other-cores" => options.settings.max_other_cores = number(value()?)?,
            "--hold-leases" => {
                options.hold_leases = value()?
                    .split(',')
                    .map(|n| n.parse::<usize>().ok())
                    .collect::<Option<Vec<_>>>()
                    .ok_or("--hold-leases: a list of lease counts")?;
                options.hold_leases.retain(|&n| n > 0);
            }
            "--distlock" => options.distlock = Some(PathBuf::from(value()?)),
            "--contender" => options.contender = Some(value()?),
            "--cycles" => {
                options.cycles = value()?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("--cycles: a positive number")?
            }
            "--sweep" => {
                options.sweep = match value()?.as_str() {
                    "on" => true,
                    "off" => false,
                    other => return Err(format!("--sweep {other:?}: on or off")),
                }
            }
            "--backends" => {
                options.backends = value()?.split(',').map(str::to_owned).collect();
                if let Some(bad) = options
                    .backends
                    .iter()
                    .find(|b| !BACKENDS.contains(&b.as_str()))
                {
                    return Err(format!("--backends: unknown backend {bad:?}"));
                }
            }
            "--clients" => {
                options.clients = value()?
                    .split(',')
                    .map(|n| n.parse().ok().filter(|&n: &usize| (1..=256).contains(&n)))
                    .collect::<Option<_>>()
                    .ok_or("--clients: a list of 1 to 256")?;
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(options)
}

/// The `sessions` sweep on each of `--backends` that has the setting
/// (`postgres`, `mysql`, `zookeeper`; by default all three).
fn sweep(options: &Options) {
    let runtime = runtime();
    let clients = options.clients.iter().copied().max().unwrap_or(16);
    let swept = swept(options);
    if swept.is_empty() {
        eprintln!("distlock-bench: sweep: --backends names none of postgres, mysql, zookeeper");
        std::process::exit(64);
    }
    for backend in swept {
        match runtime.block_on(sweep::run(backend, clients, &options.settings)) {
            Ok(result) => println!(
                "{backend}, {clients} clients, {} rounds of {} s\n{}",
                options.settings.rounds,
                options.settings.measure_s,
                result.table()
            ),
            Err(error) => {
                eprintln!("distlock-bench: sweep {backend}: {error}");
                std::process::exit(1);
            }
        }
    }
}

/// `profile`: the first of `--backends`, its single-client uncontended
/// group, the `--contender` named, `--cycles` cycles.
async fn profile(options: &Options) -> Result<(), String> {
    let name = options
        .contender
        .as_deref()
        .ok_or("--contender NAME is needed")?;
    let cycles = options.cycles;
    let backend = options.backends.first().ok_or("--backends is empty")?;
    let mut server = backends::Started::start(backend).await?;
    profile::run(&server.uncontended(1).await, name, cycles).await
}

/// The backends of `--backends` that have a `sessions` setting to sweep.
fn swept(options: &Options) -> Vec<&str> {
    options
        .backends
        .iter()
        .map(String::as_str)
        .filter(|b| ["postgres", "mysql", "zookeeper"].contains(b))
        .collect()
}

/// The runtime every measurement runs on.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        // Two workers, as the machine has two vCPUs shared with the server.
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn measure(options: &Options) -> Results {
    let load_average_start = cpu::load_average();
    let runtime = runtime();
    let mut groups = Vec::new();
    let mut holds = Vec::new();
    let mut sweeps = Vec::new();
    let contended_clients = options.clients.iter().copied().max().unwrap_or(16);
    let settings = &options.settings;
    runtime.block_on(async {
        for backend in &options.backends {
            eprintln!("{backend}: starting the server");
            let mut server = match backends::Started::start(backend).await {
                Ok(server) => server,
                Err(error) => unreachable!("checked by parse: {error}"),
            };
            for &clients in &options.clients {
                let group = server.uncontended(clients).await;
                groups.push(harness::run_group(&group, settings).await);
            }
            let group = server.contended(contended_clients).await;
            groups.push(harness::run_group(&group, settings).await);
            holds.extend(hold::run(options, backend, &server.url()));
        }
        if options.sweep {
            for backend in swept(options) {
                eprintln!("{backend}: the sessions sweep at {contended_clients} clients");
                match sweep::run(backend, contended_clients, settings).await {
                    Ok(result) => sweeps.push(result),
                    Err(error) => eprintln!("distlock-bench: sweep {backend}: {error}"),
                }
            }
        }
    });
    Results {
        date: shell(&["date", "-u", "+%Y-%m-%d %H:%M UTC"]),
        command: std::iter::once(
            "cargo run --release --manifest-path bench/Cargo.toml --".to_owned(),
        )
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" "),
        commit: shell(&[
            "git",
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ]),
        machine: Machine {
            cpus: cpu::cpus(),
            kernel: shell(&["uname", "-sr"]),
            load_average_start,
            load_average_end: cpu::load_average(),
        },
        settings: options.settings.clone(),
        groups,
        holds,
        sweeps,
    }
}

/// A command's first line of output, or "" if it failed.
fn shell(command: &[&str]) -> String {
    std::process::Command::new(command[0])
        .args(&command[1..])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_default()
}
