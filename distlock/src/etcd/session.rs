//! The session lease of one ttl class and the task that keeps it alive.
//!
//! One lease per whole-second ttl per locker, as etcd's own
//! `concurrency.Session` holds one lease for every mutex made from it
//! (<https://github.com/etcd-io/etcd/blob/main/client/v3/concurrency/session.go>).
//! Every lock key of that class is attached to it, so one keep-alive stream
//! renews them all, and when the lease is gone every lock under it is lost
//! together ([`Registry::session_closed`]).
//!
//! etcd-client's `lease_keep_alive` is only a sender and a response stream,
//! with no loop and no reconnect of its own: this task sends a keep-alive
//! about every ttl/3, reads each answer, reopens the stream after a
//! transient error while the lease can still be alive, and gives up, firing
//! every lost signal, once the lease is known gone (an answer with ttl 0:
//! revoked or expired) or could have expired (no answer in time).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::deadline::saturating_deadline;
use crate::drift_margin;
use crate::session_registry::HoldingSession;
use crate::util;

use super::Registry;

/// Pause between two attempts to reopen a broken keep-alive stream.
const REOPEN_PAUSE: Duration = Duration::from_millis(100);

/// One session lease.
pub(crate) struct Session {
    /// The lease id etcd granted.
    pub(super) lease: i64,
    /// The ttl etcd granted (whole seconds; at least the class's, more if
    /// the server's minimum is higher).
    pub(super) ttl: Duration,
    closed: AtomicBool,
    keepalive: Mutex<Option<JoinHandle<()>>>,
    /// The locker's "a name was freed here" signal, for its local waiters.
    freed: Arc<Notify>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lease = ("lease", format_args!("{:x}", self.lease));
        crate::util::fmt_session(f, lease, ("ttl", self.ttl), self.is_closed())
    }
}

impl HoldingSession for Session {
    fn id(&self) -> u64 {
        // Lease ids are positive int64s.
        self.lease as u64
    }
    fn is_closed(&self) -> bool {
        Session::is_closed(self)
    }
}

impl Session {
    /// A session for the lease `lease` etcd granted with `ttl`, its grant
    /// requested at `granted_at`; starts its keep-alive task.
    pub(super) fn start(
        client: etcd_client::Client,
        registry: Arc<Registry>,
        freed: Arc<Notify>,
        lease: i64,
        ttl: Duration,
        granted_at: Instant,
        keepalive_timeout: Duration,
    ) -> Arc<Session> {
        let session = Arc::new(Session {
            lease,
            ttl,
            closed: AtomicBool::new(false),
            keepalive: Mutex::new(None),
            freed,
        });
        let task = KeepAlive {
            client,
            registry,
            session: session.clone(),
            keepalive_timeout,
            expires_at: saturating_deadline(granted_at, ttl),
        };
        let handle = tokio::spawn(task.run());
        *util::lock(&session.keepalive) = Some(handle);
        session
    }

    /// True once the lease is known gone or given up: nothing under it is
    /// held.
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Stops the keep-alive and marks the session closed, without telling
    /// the registry (the locker is closing and revokes the lease).
    pub(super) fn stop(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(task) = util::lock(&self.keepalive).take() {
            task.abort();
        }
    }

    /// Marks the session closed and fires the lost signal of every lock
    /// under it; the server may keep them for `grace` more.
    pub(super) fn lost(&self, registry: &Registry, why: &str, grace: Duration) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        registry.session_closed(self.id(), why, grace);
        self.freed.notify_waiters();
    }
}

/// The keep-alive task of one session.
struct KeepAlive {
    client: etcd_client::Client,
    registry: Arc<Registry>,
    session: Arc<Session>,
    keepalive_timeout: Duration,
    /// The lease expires on the server no earlier than this (client clock:
    /// measured from before the request that set it).
    expires_at: Instant,
}

/// How one keep-alive stream ended.
enum StreamEnd {
    /// The server says the lease does not exist.
    LeaseGone,
    /// The stream broke or went silent: reopen it if time remains.
    Broken(String),
}

impl KeepAlive {
    /// The ttl of the lease, for the interval and the margin.
    fn ttl(&self) -> Duration {
        self.session.ttl
    }

