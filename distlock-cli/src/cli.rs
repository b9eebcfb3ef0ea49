//! Command-line syntax.

use std::borrow::Cow;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// flock(1) for a fleet: run a command only where a distributed lock is held.
///
/// The backend is chosen by URL (--url, else $DISTLOCK_URL, else lock files in
/// a per-user state directory): file:///dir, redis://host:6379,
/// redlock://host1:6379,host2:6379,host3:6379, redis+cluster://h1:7000,h2:7000,
/// redis+sentinel://s1:26379,s2:26379/MASTER, postgres://user@host/db,
/// mysql://user@host:3306/db, etcd://h1:2379,h2:2379, memory://.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, about, after_help = crate::exit::TABLE)]
pub(crate) struct Cli {
    /// Log filter for distlock's own messages (RUST_LOG wins): error, warn,
    /// info, debug, trace or off, or directives such as `warn,distlock=debug`.
    #[arg(long, global = true, default_value = "warn", value_name = "LEVEL", value_parser = parse_log_level)]
    pub(crate) log_level: String,

    /// Serve Prometheus metrics at http://HOST:PORT/metrics while distlock
    /// runs. HOST is an IP address or a name (`localhost:9100`), resolved
    /// once at start: its first IPv4 address, else its first address.
    #[arg(long, global = true, value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    pub(crate) metrics_addr: Option<SocketAddr>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run CMD while holding the lock KEY; exit 75 if it is held elsewhere.
    Run(RunArgs),
    /// Release a lock by its owner token (printed to the holder as
    /// $DISTLOCK_OWNER), or whoever holds it with --force.
    Release(ReleaseArgs),
    /// Lead the election KEY: campaign, run CMD while leader (supervised as
    /// by `run`), campaign again; or watch the leader with --observe.
    Elect(ElectArgs),
    /// Who holds the lock KEY: exit 0 when held, 1 when free.
    Status(StatusArgs),
    /// The locks held now (under --prefix), as a table or JSON.
    List(ListArgs),
    /// Run commands on cron schedules, each tick once across every replica
    /// running the same jobs against the same backend.
    Cron(CronArgs),
    /// Measure a backend: acquire+release cycles per second, handoffs
    /// between waiting clients, or the cost of holding many leases.
    Bench(BenchArgs),
    /// Print a shell completion script: `distlock completions bash >
    /// /etc/bash_completion.d/distlock` (zsh: a `_distlock` file on
    /// $fpath; fish: ~/.config/fish/completions/distlock.fish).
    Completions(CompletionsArgs),
    /// Print a man page in roff: `distlock man > distlock.1`, or `distlock
    /// man run > distlock-run.1` for a subcommand's; read one with `man -l`.
    Man(ManArgs),
    /// Internal: the helper `distlock run` starts to SIGKILL CMD's process
    /// group if distlock dies.
    #[command(hide = true)]
    Watchdog(WatchdogArgs),
}

/// `distlock completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub(crate) shell: clap_complete::Shell,
}

/// `distlock man`.
#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// The subcommand whose page to print [default: distlock's own].
    #[arg(value_name = "SUBCOMMAND")]
    pub(crate) subcommand: Option<String>,
}

/// The descriptors `distlock run` hands its watchdog (see `watchdog.rs`).
#[derive(Debug, Args)]
pub(crate) struct WatchdogArgs {
    /// Read end of the lifeline.
    #[arg(long)]
    pub(crate) lifeline: i32,
    /// Read end of the pipe CMD's child writes its pid to.
    #[arg(long)]
    pub(crate) pid: i32,
    /// Write end of the pipe CMD's child waits on.
    #[arg(long)]
    pub(crate) go: i32,
    /// A descriptor of the lock's open file, held until the watchdog exits.
    #[arg(long)]
    pub(crate) hold: Option<i32>,
}

/// Where the locks live.
#[derive(Debug, Args)]
pub(crate) struct Backend {
    /// Backend URL [default: lock files in $XDG_STATE_HOME/distlock/locks or ~/.local/state/distlock/locks].
    /// A mysql:// or mariadb:// URL without ssl-mode verifies the server
    /// (ssl-mode=VERIFY_IDENTITY; trust a private CA with ssl-ca=FILE, or
    /// pass ssl-mode=DISABLED for a server without TLS).
    #[arg(long, env = "DISTLOCK_URL", value_name = "URL", hide_env_values = true)]
    pub(crate) url: Option<String>,
}

