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
    pub command: String,
    /// The CLI's JSON object for the run, as it printed it.
    pub run: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub fn run(options: &Options, backend: &str, url: &str) -> Option<HoldResult> {
    if options.hold_leases == 0 {
        return None;
    }
    let binary = match &options.distlock {
        Some(path) => path.clone(),
        None => match build_cli() {
            Ok(path) => path,
            Err(error) => {
                return Some(HoldResult {
                    backend: backend.into(),
                    command: String::new(),
                    run: None,
                    error: Some(error),
                })
            }
        },
    };
    let leases = options.hold_leases.to_string();
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
    let output = Command::new(&binary).args(args).output();
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
                String::from_utf8_lossy(&output.stderr).trim()
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
    Some(HoldResult {
        backend: backend.into(),
        command,
        run,
        error,
    })
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
