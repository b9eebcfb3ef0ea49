//! How a session learns that it is over: its driver task, which notices the
//! connection end, and its watch, which pings a session gone quiet and gives
//! it up when the server answers nothing in time (a hop in between may keep
//! the socket looking alive). Both report through the pool's `OnClosed`,
//! with the grace the session's leases still have.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{OnClosed, Session};
use crate::postgres::errors::{self, BACKEND};
use crate::Result;

/// Shared by a session, its driver task and its watch.
pub(super) struct Liveness {
    pub(super) closed: AtomicBool,
    pub(super) close: Notify,
    /// Set before `close` is notified when the watch closes the session
    /// because the server answered nothing in time.
    pub(super) silent: AtomicBool,
    /// When the latest statement that got an answer was sent, in
    /// nanoseconds since `epoch` (only ever raised).
    heard_sent_ns: AtomicU64,
    epoch: Instant,
    /// Native waits in flight: a wait is silent by design (the server
    /// answers when the lock is granted), and a session waiting holds no
    /// lock, so the watch leaves it alone meanwhile.
    waits: AtomicUsize,
}

/// How far back from a native wait's answer the server may have sent it:
/// the grant is counted as heard this long before its answer arrived (and
/// never before the wait was sent). An answer that spent longer on the way
/// would be a network no lock could be held across.
pub(super) const ANSWER_TRAVEL_ALLOWANCE: Duration = Duration::from_secs(1);

impl Liveness {
    pub(super) fn new() -> Self {
        let epoch = Instant::now();
        Liveness {
            closed: AtomicBool::new(false),
            close: Notify::new(),
            silent: AtomicBool::new(false),
            heard_sent_ns: AtomicU64::new(0),
            epoch,
            waits: AtomicUsize::new(0),
        }
    }

    /// A statement sent at `sent` was answered.
    pub(super) fn heard(&self, sent: Instant) {
        let ns = u64::try_from(sent.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX);
        self.heard_sent_ns.fetch_max(ns, Ordering::AcqRel);
    }

    /// When the latest answered statement was sent.
    pub(super) fn heard_sent(&self) -> Instant {
        let ns = self.heard_sent_ns.load(Ordering::Acquire);
        self.epoch
            .checked_add(Duration::from_nanos(ns))
            .unwrap_or(self.epoch)
    }

    /// Records the outcome of a statement sent at `sent`: any answer from the
    /// server, an error report included, shows it was alive after `sent`.
    pub(super) fn observe<T>(
        &self,
        sent: Instant,
        result: Result<T, tokio_postgres::Error>,
    ) -> Result<T, tokio_postgres::Error> {
        if result
            .as_ref()
            .map_or_else(|e| e.as_db_error().is_some(), |_| true)
        {
            self.heard(sent);
        }
        result
    }

    /// How long the locks of this session stay ours on the server from now
    /// on: what is left of `server_window` since the last answered
    /// statement was sent.
    pub(super) fn grace(&self, server_window: Duration) -> Duration {
        self.heard_sent()
            .checked_add(server_window)
            .map_or(Duration::ZERO, |until| {
                until.saturating_duration_since(Instant::now())
            })
    }
}

/// Counts a native wait in flight for as long as it lives (a cancelled wait
/// included).
pub(super) struct WaitInFlight<'a>(&'a Liveness);

impl<'a> WaitInFlight<'a> {
    pub(super) fn start(liveness: &'a Liveness) -> Self {
        liveness.waits.fetch_add(1, Ordering::AcqRel);
        WaitInFlight(liveness)
    }
}

