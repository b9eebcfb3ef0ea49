//! Debian's ZooKeeper (3.8, package `zookeeper`, run by the JVM of
//! `default-jre-headless`) as one standalone server ([`ZooKeeperServer`])
//! or a three-node ensemble ([`ZooKeeperEnsemble`]) on free loopback ports,
//! each member in a temporary data directory.
//!
//! Debian ships no `zkServer` on `PATH` that works without its system
//! configuration, so each member is the JVM running
//! `org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg` with the
//! package's jars on the class path, as the ZooKeeper section of the
//! project's field notes describes.
//!
//! Timing is tightened so tests about session expiry run in seconds:
//! `tickTime` is 200 ms, so the server accepts session timeouts from
//! 400 ms (2 ticks) to 60 s, and checks expiries every tick. The
//! four-letter words are whitelisted (`4lw.commands.whitelist=*`: 3.8 has
//! only `srvr` on by default), because readiness is `srvr` answering with a
//! `Mode:` line, which a member only does once it serves (a follower
//! without a quorum answers "This ZooKeeper instance is not currently
//! serving requests").

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{free_port, signal};

/// The server's tick (`tickTime`, ms): sessions are checked for expiry
/// once per tick, and a session timeout must be 2 to 20 ticks unless
/// `minSessionTimeout`/`maxSessionTimeout` widen it (they do, below).
pub const TICK_MS: u64 = 200;

/// Where Debian's `zookeeper` package puts its jars.
const CLASS_PATH: &str = "/usr/share/java/*:/usr/share/zookeeper/lib/*:/usr/share/zookeeper/*";
/// The jar whose presence says the package is installed.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// How long a member may take to serve after it was spawned: a JVM start
/// on a loaded two-core machine, plus leader election for an ensemble.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One member of an ensemble.
#[derive(Debug)]
struct Member {
    id: usize,
    client_port: u16,
    quorum_port: u16,
    election_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// `java`, or a panic saying how to install it and ZooKeeper.
fn java() -> PathBuf {
    if !Path::new(ZOOKEEPER_JAR).is_file() {
        panic!(
            "ZooKeeper is not installed ({ZOOKEEPER_JAR} is missing); install it with \
             `apt-get install -y --no-install-recommends zookeeper default-jre-headless` \
             (scripts/test.sh does this for you)"
        );
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/lib/jvm/default-java/bin"].map(PathBuf::from))
        .map(|dir| dir.join("java"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`java` is not installed, and ZooKeeper needs it; install it with \
                 `apt-get install -y --no-install-recommends default-jre-headless` \
                 (scripts/test.sh does this for you)"
            )
        })
}

/// Sends the four-letter word `word` to `127.0.0.1:port` and returns the
/// answer (empty if nothing answered within `timeout`).
pub fn four_letter_word(port: u16, word: &str, timeout: Duration) -> String {
    let Ok(mut stream) = TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), timeout)
    else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    if stream.write_all(word.as_bytes()).is_err() {
        return String::new();
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// A ZooKeeper ensemble owned by one test (one member: a standalone
/// server); every member is killed when it is dropped, and when the test
/// process dies.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    members: Vec<Member>,
    java: PathBuf,
    /// Holds every member's data directory.
    _dir: TempDir,
}

impl ZooKeeperEnsemble {
    /// Starts `size` members forming one ensemble (1: a standalone
    /// server), and waits until every member serves.
    ///
    /// # Panics
    ///
    /// If ZooKeeper or Java is missing (saying how to install them), or a
    /// member does not serve within a minute.
    pub fn start(size: usize) -> Self {
        let java = java();
        // As for etcd: the transaction log's fsyncs measured the disk, not
        // the lock; tests need no durability across a machine crash.
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .expect("temp dir for zookeeper");
        let members = (1..=size)
            .map(|id| Member {
                id,
                client_port: free_port(),
                quorum_port: free_port(),
                election_port: free_port(),
                dir: dir.path().join(format!("m{id}")),
                child: None,
            })
            .collect();
        let mut ensemble = ZooKeeperEnsemble {
            members,
            java,
            _dir: dir,
        };
        for index in 0..size {
            ensemble.write_config(index);
            ensemble.spawn(index);
        }
        for index in 0..size {
            ensemble.wait_serving(index, START_TIMEOUT);
        }
        ensemble
    }

