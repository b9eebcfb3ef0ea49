//! PostgreSQL (`initdb` + `postgres`) on a free loopback port, in a temporary
//! directory, tied to the test process.
//!
//! Postgres refuses to run as root, so when the tests run as root the server
//! runs as the `postgres` user (which owns the temporary directory). The server
//! is started in its own process group, so [`PostgresServer::kill`] and
//! [`PostgresServer::pause`] reach every backend process, not only the
//! postmaster; and it receives SIGKILL when the test process dies, so a server
//! held in a `static` (never dropped) does not outlive its test binary.
//!
//! ```no_run
//! let server = test_servers::PostgresServer::start();
//! let url = server.url(); // postgres://postgres@127.0.0.1:<port>/postgres
//! assert_eq!(server.psql("SELECT 1 + 1"), "2");
//! # let _ = url;
//! ```

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::free_port;

/// The superuser every server is initialised with.
pub const SUPERUSER: &str = "postgres";

/// How to start a [`PostgresServer`].
#[derive(Debug, Clone, Default)]
pub struct PostgresOptions {
    /// Require this password (SCRAM-SHA-256) for TCP connections of the
    /// superuser. Without it, TCP connections are trusted.
    pub password: Option<String>,
    /// Serve TLS with a certificate for `localhost` signed by a throwaway CA
    /// ([`PostgresServer::ca_cert`]). Plain connections are still accepted.
    pub tls: bool,
    /// Extra `-c name=value` server settings.
    pub settings: Vec<(String, String)>,
}

/// A PostgreSQL server owned by one test (or one test binary); killed when
/// dropped, or when the test process dies.
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    bin: PathBuf,
    run_as: Option<Account>,
    options: PostgresOptions,
}

