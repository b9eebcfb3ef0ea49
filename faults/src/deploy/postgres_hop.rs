//! Postgres through a local TCP hop, as users deploy it behind a Cloud SQL
//! or AlloyDB auth proxy, an Envoy/Istio/Linkerd sidecar, an SSH tunnel or
//! `kubectl port-forward`: the workers connect to a user-space proxy that
//! forwards to the server. A partition here cuts the hop's upstream
//! connections and leaves the hop up, so the holder's kernel keeps hearing
//! the hop (its keepalive is answered) and only the holder's own pings can
//! tell it the server is gone.

use test_servers::FaultProxy;

use super::{postgres::PostgresDeployment, Deployment, Holder};

/// A Postgres server and a local hop in front of it.
#[derive(Debug)]
pub struct PostgresHopDeployment {
    // Dropped first: the hop before its server.
    hop: FaultProxy,
    server: PostgresDeployment,
}

impl PostgresHopDeployment {
    /// Starts the server and the hop.
    pub fn start() -> Result<Self, String> {
        let server = PostgresDeployment::start()?;
        let upstream = server.server_ports();
        let [port] = upstream[..] else {
            return Err("one Postgres server expected".to_owned());
        };
        Ok(PostgresHopDeployment {
            hop: FaultProxy::start(port),
            server,
        })
    }
}

impl Deployment for PostgresHopDeployment {
    fn url(&self) -> String {
        self.hop.proxied_url(&self.server.url())
    }

    /// The final check asks the server directly.
    fn check_url(&self) -> String {
        self.server.url()
    }

    fn server_ports(&self) -> Vec<u16> {
        vec![self.hop.port()]
    }

    /// The hop's upstream connections that carry the holder's: cut there,
    /// the hop keeps answering the holder.
    fn partition_ports(&self, holder: &Holder) -> Vec<u16> {
        self.hop.upstream_ports_of(&holder.local_ports)
    }

    fn end_session(&mut self, holder: &Holder) -> Result<(), String> {
        self.server.end_session(holder)
    }

    fn restart(&mut self) -> Result<(), String> {
        self.server.restart()
    }
}
