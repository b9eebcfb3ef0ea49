//! One ZooKeeper session, the locks held on it, and the watchdog that
//! decides when they must be given up.
//!
//! Every lock lives on the current session of its key's slot (a locker has
//! `Config::sessions` slots, a key always in the same one): its contender
//! node is an ephemeral node of that session, which the server deletes when
//! the session ends (expiry, or a close). zookeeper-client keeps the session
//! alive itself (it pings, and reconnects to another server after a
//! connection loss) until the session expires: an expired session is
//! terminal, and the locker opens a new one for later acquires.
//!
//! # When a holder stops believing in its lock
//!
//! The server expires a session once it has heard nothing from it for the
//! negotiated session timeout (measured on the server, rounded *up* to the
//! next tick: `ExpiryQueue.roundToNextInterval` in ZooKeeper's
//! `server/ExpiryQueue.java`). A request the server answered was received
//! after it was sent, so the server cannot expire the session before
//! *the send time of the last answered request + the session timeout*.
//! The watchdog sends its own heartbeat (an `exists` of `/`) every fifth of
//! the session timeout and keeps that bound; so the lost signal fires:
//!
//! | zookeeper-client state | Curator's name | what it means for a holder | lost signal |
//! | --- | --- | --- | --- |
//! | `SyncConnected` | CONNECTED / RECONNECTED | the session lives; heartbeats are answered | no |
//! | `Disconnected` | SUSPENDED | no server answers; the locks are still held until the server expires the session | at the last answered heartbeat's send time + session timeout − [`drift_margin`] (ConnectionLost, with what is left as grace) |
//! | `Expired` | LOST | the server expired the session and deleted its nodes | at once (ConnectionLost, no grace) |
//! | `Closed`, `AuthFailed` | LOST | the session is gone | at once |
//!
//! A session given up on while merely disconnected may still be alive on
//! the server (the ensemble was paused, say): the watchdog then drops the
//! session's client, which closes the session as soon as a server answers
//! (deleting its nodes at once) and otherwise lets it expire, so its locks
//! are never kept by a holder that stopped working under them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use zookeeper_client::{self as zk, SessionState};

use crate::deadline::saturating_deadline;
use crate::{drift_margin, util, LostNotifier};

use super::BACKEND;

/// A lock held on a session, by its owner token.
pub(super) struct Held {
    pub(super) session: Arc<Session>,
    pub(super) lost: LostNotifier,
}

/// The locks one locker holds, by owner token. (Not the shared
/// `session_registry`: that one exists for servers whose session locks are
/// re-entrant, where two attempts of one key on one session would merge.
/// ZooKeeper gives every attempt a node of its own, so nothing needs
/// reserving; only "which locks go down with which session" is needed.)
#[derive(Default)]
pub(super) struct Registry {
    held: Mutex<HashMap<String, Held>>,
}

impl Registry {
    /// Records a grant. Fails if its session has ended meanwhile: nothing
    /// would ever tell the lease.
    pub(super) fn grant(&self, owner: String, held: Held) -> Result<(), ()> {
        let mut map = util::lock(&self.held);
        if held.session.is_closed() {
            return Err(());
        }
        map.insert(owner, held);
        Ok(())
    }

    /// Forgets `owner`'s lock (released, or found gone).
    pub(super) fn take(&self, owner: &str) -> Option<Held> {
        util::lock(&self.held).remove(owner)
    }

    /// The session holding `owner`'s lock, if this locker holds it.
    pub(super) fn session_of(&self, owner: &str) -> Option<Arc<Session>> {
        util::lock(&self.held)
            .get(owner)
            .map(|held| held.session.clone())
    }

    /// Forgets every lock of session `id` and fires their lost signals,
    /// each with `grace`: how long the server may still hold them.
    fn session_lost(&self, id: i64, why: &str, grace: Duration) {
        let lost: Vec<LostNotifier> = {
            let mut map = util::lock(&self.held);
            let owners: Vec<String> = map
                .iter()
                .filter(|(_, held)| held.session.id == id)
                .map(|(owner, _)| owner.clone())
                .collect();
            owners
                .iter()
                .filter_map(|owner| map.remove(owner))
                .map(|held| held.lost)
                .collect()
        };
        LostNotifier::session_ended(
            lost,
            BACKEND,
            Some(format_args!("{id:#x}")),
            why,
            grace,
            "a ZooKeeper session holding locks was lost; the server has deleted their nodes, or will within the grace",
        );
    }
}

/// One ZooKeeper session.
pub(crate) struct Session {
    /// The client of this session (clones share it). Dropping the last one
    /// closes the session.
    client: Mutex<Option<zk::Client>>,
    /// The session id the server assigned (`ephemeralOwner` of its nodes).
    pub(super) id: i64,
    /// The negotiated session timeout.
    pub(super) timeout: Duration,
    closed: AtomicBool,
    watchdog: Mutex<Option<JoinHandle<()>>>,
    /// Woken when the session ends, for waiters of this locker.
    ended: tokio::sync::Notify,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = ("id", format_args!("{:#x}", self.id));
        util::fmt_session(f, id, ("timeout", self.timeout), self.is_closed())
    }
}

