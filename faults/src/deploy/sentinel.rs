//! Sentinel: a master, its replica and three sentinels (test-servers'
//! `RedisSentinelSet`); the locker asks the sentinels for the master.

use std::process::Command;
use std::time::{Duration, Instant};

use test_servers::{RedisSentinelSet, SENTINEL_MASTER_NAME};

use super::{Deployment, Holder};

/// A Sentinel-managed master and replica.
#[derive(Debug)]
pub struct SentinelDeployment {
    set: RedisSentinelSet,
    /// [`Deployment::prepare_failover`] ran.
    prepared: bool,
    /// [`Deployment::fail_over`] ran: the old master is dead.
    failed_over: bool,
}

impl SentinelDeployment {
    /// Starts the set and waits until the replica is in sync.
    pub fn start() -> Result<Self, String> {
        Ok(SentinelDeployment {
            set: RedisSentinelSet::start(),
            prepared: false,
            failed_over: false,
        })
    }
}

impl Deployment for SentinelDeployment {
    fn url(&self) -> String {
        self.set.url()
    }

    /// The data servers (cutting the holder from the sentinels changes
    /// nothing while the master stays).
    fn server_ports(&self) -> Vec<u16> {
        vec![self.set.master().port(), self.set.replica().port()]
    }

    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        super::redis_client_kill(self.set.master(), holder)
    }

    fn spent(&self) -> bool {
        self.failed_over
    }

    /// Pauses the replica, then drops its link on the master (`CLIENT KILL
    /// TYPE replica`). In that order: a write made while only paused is
    /// already in the replica's socket buffer and is applied when it
    /// resumes; with the link dropped first the master sends it nowhere.
    fn prepare_failover(&mut self) -> Result<(), String> {
        self.set.replica().pause();
        self.set
            .master()
            .cli(&["CLIENT", "KILL", "TYPE", "replica"]);
        self.prepared = true;
        Ok(())
    }

    /// SIGKILL of the master, then the replica resumed and promoted by
    /// `SENTINEL FAILOVER`; returns once every sentinel names it.
    fn fail_over(&mut self) -> Result<(), String> {
        if !std::mem::take(&mut self.prepared) {
            return Err("fail_over without prepare_failover".to_owned());
        }
        let replica = self.set.replica().port();
        self.failed_over = true;
        test_servers::signal(self.set.master().pid(), libc::SIGKILL);
        self.set.replica().resume();
        let sentinels = self.set.sentinel_ports();
        let first = *sentinels.first().ok_or("no sentinels")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        // The sentinels may still be deciding that the master is down:
        // retry the command until one is accepted.
        while sentinel_cli(first, &["SENTINEL", "FAILOVER", SENTINEL_MASTER_NAME])? != "OK" {
            if Instant::now() > deadline {
                return Err("SENTINEL FAILOVER was not accepted within 30 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        loop {
            let mut named = true;
            for sentinel in &sentinels {
                let answer = sentinel_cli(
                    *sentinel,
                    &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER_NAME],
                )?;
                named &= answer.lines().nth(1).map(str::trim) == Some(&replica.to_string());
            }
            if named {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the sentinels did not name {replica} within 30 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn sentinel_cli(port: u16, args: &[&str]) -> Result<String, String> {
    let output = Command::new(test_servers::find_binary("redis-cli", "redis-tools"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map_err(|err| format!("redis-cli: {err}"))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