impl Backend {
    /// The URL to connect to, with the CLI's defaults: lock files without
    /// one, and [`verified_mysql`] for MySQL.
    pub(crate) fn url(&self) -> Cow<'_, str> {
        match self.url.as_deref() {
            None => Cow::Borrowed("file://"),
            Some(url) => verified_mysql(url),
        }
    }
}

/// A `mysql://` or `mariadb://` URL with `ssl-mode=VERIFY_IDENTITY` put
/// first in its query; any other URL as it is. The library's default,
/// `PREFERRED` (MySQL's), lets anyone on the path strip TLS or present any
/// certificate, and the CLI is handed production URLs with passwords in
/// them: so it checks the server unless the URL says otherwise. Put first,
/// the URL's own `ssl-mode` (in any spelling the library accepts) comes
/// later and wins, so nothing here has to recognise it.
fn verified_mysql(url: &str) -> Cow<'_, str> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !scheme.is_some_and(|s| s.eq_ignore_ascii_case("mysql") || s.eq_ignore_ascii_case("mariadb"))
    {
        return Cow::Borrowed(url);
    }
    const DEFAULT: &str = "ssl-mode=VERIFY_IDENTITY";
    Cow::Owned(match url.find('?') {
        Some(query) => format!("{}?{DEFAULT}&{}", &url[..query], &url[query + 1..]),
        None => match url.find('#') {
            Some(fragment) => format!("{}?{DEFAULT}{}", &url[..fragment], &url[fragment..]),
            None => format!("{url}?{DEFAULT}"),
        },
    })
}

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub(crate) struct RunArgs {
    /// The lock's name.
    #[arg(long, short)]
    pub(crate) key: String,

    #[command(flatten)]
    pub(crate) backend: Backend,

    /// How long the lock outlives a holder that stops refreshing it; it is
    /// refreshed every ttl/3 while CMD runs. At least 250ms (see
    /// --kill-after); a second or more on backends whose locks expire.
    #[arg(long, default_value = "30s", value_parser = parse_supervised_ttl, value_name = "DURATION")]
    pub(crate) ttl: Duration,

    /// Wait up to this long for the lock [default: one attempt, no waiting].
    /// It bounds connecting too: a backend that has not answered 500 ms
    /// after it is unreachable (exit 69). Durations beyond 100 years wait
    /// 100 years.
    #[arg(long, short, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) wait: Option<Duration>,

    /// Stop CMD (SIGTERM, SIGKILL after --kill-after) once the lock has been
    /// held this long; the lock stops being renewed then and is released once
    /// CMD's process group has exited. Exit status 76. Durations beyond 100
    /// years mean no max hold.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) max_hold: Option<Duration>,

    /// Exit code when the lock is held elsewhere.
    #[arg(long, default_value_t = crate::exit::CONFLICT, value_name = "N")]
    pub(crate) conflict_exit_code: u8,

    /// Take one of N permits of KEY instead of the lock KEY, like `consul
    /// lock -n N`: at most N commands run at once across every host using
    /// the same N. The permit is the lock KEY#I (I from 0 to N-1), in
    /// $DISTLOCK_KEY; everything else is as for a lock. 1 to 1024.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) limit: Option<u32>,

    /// Take a shared (reader) lease instead of an exclusive one: any number
    /// of `--shared` runs of KEY hold it at once, and none while an
    /// exclusive `run` holds it (nor an exclusive one while any of them
    /// does). Everything else (supervision, --wait, exit codes) is as for
    /// an exclusive run. A waiting exclusive run holds new readers back on
    /// Postgres (the server queues it), etcd and ZooKeeper (readers and
    /// writers queue in order), not on file or Redis. On a backend without
    /// shared locks (Redlock, MySQL) it exits 64 with the reason.
    #[arg(long, conflicts_with = "limit")]
    pub(crate) shared: bool,

    /// How long CMD's process group gets between SIGTERM and SIGKILL, when
    /// the lock is lost, reaches --max-hold, or CMD's first process exits and
    /// leaves others behind. Capped at ttl/2 - drift margin (ttl/100 + 100ms)
    /// with a warning: the lock is refreshed every ttl/3, and a stop that
    /// starts at most ttl/2 before the lease would lapse never fires while
    /// refreshes succeed, yet leaves ttl/6 to retry a failing one. SIGKILL
    /// never comes later than drift margin before the lease's validity ends.
    /// [default: 10s, or the cap if that is shorter, without a warning]
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) kill_after: Option<Duration>,

    /// The command and its arguments, run directly (no shell), as the leader
    /// of its own process group: signals and stops go to the whole group, and
    /// the lock is released only once every process of the group has exited.
    #[arg(required = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