    fn write_config(&self, index: usize) {
        let member = &self.members[index];
        let data = member.dir.join("data");
        std::fs::create_dir_all(&data).expect("zookeeper data dir");
        let mut config = format!(
            "tickTime={TICK_MS}\n\
             initLimit=50\n\
             syncLimit=10\n\
             dataDir={}\n\
             clientPort={}\n\
             clientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=*\n\
             minSessionTimeout={}\n\
             maxSessionTimeout=60000\n\
             forceSync=no\n\
             maxClientCnxns=0\n",
            data.display(),
            member.client_port,
            2 * TICK_MS,
        );
        if self.members.len() > 1 {
            std::fs::write(data.join("myid"), format!("{}\n", member.id)).expect("write myid");
            for other in &self.members {
                config.push_str(&format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    other.id, other.quorum_port, other.election_port
                ));
            }
        }
        std::fs::write(member.dir.join("zoo.cfg"), config).expect("write zoo.cfg");
    }

    fn spawn(&mut self, index: usize) {
        let member = &self.members[index];
        let mut command = Command::new(&self.java);
        command
            // A small heap and the serial collector: several servers share
            // two cores and the tests' memory.
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg("-Dzookeeper.log.dir=".to_owned() + &member.dir.display().to_string())
            .args(["-cp", CLASS_PATH])
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(member.dir.join("zoo.cfg"))
            .current_dir(&member.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = crate::spawn_tied_to_this_process(command).expect("spawn zookeeper (java)");
        self.members[index].child = Some(child);
    }

    /// Waits until member `index` answers `srvr` with its mode (it serves
    /// clients), or panics.
    pub fn wait_serving(&mut self, index: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let port = self.members[index].client_port;
        loop {
            let answer = four_letter_word(port, "srvr", Duration::from_millis(500));
            if answer.contains("Mode:") {
                return;
            }
            if let Some(child) = self.members[index].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "zookeeper member {} exited with {status} before serving; its log is in {}",
                        index + 1,
                        self.members[index].dir.display()
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "zookeeper member {} did not serve on port {port} within {timeout:?}: {answer:?}",
                index + 1
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many members the ensemble has (running or not).
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The connect string, `127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `zookeeper://127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn url(&self) -> String {
        format!("zookeeper://{}", self.connect_string())
    }

    /// The client port of member `index`.
    pub fn client_port(&self, index: usize) -> u16 {
        self.members[index].client_port
    }

    /// `leader`, `follower` or `standalone` as member `index` says (`srvr`),
    /// `None` if it does not answer or does not serve.
    pub fn mode(&self, index: usize) -> Option<String> {
        let answer = four_letter_word(
            self.members[index].client_port,
            "srvr",
            Duration::from_millis(500),
        );
        answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode: "))
            .map(|mode| mode.trim().to_owned())
    }

    /// The index of the member that leads now, if one does.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&index| {
            self.members[index].child.is_some() && self.mode(index).as_deref() == Some("leader")
        })
    }

    /// Waits until a member leads and returns its index, or panics after
    /// `timeout` (after a kill, the others take an election to agree).
    pub fn wait_for_leader(&self, timeout: Duration) -> usize {
        crate::poll_until(timeout, Duration::from_millis(50), || self.leader())
            .unwrap_or_else(|| panic!("no zookeeper member led within {timeout:?}"))
    }

    /// Whether member `index` is running.
    pub fn is_running(&self, index: usize) -> bool {
        self.members[index].child.is_some()
    }

    /// The process id of member `index`.
    pub fn pid(&self, index: usize) -> u32 {
        self.members[index]
            .child
            .as_ref()
            .expect("the member is running")
            .id()
    }

    /// Kills member `index` with SIGKILL and waits for it to exit.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `index` again on its ports and data directory; does
    /// not wait for it to serve (see [`wait_serving`](Self::wait_serving)).
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index);
    }

    /// Freezes member `index` (SIGSTOP): its connections stay open and
    /// nothing answers.
    pub fn pause(&self, index: usize) {
        signal(self.pid(index), libc::SIGSTOP);
    }

    /// Thaws member `index` (SIGCONT).
    pub fn resume(&self, index: usize) {
        signal(self.pid(index), libc::SIGCONT);
    }
}

impl Drop for ZooKeeperEnsemble {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }
}

/// One standalone ZooKeeper server owned by one test; killed when dropped.
#[derive(Debug)]
pub struct ZooKeeperServer {
    ensemble: ZooKeeperEnsemble,
}

impl ZooKeeperServer {
    /// Starts a standalone server and waits until it serves.
    ///
    /// # Panics
    ///
    /// As [`ZooKeeperEnsemble::start`].
    pub fn start() -> Self {
        ZooKeeperServer {
            ensemble: ZooKeeperEnsemble::start(1),
        }
    }

    /// `zookeeper://127.0.0.1:port`.
    pub fn url(&self) -> String {
        self.ensemble.url()
    }

    /// `127.0.0.1:port`.
    pub fn connect_string(&self) -> String {
        self.ensemble.connect_string()
    }

    /// The port it serves clients on.
    pub fn port(&self) -> u16 {
        self.ensemble.client_port(0)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.ensemble.pid(0)
    }

    /// Kills the server (SIGKILL).
    pub fn kill(&mut self) {
        self.ensemble.kill(0);
    }

    /// Freezes the server (SIGSTOP).
    pub fn pause(&self) {
        self.ensemble.pause(0);
    }

    /// Thaws the server (SIGCONT).
    pub fn resume(&self) {
        self.ensemble.resume(0);
    }

    /// Starts it again on the same port and data directory (its sessions
    /// and their ephemeral nodes are restored from the transaction log and
    /// live on if their clients reconnect within the session timeout), and
    /// waits until it serves.
    pub fn restart(&mut self) {
        self.ensemble.restart(0);
        self.ensemble.wait_serving(0, START_TIMEOUT);
    }

    /// Starts it again without waiting for it to serve.
    pub fn restart_in_background(&mut self) {
        self.ensemble.restart(0);
    }

    /// Waits until it serves (after [`restart_in_background`](Self::restart_in_background)).
    pub fn wait_serving(&mut self) {
        self.ensemble.wait_serving(0, START_TIMEOUT);
    }

    /// Sends a four-letter word (`srvr`, `cons`, `dump`, ...) and returns
    /// the answer.
    pub fn four_letter_word(&self, word: &str) -> String {
        four_letter_word(self.port(), word, Duration::from_secs(2))
    }

    /// One counter of the server's `mntr` (`zk_packets_received`,
    /// `zk_num_alive_connections`, ...), `None` if it does not report it.
    /// The `mntr` asking is itself one packet and one connection in them.
    pub fn mntr(&self, metric: &str) -> Option<u64> {
        self.four_letter_word("mntr").lines().find_map(|line| {
            let value = line.strip_prefix(metric)?;
            // Whole names only: `zk_packets_received` is not a prefix match
            // of a longer metric's name.
            value.starts_with(char::is_whitespace).then_some(())?;
            value.trim().parse().ok()
        })
    }
}