impl Session {
    /// A session for `client`, whose connect request was sent at
    /// `connecting_since`; starts its watchdog.
    pub(super) fn start(
        client: zk::Client,
        registry: Arc<Registry>,
        connecting_since: Instant,
        request_timeout: Duration,
    ) -> Arc<Session> {
        let session = Arc::new(Session {
            id: client.session_id().0,
            timeout: client.session_timeout(),
            client: Mutex::new(Some(client)),
            closed: AtomicBool::new(false),
            watchdog: Mutex::new(None),
            ended: tokio::sync::Notify::new(),
        });
        let watchdog = Watchdog {
            session: session.clone(),
            registry,
            last_answered_sent: connecting_since,
            request_timeout,
        };
        let handle = tokio::spawn(watchdog.run());
        *util::lock(&session.watchdog) = Some(handle);
        session
    }

    /// The session's client, or `None` once the session was given up.
    pub(super) fn client(&self) -> Option<zk::Client> {
        util::lock(&self.client).clone()
    }

    /// True once the session is known gone or was given up: nothing under
    /// it is held.
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Resolves once the session has ended (at once if it has).
    pub(super) async fn ended(&self) {
        let notified = self.ended.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.is_closed() {
            return;
        }
        notified.await;
    }

    /// Ends the session: stops the watchdog and drops the client (which
    /// closes the session on the server, deleting its nodes, as soon as a
    /// server answers), without telling the registry (the locker does).
    pub(super) fn stop(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(task) = util::lock(&self.watchdog).take() {
            task.abort();
        }
        util::lock(&self.client).take();
        self.ended.notify_waiters();
    }

    /// Marks the session ended, fires the lost signal of every lock on it
    /// (the server may keep them for `grace` more), and drops its client.
    pub(super) fn lost(&self, registry: &Registry, why: &str, grace: Duration) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        registry.session_lost(self.id, why, grace);
        util::lock(&self.client).take();
        self.ended.notify_waiters();
    }
}

/// The watchdog of one session: heartbeats, and the state changes the
/// client reports.
struct Watchdog {
    session: Arc<Session>,
    registry: Arc<Registry>,
    /// When the last request the server answered was sent (client clock):
    /// the server cannot expire the session before this + its timeout.
    last_answered_sent: Instant,
    request_timeout: Duration,
}

impl Watchdog {
    /// The earliest the server could expire the session.
    fn expires_at(&self) -> Instant {
        saturating_deadline(self.last_answered_sent, self.session.timeout)
    }

    /// When the holders must give their locks up: [`drift_margin`] before
    /// the server could expire the session, so their work has stopped
    /// before a lock can be anyone else's.
    fn give_up_at(&self) -> Instant {
        let expires = self.expires_at();
        expires
            .checked_sub(drift_margin(self.session.timeout))
            .unwrap_or(expires)
    }

    /// How often to send a heartbeat: a fifth of the session timeout, so
    /// several go unanswered before the holder gives up; at least 50 ms and
    /// at most 2 s (zookeeper-client pings idle connections itself; the
    /// heartbeat only measures).
    fn interval(&self) -> Duration {
        (self.session.timeout / 5).clamp(Duration::from_millis(50), Duration::from_secs(2))
    }

    async fn run(mut self) {
        let Some(client) = self.session.client() else {
            return;
        };
        let mut states = client.state_watcher();
        drop(client);
        let mut next_beat = saturating_deadline(Instant::now(), self.interval());
        loop {
            if self.session.is_closed() {
                return;
            }
            let now = Instant::now();
            if now >= self.give_up_at() {
                let grace = self.expires_at().saturating_duration_since(now);
                self.session.lost(
                    &self.registry,
                    "no ZooKeeper server answered within the session timeout (connection suspended)",
                    grace,
                );
                return;
            }
            tokio::select! {
                state = states.changed() => match state {
                    SessionState::Expired => {
                        self.session.lost(&self.registry, "ZooKeeper expired the session", Duration::ZERO);
                        return;
                    }
                    SessionState::Closed | SessionState::AuthFailed => {
                        self.session.lost(&self.registry, "the ZooKeeper session was closed", Duration::ZERO);
                        return;
                    }
                    SessionState::Disconnected => {
                        tracing::debug!(component = "distlock", backend = BACKEND,
                            session = format_args!("{:#x}", self.session.id),
                            "ZooKeeper connection suspended; locks are kept until the session could expire");
                    }
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                        // Reconnected: measure now rather than at the next beat.
                        next_beat = Instant::now();
                    }
                },
                () = tokio::time::sleep_until(next_beat.min(self.give_up_at())) => {
                    if Instant::now() >= next_beat {
                        self.beat().await;
                        next_beat = saturating_deadline(Instant::now(), self.interval());
                    }
                }
            }
        }
    }

    /// One heartbeat, bounded by the request timeout and the give-up time.
    async fn beat(&mut self) {
        let Some(client) = self.session.client() else {
            return;
        };
        let sent = Instant::now();
        let bound = self
            .request_timeout
            .min(self.give_up_at().saturating_duration_since(sent));
        match tokio::time::timeout(bound, client.check_stat("/")).await {
            Ok(Ok(_)) => self.last_answered_sent = self.last_answered_sent.max(sent),
            Ok(Err(error)) if super::errors::session_ended(&error) => {
                self.session.lost(
                    &self.registry,
                    "ZooKeeper expired or closed the session",
                    Duration::ZERO,
                );
            }
            Ok(Err(_)) | Err(_) => {}
        }
    }
}