/// The unprivileged account the server runs as when the tests run as root.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Account {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl PostgresServer {
    /// Starts a server with trusted (password-less) TCP connections.
    pub fn start() -> Self {
        Self::start_with(PostgresOptions::default())
    }

    /// Starts a server with `options`.
    pub fn start_with(options: PostgresOptions) -> Self {
        let bin = postgres_bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("distlock-pg-")
            .tempdir()
            .expect("temp dir for postgres");
        let run_as = unprivileged_account_if_root();
        if let Some(account) = run_as {
            chown(dir.path(), account);
        }
        let mut server = PostgresServer {
            child: None,
            port: free_port(),
            dir,
            bin,
            run_as,
            options,
        };
        server.init_data_dir();
        if server.options.tls {
            server.make_certificates();
        }
        server.spawn();
        server
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command running `program` from the Postgres bin directory as the
    /// server's account.
    fn server_command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        if let Some(account) = self.run_as {
            command.uid(account.uid).gid(account.gid);
            // Root's HOME is not readable by the postgres user.
            command.env("HOME", self.dir.path());
        }
        command.current_dir(self.dir.path());
        command
    }

    fn init_data_dir(&self) {
        let mut command = self.server_command("initdb");
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", SUPERUSER, "-E", "UTF8", "--locale=C", "--no-sync"])
            .args(["--auth-local=trust"]);
        match &self.options.password {
            Some(password) => {
                let file = self.dir.path().join("pwfile");
                std::fs::write(&file, password).expect("write the password file");
                self.give_to_server_account(&file);
                command
                    .arg("--auth-host=scram-sha-256")
                    .arg(format!("--pwfile={}", file.display()));
            }
            None => {
                command.arg("--auth-host=trust");
            }
        }
        let output = command.output().expect("run initdb");
        assert_success("initdb", &output);
    }

    /// A CA, and a certificate for `localhost` it signed (see
    /// [`make_certificates`]), readable by the server's account.
    fn make_certificates(&self) {
        let dir = self.dir.path();
        make_certificates(dir);
        for file in ["server.key", "server.crt"] {
            self.give_to_server_account(&dir.join(file));
        }
        // Postgres refuses a private key readable by others.
        set_mode(&dir.join("server.key"), 0o600);
    }

    fn give_to_server_account(&self, path: &Path) {
        if let Some(account) = self.run_as {
            chown(path, account);
        }
    }

    fn spawn(&mut self) {
        // After a kill, the old backends may still be detaching from shared
        // memory for a moment; a start that fails then is retried.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut child =
                crate::spawn_tied_to_this_process(self.postgres_command()).expect("spawn postgres");
            match wait_until_ready(&self.bin, self.port, &mut child, Duration::from_secs(15)) {
                Ok(()) => {
                    self.child = Some(child);
                    return;
                }
                Err(why) if Instant::now() < deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    eprintln!("postgres did not start ({why}); retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(why) => panic!(
                    "postgres did not start: {why}; its log is {}",
                    self.log_path().display()
                ),
            }
        }
    }

    fn postgres_command(&self) -> Command {
        let mut command = self.server_command("postgres");
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            // A test server: durability is not under test, speed is.
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=300"]);
        if self.options.tls {
            let dir = self.dir.path();
            command
                .args(["-c", "ssl=on"])
                .arg("-c")
                .arg(format!(
                    "ssl_cert_file={}",
                    dir.join("server.crt").display()
                ))
                .arg("-c")
                .arg(format!("ssl_key_file={}", dir.join("server.key").display()));
        }
        for (name, value) in &self.options.settings {
            command.arg("-c").arg(format!("{name}={value}"));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the postgres log");
        self.give_to_server_account(&self.log_path());
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group: kill and pause reach every backend.
            .process_group(0);
        command
    }

    /// Where the server writes its log (stderr).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres[:password]@127.0.0.1:port/postgres`, with TLS
    /// disabled (`sslmode=disable`) unless the server serves TLS (then the
    /// client's default applies). Append query parameters with `&`.
    pub fn url(&self) -> String {
        let auth = match &self.options.password {
            Some(password) => format!("{SUPERUSER}:{password}"),
            None => SUPERUSER.to_owned(),
        };
        let sslmode = if self.options.tls {
            "prefer"
        } else {
            "disable"
        };
        format!(
            "postgres://{auth}@127.0.0.1:{}/postgres?sslmode={sslmode}",
            self.port
        )
    }

    /// The CA certificate (PEM file) that signed the server's certificate for
    /// `localhost`, when started with [`PostgresOptions::tls`].
    pub fn ca_cert(&self) -> PathBuf {
        assert!(self.options.tls, "the server was started without TLS");
        self.dir.path().join("ca.crt")
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// Kills the postmaster and every backend (SIGKILL to the process group)
    /// and waits for the postmaster to exit. Every client connection breaks.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same port and data
    /// directory (crash recovery runs; committed data survives).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes the postmaster and every backend (SIGSTOP): connections stay
    /// open, nothing answers.
    ///
    /// Each backend calls `setsid()` as it starts (`InitPostmasterChild`,
    /// postgres `src/backend/utils/init/miscinit.c`), so it is not in the
    /// postmaster's process group: the postmaster is stopped first (it forks
    /// no one while stopped), then each of its children by pid.
    pub fn pause(&self) {
        signal_group(self.pid(), libc::SIGSTOP);
        for child in children_of(self.pid()) {
            signal_pid(child, libc::SIGSTOP);
        }
    }

    /// Thaws a paused server (SIGCONT), its backends first.
    pub fn resume(&self) {
        for child in children_of(self.pid()) {
            signal_pid(child, libc::SIGCONT);
        }
        signal_group(self.pid(), libc::SIGCONT);
    }

    /// Runs `sql` as the superuser through `psql` and returns its unaligned,
    /// tuples-only output, trimmed (`|` between columns, one row per line).
    /// Panics, showing psql's error, if the statement fails.
    pub fn psql(&self, sql: &str) -> String {
        let output = self.try_psql(sql);
        assert_success(&format!("psql -c {sql:?}"), &output);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Like [`psql`](Self::psql), but returns psql's output whether or not
    /// the statement succeeded.
    pub fn try_psql(&self, sql: &str) -> Output {
        let mut command = self.psql_command();
        command
            .args(["-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("run psql")
    }

    /// `psql` connected to this server as the superuser over TCP (no
    /// `.psqlrc`), for a test to add arguments to: an interactive session
    /// fed through stdin keeps a transaction open for as long as it likes.
    pub fn psql_command(&self) -> Command {
        let mut command = Command::new(self.bin.join("psql"));
        command
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", SUPERUSER, "-d", "postgres", "-X"])
            .env("PGCONNECT_TIMEOUT", "10")
            .env("PGSSLMODE", "disable");
        if let Some(password) = &self.options.password {
            command.env("PGPASSWORD", password);
        }
        command
    }

    /// Advisory locks currently granted, as `(pid, 64-bit key)` pairs, from
    /// `pg_locks`.
    pub fn advisory_locks(&self) -> Vec<(i32, i64)> {
        let rows = self.psql(
            "SELECT pid, ((classid::int8 << 32) | objid::int8) FROM pg_locks \
             WHERE locktype = 'advisory' AND objsubid = 1 AND granted ORDER BY 1, 2",
        );
        rows.lines()
            .filter(|line| !line.is_empty())
            .map(|line| {
                let (pid, key) = line.split_once('|').expect("pid|key");
                (
                    pid.parse().expect("pid"),
                    key.parse().expect("advisory key"),
                )
            })
            .collect()
    }

    /// The number of client connections whose `application_name` is
    /// `application_name`, from `pg_stat_activity`.
    pub fn connection_count(&self, application_name: &str) -> usize {
        let quoted = application_name.replace('\'', "''");
        self.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{quoted}'"
        ))
        .parse()
        .expect("a count")
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused server ignores SIGTERM but not SIGKILL.
            self.kill();
        }
    }
}

/// The bin directory of the newest PostgreSQL installed under
/// `/usr/lib/postgresql`, or a panic saying what to install.
fn postgres_bin_dir() -> PathBuf {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    match newest {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL is not installed under /usr/lib/postgresql; install it with \
             `apt-get install -y postgresql` (scripts/test.sh does this for you)"
        ),
    }
}

