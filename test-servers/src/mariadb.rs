//! MariaDB (`mariadb-install-db` + `mariadbd`) on a free loopback port, in a
//! temporary directory, tied to the test process.
//!
//! As root, the server is started as the `mysql` user, which owns the
//! temporary directory. The server is started in its own process group and
//! receives SIGKILL when the test process dies, so a server held in a
//! `static` does not outlive its test binary.
//!
//! ```no_run
//! let server = test_servers::MariaDbServer::start();
//! let url = server.url(); // mysql://distlock:…@127.0.0.1:<port>/distlock
//! assert_eq!(server.sql("SELECT 1 + 1"), "2");
//! # let _ = url;
//! ```

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::free_port;
use crate::postgres::{assert_success, chown, make_certificates, signal_group, Account};

const USER: &str = MariaDbServer::USER;
const PASSWORD: &str = MariaDbServer::PASSWORD;
const DATABASE: &str = MariaDbServer::DATABASE;

const INSTALL_HINT: &str = "mariadb-server mariadb-client";

/// How to start a [`MariaDbServer`].
#[derive(Debug, Clone, Default)]
pub struct MariaDbOptions {
    /// Serve TLS with a certificate for `localhost` signed by a throwaway CA
    /// ([`MariaDbServer::ca_cert`]). Plain connections are still accepted.
    pub tls: bool,
    /// Extra `--name=value` server options.
    pub settings: Vec<(String, String)>,
}

/// A MariaDB server owned by one test (or one test binary); killed when
/// dropped, or when the test process dies.
#[derive(Debug)]
pub struct MariaDbServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    server_bin: PathBuf,
    client_bin: PathBuf,
    options: MariaDbOptions,
}

impl MariaDbServer {
    /// The account (with all privileges on [`DATABASE`](Self::DATABASE))
    /// that [`url`](Self::url) connects as.
    pub const USER: &'static str = "distlock";
    /// Its password.
    pub const PASSWORD: &'static str = "distlock-test-pw";
    /// The database [`url`](Self::url) names.
    pub const DATABASE: &'static str = "distlock";

    /// Starts a server with a [`USER`](Self::USER) account and a
    /// [`DATABASE`](Self::DATABASE).
    pub fn start() -> Self {
        Self::start_with(MariaDbOptions::default())
    }

