//! Client wiring: opening sessions, the request helpers every call goes
//! through (each bounded by the request timeout), and creating lock paths.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{self as zk, Acls, CreateMode};

use super::session::{Registry, Session};
use super::{errors, Config, Inner, ZooKeeperLocker};
use crate::Result;

impl ZooKeeperLocker {
    /// Opens a session with the ensemble `config` names and checks that the
    /// chroot (if any) exists, within `connect_timeout + request_timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a config that names no endpoint or is
    /// otherwise unusable (TLS, a relative `key_prefix`);
    /// [`Error::Backend`](crate::Error::Backend) if no server can be reached, the credentials are
    /// refused, or the chroot does not exist (the message says which, and
    /// what to do); [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded) if no session was
    /// established within the bound.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: nothing is written while connecting; a session being
    /// opened is closed when its future is dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use distlock::zookeeper::{Config, ZooKeeperLocker};
    ///
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let locker = ZooKeeperLocker::from_config(Config::from_env()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_config(config: Config) -> Result<Self> {
        let connect = config.connect_string()?;
        let prefix = config.key_prefix.clone();
        let parent = match prefix.rsplit_once('/') {
            Some((dir, _)) => dir.to_owned(),
            None => String::new(),
        };
        let auth = config.username.as_ref().map(|user| {
            let password = config.password.as_ref().map_or("", |p| p.expose());
            format!("{user}:{password}")
        });
        let inner = Arc::new(Inner {
            leases: crate::SharedLocker::default(),
            connect,
            auth,
            ensemble: config.to_string(),
            chroot: config.chroot().map(str::to_owned),
            session_timeout: config.session_timeout,
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            prefix,
            parent,
            sessions: (0..config.sessions)
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            spare: tokio::sync::Mutex::new(None),
            registry: Arc::new(Registry::default()),
            holder_record: config.holder_record,
            no_multi_read: AtomicBool::new(false),
        });
        inner.any_session().await?;
        Ok(ZooKeeperLocker { inner })
    }

    /// Opens a session with the ensemble a `zookeeper://` URL names (see
    /// [`Config::from_url`] for the format).
    ///
    /// # Errors
    ///
    /// As [`from_config`](Self::from_config), and [`Error::InvalidInput`](crate::Error::InvalidInput)
    /// for a malformed URL (the message never contains the password).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`from_config`](Self::from_config).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), distlock::Error> {
    /// let locker =
    ///     distlock::zookeeper::ZooKeeperLocker::from_url("zookeeper://127.0.0.1:2181?session_timeout=6s").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::from_config(Config::from_url(url)?).await
    }

    /// Closes the sessions, which deletes every contender node this locker
    /// has (so every lock it holds is freed at once, and their lost signals
    /// fire with [`LostReason::ConnectionLost`](crate::LostReason::ConnectionLost)).
    /// Later acquires open new sessions.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: each session is closed when this reaches it; the close
    /// reaches the server in the background.
    pub async fn close(&self) {
        for slot in self.inner.sessions.iter().chain([&self.inner.spare]) {
            let session = slot.lock().await.take();
            if let Some(session) = session {
                session.lost(
                    &self.inner.registry,
                    "the locker was closed",
                    Duration::ZERO,
                );
            }
        }
    }

    /// The id of the session `key`'s locks live on now (as ZooKeeper's
    /// `cons` and a node's `ephemeralOwner` show it), `None` if it is not
    /// open. For operators and tests.
    pub async fn session_id(&self, key: &str) -> Option<i64> {
        let session = self.inner.sessions[self.inner.session_index(key)]
            .lock()
            .await;
        session.as_ref().filter(|s| !s.is_closed()).map(|s| s.id)
    }

    /// The session timeout the ensemble negotiated for the first open
    /// session (`None` if none is open; every session asks for the same):
    /// how long a session outlives a client that stopped answering.
    pub async fn negotiated_session_timeout(&self) -> Option<Duration> {
        for slot in self.inner.sessions.iter().chain([&self.inner.spare]) {
            let session = slot.lock().await;
            if let Some(session) = session.as_ref().filter(|s| !s.is_closed()) {
                return Some(session.timeout);
            }
        }
        None
    }
}