/// Writes `ca.crt`, and `server.crt` + `server.key` for `localhost` signed
/// by it, into `dir`, made with `openssl`.
pub(crate) fn make_certificates(dir: &Path) {
    let openssl = crate::find_binary("openssl", "openssl");
    let run = |args: &[&str]| {
        let output = Command::new(&openssl)
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert_success("openssl", &output);
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    run(&[
        &["req", "-x509", "-nodes", "-days", "2"][..],
        &ec[..],
        &[
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=distlock test CA",
        ],
    ]
    .concat());
    run(&[
        &["req", "-nodes"][..],
        &ec[..],
        &[
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    ]
    .concat());
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost\n").expect("write san.ext");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ]);
}

pub(crate) fn unprivileged_account_if_root() -> Option<Account> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = CString::new(SUPERUSER).expect("no NUL in a user name");
    // SAFETY: getpwnam returns a pointer into a static buffer (or null); the
    // two ids are copied out at once. Not thread-safe against a concurrent
    // getpw* call in this process, which tests do not make.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !entry.is_null(),
        "running as root and there is no `postgres` user to run the server as; \
         install the `postgresql` package, which creates it"
    );
    // SAFETY: non-null pointer to a passwd record returned just above.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    Some(Account { uid, gid })
}

pub(crate) fn chown(path: &Path, account: Account) {
    std::os::unix::fs::chown(path, Some(account.uid), Some(account.gid))
        .unwrap_or_else(|e| panic!("chown {} to the postgres user: {e}", path.display()));
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

pub(crate) fn assert_success(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Waits until the server accepts sessions (not only TCP connections: a
/// server in startup or crash recovery accepts those and then refuses), or
/// says why not.
fn wait_until_ready(
    bin: &Path,
    port: u16,
    child: &mut Child,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
            .status()
            .map_err(|e| format!("cannot run pg_isready: {e}"))?;
        if ready.success() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("postgres exited with {status}"));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "not accepting sessions on port {port} within {timeout:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The processes whose parent is `parent`, from `/proc/*/stat`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may contain spaces and parens.
            let after_comm = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = after_comm.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

/// Signals one process; one that is already gone is fine.
fn signal_pid(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
    if rc != 0 {
        let error = std::io::Error::last_os_error();
        assert_eq!(
            error.raw_os_error(),
            Some(libc::ESRCH),
            "kill({pid}, {signal}) failed: {error}"
        );
    }
}

pub(crate) fn signal_group(pid: u32, signal: libc::c_int) {
    // SAFETY: killpg has no memory-safety preconditions. The server leads its
    // own process group (spawned with process_group(0)), so its pid is the
    // group id.
    let rc = unsafe { libc::killpg(pid as libc::pid_t, signal) };
    if rc != 0 {
        let error = std::io::Error::last_os_error();
        // ESRCH: already gone, which is what a kill wanted anyway.
        assert_eq!(
            error.raw_os_error(),
            Some(libc::ESRCH),
            "killpg({pid}, {signal}) failed: {error}"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};

    use super::*;

    #[test]
    fn starts_answers_restarts_and_keeps_data() {
        let mut server = PostgresServer::start();
        assert_eq!(server.psql("SELECT 40 + 2"), "42");
        server.psql("CREATE TABLE survives (x int); INSERT INTO survives VALUES (7)");
        server.restart();
        assert_eq!(server.psql("SELECT x FROM survives"), "7");
        // Backends are paused too, not only the postmaster: a session
        // opened before the pause gets no answer until the resume.
        let mut session = server
            .psql_command()
            .args(["-A", "-t"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = session.stdin.take().unwrap();
        let stdout = BufReader::new(session.stdout.take().unwrap());
        let (lines, answers) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let _ = lines.send(line.unwrap());
            }
        });
        writeln!(stdin, "SELECT 1;").unwrap();
        assert_eq!(answers.recv_timeout(Duration::from_secs(5)).unwrap(), "1");
        server.pause();
        writeln!(stdin, "SELECT 2;").unwrap();
        assert!(
            answers.recv_timeout(Duration::from_millis(300)).is_err(),
            "a paused backend answered"
        );
        server.resume();
        assert_eq!(answers.recv_timeout(Duration::from_secs(5)).unwrap(), "2");
        drop(stdin);
        session.wait().unwrap();
        assert!(server.advisory_locks().is_empty());
    }

    #[test]
    fn password_and_tls_options() {
        let server = PostgresServer::start_with(PostgresOptions {
            password: Some("s3cret".into()),
            tls: true,
            ..PostgresOptions::default()
        });
        assert_eq!(server.psql("SHOW ssl"), "on");
        assert!(server.url().contains(":s3cret@"));
        assert!(server.ca_cert().is_file());
    }
}
