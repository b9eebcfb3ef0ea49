//! The hold workload: `distlock bench --workload hold` (the CLI's own
//! measurement) run as a child process against the harness's server, so its
//! resident-memory figures are those of a fresh process holding only the
//! leases.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::Options;

/// How long the leases live and are held: each is refreshed every ttl/3,
/// so about once or twice while held.
const TTL: &str = "30s";
const HOLD: &str = "15s";
const CLIENTS: &str = "16";

#[derive(Debug, Serialize, Deserialize)]
pub struct HoldResult {
    pub backend: String,
    /// Leases asked for.
    #[serde(default)]
    pub leases: usize,
    pub command: String,
    /// The CLI's JSON object for the run, as it printed it.
    pub run: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl HoldResult {
    /// A number of the run's JSON object (`None`: the run failed, or
    /// printed no such figure).
    pub fn figure(&self, key: &str) -> Option<f64> {
        self.run.as_ref()?.get(key)?.as_f64()
    }
}

/// One hold run per lease count of `--hold-leases`.
pub fn run(options: &Options, backend: &str, url: &str) -> Vec<HoldResult> {
    options
        .hold_leases
        .iter()
        .map(|&leases| run_one(options, backend, url, leases))
        .collect()
}

fn run_one(options: &Options, backend: &str, url: &str, leases: usize) -> HoldResult {
    let binary = match &options.distlock {
        Some(path) => path.clone(),
        None => match build_cli() {
            Ok(path) => path,
            Err(error) => {
                return HoldResult {
                    backend: backend.into(),
                    leases,
                    command: String::new(),
                    run: None,
                    error: Some(error),
                }
            }
        },
    };
    let asked = leases;
    let leases = leases.to_string();
    let args = [
        "bench",
        "--workload",
        "hold",
        "--keys",
        &leases,
        "--clients",
        CLIENTS,
        "--ttl",
        TTL,
        "--duration",
        HOLD,
        "--json",
        "--url",
        url,
    ];
    let command = format!("distlock {}", args[..args.len() - 1].join(" ")) + " URL";
    eprintln!("{backend}: {command}");
    let output = Command::new(&binary)
        .args(args)
        .env("NO_COLOR", "1")
        .output();
    let (run, error) = match output {
        Ok(output) if output.status.success() => {
            let stdout = String::from_utf8_lossy(&output.stdout);
            match stdout
                .lines()
                .next()
                .map(serde_json::from_str::<serde_json::Value>)
            {
                Some(Ok(value)) => (Some(value), None),
                other => (None, Some(format!("unexpected output {other:?}"))),
            }
        }
        Ok(output) => (
            None,
            Some(format!(
                "exit {:?}: {}",
                output.status.code(),
                summary(&String::from_utf8_lossy(&output.stderr))
            )),
        ),
        Err(error) => (
            None,
            Some(format!("cannot run {}: {error}", binary.display())),
        ),
    };
    if let Some(error) = &error {
        eprintln!("{backend}: hold failed: {error}");
    }
    HoldResult {
        backend: backend.into(),
        leases: asked,
        command,
        run,
        error,
    }
}

/// The first and last lines of a failed run's stderr (a failing keepalive
/// logs one line per lease), without terminal colours, each cut short.
fn summary(stderr: &str) -> String {
    let plain: String = {
        let mut out = String::with_capacity(stderr.len());
        let mut chars = stderr.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                // Skip a CSI sequence: ESC [ ... final byte in @..~.
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) && d != '[' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    };
    let lines: Vec<&str> = plain.lines().filter(|l| !l.trim().is_empty()).collect();
    let cut = |l: &str| l.chars().take(300).collect::<String>();
    match lines.as_slice() {
        [] => "no output".into(),
        [only] => cut(only),
        [first, .., last] => format!(
            "{} ... ({} lines) ... {}",
            cut(first),
            lines.len(),
            cut(last)
        ),
    }
}

/// Builds the CLI in release mode from the repository this crate sits in.
fn build_cli() -> Result<PathBuf, String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("the bench crate has no parent directory")?;
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "-p",
            "distlock-cli",
            "--manifest-path",
        ])
        .arg(repo.join("Cargo.toml"))
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("building distlock-cli failed: {status}"));
    }
    Ok(repo.join("target/release/distlock"))
}
