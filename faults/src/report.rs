//! The table (stdout) and the machine-readable file (JSON).

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::analysis::Figures;
use crate::scenario::{Expect, Fault, Profile, RunResult, Workload};

/// One backend × fault × workload over all its runs.
#[derive(Debug, Clone, Serialize)]
pub struct CellSummary {
    pub backend: &'static str,
    pub fault: Fault,
    pub workload: Workload,
    pub expect: Expect,
    pub runs: u32,
    pub orphan_bound_ms: f64,
    pub figures: Figures,
    pub failures: Vec<String>,
}

impl CellSummary {
    /// Sums `runs` (all of one cell).
    pub fn of(runs: &[RunResult], orphan_bound_ms: f64) -> Option<CellSummary> {
        let first = runs.first()?;
        let mut figures = Figures::default();
        let mut failures = Vec::new();
        for run in runs {
            figures.absorb(&run.figures);
            failures.extend(
                run.failures
                    .iter()
                    .map(|failure| format!("run {}: {failure}", run.repetition)),
            );
        }
        Some(CellSummary {
            backend: first.backend,
            fault: first.fault,
            workload: first.workload,
            expect: first.expect,
            runs: runs.len() as u32,
            orphan_bound_ms,
            figures,
            failures,
        })
    }

    /// True if every invariant held in every run.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    pub profile: Profile,
    /// `distlock-faults run ...` as invoked.
    pub command: String,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix: u64,
    pub cpus: usize,
    pub seconds: f64,
    pub cells: Vec<CellSummary>,
    pub runs: Vec<RunResult>,
}

impl Report {
    /// True if every cell passed.
    pub fn passed(&self) -> bool {
        self.cells.iter().all(CellSummary::passed)
    }

    /// The table, as Markdown (it reads as plain text too), then every
    /// failure.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "| backend | fault | workload | expect | runs | grants | overlaps (explained) | stale writes accepted | fencing rejections | token regressions | outages as contention | never released | orphan ms (bound) | lost-signal lag ms | lost increments | result |\n\
             | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        );
        for cell in &self.cells {
            let figures = &cell.figures;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} ({:.0}) | {} | {} | {} |",
                cell.backend,
                cell.fault.name(),
                cell.workload.name(),
                match cell.expect {
                    Expect::Exclusive => "exclusive",
                    Expect::Breaks => "breaks",
                    Expect::Races => "races",
                    Expect::BreaksFencing => "breaks fencing",
                },
                cell.runs,
                figures.grants,
                figures.overlaps,
                figures.overlaps_explained,
                figures.stale_writes_accepted,
                figures.fencing_rejections,
                figures.token_regressions,
                figures.outages_as_contention,
                figures.never_released,
                milliseconds(figures.orphan_ms),
                cell.orphan_bound_ms,
                milliseconds(figures.lost_signal_lag_ms),
                figures.lost_increments,
                if cell.passed() { "ok" } else { "FAILED" },
            );
        }
        for cell in self.cells.iter().filter(|cell| !cell.passed()) {
            for failure in &cell.failures {
                let _ = writeln!(
                    out,
                    "FAILED {} {} {}: {failure}",
                    cell.backend,
                    cell.fault.name(),
                    cell.workload.name()
                );
            }
        }
        out
    }

    /// Writes the report as pretty JSON to `path`.
    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        let json = serde_json::to_string_pretty(self)
            .map_err(|err| format!("cannot encode the report: {err}"))?;
        std::fs::write(path, json + "\n")
            .map_err(|err| format!("cannot write {}: {err}", path.display()))
    }
}

fn milliseconds(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0}"))
}