impl Drop for WaitInFlight<'_> {
    fn drop(&mut self) {
        self.0.waits.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(super) fn spawn_driver(
    driver: crate::postgres::tls::Driver,
    liveness: Arc<Liveness>,
    id: u64,
    server_window: Duration,
    ping_timeout: Duration,
    on_closed: OnClosed,
) {
    tokio::spawn(async move {
        tokio::pin!(driver);
        let ended = tokio::select! {
            ended = &mut driver => Some(ended),
            () = liveness.close.notified() => None,
        };
        let (why, grace) = match ended {
            // The server closed it (`pg_terminate_backend`, a shutdown): its
            // locks went with its session.
            Some(Ok(())) => ("the connection was closed".to_owned(), Duration::ZERO),
            Some(Err(e)) => {
                // Only a silent peer leaves the server holding the locks for
                // a while; a reset or an error report means the server ended
                // (or is ending) the session itself.
                let grace = if gave_up_on_silent_peer(&e) {
                    liveness.grace(server_window)
                } else {
                    Duration::ZERO
                };
                (
                    errors::backend("hold", "the connection failed", e).to_string(),
                    grace,
                )
            }
            None if liveness.silent.load(Ordering::Acquire) => {
                // Given up by the watch: the leases are told now, and the
                // connection stays open until the watch closes it at the end
                // of their grace (or the server ends it first), so the
                // server frees nothing under a holder still inside it.
                let why = format!(
                    "the server left a ping unanswered for {ping_timeout:?} (a partition, or a \
                     server silent behind a proxy or pooler)"
                );
                on_closed(id, &why, liveness.grace(server_window));
                tokio::select! {
                    _ = &mut driver => {}
                    () = liveness.close.notified() => {}
                }
                return;
            }
            None => ("distlock closed the connection".to_owned(), Duration::ZERO),
        };
        // The driver (and with it the socket) is dropped by now.
        liveness.closed.store(true, Ordering::Release);
        on_closed(id, &why, grace);
    });
}

/// How late the watch may wake before it takes the delay for a stall of this
/// process (SIGSTOP, a frozen VM, a starved runtime) rather than the
/// server's silence: an answer may then be waiting, unread, in the socket.
const STALL_TOLERANCE: Duration = Duration::from_millis(500);

/// Keeps a session talking and gives it up when the server falls silent:
/// after `ping_interval` without an answer it is pinged, and a ping left
/// unanswered for `ping_timeout` (with nothing else answered meanwhile)
/// means the server went silent. A wake-up later than the ping's deadline
/// by more than [`STALL_TOLERANCE`] is this process's stall, not evidence:
/// the session is pinged again instead. A native wait in flight pauses the
/// watch (the session holds nothing while it waits).
///
/// A silent session's leases are told at once (with what is left of the
/// server window as their grace), but its connection is held open until
/// that grace has passed: closing it sooner would free the locks at once on
/// a server that was alive after all (slow, or itself stalled), under
/// holders still inside their grace. Ends with the session (it holds only a
/// weak reference between looks) or its connection.
pub(super) fn spawn_watch(session: Weak<Session>, ping_interval: Duration, ping_timeout: Duration) {
    tokio::spawn(async move {
        loop {
            let Some(live) = session.upgrade() else {
                return;
            };
            if live.is_closed() {
                return;
            }
            let liveness = &live.liveness;
            let next_look = if liveness.waits.load(Ordering::Acquire) > 0 {
                Instant::now().checked_add(ping_interval)
            } else {
                let heard = liveness.heard_sent();
                if heard.elapsed() >= ping_interval {
                    // A ping answered later than the server window would
                    // come too late to matter: the server may free the locks
                    // first. Give up now, while the leases still have what
                    // is left of it (this also bounds how long stalls of
                    // this process can put the verdict off).
                    let left = liveness.grace(live.server_window);
                    if !live.server_window.is_zero() && left <= ping_timeout {
                        give_up(&live, heard, "the server window ran short before an answer").await;
                        return;
                    }
                    let sent = Instant::now();
                    let answered = tokio::time::timeout(ping_timeout, live.ping()).await;
                    let waited = sent.elapsed();
                    let stalled = waited > ping_timeout.saturating_add(STALL_TOLERANCE);
                    // An answer to anything (the ping, or a statement ahead
                    // of it) since the ping was sent: the server is there.
                    let heard_since = liveness.heard_sent() != heard;
                    if answered.is_err() && !stalled && !heard_since {
                        give_up(&live, heard, "a ping went unanswered").await;
                        return;
                    }
                    if matches!(answered, Ok(Err(_))) && !heard_since {
                        // Failed at once without an answer (the connection
                        // is going): its driver reports it; do not spin.
                        drop(live);
                        tokio::time::sleep(ping_interval).await;
                    }
                    continue;
                }
                heard.checked_add(ping_interval)
            };
            drop(live);
            match next_look {
                Some(at) => tokio::time::sleep_until(at).await,
                None => return,
            }
        }
    });
}

/// Gives a silent session up: its leases are told now, with what is left
/// of the server window, and its connection (with the locks on the server)
/// is held open until that has passed, then closed.
async fn give_up(live: &Session, heard: Instant, why: &str) {
    let grace = live.give_up_silent();
    tracing::warn!(
        component = "distlock",
        backend = BACKEND,
        session = live.id,
        silent_for = ?heard.elapsed(),
        ?grace,
        "a session's server stopped answering ({why}: a partition, or a server silent behind a \
         proxy or pooler): its locks are given up, its connection closed once they can no \
         longer be held"
    );
    tokio::time::sleep(grace).await;
    live.close_now();
}

/// True when the connection died because this side's TCP keepalive or user
/// timeout gave up (`ETIMEDOUT`, tcp(7)): the server went silent, and may not
/// know yet that the session is over.
fn gave_up_on_silent_peer(error: &tokio_postgres::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if current
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cause = current.source();
    }
    false
}

impl Session {
    /// One round trip that does nothing on the server (an empty query).
    async fn ping(&self) -> Result<(), tokio_postgres::Error> {
        let sent = Instant::now();
        let answer = self.client.batch_execute("").await;
        self.liveness.observe(sent, answer)
    }

    /// Gives the session up because its server went silent: closed from now
    /// on for anyone choosing a session, and its leases told, with what is
    /// left of the server window as their grace (returned). The connection
    /// itself stays open until the caller closes it.
    fn give_up_silent(&self) -> Duration {
        let grace = self.liveness.grace(self.server_window);
        self.liveness.silent.store(true, Ordering::Release);
        self.liveness.closed.store(true, Ordering::Release);
        self.liveness.close.notify_one();
        grace
    }
}