    /// Until when renewing may still save the lease: the holder gives up
    /// [`drift_margin`] before the server could expire it, so its work has
    /// stopped before the lock can be anyone else's.
    fn give_up_at(&self) -> Instant {
        self.expires_at
            .checked_sub(drift_margin(self.ttl()))
            .unwrap_or(self.expires_at)
    }

    async fn run(mut self) {
        let lease = self.session.lease;
        let mut last_error = String::from("no keep-alive answered");
        loop {
            if self.session.is_closed() {
                return;
            }
            let now = Instant::now();
            if now >= self.give_up_at() {
                let grace = self.expires_at.saturating_duration_since(now);
                tracing::warn!(
                    component = "distlock",
                    backend = super::BACKEND,
                    lease = format_args!("{lease:x}"),
                    error = last_error,
                    "etcd lease could not be kept alive before its ttl ran out; its locks are lost"
                );
                self.session.lost(
                    &self.registry,
                    "the etcd lease could not be renewed in time",
                    grace,
                );
                return;
            }
            match self.stream().await {
                StreamEnd::LeaseGone => {
                    tracing::warn!(
                        component = "distlock",
                        backend = super::BACKEND,
                        lease = format_args!("{lease:x}"),
                        "etcd says the session lease is gone (revoked or expired); its locks are lost"
                    );
                    self.session.lost(
                        &self.registry,
                        "etcd revoked or expired the lease",
                        Duration::ZERO,
                    );
                    return;
                }
                StreamEnd::Broken(error) => {
                    tracing::debug!(
                        component = "distlock",
                        backend = super::BACKEND,
                        lease = format_args!("{lease:x}"),
                        error,
                        "etcd keep-alive stream broke; reopening"
                    );
                    last_error = error;
                    let pause =
                        saturating_deadline(Instant::now(), REOPEN_PAUSE).min(self.give_up_at());
                    tokio::time::sleep_until(pause).await;
                }
            }
        }
    }

    /// Opens a keep-alive stream and renews through it until it breaks or
    /// the lease is gone.
    async fn stream(&mut self) -> StreamEnd {
        let lease = self.session.lease;
        let interval = (self.ttl() / 3).max(Duration::from_millis(100));
        let open_bound = self.bound();
        let mut lease_client = self.client.lease_client();
        let mut sent = Instant::now();
        // etcd-client's `keep_alive` sends the first request and reads its
        // answer itself: an open stream is a renewal.
        let (mut keeper, mut responses) =
            match tokio::time::timeout(open_bound, lease_client.keep_alive(lease)).await {
                Ok(Ok(opened)) => opened,
                Ok(Err(etcd_client::Error::LeaseKeepAliveError(message)))
                    if message.contains("lease not found") =>
                {
                    return StreamEnd::LeaseGone
                }
                Ok(Err(error)) => return StreamEnd::Broken(error.to_string()),
                Err(_) => return StreamEnd::Broken("opening the stream timed out".into()),
            };
        self.renewed(sent, self.ttl());
        loop {
            tokio::time::sleep_until(saturating_deadline(sent, interval)).await;
            if self.session.is_closed() {
                return StreamEnd::Broken("closed".into());
            }
            sent = Instant::now();
            if let Err(error) = keeper.keep_alive().await {
                return StreamEnd::Broken(error.to_string());
            }
            match tokio::time::timeout(self.bound(), responses.message()).await {
                Ok(Ok(Some(response))) if response.ttl() > 0 => {
                    self.renewed(sent, Duration::from_secs(response.ttl().unsigned_abs()));
                }
                Ok(Ok(Some(_))) => return StreamEnd::LeaseGone,
                Ok(Ok(None)) => return StreamEnd::Broken("the stream was closed".into()),
                Ok(Err(error)) => return StreamEnd::Broken(error.to_string()),
                Err(_) => return StreamEnd::Broken("no answer to a keep-alive".into()),
            }
        }
    }

    /// Records a renewal whose request was sent at `sent`, for `ttl`; never
    /// shortens what an earlier answer established.
    fn renewed(&mut self, sent: Instant, ttl: Duration) {
        self.expires_at = self.expires_at.max(saturating_deadline(sent, ttl));
    }

    /// How long one answer may take: the keep-alive timeout, and never past
    /// the moment the lease must be given up.
    fn bound(&self) -> Duration {
        self.keepalive_timeout
            .min(self.give_up_at().saturating_duration_since(Instant::now()))
    }
}