/// `distlock elect`.
#[derive(Debug, Args)]
#[command(
    trailing_var_arg = true,
    after_help = "\
A replica campaigns, runs CMD while it leads, and campaigns again when CMD \
exits or the term is lost (--once: exits instead); standbys wait their turn. \
CMD runs exactly as under `distlock run`: its own process group, a watchdog, \
stopped (SIGTERM, SIGKILL after --kill-after) before the term can lapse, and \
the election is released only once the group has exited. CMD gets \
DISTLOCK_TERM (the term's fencing token: pass it with every write), \
DISTLOCK_LEADER (the proclaimed value, else HOST:PID), DISTLOCK_KEY, \
DISTLOCK_OWNER and DISTLOCK_FENCING_TOKEN. SIGINT or SIGTERM is forwarded to \
CMD; distlock then exits with CMD's status instead of campaigning again (0 \
if it was standing by). `distlock elect --observe` prints one line per leader \
change (`no leader`, or the term, host, pid, proclaimed value and since) \
until interrupted; `distlock status --key NAME` shows the leader once."
)]
pub(crate) struct ElectArgs {
    /// The election's name (the key of its lock).
    #[arg(long, short)]
    pub(crate) key: String,

    #[command(flatten)]
    pub(crate) backend: Backend,

    /// How long a leader that stops refreshing (paused, cut off, killed)
    /// blocks the election on backends whose locks expire; the term is
    /// refreshed every ttl/3. At least 250ms, as for `distlock run`.
    #[arg(long, default_value = "15s", value_parser = parse_supervised_ttl, value_name = "DURATION")]
    pub(crate) ttl: Duration,

    /// What the leader publishes to observers (its address, for example),
    /// recorded beside the election's lock; at most 256 bytes, not secret.
    #[arg(long, value_name = "VALUE")]
    pub(crate) proclaim: Option<String>,

    /// Watch the election instead of campaigning: one line per change.
    #[arg(long, conflicts_with_all = ["command", "proclaim", "once", "wait"])]
    pub(crate) observe: bool,

    /// With --observe: print each change as one JSON object per line.
    #[arg(long, requires = "observe")]
    pub(crate) json: bool,

    /// Lead once: exit with CMD's status (76 if the term was lost) instead
    /// of campaigning again.
    #[arg(long)]
    pub(crate) once: bool,

    /// Give up campaigning after this long [default: wait as long as it
    /// takes] and exit with --conflict-exit-code.
    #[arg(long, short, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) wait: Option<Duration>,

    /// Exit code when --wait passes without leading.
    #[arg(long, default_value_t = crate::exit::CONFLICT, value_name = "N")]
    pub(crate) conflict_exit_code: u8,

    /// How long CMD's process group gets between SIGTERM and SIGKILL
    /// [default: 10s, or ttl/2 - drift margin if that is shorter]; a longer
    /// one is capped there with a warning, as for `distlock run`.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) kill_after: Option<Duration>,

    /// The command and its arguments, run directly (no shell) while this
    /// replica leads.
    #[arg(value_name = "CMD", required_unless_present = "observe")]
    pub(crate) command: Vec<OsString>,
}

