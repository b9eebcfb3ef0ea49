//! etcd: one `etcd` member (test-servers' spawner); the concurrency-mutex
//! recipe on a session lease.

use test_servers::EtcdServer;

use super::{Deployment, Holder};

/// One etcd member.
#[derive(Debug)]
pub struct EtcdDeployment {
    server: EtcdServer,
}

impl EtcdDeployment {
    /// Starts the member.
    pub fn start() -> Result<Self, String> {
        Ok(EtcdDeployment {
            server: EtcdServer::start(),
        })
    }
}

impl Deployment for EtcdDeployment {
    fn url(&self) -> String {
        self.server.url()
    }

    fn server_ports(&self) -> Vec<u16> {
        vec![self.server.port()]
    }

    /// `etcdctl lease revoke` of the holder's lease. The holder is the key
    /// with the lowest create revision under `lock:<key>/`, whose last
    /// segment is its lease in hex (the recipe of etcd's
    /// `client/v3/concurrency/mutex.go`, which distlock follows).
    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        let prefix = format!("lock:{}/", holder.key);
        let keys = self.server.etcdctl_ok(&[
            "get",
            "--prefix",
            &prefix,
            "--sort-by=CREATE",
            "--order=ASCEND",
            "--limit=1",
            "--keys-only",
        ]);
        let lease = keys
            .lines()
            .find_map(|line| line.trim().strip_prefix(&prefix))
            .ok_or_else(|| format!("no key under {prefix}"))?
            .to_owned();
        self.server.etcdctl_ok(&["lease", "revoke", &lease]);
        Ok(())
    }

    fn restart(&mut self) -> Result<(), String> {
        self.server.restart();
        Ok(())
    }
}
