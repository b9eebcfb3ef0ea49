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
    /// failure. Semaphore cells have a table of their own, with two columns
    /// more: the most holders at once against the limit (N), and the grants
    /// over it.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let (semaphores, locks): (Vec<&CellSummary>, Vec<&CellSummary>) = self
            .cells
            .iter()
            .partition(|cell| cell.workload == Workload::Semaphore);
        if !locks.is_empty() {
            write_table(&mut out, &locks, None);
        }
        if !semaphores.is_empty() {
            if !locks.is_empty() {
                out.push('\n');
            }
            write_table(&mut out, &semaphores, Some(self.profile.permits));
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

/// One Markdown table of `cells`; with `limit` (a semaphore's N), the
/// columns of the limit after the overlaps.
fn write_table(out: &mut String, cells: &[&CellSummary], limit: Option<u32>) {
    let mut header = vec![
        "backend",
        "fault",
        "workload",
        "expect",
        "runs",
        "grants",
        "overlaps (explained)",
    ];
    if limit.is_some() {
        header.extend(["most holders (limit)", "over the limit (explained)"]);
    }
    header.extend([
        "stale writes accepted",
        "fencing rejections",
        "token regressions",
        "outages as contention",
        "never released",
        "orphan ms (bound)",
        "lost-signal lag ms",
        "lost increments",
        "result",
    ]);
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let alignment: Vec<&str> = header
        .iter()
        .enumerate()
        .map(|(index, _)| match index {
            // The names and the verdicts are text; every other column a
            // number.
            0..=3 => "---",
            _ if index == header.len() - 1 => "---",
            _ => "---:",
        })
        .collect();
    let _ = writeln!(out, "| {} |", alignment.join(" | "));
    for cell in cells {
        let figures = &cell.figures;
        let mut row = vec![
            cell.backend.to_owned(),
            cell.fault.name().to_owned(),
            cell.workload.name().to_owned(),
            match cell.expect {
                Expect::Exclusive => "exclusive",
                Expect::Breaks => "breaks",
                Expect::Races => "races",
                Expect::BreaksFencing => "breaks fencing",
            }
            .to_owned(),
            cell.runs.to_string(),
            figures.grants.to_string(),
            format!("{} ({})", figures.overlaps, figures.overlaps_explained),
        ];
        if let Some(limit) = limit {
            row.push(format!("{} ({limit})", figures.max_holders));
            row.push(format!(
                "{} ({})",
                figures.over_limit, figures.over_limit_explained
            ));
        }
        row.extend([
            figures.stale_writes_accepted.to_string(),
            figures.fencing_rejections.to_string(),
            figures.token_regressions.to_string(),
            figures.outages_as_contention.to_string(),
            figures.never_released.to_string(),
            format!(
                "{} ({:.0})",
                milliseconds(figures.orphan_ms),
                cell.orphan_bound_ms
            ),
            milliseconds(figures.lost_signal_lag_ms),
            figures.lost_increments.to_string(),
            if cell.passed() { "ok" } else { "FAILED" }.to_owned(),
        ]);
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
}

fn milliseconds(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Profile;

    fn summary(workload: Workload, figures: Figures) -> CellSummary {
        CellSummary {
            backend: "redis",
            fault: Fault::Pause,
            workload,
            expect: Expect::Breaks,
            runs: 1,
            orphan_bound_ms: 2000.0,
            figures,
            failures: Vec::new(),
        }
    }

    #[test]
    fn semaphore_cells_have_a_table_with_the_limits_columns() {
        let report = Report {
            profile: Profile::QUICK,
            command: String::new(),
            started_unix: 0,
            cpus: 2,
            seconds: 1.0,
            cells: vec![
                summary(Workload::Lock, Figures::default()),
                summary(
                    Workload::Semaphore,
                    Figures {
                        max_holders: 3,
                        over_limit: 1,
                        over_limit_explained: 1,
                        ..Figures::default()
                    },
                ),
            ],
            runs: Vec::new(),
        };
        let table = report.table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| backend | fault | workload | expect | runs | grants | overlaps (explained) | \
             stale writes accepted | fencing rejections | token regressions | outages as contention | \
             never released | orphan ms (bound) | lost-signal lag ms | lost increments | result |"
        );
        assert_eq!(
            lines[1],
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        );
        assert_eq!(
            lines[2],
            "| redis | pause | lock | breaks | 1 | 0 | 0 (0) | 0 | 0 | 0 | 0 | 0 | - (2000) | - | 0 | ok |"
        );
        assert_eq!(lines[3], "");
        assert!(lines[4].contains(
            "| overlaps (explained) | most holders (limit) | over the limit (explained) | stale"
        ));
        assert_eq!(
            lines[6],
            "| redis | pause | semaphore | breaks | 1 | 0 | 0 (0) | 3 (2) | 1 (1) | 0 | 0 | 0 | 0 | 0 | - (2000) | - | 0 | ok |"
        );
    }
}
