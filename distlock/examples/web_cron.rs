//! A web service (axum) that runs the replica-safe cron scheduler
//! (`distlock::cron`) beside its handlers, on the same tokio runtime, and
//! serves Prometheus metrics on `/metrics`. Every replica runs the same
//! scheduler; each tick runs on one of them.
//!
//! ```sh
//! cargo run -p distlock --example web_cron --features cron
//! curl http://127.0.0.1:3000/ ; curl -s http://127.0.0.1:3000/metrics | grep distlock_
//! ```
//!
//! With no `DISTLOCK_URL` the locks are files in the default directory, so
//! a second copy on the same host (`ADDR=127.0.0.1:3001 cargo run ...`)
//! is a second replica: each tick runs on one, the other logs `held
//! elsewhere` or `already ran`. Across hosts, name a shared backend:
//! `DISTLOCK_URL=redis://10.0.0.5:6379 cargo run -p distlock --example
//! web_cron --features cron,redis`. Ctrl-C (or SIGTERM) stops the server,
//! then the scheduler: no new ticks, a running job gets a grace period.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use distlock::cron::{Job, JobContext, Scheduler, TickReport};
use distlock::LockerExt;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

mod common;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a running job may go on after shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What the handlers read and the job writes.
struct App {
    metrics: PrometheusHandle,
    /// Ticks this replica ran.
    runs_here: AtomicU64,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // First: the recorder must be installed before anything records.
    let metrics = install_metrics()?;
    let app = Arc::new(App {
        metrics,
        runs_here: AtomicU64::new(0),
    });

    // The locker with `distlock_*` metrics (attempts, waits, hold times).
    let locker = common::locker_from_env().await?.with_metrics();
    let mut scheduler = Scheduler::new(locker).on_tick(log_tick);
    let job_state = app.clone();
    scheduler.add(
        // Every 10 s (six fields: seconds first). `at_most` bounds a run:
        // a hung job is stopped and its lock let go.
        Job::new("rollup", "*/10 * * * * *").at_most(Duration::from_secs(60)),
        move |ctx: JobContext| {
            let app = job_state.clone();
            async move {
                // Pass ctx.fencing_token() with every write the job makes.
                println!(
                    "rollup for {} on {} (fencing token {:?})",
                    ctx.scheduled_at(),
                    ctx.replica(),
                    ctx.fencing_token()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                app.runs_here.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        },
    )?;
    // On this runtime, beside the server: no thread or runtime of its own.
    let running = scheduler.start()?;

    let routes = Router::new()
        .route("/", get(index))
        .route("/metrics", get(render_metrics))
        .with_state(app);
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{addr}");
    axum::serve(listener, routes)
        .with_graceful_shutdown(shutdown_signal())
        .await?;

    // The server has stopped taking requests; now the scheduler: no tick
    // starts any more, a running job has `SHUTDOWN_GRACE` to finish, and
    // every claim is released before this returns.
    println!("shutting down the scheduler");
    running.shutdown(SHUTDOWN_GRACE).await;
    println!("stopped");
    Ok(())
}

async fn index(State(app): State<Arc<App>>) -> String {
    format!(
        "ticks run on this replica: {}\n",
        app.runs_here.load(Ordering::Relaxed)
    )
}

async fn render_metrics(State(app): State<Arc<App>>) -> String {
    app.metrics.render()
}

/// Installs the Prometheus recorder with distlock's histogram buckets, as
/// `distlock --metrics-addr` does (`serve_metrics` in `distlock-cli`).
fn install_metrics() -> Result<PrometheusHandle, BuildError> {
    // Histograms, not the exporter's default summaries: only histograms
    // aggregate across replicas (`histogram_quantile(sum by (le) ...)`).
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            distlock::DURATION_BUCKETS,
        )?
        .install_recorder()?;
    distlock::describe_metrics();
    // `install_recorder` leaves upkeep to the caller (the crate docs,
    // "Upkeep and maintenance"): without it histogram data piles up between
    // scrapes. Every 5 s, the exporter's own listener's default.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// One line per tick and replica: ran, held elsewhere, already ran, ...
fn log_tick(report: &TickReport) {
    eprintln!(
        "tick {} {}: {}",
        report.job,
        report.scheduled_at,
        report.outcome.label()
    );
}

/// Ctrl-C or SIGTERM (what an orchestrator sends).
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            eprintln!("cannot listen for Ctrl-C: {error}");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(error) => {
                eprintln!("cannot listen for SIGTERM: {error}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    println!("signal received: stopping the server");
}