/// `distlock cron`: one job from the flags, or many from `--config`.
#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub(crate) struct CronArgs {
    #[command(flatten)]
    pub(crate) backend: Backend,

    /// A TOML file of `[[job]]` tables (name, schedule, command, and
    /// optionally tz, at_most, at_least, overlap, catch_up) instead of one
    /// job from the flags.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["name", "schedule", "command"])]
    pub(crate) config: Option<std::path::PathBuf>,

    /// The job's name: its lock keys are cron:NAME and cron:NAME@INSTANT.
    #[arg(long, required_unless_present = "config")]
    pub(crate) name: Option<String>,

    /// A cron expression: 5 fields (minute hour day month weekday), 6 with
    /// seconds first, or @hourly, @daily, ...
    #[arg(long, required_unless_present = "config", value_name = "CRON")]
    pub(crate) schedule: Option<String>,

    /// The IANA time zone the schedule is read in [default: UTC].
    #[arg(long, value_name = "ZONE")]
    pub(crate) tz: Option<String>,

    /// ShedLock's lockAtMostFor: the claims' ttl and the longest a run may
    /// last (the command is stopped then, exit 76 in the log line).
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) at_most: Duration,

    /// ShedLock's lockAtLeastFor: the tick's claim is held this long after
    /// the tick even if the command finished sooner.
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) at_least: Duration,

    /// While an earlier run still runs on any replica: skip the tick
    /// (forbid) or run it anyway (allow).
    #[arg(long, default_value = "forbid", value_name = "POLICY", value_parser = ["forbid", "allow"])]
    pub(crate) overlap: String,

    /// Run the latest missed tick once, if it lies within this look-back,
    /// when distlock starts or a run ends [default: missed ticks are skipped].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) catch_up: Option<Duration>,

    /// This replica's name in log lines and $DISTLOCK_REPLICA [default: hostname:pid].
    #[arg(long, value_name = "ID")]
    pub(crate) replica_id: Option<String>,

    /// On SIGINT or SIGTERM: how long running commands may take to finish
    /// before they are stopped (SIGTERM, then SIGKILL after --kill-after).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) grace: Duration,

    /// How long a command's process group gets between SIGTERM and SIGKILL
    /// (capped as for `distlock run`).
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) kill_after: Duration,

    /// The command and its arguments, run directly (no shell) as the leader
    /// of its own process group, for every tick this replica wins.
    #[arg(value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

#[derive(Debug, Args)]
#[command(after_help = "\
--force frees the lock whoever holds it, for operators: the evicted holder is \
not told at once and may still be working until its next refresh fails (its \
lease is then lost, and `distlock run` stops its command, exit 76); only its \
fencing token makes its late writes rejectable. Redis, Redlock, etcd and \
memory delete the lock. Postgres and MySQL locks belong to a server session \
and can only be freed by ending that session: --terminate-session does so \
and ALSO FREES EVERY OTHER LOCK THAT SESSION HOLDS, and the holding process \
sees its connection die. A file lock belongs to the process holding it and \
cannot be forced (exit 77). Every forced release is logged with who did it.")]
pub(crate) struct ReleaseArgs {
    /// The lock's name.
    #[arg(long, short)]
    pub(crate) key: String,

    /// The holder's owner token.
    #[arg(long, required_unless_present = "force", conflicts_with = "force")]
    pub(crate) owner: Option<String>,

    /// Free the lock whoever holds it, and print whom it evicted (see
    /// below). Exit 0 when a holder was evicted, 1 when nothing was held,
    /// 77 when the backend cannot.
    #[arg(long)]
    pub(crate) force: bool,

    /// With --force on Postgres or MySQL: end the holder's server session
    /// (pg_terminate_backend, KILL), which frees EVERY lock that session
    /// holds, not only KEY.
    #[arg(long)]
    pub(crate) terminate_session: bool,

    #[command(flatten)]
    pub(crate) backend: Backend,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The lock's name.
    #[arg(long, short)]
    pub(crate) key: String,

    #[command(flatten)]
    pub(crate) backend: Backend,

    /// Print one JSON object (times as RFC 3339 and unix ms, durations in ms);
    /// with --limit, an array of them.
    #[arg(long)]
    pub(crate) json: bool,

    /// KEY is a semaphore of N permits (`distlock run --limit N`): show
    /// every permit holder; exit 0 when any permit is held, 1 when none is.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) limit: Option<u32>,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only locks whose names start with this.
    #[arg(long, short, default_value = "")]
    pub(crate) prefix: String,

    #[command(flatten)]
    pub(crate) backend: Backend,

    /// Print a JSON array of the objects `status --json` prints.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) backend: Backend,

    /// What to measure: uncontended (each client acquires and releases a
    /// key of its own: cycles/s, acquire and release latency), contended
    /// (every client waits for one key through lock and holds it 1 ms:
    /// handoffs/s and the handoff gap), hold (hold --keys leases with keepalive: memory per
    /// lease, connections, refreshes/s), handoff (a leader resigns to a
    /// waiting candidate, --runs times: resign to the next campaign's return,
    /// beside a round trip), failover (three `distlock elect --once`
    /// replicas; the leader is SIGKILLed --runs times: kill to the next
    /// leader's CMD starting), permits (each client takes and releases a
    /// permit of one semaphore per --permits value, retrying 1 ms after
    /// finding it full, interleaved with the lock's own uncontended cycle:
    /// permit cycles/s and acquire latency beside the lock's).
    #[arg(long, short, value_enum, default_value_t = Workload::Uncontended)]
    pub(crate) workload: Workload,