    /// Starts a server with `options`.
    pub fn start_with(options: MariaDbOptions) -> Self {
        let server_bin = crate::find_binary("mariadbd", INSTALL_HINT);
        let client_bin = crate::find_binary("mariadb", INSTALL_HINT);
        let install = crate::find_binary("mariadb-install-db", INSTALL_HINT);
        let dir = tempfile::Builder::new()
            .prefix("distlock-mariadb-")
            .tempdir()
            .expect("temp dir for mariadb");
        // A temp directory of its own: bootstraps running at once in the
        // shared /tmp delete each other's `#sql-temptable-*` files (checked:
        // two of six parallel `mariadb-install-db` failed that way).
        std::fs::create_dir(dir.path().join("tmp")).expect("create the server's tmpdir");
        if let Some(account) = mysql_account_if_root() {
            chown(dir.path(), account);
            chown(&dir.path().join("tmp"), account);
        }
        let mut server = MariaDbServer {
            child: None,
            port: free_port(),
            dir,
            server_bin,
            client_bin,
            options,
        };
        let output = Command::new(install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", server.data_dir().display()))
            .arg(format!("--tmpdir={}", server.tmp_dir().display()))
            .args([
                "--user=mysql",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .current_dir(server.dir.path())
            .output()
            .expect("run mariadb-install-db");
        assert_success("mariadb-install-db", &output);
        if server.options.tls {
            server.make_certificates();
        }
        server.spawn();
        server.sql(&format!(
            "CREATE DATABASE {DATABASE}; CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL ON {DATABASE}.* TO '{USER}'@'%'; GRANT PROCESS ON *.* TO '{USER}'@'%'"
        ));
        server
    }

    fn make_certificates(&self) {
        make_certificates(self.dir.path());
        if let Some(account) = mysql_account_if_root() {
            for file in ["server.key", "server.crt", "ca.crt"] {
                chown(&self.dir.path().join(file), account);
            }
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn tmp_dir(&self) -> PathBuf {
        self.dir.path().join("tmp")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("mariadb.sock")
    }

    /// Where the server writes its log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("mariadb.log")
    }

    fn spawn(&mut self) {
        let mut command = Command::new(&self.server_bin);
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data_dir().display()))
            .arg(format!("--tmpdir={}", self.tmp_dir().display()))
            .arg("--user=mysql")
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", self.socket().display()))
            .arg(format!("--log-error={}", self.log_path().display()))
            // A test server: durability is not under test, speed is.
            .args([
                // 2: each commit reaches the OS at once (it survives a SIGKILL of the
                // server, which restart tests use), without an fsync.
                "--innodb-flush-log-at-trx-commit=2",
                "--skip-name-resolve",
                "--max-connections=500",
            ]);
        if self.options.tls {
            let dir = self.dir.path();
            command
                .arg(format!("--ssl-cert={}", dir.join("server.crt").display()))
                .arg(format!("--ssl-key={}", dir.join("server.key").display()))
                .arg(format!("--ssl-ca={}", dir.join("ca.crt").display()));
        }
        for (name, value) in &self.options.settings {
            command.arg(format!("--{name}={value}"));
        }
        if let Some(account) = mysql_account_if_root() {
            // Started as root, mariadbd would switch to `mysql` itself
            // (`--user`), and the kernel clears the parent-death signal on a
            // change of effective user id (prctl(2), PR_SET_PDEATHSIG): the
            // server then outlived its test process. Switched here, before
            // the pre-exec hook sets the signal, it keeps it; `--user=mysql`
            // is then the user it already runs as.
            command.uid(account.uid).gid(account.gid);
        }
        command
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let mut child = crate::spawn_tied_to_this_process(command).expect("spawn mariadbd");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.try_sql_as_root("SELECT 1").status.success() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "mariadbd exited with {status}; its log is {}",
                    self.log_path().display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "mariadbd did not accept connections on port {} within 30 s; its log is {}",
                self.port,
                self.log_path().display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://distlock:…@127.0.0.1:port/distlock?ssl-mode=DISABLED`
    /// (unless the server serves TLS: then the client's default applies).
    /// Append query parameters with `&`.
    pub fn url(&self) -> String {
        self.url_as(USER, PASSWORD)
    }

    /// Like [`url`](Self::url), for another account (see
    /// [`create_user`](Self::create_user)).
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let mode = if self.options.tls {
            "PREFERRED"
        } else {
            "DISABLED"
        };
        format!(
            "mysql://{user}:{password}@127.0.0.1:{}/{DATABASE}?ssl-mode={mode}",
            self.port
        )
    }

    /// Creates an account with all privileges on [`DATABASE`](Self::DATABASE).
    pub fn create_user(&self, user: &str, password: &str) {
        self.sql(&format!(
            "CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'; \
             GRANT ALL ON {DATABASE}.* TO '{user}'@'%'"
        ));
    }

    /// The CA certificate (PEM file) that signed the server's certificate
    /// for `localhost`, when started with [`MariaDbOptions::tls`].
    pub fn ca_cert(&self) -> PathBuf {
        assert!(self.options.tls, "the server was started without TLS");
        self.dir.path().join("ca.crt")
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Every client
    /// connection breaks; every named lock is gone.
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

    /// Kills the server and starts it again serving TLS, as if started with
    /// [`MariaDbOptions::tls`]: a server that gained TLS since a client
    /// first met it.
    pub fn restart_with_tls(&mut self) {
        self.kill();
        if !self.options.tls {
            self.make_certificates();
            self.options.tls = true;
        }
        self.spawn();
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        signal_group(self.pid(), libc::SIGSTOP);
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        signal_group(self.pid(), libc::SIGCONT);
    }

    /// Runs `sql` as root through the `mariadb` client and returns its
    /// batch output, trimmed (tab between columns, one row per line, no
    /// column names). Panics, showing the client's error, if it fails.
    pub fn sql(&self, sql: &str) -> String {
        let output = self.try_sql_as_root(sql);
        assert_success(&format!("mariadb -e {sql:?}"), &output);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Like [`sql`](Self::sql), but returns the client's output whether or
    /// not the statement succeeded.
    pub fn try_sql_as_root(&self, sql: &str) -> Output {
        self.client_command()
            .args(["-N", "-B", "-e", sql])
            .output()
            .expect("run the mariadb client")
    }

    /// The `mariadb` client connected to this server as root over TCP (no
    /// option files), for a test to add arguments to.
    pub fn client_command(&self) -> Command {
        let mut command = Command::new(&self.client_bin);
        command
            .arg("--no-defaults")
            .args([
                "-h",
                "127.0.0.1",
                "-P",
                &self.port.to_string(),
                "-u",
                "root",
            ])
            .arg("--connect-timeout=10");
        command
    }

    /// The connection ids of sessions of `user`, from the process list.
    pub fn connections_of(&self, user: &str) -> Vec<u64> {
        self.sql(&format!(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{user}' ORDER BY ID"
        ))
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| line.parse().expect("a connection id"))
        .collect()
    }

    /// The connection holding the named lock `name`, if any (`IS_USED_LOCK`).
    pub fn lock_holder(&self, name: &str) -> Option<u64> {
        let quoted = name.replace('\'', "''");
        self.sql(&format!("SELECT IS_USED_LOCK('{quoted}')"))
            .parse()
            .ok()
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.kill();
        }
    }
}

fn mysql_account_if_root() -> Option<Account> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = CString::new("mysql").expect("no NUL in a user name");
    // SAFETY: getpwnam returns a pointer into a static buffer (or null); the
    // two ids are copied out at once.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !entry.is_null(),
        "running as root and there is no `mysql` user to run the server as; install it with \
         `apt-get install -y {INSTALL_HINT}`, which creates it"
    );
    // SAFETY: non-null pointer to a passwd record returned just above.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    Some(Account { uid, gid })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_restarts_and_keeps_data() {
        let mut server = MariaDbServer::start();
        assert_eq!(server.sql("SELECT 40 + 2"), "42");
        server.sql(&format!(
            "CREATE TABLE {DATABASE}.survives (x INT) ENGINE=InnoDB; INSERT INTO {DATABASE}.survives VALUES (7)"
        ));
        server.restart();
        assert_eq!(
            server.sql(&format!("SELECT x FROM {DATABASE}.survives")),
            "7"
        );
        assert_eq!(server.lock_holder("nobody"), None);
    }

    /// Run as a child process by
    /// `a_server_held_in_a_static_stops_when_its_test_process_ends`: starts
    /// a server that is never dropped, prints its data directory, and ends.
    #[test]
    #[ignore = "a helper, run as a child process by another test"]
    fn child_starts_a_shared_server_and_exits() {
        let server = MariaDbServer::shared();
        println!("DATADIR={}", server.data_dir().display());
    }

    /// The processes whose command line names `datadir`.
    fn servers_of(datadir: &str) -> Vec<u32> {
        let output = Command::new("pgrep")
            .args(["-f", "--", &format!("--datadir={datadir}")])
            .output()
            .expect("run pgrep (procps)");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect()
    }

    #[test]
    fn a_server_held_in_a_static_stops_when_its_test_process_ends() {
        let output = Command::new(std::env::current_exe().expect("this test binary"))
            .args([
                "mariadb::tests::child_starts_a_shared_server_and_exits",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .stderr(Stdio::inherit())
            .output()
            .expect("run the child test process");
        assert!(output.status.success(), "the child test failed");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let datadir = stdout
            .lines()
            .find_map(|line| line.strip_prefix("DATADIR="))
            .unwrap_or_else(|| panic!("the child printed no data directory: {stdout}"))
            .to_owned();
        // The kernel delivers the parent-death signal as the child exits;
        // mariadbd then needs a moment to be reaped.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut left = servers_of(&datadir);
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            left = servers_of(&datadir);
        }
        // Clean up what this test started before failing, so that a failure
        // leaves nothing behind either.
        for pid in &left {
            crate::signal(*pid, libc::SIGKILL);
        }
        if let Some(dir) = std::path::Path::new(&datadir).parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
        assert_eq!(
            left,
            Vec::<u32>::new(),
            "mariadbd with --datadir={datadir} outlived the test process that started it"
        );
    }
}
