//! `distlock`: flock(1) for a fleet. A thin layer over the `distlock` library.

mod bench;
mod cli;
mod cron;
mod cron_config;
mod elect;
mod exit;
mod generated;
mod inspect;
mod process_group;
mod reaper;
mod run;
mod supervise;
mod terminal;
mod watchdog;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return exit::usage_error(err),
    };
    // The watchdog is distlock re-executed by itself, and the generated
    // documents are text from the clap definitions: no runtime, no logging.
    let cli = match cli.command {
        Command::Watchdog(args) => return ExitCode::from(watchdog::main(args)),
        Command::Completions(args) => return ExitCode::from(generated::completions(args.shell)),
        Command::Man(args) => return ExitCode::from(generated::man(args.subcommand.as_deref())),
        _ => cli,
    };
    init_logging(&cli.log_level);
    // One thread: the child is spawned from the thread that lives as long as
    // the process, so its parent-death signal fires only when distlock dies
    // (PR_SET_PDEATHSIG tracks the spawning *thread*).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("distlock: cannot start the async runtime: {err}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = runtime.block_on(async {
        if let Some(addr) = cli.metrics_addr {
            if let Err(error) = serve_metrics(addr) {
                // distlock's own set-up failed (a port in use, say), not the
                // backend: EX_SOFTWARE, as for the signal handlers.
                eprintln!(
                    "distlock: cannot serve metrics on {addr}: {error} (is the port in use? choose another --metrics-addr)"
                );
                return exit::SOFTWARE;
            }
        }
        match cli.command {
            Command::Run(args) => run::run(args).await,
            // clap's `requires` counts a `false` flag as present.
            Command::Release(args) if args.terminate_session && !args.force => {
                eprintln!(
                    "distlock: --terminate-session needs --force (see distlock release --help)"
                );
                exit::USAGE
            }
            Command::Release(args) if args.force => inspect::force_release(args).await,
            Command::Release(args) => run::release(args).await,
            Command::Elect(args) => elect::elect(args).await,
            Command::Status(args) => inspect::status(args).await,
            Command::List(args) => inspect::list(args).await,
            Command::Cron(args) => cron::cron(args).await,
            Command::Bench(args) => bench::bench(args).await,
            Command::Watchdog(_) | Command::Completions(_) | Command::Man(_) => exit::USAGE,
        }
    });
    ExitCode::from(code)
}

/// Installs the Prometheus recorder and its HTTP listener on the current runtime.
fn serve_metrics(
    addr: std::net::SocketAddr,
) -> Result<(), metrics_exporter_prometheus::BuildError> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    // Histograms, not the exporter's default summaries: only histograms
    // aggregate across replicas (`histogram_quantile(sum by (le) ...)`).
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            distlock::DURATION_BUCKETS,
        )?
        .with_http_listener(addr)
        .install()?;
    distlock::describe_metrics();
    Ok(())
}

/// Logs go to stderr; `RUST_LOG` wins over `--log-level`. Colours only when
/// stderr is a terminal and `NO_COLOR` is unset (<https://no-color.org>):
/// escape codes in a log file or a journal are noise.
fn init_logging(level: &str) {
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_target(false)
        .init();
}