    /// Concurrent clients (tasks on one connection pool); a comma-separated
    /// list runs once per value.
    #[arg(long, short = 'c', alias = "tasks", value_delimiter = ',', default_values_t = [1usize, 16])]
    pub(crate) clients: Vec<usize>,

    /// How long each run lasts (for hold: how long the leases are held).
    #[arg(long, short, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) duration: Duration,

    /// The ttl of each lock taken.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) ttl: Duration,

    /// Leases the hold workload holds.
    #[arg(long, short, default_value_t = 1000, value_name = "N")]
    pub(crate) keys: usize,

    /// Handoffs or failovers measured by the handoff and failover
    /// workloads (which ignore --clients and --duration).
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub(crate) runs: usize,

    /// Permits of the semaphore the permits workload measures; a
    /// comma-separated list runs once per value.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 10, 100], value_name = "N")]
    pub(crate) permits: Vec<u32>,

    /// One JSON object per run on stdout (one per line) instead of a table.
    #[arg(long)]
    pub(crate) json: bool,

    /// Same as --workload contended (kept for older scripts).
    #[arg(long, hide = true, conflicts_with = "workload")]
    pub(crate) shared_key: bool,
}

/// The `distlock bench` workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Workload {
    Uncontended,
    Contended,
    Hold,
    Handoff,
    Failover,
    Permits,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Workload::Uncontended => "uncontended",
            Workload::Contended => "contended",
            Workload::Hold => "hold",
            Workload::Handoff => "handoff",
            Workload::Failover => "failover",
            Workload::Permits => "permits",
        })
    }
}

/// `500ms`, `30s`, `5m`, `1h 30m`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (expected a duration such as 500ms, 30s or 5m)"))
}

/// The shortest `--ttl` a supervised command (`run`, `elect`) can hold a
/// lease for. CMD is stopped a drift margin (ttl/100 + 100ms) before the
/// lease could lapse and the kill-after grace is capped at ttl/2 − drift
/// (`supervise::kill_after_cap`); below 250ms that leaves a grace of a few
/// milliseconds or none, and the lease is "about to lapse" the moment it
/// is granted, so CMD would never start.
pub(crate) const MIN_SUPERVISED_TTL: Duration = Duration::from_millis(250);

/// `--ttl` of a supervised command: a duration of at least
/// [`MIN_SUPERVISED_TTL`].
fn parse_supervised_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    if ttl < MIN_SUPERVISED_TTL {
        return Err(format!(
            "{} is too short for a command run under the lock: it is stopped a drift margin \
             (ttl/100 + 100ms) before the lock could lapse, which leaves it no time below {}; \
             use 1s or more (a second or more on Redis and etcd, whose locks expire)",
            humantime::format_duration(ttl),
            humantime::format_duration(MIN_SUPERVISED_TTL)
        ));
    }
    Ok(ttl)
}

/// `--log-level`: level names, or `tracing` filter directives with a
/// target (`distlock=debug`). A bare word that is no level would be read
/// by `EnvFilter` as a *target* name and silently hide every warning.
fn parse_log_level(text: &str) -> Result<String, String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    for directive in text.split(',').map(str::trim) {
        if LEVELS
            .iter()
            .any(|level| directive.eq_ignore_ascii_case(level))
        {
            continue;
        }
        if !directive.contains('=') {
            return Err(format!(
                "unknown level {directive:?}: use one of {}, or a directive such as distlock=debug",
                LEVELS.join(", ")
            ));
        }
        tracing_subscriber::EnvFilter::try_new(directive)
            .map_err(|error| format!("bad filter directive {directive:?}: {error}"))?;
    }
    Ok(text.to_owned())
}

