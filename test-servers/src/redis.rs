//! `redis-server` on a free port, persistence off unless asked for.
//!
//! Every server dies with the test process, even one kept in a `static`
//! (which is never dropped): see [`spawn_dying_with_this_process`].

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::{find_binary, free_port, signal, wait_for_port};

/// How to start a [`RedisServer`].
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// `requirepass`: clients must authenticate (user `default`).
    pub password: Option<String>,
    /// `appendonly yes` (so locks and fence counters survive a restart).
    pub appendonly: bool,
    /// Serve TLS only (`--tls-port`, plain port 0) with these files.
    pub tls: Option<RedisTls>,
    /// `--replicaof 127.0.0.1 PORT`: start as a replica of that server.
    pub replica_of: Option<u16>,
    /// More `redis-server` arguments, after the ones above (for example
    /// `["--maxmemory", "10mb", "--maxmemory-policy", "volatile-lru"]`, or
    /// `["--rename-command", "CONFIG", ""]` as managed services do).
    pub extra_args: Vec<String>,
}

/// A TLS-only server's certificate, key and CA (see
/// [`crate::TestCertificates`]).
#[derive(Debug, Clone)]
pub struct RedisTls {
    /// The server's certificate (`--tls-cert-file`).
    pub cert: PathBuf,
    /// Its private key (`--tls-key-file`).
    pub key: PathBuf,
    /// The CA that client certificates must chain to, and that
    /// [`RedisServer::cli`] trusts (`--tls-ca-cert-file`).
    pub ca: PathBuf,
    /// Whether clients must present a certificate (`--tls-auth-clients
    /// yes`) or may (`optional`).
    pub require_client_cert: bool,
    /// The client certificate and key [`RedisServer::cli`] presents.
    pub cli_client: Option<(PathBuf, PathBuf)>,
}

/// A `redis-server` owned by one test; killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    options: RedisOptions,
    binary: PathBuf,
}

impl RedisServer {
    /// Starts a server without password or persistence.
    pub fn start() -> Self {
        Self::start_with(RedisOptions::default())
    }

    /// Starts a server with `options`.
    pub fn start_with(options: RedisOptions) -> Self {
        let binary = find_binary("redis-server", "redis-server");
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let mut server = RedisServer {
            child: None,
            port: free_port(),
            dir,
            options,
            binary,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut command = Command::new(&self.binary);
        let port = self.port.to_string();
        match &self.options.tls {
            None => {
                command.args(["--port", &port]);
            }
            Some(tls) => {
                command
                    .args(["--port", "0", "--tls-port", &port])
                    .arg("--tls-cert-file")
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    .args([
                        "--tls-auth-clients",
                        if tls.require_client_cert {
                            "yes"
                        } else {
                            "optional"
                        },
                    ]);
            }
        }
        command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args([
                "--appendonly",
                if self.options.appendonly { "yes" } else { "no" },
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(password) = &self.options.password {
            command.args(["--requirepass", password]);
        }
        if let Some(primary) = self.options.replica_of {
            command.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
        }
        command.args(&self.options.extra_args);
        let mut child = crate::spawn_tied_to_this_process(command).expect("spawn redis-server");
        wait_for_port(
            self.port,
            &mut child,
            "redis-server",
            Duration::from_secs(10),
        );
        self.child = Some(child);
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://[:password@]127.0.0.1:port`, or for a TLS server
    /// `rediss://[:password@]127.0.0.1:port?ca=CA` (no client certificate).
    pub fn url(&self) -> String {
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        let auth = match &self.options.password {
            Some(password) => format!(":{password}@"),
            None => String::new(),
        };
        let query = match &self.options.tls {
            Some(tls) => format!("?ca={}", tls.ca.display()),
            None => String::new(),
        };
        format!("{scheme}://{auth}127.0.0.1:{}{query}", self.port)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// Kills the server with SIGKILL and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory (after
    /// [`kill`](Self::kill), or killing it first).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        signal(self.pid(), libc::SIGCONT);
    }

    /// Runs `redis-cli` against this server and returns its trimmed stdout.
    /// Panics if it fails.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|failure| panic!("redis-cli {args:?} failed: {failure}"))
    }

    /// Runs `redis-cli` against this server: its trimmed stdout, or what it
    /// said when it failed (a server that closed the connection, as a
    /// Sentinel failover does to every client it reconfigures).
    pub fn try_cli(&self, args: &[&str]) -> Result<String, String> {
        let cli = find_binary("redis-cli", "redis-tools");
        let mut command = Command::new(cli);
        command.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(tls) = &self.options.tls {
            command.arg("--tls").arg("--cacert").arg(&tls.ca);
            if let Some((cert, key)) = &tls.cli_client {
                command.arg("--cert").arg(cert).arg("--key").arg(key);
            }
        }
        if let Some(password) = &self.options.password {
            command.args(["--no-auth-warning", "-a", password]);
        }
        let output = command.args(args).output().expect("run redis-cli");
        if !output.status.success() {
            return Err(format!("{output:?}"));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused server ignores SIGTERM but not SIGKILL.
            self.kill();
        }
    }
}
