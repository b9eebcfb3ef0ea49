//! `distlock cron`'s jobs: from the flags (one job) or from a TOML file of
//! `[[job]]` tables. Every job is checked before anything runs; an error
//! names the file, the job and the field.
//!
//! ```toml
//! [[job]]
//! name = "report"
//! schedule = "30 2 * * *"
//! command = ["/usr/local/bin/report", "--daily"]
//! tz = "Europe/Berlin"        # optional, default UTC
//! at_most = "1h"              # optional, default 10m
//! at_least = "30s"            # optional, default 0s
//! overlap = "forbid"          # optional: forbid (default) or allow
//! catch_up = "6h"             # optional: run the latest missed tick within 6 h
//! ```

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use distlock::cron::{Job, Missed, Overlap};
use serde::Deserialize;

use crate::cli::{parse_duration, CronArgs};

/// One job to run: its schedule and settings, and its command.
#[derive(Debug, Clone)]
pub(crate) struct JobSpec {
    pub(crate) job: Job,
    pub(crate) command: Vec<OsString>,
}

/// A `[[job]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: String,
    schedule: String,
    command: Vec<String>,
    tz: Option<String>,
    at_most: Option<String>,
    at_least: Option<String>,
    overlap: Option<String>,
    catch_up: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    job: Vec<RawJob>,
}

/// The jobs `args` name, each checked ([`Job::validate`]).
pub(crate) fn jobs(args: &CronArgs) -> Result<Vec<JobSpec>, String> {
    match &args.config {
        Some(path) => from_file(path),
        None => {
            let spec = from_flags(args)?;
            spec.job.validate().map_err(|error| error.to_string())?;
            Ok(vec![spec])
        }
    }
}

fn from_flags(args: &CronArgs) -> Result<JobSpec, String> {
    // clap makes --name and --schedule required without --config.
    let name = args.name.clone().unwrap_or_default();
    if args.command.is_empty() {
        return Err(format!(
            "job {name:?}: no command given (distlock cron ... -- CMD [ARGS...])"
        ));
    }
    let mut job = Job::new(name, args.schedule.clone().unwrap_or_default())
        .at_most(args.at_most)
        .at_least(args.at_least)
        .overlap(overlap(&args.overlap).map_err(|e| e.to_string())?);
    if let Some(zone) = &args.tz {
        job = job.time_zone(zone);
    }
    if let Some(look_back) = args.catch_up {
        job = job.missed(Missed::CatchUp { look_back });
    }
    Ok(JobSpec {
        job: job.handler_watches_loss(true),
        command: args.command.clone(),
    })
}

fn from_file(path: &Path) -> Result<Vec<JobSpec>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    // toml's message is several lines (the line and a caret under the
    // column): kept as it is, after the file's name on a line of its own.
    let raw: RawFile =
        toml::from_str(&text).map_err(|e| format!("{shown}: {}", e.to_string().trim_end()))?;
    if raw.job.is_empty() {
        return Err(format!("{shown}: no [[job]] tables"));
    }
    raw.job
        .into_iter()
        .map(|raw| {
            let spec = job_from_table(raw)?;
            spec.job.validate().map_err(|e| e.to_string())?;
            Ok(spec)
        })
        .map(|spec: Result<JobSpec, String>| spec.map_err(|e| format!("{shown}: {e}")))
        .collect()
}

fn job_from_table(raw: RawJob) -> Result<JobSpec, String> {
    let name = raw.name;
    let field = |what: &str, text: &Option<String>| -> Result<Option<Duration>, String> {
        text.as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|e| format!("job {name:?}: {what}: {e}"))
    };
    let at_most = field("at_most", &raw.at_most)?;
    let at_least = field("at_least", &raw.at_least)?;
    let catch_up = field("catch_up", &raw.catch_up)?;
    if raw.command.is_empty() || raw.command[0].is_empty() {
        return Err(format!("job {name:?}: command: the argument list is empty"));
    }
    let overlap = match raw.overlap.as_deref() {
        None => Overlap::Forbid,
        Some(text) => overlap(text).map_err(|e| format!("job {name:?}: overlap: {e}"))?,
    };
    let mut job = Job::new(name, raw.schedule).overlap(overlap);
    if let Some(at_most) = at_most {
        job = job.at_most(at_most);
    }
    if let Some(at_least) = at_least {
        job = job.at_least(at_least);
    }
    if let Some(zone) = raw.tz {
        job = job.time_zone(zone);
    }
    if let Some(look_back) = catch_up {
        job = job.missed(Missed::CatchUp { look_back });
    }
    Ok(JobSpec {
        job: job.handler_watches_loss(true),
        command: raw.command.into_iter().map(OsString::from).collect(),
    })
}

fn overlap(text: &str) -> Result<Overlap, String> {
    match text {
        "forbid" => Ok(Overlap::Forbid),
        "allow" => Ok(Overlap::Allow),
        other => Err(format!(
            "{other:?} is not an overlap policy (forbid or allow)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<JobSpec>, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.toml");
        std::fs::write(&path, text).unwrap();
        from_file(&path)
    }

    #[test]
    fn a_file_of_jobs_parses_with_defaults_and_options() {
        let jobs = parse(
            r#"
[[job]]
name = "a"
schedule = "* * * * * *"
command = ["echo", "a b"]

[[job]]
name = "b"
schedule = "30 2 * * *"
command = ["true"]
tz = "Europe/Berlin"
at_most = "1h"
at_least = "5s"
overlap = "allow"
catch_up = "6h"
"#,
        )
        .unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].job.name(), "a");
        assert_eq!(jobs[0].command, ["echo", "a b"]);
        assert_eq!(jobs[1].job.name(), "b");
    }

    #[test]
    fn bad_files_are_one_error_naming_the_job_and_the_field() {
        let cases = [
            ("[[job]]\nname = \"a\"\nschedule = \"61 * * * *\"\ncommand = [\"true\"]\n", "job \"a\": schedule"),
            ("[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\ntz = \"Nowhere/City\"\n", "invalid time zone: job \"a\""),
            ("[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\nat_most = \"soon\"\n", "job \"a\": at_most"),
            ("[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = []\n", "job \"a\": command"),
            ("[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\noverlap = \"replace\"\n", "job \"a\": overlap"),
            ("", "no [[job]] tables"),
        ];
        for (text, needle) in cases {
            let error = parse(text).unwrap_err();
            assert!(error.contains(needle), "{text:?}: {error}");
            assert!(error.contains("jobs.toml"), "{error}");
            assert!(!error.contains('\n'), "one line: {error}");
        }
    }

    #[test]
    fn toml_errors_keep_tomls_own_lines_after_the_file_name() {
        let cases = [
            ("[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\ncolour = \"red\"\n", "colour"),
            ("[[job]]\nname = \"a\"\ncommand = [\"true\"]\n", "schedule"),
        ];
        for (text, needle) in cases {
            let error = parse(text).unwrap_err();
            assert!(error.contains(needle), "{text:?}: {error}");
            let first = error.lines().next().unwrap_or_default();
            assert!(
                first.contains("jobs.toml: TOML parse error at line"),
                "{error}"
            );
            assert_eq!(error.matches("jobs.toml").count(), 1, "{error}");
            assert!(
                error.lines().any(|line| line.trim_end().ends_with('^')),
                "caret kept: {error}"
            );
        }
    }
}