/// `--metrics-addr`: `HOST:PORT`, HOST an IP address or a name to resolve.
/// A name's IPv4 address comes first: `localhost` usually resolves to `::1`
/// first, and a scraper told `localhost:9100` may well try 127.0.0.1.
fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|error| {
            format!("{text:?} is not HOST:PORT or HOST does not resolve ({error}); e.g. 127.0.0.1:9100 or localhost:9100")
        })?
        .collect();
    addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| format!("{text:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_urls_verify_the_server_unless_they_say_otherwise() {
        let cases = [
            ("mysql://u@h/db", "mysql://u@h/db?ssl-mode=VERIFY_IDENTITY"),
            (
                "MariaDB://u@h/db?ssl-mode=DISABLED&sessions=2",
                "MariaDB://u@h/db?ssl-mode=VERIFY_IDENTITY&ssl-mode=DISABLED&sessions=2",
            ),
            (
                "mysql://u@h/db#x",
                "mysql://u@h/db?ssl-mode=VERIFY_IDENTITY#x",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("file:///tmp/locks", "file:///tmp/locks"),
        ];
        for (given, used) in cases {
            let backend = Backend {
                url: Some(given.to_owned()),
            };
            assert_eq!(backend.url(), used, "{given}");
        }
        assert_eq!(Backend { url: None }.url(), "file://");
    }

    #[test]
    fn durations_read_like_humans_write_them() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("soon")
            .unwrap_err()
            .contains("such as 500ms"));
    }

    #[test]
    fn the_command_keeps_its_own_flags() {
        let cli =
            Cli::try_parse_from(["distlock", "run", "--key", "k", "--", "ls", "-l", "--wait"])
                .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.command, ["ls", "-l", "--wait"]);
        assert_eq!(args.ttl, Duration::from_secs(30));
        assert_eq!(args.wait, None);
    }

    #[test]
    fn shared_is_a_flag_of_run_and_excludes_limit() {
        let cli = Cli::try_parse_from(["distlock", "run", "--shared", "--key", "k", "--", "true"])
            .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert!(args.shared && args.limit.is_none());
        // A permit of a semaphore and a reader lease are different things:
        // asking for both is a usage error, not one silently ignored.
        let both = Cli::try_parse_from([
            "distlock", "run", "--shared", "--limit", "3", "--key", "k", "--", "true",
        ]);
        assert!(both.is_err());
    }

    /// Every unit humantime accepts.
    const UNITS: &[&str] = &[
        "nsec", "ns", "usec", "us", "msec", "ms", "seconds", "second", "sec", "s", "minutes",
        "minute", "min", "m", "hours", "hour", "hr", "h", "days", "day", "d", "weeks", "week", "w",
        "months", "month", "M", "years", "year", "y", "",
    ];

    proptest::proptest! {
        #[test]
        fn the_duration_parser_never_panics_on_any_string(text in ".*") {
            let _ = parse_duration(&text);
        }

        #[test]
        fn the_duration_parser_never_panics_on_any_number_and_unit(
            number in proptest::prelude::any::<u128>(),
            unit in proptest::sample::select(UNITS),
            second in proptest::option::of((proptest::prelude::any::<u64>(), proptest::sample::select(UNITS))),
        ) {
            let mut text = format!("{number}{unit}");
            if let Some((n, u)) = second {
                text.push_str(&format!(" {n}{u}"));
            }
            let _ = parse_duration(&text);
        }

        #[test]
        fn run_parses_extreme_durations_without_panicking(
            wait in extreme_duration(),
            max_hold in extreme_duration(),
            ttl in extreme_duration(),
        ) {
            let _ = Cli::try_parse_from([
                "distlock", "run", "--key", "k", "--wait", &wait, "--max-hold", &max_hold,
                "--ttl", &ttl, "--", "true",
            ]);
        }
    }

    /// Durations at and past every limit: zero, u64 seconds, u128
    /// nanoseconds, 300000000000 years, with any unit.
    fn extreme_duration() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let numbers = prop_oneof![
            Just(0u128),
            Just(300_000_000_000u128),
            Just(u64::MAX as u128),
            Just(u64::MAX as u128 + 1),
            Just(u128::MAX),
            any::<u128>(),
        ];
        (numbers, proptest::sample::select(UNITS)).prop_map(|(n, unit)| format!("{n}{unit}"))
    }

    #[test]
    fn huge_waits_and_holds_parse() {
        let cli = Cli::try_parse_from([
            "distlock",
            "run",
            "--key",
            "k",
            "--wait",
            "300000000000y",
            "--max-hold",
            "300000000000y",
            "--",
            "true",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert!(args
            .wait
            .is_some_and(|w| w > Duration::from_secs(u32::MAX.into())));
        assert!(args.max_hold.is_some());
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
