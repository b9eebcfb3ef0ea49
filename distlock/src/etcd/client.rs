//! Client wiring: connecting to the cluster, the session leases (one per
//! ttl class) and their revocation, and the request helpers every call goes
//! through (resent while a request never left this process, bounded by the
//! request timeout).

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, TlsOptions};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::session::Session;
use super::{errors, recipe, Config, EtcdLocker, Inner, Password, Registry, BACKEND};
use crate::{Error, Result};

impl EtcdLocker {
    /// Connects to the cluster `config` names and checks that it answers a
    /// linearizable read (so a cluster without quorum fails here), within
    /// `connect_timeout + request_timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a config that names no endpoint or is
    /// otherwise unusable (an unreadable `ca_file`), [`Error::Backend`] if
    /// the cluster cannot be reached, rejects the credentials, or does not
    /// answer within the bound (the message names the cluster,
    /// `connect_timeout` and `request_timeout`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: nothing is written while connecting.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use distlock::etcd::{Config, EtcdLocker};
    ///
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let locker = EtcdLocker::from_config(Config::from_env()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_config(config: Config) -> Result<Self> {
        let urls = config.endpoint_urls()?;
        let cluster = config.to_string();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(config.keepalive_timeout, config.keepalive_timeout)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some(user) = &config.username {
            let password = config.password.as_ref().map_or("", Password::expose);
            options = options.with_user(user.clone(), password);
        }
        if config.uses_tls() {
            let tls = match &config.ca_file {
                Some(path) => {
                    let pem = std::fs::read(path).map_err(|e| {
                        Error::invalid(
                            "config",
                            format!("cannot read ca_file {}: {e}", path.display()),
                        )
                    })?;
                    TlsOptions::new().ca_certificate(Certificate::from_pem(pem))
                }
                None => TlsOptions::new().with_native_roots(),
            };
            options = options.with_tls(tls);
        }
        let bound = config
            .connect_timeout
            .saturating_add(config.request_timeout);
        let connecting = async {
            let client = Client::connect(&urls, Some(options))
                .await
                .map_err(|e| errors::backend(&cluster, "connect", e, false))?;
            // Connecting is lazy: one linearizable read proves a quorum.
            recipe::queue_length(client.kv_client(), &config.key_prefix)
                .await
                .map_err(|e| errors::backend(&cluster, "connect", e, false))?;
            Ok(client)
        };
        let client = crate::deadline::connect::bounded_connect(
            BACKEND,
            &cluster,
            "connect_timeout= plus request_timeout= in the URL",
            bound,
            connecting,
        )
        .await?;
        Ok(EtcdLocker {
            inner: Arc::new(Inner {
                leases: crate::SharedLocker::default(),
                client,
                prefix: config.key_prefix,
                request_timeout: config.request_timeout,
                keepalive_timeout: config.keepalive_timeout,
                cluster,
                sessions: tokio::sync::Mutex::default(),
                registry: Arc::new(Registry::new(BACKEND)),
                freed: Arc::new(Notify::new()),
                holder_record: config.holder_record,
                readers: AtomicU64::new(0),
            }),
        })
    }

    /// Connects to the cluster an `etcd://` or `etcd+https://` URL names
    /// (see [`Config::from_url`] for the format).
    ///
    /// # Errors
    ///
    /// As [`from_config`](Self::from_config), and [`Error::InvalidInput`]
    /// for a malformed URL (the message never contains the password).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: nothing is written while connecting.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let locker = distlock::etcd::EtcdLocker::from_url("etcd://127.0.0.1:2379?prefix=jobs:").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::from_config(Config::from_url(url)?).await
    }

    /// Stops every keep-alive and revokes every session lease, which frees
    /// at once every lock this locker still holds (their lost signals fire
    /// with [`LostReason::ConnectionLost`](crate::LostReason::ConnectionLost)). Each revoke is bounded by the
    /// request timeout; a lease whose revoke fails expires at its ttl. Later
    /// acquires open new sessions.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after it started leaves the keep-alives
    /// stopped; leases not yet revoked expire at their ttl.
    pub async fn close(&self) {
        let sessions: Vec<Arc<Session>> = {
            let mut map = self.inner.sessions.lock().await;
            map.drain().map(|(_, session)| session).collect()
        };
        for session in sessions {
            session.stop();
            self.inner.registry.session_closed(
                session.lease as u64,
                "the locker was closed",
                Duration::ZERO,
            );
            let mut lease = self.inner.client.lease_client();
            let revoked =
                tokio::time::timeout(self.inner.request_timeout, lease.revoke(session.lease)).await;
            if !matches!(revoked, Ok(Ok(_))) {
                tracing::warn!(
                    component = "distlock",
                    backend = BACKEND,
                    lease = format_args!("{:x}", session.lease),
                    "could not revoke an etcd session lease; it expires at its ttl"
                );
            }
        }
        self.inner.freed.notify_waiters();
    }