impl Inner {
    /// Which of the sessions `key`'s locks live on: always the same one
    /// for a key within a locker, so its readers, writers and waiters share
    /// a session as the recipe's "one locker, both modes" rules assume.
    pub(super) fn session_index(&self, key: &str) -> usize {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut hasher);
        // The remainder is below `sessions.len()`, a usize.
        (hasher.finish() % self.sessions.len() as u64) as usize
    }

    /// The live session `key`'s locks live on, opening it if it is not
    /// open (the first call, or after it expired or was given up).
    pub(super) async fn session(&self, key: &str) -> Result<Arc<Session>> {
        self.session_at(self.session_index(key)).await
    }

    /// A live session for a request about no key in particular (a listing,
    /// the connect check): one a key's locks live on if one is open, else
    /// the spare, opened if need be. The first key to need a session takes
    /// the spare, so a locker of one key has one session.
    pub(super) async fn any_session(&self) -> Result<Arc<Session>> {
        for slot in &self.sessions {
            if let Some(session) = slot.lock().await.as_ref().filter(|s| !s.is_closed()) {
                return Ok(session.clone());
            }
        }
        let mut spare = self.spare.lock().await;
        if let Some(session) = spare.as_ref().filter(|s| !s.is_closed()) {
            return Ok(session.clone());
        }
        let session = self.open().await?;
        *spare = Some(session.clone());
        Ok(session)
    }

    /// The live session of slot `index`: its own, else the spare, else a
    /// new one.
    async fn session_at(&self, index: usize) -> Result<Arc<Session>> {
        let mut current = self.sessions[index].lock().await;
        if let Some(session) = current.as_ref().filter(|s| !s.is_closed()) {
            return Ok(session.clone());
        }
        let spare = self.spare.lock().await.take().filter(|s| !s.is_closed());
        let session = match spare {
            Some(session) => session,
            None => self.open().await?,
        };
        *current = Some(session.clone());
        Ok(session)
    }

    /// Opens a session and starts its watchdog.
    async fn open(&self) -> Result<Arc<Session>> {
        let since = Instant::now();
        let client = self.connect().await?;
        Ok(Session::start(
            client,
            self.registry.clone(),
            since,
            self.request_timeout,
        ))
    }

    /// Connects a new session and checks the chroot.
    async fn connect(&self) -> Result<zk::Client> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_connection_timeout(connection_timeout(self.session_timeout))
            // Fail at once when every server refused, rather than retrying
            // until the session timeout.
            .with_fail_eagerly();
        if let Some(auth) = &self.auth {
            connector = connector.with_auth("digest", auth.as_bytes());
        }
        let client = match tokio::time::timeout(
            self.connect_timeout,
            connector.connect(&self.connect),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => return Err(errors::backend(&self.ensemble, "connect", error, false)),
            Err(_) => {
                return Err(errors::plain(
                    "connect",
                    format!(
                        "{}: no ZooKeeper session within connect_timeout ({:?}); is the ensemble running and reachable?",
                        self.ensemble, self.connect_timeout
                    ),
                ))
            }
        };
        if let Some(chroot) = &self.chroot {
            let exists = self
                .request("connect", false, client.check_stat("/"))
                .await?;
            if exists.is_none() {
                return Err(errors::plain(
                    "connect",
                    format!(
                        "{}: the chroot {chroot} does not exist; create it (`zkCli.sh create {chroot}`) or drop it from the URL",
                        self.ensemble
                    ),
                ));
            }
        }
        Ok(client)
    }

    /// Runs one request under the request timeout: a zookeeper-client error
    /// becomes [`Error::Backend`](crate::Error::Backend) (`outcome_unknown` if the request writes
    /// and may have been applied), the timeout [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded).
    pub(super) async fn request<T>(
        &self,
        operation: &'static str,
        writes: bool,
        call: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<T> {
        self.answered(operation, writes, self.call(call).await)
    }

    /// What [`call`](Self::call) answered, as [`request`](Self::request)
    /// reports it: for a caller that looks at the raw error first.
    pub(super) fn answered<T>(
        &self,
        operation: &'static str,
        writes: bool,
        answer: Option<std::result::Result<T, zk::Error>>,
    ) -> Result<T> {
        match answer {
            Some(Ok(value)) => Ok(value),
            Some(Err(error)) => Err(errors::backend(&self.ensemble, operation, error, writes)),
            None => Err(errors::deadline(operation, self.request_timeout)),
        }
    }

    /// `call` under the request timeout; `None` once it passed. (The
    /// request itself was sent when `call` was made: zookeeper-client sends
    /// synchronously and only the answer is awaited.)
    pub(super) async fn call<T>(
        &self,
        call: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Option<std::result::Result<T, zk::Error>> {
        tokio::time::timeout(self.request_timeout, call).await.ok()
    }

    /// Creates the lock path `path` as a container node (ZooKeeper deletes
    /// it once its last child is gone, as Curator creates its lock paths),
    /// and its parents as persistent nodes if they are missing.
    pub(super) async fn ensure_lock_path(&self, client: &zk::Client, path: &str) -> Result<()> {
        let container = CreateMode::Container.with_acls(Acls::anyone_all());
        for _ in 0..2 {
            match self.call(client.create(path, &[], &container)).await {
                Some(Ok(_)) | Some(Err(zk::Error::NodeExists)) => return Ok(()),
                Some(Err(zk::Error::NoNode)) if !self.parent.is_empty() => {
                    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
                    self.request("acquire", true, client.mkdir(&self.parent, &persistent))
                        .await?;
                }
                Some(Err(zk::Error::NoNode)) => {
                    return Err(errors::plain(
                        "acquire",
                        format!("cannot create {path}: its parent is missing"),
                    ))
                }
                Some(Err(error)) => {
                    return Err(errors::backend(&self.ensemble, "acquire", error, true))
                }
                None => return Err(errors::deadline("acquire", self.request_timeout)),
            }
        }
        Err(errors::plain(
            "acquire",
            format!(
                "{} was deleted again as soon as it was created",
                self.parent
            ),
        ))
    }
}

/// How long zookeeper-client waits on a connection that says nothing (a
/// connect request unanswered, or no answer to its pings) before it gives
/// that connection up and tries the next server: a tenth of the session
/// timeout, between 250 ms and 1 s.
///
/// zookeeper-client's default is 2/5 of the *requested* session timeout
/// (4 s for 10 s, 8 s for 20 s), and it applies to a reconnect too: a
/// reconnect that reached a server still starting up (its port bound, the
/// connect request never answered) waited that long before the next try,
/// so a holder whose server was back after ~1 s reconnected ~9.7 s after
/// the kill (20 s session), close to the time a 10 s session's holder gives
/// up. The crate derives its pings from this timeout (one once the
/// connection was idle for 3/8 of it), and gives a connection up when
/// nothing arrived on it for the whole timeout: a server stalled longer
/// than this costs a reconnect (to it or another server), never the
/// session, whose expiry is the session timeout's business.
pub(super) fn connection_timeout(session_timeout: Duration) -> Duration {
    (session_timeout / 10).clamp(Duration::from_millis(250), Duration::from_secs(1))
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last clone and the last lease are gone: close the sessions, so
        // their nodes are deleted now rather than at their expiry.
        for slot in self.sessions.iter_mut().chain([&mut self.spare]) {
            if let Some(session) = slot.get_mut().take() {
                session.stop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_timeout_is_one_zookeeper_client_honours() {
        // zookeeper-client ignores a connection timeout above 3/5 of the
        // session timeout (`calc_tick_timeout`) and falls back to 2/5 of
        // it: the slow reconnect this setting exists to avoid.
        for ms in [2_000u64, 4_000, 6_000, 10_000, 20_000, 60_000] {
            let session = Duration::from_millis(ms);
            let connection = connection_timeout(session);
            assert!(connection <= session * 3 / 5, "{session:?}: {connection:?}");
            assert!(connection <= Duration::from_secs(1));
        }
        assert_eq!(
            connection_timeout(Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            connection_timeout(Duration::from_secs(2)),
            Duration::from_millis(250)
        );
    }
}