    /// The live session of `ttl`'s class, granting a lease if there is none.
    pub(super) async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        let seconds = lease_seconds(ttl);
        let mut sessions = self.inner.sessions.lock().await;
        if let Some(session) = sessions.get(&seconds).filter(|s| !s.is_closed()) {
            return Ok(session.clone());
        }
        let granted_at = Instant::now();
        let ttl_arg = i64::try_from(seconds).unwrap_or(i64::MAX);
        // A grant whose answer is lost leaves a lease with no keys, which
        // expires at its ttl.
        let granted = self
            .inner
            .request("grant lease", false, || {
                let mut lease_client = self.inner.client.lease_client();
                async move { lease_client.grant(ttl_arg, None).await }
            })
            .await?;
        let granted_ttl = Duration::from_secs(granted.ttl().unsigned_abs().max(seconds));
        let session = Session::start(
            self.inner.client.clone(),
            self.inner.registry.clone(),
            self.inner.freed.clone(),
            granted.id(),
            granted_ttl,
            granted_at,
            self.inner.keepalive_timeout,
        );
        sessions.insert(seconds, session.clone());
        Ok(session)
    }
}

impl Inner {
    /// Runs one request under the request timeout: an etcd-client error
    /// becomes [`Error::Backend`] (`outcome_unknown` if the request writes
    /// and may have been applied), the timeout [`Error::DeadlineExceeded`].
    pub(super) async fn request<T, Fut>(
        &self,
        operation: &'static str,
        writes: bool,
        call: impl FnMut() -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        match self.call(call).await {
            Some(Ok(value)) => Ok(value),
            Some(Err(error)) => {
                let unknown = writes && !errors::certainly_not_applied(&error);
                Err(errors::backend(&self.cluster, operation, error, unknown))
            }
            None => Err(Error::DeadlineExceeded {
                backend: BACKEND,
                operation,
                after: self.request_timeout,
            }),
        }
    }

    /// Runs `call` until it is answered, sending it again while it failed
    /// without leaving this process (etcd-client balances requests over
    /// every endpoint, a member that is down included: a request the
    /// balancer sent to it fails to connect, and the next one likely goes
    /// to a live member); `None` once the request timeout passed.
    pub(super) async fn call<T, Fut>(
        &self,
        mut call: impl FnMut() -> Fut,
    ) -> Option<std::result::Result<T, etcd_client::Error>>
    where
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        const RESEND_PAUSE: Duration = Duration::from_millis(20);
        let deadline = crate::deadline::saturating_deadline(Instant::now(), self.request_timeout);
        loop {
            match tokio::time::timeout_at(deadline, call()).await {
                Ok(Err(error))
                    if errors::not_sent(&error)
                        && crate::deadline::saturating_deadline(Instant::now(), RESEND_PAUSE)
                            < deadline =>
                {
                    tokio::time::sleep(RESEND_PAUSE).await;
                }
                Ok(answer) => return Some(answer),
                Err(_) => return None,
            }
        }
    }

    pub(super) fn kv(&self) -> etcd_client::KvClient {
        self.client.kv_client()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last clone and the last lease are gone: stop renewing and
        // revoke, so the locks are freed now rather than at ttl expiry.
        let sessions: Vec<Arc<Session>> = self.sessions.get_mut().drain().map(|(_, s)| s).collect();
        if sessions.is_empty() {
            return;
        }
        for session in &sessions {
            session.stop();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(component = "distlock", backend = BACKEND,
                "etcd locker dropped outside a tokio runtime: its session leases expire at their ttl");
            return;
        };
        let client = self.client.clone();
        let timeout = self.request_timeout;
        runtime.spawn(async move {
            let mut lease = client.lease_client();
            for session in sessions {
                let _ = tokio::time::timeout(timeout, lease.revoke(session.lease)).await;
            }
        });
    }
}

/// The whole seconds of an etcd lease for `ttl`: rounded up, at least 1.
fn lease_seconds(ttl: Duration) -> u64 {
    crate::validate::whole_units(ttl, Duration::from_secs(1)).max(1)
}
