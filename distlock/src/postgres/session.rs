//! One Postgres session: a connection whose driver runs in its own task, the
//! statements the backend sends on it, and the news of its death.
//!
//! A session's advisory locks live exactly as long as its connection. The
//! driver task is what notices the end (the server closed it, TCP keepalive
//! or the user timeout gave up, or distlock closed it) and reports it, so the
//! leases held on it can fire their lost signal.
//!
//! A socket's own view is not enough: a proxy, a sidecar or a pooler between
//! client and server (a Cloud SQL auth proxy, Envoy, PgBouncer on the client
//! host, an SSH tunnel) answers the client's TCP keepalive itself, so a
//! server cut off behind it is never noticed by the client's kernel. So each
//! session is also watched by answers: every statement that is answered
//! records when it was sent, a session silent for `ping_interval` is pinged,
//! and one that has answered nothing for `ping_interval + ping_timeout` is
//! closed as silent ([`spawn_watch`]). Its locks stay ours on the server for
//! [`Settings::server_window`] after the last answered statement was sent,
//! so that is how long its leases stay valid.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{CancelToken, Client, SimpleQueryMessage, Statement};

use super::config::Settings;
use super::errors::{self, BACKEND};
use super::fencing::{self, GrantRecord, Sql};
use crate::deadline::bounded;
use crate::{Error, Result};

pub(super) use crate::sql::pool::{OnClosed, Opening, Role};

pub(crate) struct Session {
    pub(super) id: u64,
    pub(super) role: Role,
    client: Client,
    statements: Statements,
    liveness: Arc<Liveness>,
    /// See [`Settings::server_window`].
    server_window: Duration,
    /// A waiter connection's place under `max_waiters`, taken before it was
    /// opened and returned when this value is dropped, which is also what
    /// closes the connection (with the client). Tying it to the value rather
    /// than to each way a wait or a hold can end (timeout, cancellation,
    /// release, dropped lease, dead session) means no path can leak it.
    _waiter_permit: Option<OwnedSemaphorePermit>,
}

/// Shared by a session, its driver task and its watch.
struct Liveness {
    closed: AtomicBool,
    close: Notify,
    /// Set before `close` is notified when the watch closes the session
    /// because the server answered nothing in time.
    silent: AtomicBool,
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
const ANSWER_TRAVEL_ALLOWANCE: Duration = Duration::from_secs(1);

impl Liveness {
    fn new() -> Self {
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
    fn heard(&self, sent: Instant) {
        let ns = u64::try_from(sent.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX);
        self.heard_sent_ns.fetch_max(ns, Ordering::AcqRel);
    }

    /// When the latest answered statement was sent.
    fn heard_sent(&self) -> Instant {
        let ns = self.heard_sent_ns.load(Ordering::Acquire);
        self.epoch
            .checked_add(Duration::from_nanos(ns))
            .unwrap_or(self.epoch)
    }

    /// Records the outcome of a statement sent at `sent`: any answer from the
    /// server, an error report included, shows it was alive after `sent`.
    fn observe<T>(
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
    fn grace(&self, server_window: Duration) -> Duration {
        self.heard_sent()
            .checked_add(server_window)
            .map_or(Duration::ZERO, |until| {
                until.saturating_duration_since(Instant::now())
            })
    }
}

/// Counts a native wait in flight for as long as it lives (a cancelled wait
/// included).
struct WaitInFlight<'a>(&'a Liveness);

impl<'a> WaitInFlight<'a> {
    fn start(liveness: &'a Liveness) -> Self {
        liveness.waits.fetch_add(1, Ordering::AcqRel);
        WaitInFlight(liveness)
    }
}

impl Drop for WaitInFlight<'_> {
    fn drop(&mut self) {
        self.0.waits.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Statements {
    try_lock: Statement,
    try_lock_any: Statement,
    unlock_any_if_held: Statement,
    unlock: Statement,
    holds: Statement,
    lost_among: Statement,
    unlock_if_held: Statement,
    grant_token: Option<Statement>,
    shared: SharedStatements,
}

/// The statements of shared (reader) holds.
struct SharedStatements {
    try_lock: Statement,
    reader_token: Option<Statement>,
    unlock: Statement,
    unlock_if_held: Statement,
    writer_queued: Statement,
}

impl Session {
    /// Connects, starts the driver task, creates the fencing table if asked
    /// to (`ensure_table`: the statements name it, so it must exist before
    /// they are prepared), then sets the server-side keepalive and prepares
    /// the statements (pipelined: about one round trip). The waiter permit
    /// is held for the session's lifetime (returned at once if opening
    /// fails).
    pub(super) async fn open(
        settings: &Settings,
        sql: &Sql,
        opening: Opening,
        on_closed: OnClosed,
    ) -> Result<Arc<Session>> {
        let Opening {
            id,
            role,
            waiter_permit,
            ensure_table,
        } = opening;
        let ensure_table = settings.fencing.as_ref().filter(|_| ensure_table);
        let connect_within = settings
            .pg
            .get_connect_timeout()
            .copied()
            .unwrap_or(settings.query_timeout)
            * settings.pg.get_hosts().len().max(1) as u32
            + settings.query_timeout;
        let connecting = settings.tls.connect(&settings.pg);
        let context = || format!("cannot connect to {}", settings.target);
        let connecting = async {
            connecting
                .await
                .map_err(|e| errors::backend("connect", context(), e))
        };
        let (client, driver) = crate::deadline::bounded_connect(
            BACKEND,
            &settings.target,
            "connect_timeout= in the URL, per host, plus query_timeout=",
            connect_within,
            connecting,
        )
        .await?;
        let liveness = Arc::new(Liveness::new());
        spawn_driver(
            driver,
            liveness.clone(),
            id,
            settings.server_window(),
            settings.ping_timeout,
            on_closed,
        );
        let setup_sent = Instant::now();

        let prepare = async {
            if let Some(table) = ensure_table {
                fencing::ensure_table(&client, table).await?;
            }
            let setup_sql = session_setup_sql(settings);
            let setup = async {
                let applied = client.simple_query(&setup_sql).await?;
                warn_if_idle_session_timeout_is_missing(settings, &applied);
                Ok(())
            };
            let grant_token = async {
                match sql.grant_token() {
                    Some(text) => client.prepare(&text).await.map(Some),
                    None => Ok(None),
                }
            };
            let shared = async {
                let reader_token = async {
                    match &sql.reader_token {
                        Some(text) => client.prepare(text).await.map(Some),
                        None => Ok(None),
                    }
                };
                let (try_lock, reader_token, unlock, unlock_if_held, writer_queued) = tokio::try_join!(
                    client.prepare(&sql.try_lock_shared),
                    reader_token,
                    client.prepare(&sql.unlock_shared),
                    client.prepare(&sql.unlock_shared_if_held),
                    client.prepare(&sql.writer_queued),
                )?;
                Ok(SharedStatements {
                    try_lock,
                    reader_token,
                    unlock,
                    unlock_if_held,
                    writer_queued,
                })
            };
            let any = async {
                tokio::try_join!(
                    client.prepare(&sql.try_lock_any),
                    client.prepare(&sql.unlock_any_if_held),
                )
            };
            let (
                (),
                try_lock,
                (try_lock_any, unlock_any_if_held),
                unlock,
                holds,
                lost_among,
                unlock_if_held,
                grant_token,
                shared,
            ) = tokio::try_join!(
                setup,
                client.prepare(&sql.try_lock),
                any,
                client.prepare(&sql.unlock),
                client.prepare(&sql.holds),
                client.prepare(&sql.lost_among),
                client.prepare(&sql.unlock_if_held),
                grant_token,
                shared,
            )
            .map_err(|e| {
                errors::backend(
                    "connect",
                    format!("set up a session on {}", settings.target),
                    e,
                )
            })?;
            Ok::<_, Error>(Statements {
                try_lock,
                try_lock_any,
                unlock_any_if_held,
                unlock,
                holds,
                lost_among,
                unlock_if_held,
                grant_token,
                shared,
            })
        };
        let statements = match bounded(BACKEND, "connect", settings.query_timeout, prepare).await {
            Ok(statements) => statements,
            Err(e) => {
                liveness.close.notify_one();
                return Err(e);
            }
        };
        liveness.heard(setup_sent);
        let session = Arc::new(Session {
            id,
            role,
            client,
            statements,
            liveness,
            server_window: settings.server_window(),
            _waiter_permit: waiter_permit,
        });
        spawn_watch(
            Arc::downgrade(&session),
            settings.ping_interval,
            settings.ping_timeout,
        );
        Ok(session)
    }

    /// True once the connection is gone (or going): nothing it held is held.
    pub(super) fn is_closed(&self) -> bool {
        self.liveness.closed.load(Ordering::Acquire) || self.client.is_closed()
    }

    /// Drops the connection now, whatever is in flight on it: the server ends
    /// the session and frees every lock it held. Its leases fire
    /// `ConnectionLost` through the driver task.
    pub(super) fn close(&self) {
        // A session given up as silent is closed by its watch, at the end of
        // its leases' grace: closing it sooner would free their locks under
        // them if the server is alive after all.
        if self.liveness.silent.load(Ordering::Acquire) {
            return;
        }
        self.close_now();
    }

    /// Closes the connection whatever its state (the watch, once a silent
    /// session's grace has passed).
    fn close_now(&self) {
        // Closed from now on, for anyone choosing a session; the driver task
        // reports the death (and fires the lost signals) once it has ended.
        self.liveness.closed.store(true, Ordering::Release);
        self.liveness.close.notify_one();
    }

    pub(super) fn cancel_token(&self) -> CancelToken {
        self.client.cancel_token()
    }

    /// One attempt: `Some(token)` if acquired (`token` is `None` without
    /// fencing), `None` if held elsewhere. With fencing the grant writes
    /// `record` into the key's row.
    pub(super) async fn try_lock(
        &self,
        key: i64,
        owner_digest: &str,
        record: &GrantRecord<'_>,
        fencing: bool,
    ) -> Result<Option<Option<i64>>, tokio_postgres::Error> {
        let statement = &self.statements.try_lock;
        let sent = Instant::now();
        let row = if fencing {
            self.client
                .query_opt(statement, &record_params(&key, &owner_digest, record))
                .await
        } else {
            self.client.query_opt(statement, &[&key]).await
        };
        let row = self.liveness.observe(sent, row)?;
        row.map(|row| row.try_get::<_, Option<i64>>(0)).transpose()
    }

    /// One attempt over `keys` in order ([`Sql::try_lock_any`]): the key
    /// taken and its token (`None` without fencing), or `None` if every key
    /// was held elsewhere. `names` are the keys' recorded names, in the
    /// same order; with fencing the grant writes `record` (whose own
    /// `key_name` is not used) and the taken key's name into its row.
    pub(super) async fn try_lock_any(
        &self,
        keys: &[i64],
        names: &[Option<&str>],
        owner_digest: &str,
        record: &GrantRecord<'_>,
        fencing: bool,
    ) -> Result<Option<(i64, Option<i64>)>, tokio_postgres::Error> {
        let statement = &self.statements.try_lock_any;
        let sent = Instant::now();
        let row = if fencing {
            let params: [&(dyn ToSql + Sync); 7] = [
                &keys,
                &owner_digest,
                &names,
                &record.host,
                &record.pid,
                &record.label,
                &record.ttl_ms,
            ];
            self.client.query_opt(statement, &params).await
        } else {
            self.client.query_opt(statement, &[&keys]).await
        };
        let row = self.liveness.observe(sent, row)?;
        row.map(|row| Ok((row.try_get(1)?, row.try_get(0)?)))
            .transpose()
    }

    /// Releases every one of `keys` this session holds exclusively (one
    /// hold each): how many it released.
    pub(super) async fn unlock_any_if_held(
        &self,
        keys: &[i64],
    ) -> Result<usize, tokio_postgres::Error> {
        let sent = Instant::now();
        let rows = self
            .client
            .query(&self.statements.unlock_any_if_held, &[&keys])
            .await;
        Ok(self.liveness.observe(sent, rows)?.len())
    }

    /// Releases one hold of `key`: true if this session held it.
    pub(super) async fn unlock(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        let sent = Instant::now();
        let row = self
            .client
            .query_one(&self.statements.unlock, &[&key])
            .await;
        self.liveness.observe(sent, row)?.try_get(0)
    }

    /// True if this session holds `key` (and so, that the session is alive).
    pub(super) async fn holds(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        let sent = Instant::now();
        let row = self.client.query_one(&self.statements.holds, &[&key]).await;
        self.liveness.observe(sent, row)?.try_get(0)
    }

    /// Which of `keys` this session does not hold (in no particular order).
    pub(super) async fn lost_among(&self, keys: &[i64]) -> Result<Vec<i64>, tokio_postgres::Error> {
        let sent = Instant::now();
        let rows = self
            .client
            .query(&self.statements.lost_among, &[&keys])
            .await;
        let rows = self.liveness.observe(sent, rows)?;
        rows.iter().map(|row| row.try_get(0)).collect()
    }

    /// Releases `key` if this session holds it; true if it did.
    pub(super) async fn unlock_if_held(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        let sent = Instant::now();
        let rows = self
            .client
            .query(&self.statements.unlock_if_held, &[&key])
            .await;
        Ok(!self.liveness.observe(sent, rows)?.is_empty())
    }

    /// One shared attempt: `Some(token)` if this session now holds `key`
    /// shared (`token`, the key's counter, is `None` without fencing),
    /// `None` if it is held exclusively or an exclusive request waits for
    /// it. With fencing the counter is read by a second statement sent
    /// with the first (one round trip): its own snapshot, taken once the
    /// lock is held, sees every writer's bump before it released the key.
    pub(super) async fn try_lock_shared(
        &self,
        key: i64,
    ) -> Result<Option<Option<i64>>, tokio_postgres::Error> {
        let statements = &self.statements.shared;
        let params: [&(dyn ToSql + Sync); 1] = [&key];
        let sent = Instant::now();
        let try_lock = self.client.query_one(&statements.try_lock, &params);
        let (taken, token) = match &statements.reader_token {
            // Pipelined: `join` polls the attempt first, and each sends its
            // request on its first poll, so both are sent in this order
            // before either answer is awaited; the server runs them in order.
            Some(read) => {
                let read = self.client.query_one(read, &params);
                let (taken, token) = futures_util::future::join(try_lock, read).await;
                (taken, Some(token))
            }
            None => (try_lock.await, None),
        };
        let taken: bool = self.liveness.observe(sent, taken)?.try_get(0)?;
        if !taken {
            return Ok(None);
        }
        match token {
            Some(row) => Ok(Some(Some(self.liveness.observe(sent, row)?.try_get(0)?))),
            None => Ok(Some(None)),
        }
    }

    /// The key's counter, read (never advanced) for a reader that holds
    /// `key` shared; `None` without fencing.
    pub(super) async fn reader_token(
        &self,
        key: i64,
    ) -> Result<Option<i64>, tokio_postgres::Error> {
        let Some(read) = &self.statements.shared.reader_token else {
            return Ok(None);
        };
        let sent = Instant::now();
        let row = self.client.query_one(read, &[&key]).await;
        self.liveness.observe(sent, row)?.try_get(0).map(Some)
    }

    /// True if an exclusive request for `key` waits on the server.
    pub(super) async fn writer_queued(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        let sent = Instant::now();
        let row = self
            .client
            .query_one(&self.statements.shared.writer_queued, &[&key])
            .await;
        self.liveness.observe(sent, row)?.try_get(0)
    }

    /// Releases one shared hold of `key`: true if this session held it
    /// shared.
    pub(super) async fn unlock_shared(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        let sent = Instant::now();
        let row = self
            .client
            .query_one(&self.statements.shared.unlock, &[&key])
            .await;
        self.liveness.observe(sent, row)?.try_get(0)
    }

    /// Releases `key`'s shared hold if this session has one; true if it
    /// did.
    pub(super) async fn unlock_shared_if_held(
        &self,
        key: i64,
    ) -> Result<bool, tokio_postgres::Error> {
        let sent = Instant::now();
        let rows = self
            .client
            .query(&self.statements.shared.unlock_if_held, &[&key])
            .await;
        Ok(!self.liveness.observe(sent, rows)?.is_empty())
    }

    /// Bumps the fencing counter of `key`, held by this session, and writes
    /// `record` into its row.
    pub(super) async fn grant_token(
        &self,
        key: i64,
        owner_digest: &str,
        record: &GrantRecord<'_>,
    ) -> Result<Option<i64>, tokio_postgres::Error> {
        match &self.statements.grant_token {
            Some(statement) => {
                let sent = Instant::now();
                let row = self
                    .client
                    .query_one(statement, &record_params(&key, &owner_digest, record))
                    .await;
                self.liveness.observe(sent, row)?.try_get(0).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Runs a native wait ([`Sql::wait`]); returns the fencing token of the
    /// grant (`None` without fencing).
    pub(super) async fn wait(
        &self,
        wait_sql: &str,
        fencing: bool,
    ) -> Result<Option<i64>, WaitError> {
        let sent = Instant::now();
        let in_flight = WaitInFlight::start(&self.liveness);
        let messages = self.client.simple_query(wait_sql).await;
        // The server answers a wait when it grants the lock, long after the
        // wait was sent: count it as heard shortly before the answer came.
        let answered = Instant::now()
            .checked_sub(ANSWER_TRAVEL_ALLOWANCE)
            .map_or(sent, |at| at.max(sent));
        let messages = self
            .liveness
            .observe(answered, messages)
            .map_err(WaitError::Postgres)?;
        drop(in_flight);
        if !fencing {
            return Ok(None);
        }
        // Rows of `pg_advisory_lock` (void) come first; the token is the
        // last row, from the counter bump.
        let token = messages.iter().rev().find_map(|message| match message {
            SimpleQueryMessage::Row(row) => row.get(0),
            _ => None,
        });
        match token.map(str::parse::<i64>) {
            Some(Ok(token)) => Ok(Some(token)),
            _ => Err(WaitError::BadToken),
        }
    }

    /// Runs an unprepared statement returning rows (rare paths only).
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let sent = Instant::now();
        let rows = self.client.query(sql, params).await;
        self.liveness.observe(sent, rows)
    }

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

/// The parameters of a grant with fencing: the key, the owner digest, then
/// the record as [`Sql::try_lock`](super::fencing::Sql) lists them.
fn record_params<'a>(
    key: &'a i64,
    owner_digest: &'a &'a str,
    record: &'a GrantRecord<'a>,
) -> [&'a (dyn ToSql + Sync); 7] {
    [
        key,
        owner_digest,
        &record.key_name,
        &record.host,
        &record.pid,
        &record.label,
        &record.ttl_ms,
    ]
}

/// How a native wait failed.
#[derive(Debug)]
pub(super) enum WaitError {
    Postgres(tokio_postgres::Error),
    /// The server returned no fencing token, or one that is not an integer.
    BadToken,
}

impl WaitError {
    pub(super) fn into_error(self, context: String) -> Error {
        match self {
            WaitError::Postgres(e) => errors::backend("acquire", context, e),
            WaitError::BadToken => Error::backend(
                BACKEND,
                "acquire",
                format!("{context}: the server returned no integer fencing token"),
            ),
        }
    }
}

fn spawn_driver(
    driver: super::tls::Driver,
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
fn spawn_watch(session: Weak<Session>, ping_interval: Duration, ping_timeout: Duration) {
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

/// The one setup statement of every session, skipping settings the server
/// does not have (`idle_session_timeout` is Postgres 14+,
/// `tcp_user_timeout` 12+):
///
/// - `statement_timeout` and `idle_in_transaction_session_timeout` off: a
///   role or database default would otherwise turn a native wait into an
///   error, or end a session that holds locks (and so free them under their
///   holders);
/// - `idle_session_timeout` as configured (off unless set): the server ends
///   a session it has heard nothing from for that long, whatever sits in
///   between; the watch's pings keep a live one inside it;
/// - `lock_timeout` (see [`Settings::session_lock_timeout_ms`]);
/// - the server's keepalive for this connection, unless left alone. On a
///   Unix socket the server accepts and ignores it.
fn session_setup_sql(settings: &Settings) -> String {
    let mut values = vec![
        ("statement_timeout", "0".to_owned()),
        (
            "idle_session_timeout",
            settings
                .idle_session_timeout
                .map_or_else(|| "0".to_owned(), |idle| format!("{}ms", idle.as_millis())),
        ),
        ("idle_in_transaction_session_timeout", "0".to_owned()),
        (
            "lock_timeout",
            format!("{}ms", settings.session_lock_timeout_ms()),
        ),
    ];
    if let Some(keepalive) = settings.server_keepalive {
        values.extend([
            (
                "tcp_keepalives_idle",
                format!("{}s", whole_seconds(keepalive.idle)),
            ),
            (
                "tcp_keepalives_interval",
                format!("{}s", whole_seconds(keepalive.interval)),
            ),
            ("tcp_keepalives_count", keepalive.retries.to_string()),
            (
                "tcp_user_timeout",
                format!("{}ms", keepalive.user_timeout.as_millis()),
            ),
        ]);
    }
    // Every value is generated here (names above, integers), never caller
    // text.
    let rows: Vec<String> = values
        .iter()
        .map(|(name, value)| format!("('{name}', '{value}')"))
        .collect();
    format!(
        "SELECT s.name, set_config(s.name, s.value, false) FROM (VALUES {}) AS s(name, value) \
         WHERE s.name IN (SELECT name FROM pg_settings)",
        rows.join(", ")
    )
}

/// Warns once per process when `idle_session_timeout` is configured but the
/// server has no such setting (Postgres 13 and older): the one bound on a
/// vanished holder's locks that holds whatever sits in between is then
/// missing, and behind a pooler or proxy that keeps the server session open
/// only the pooler's own keepalive ends it.
fn warn_if_idle_session_timeout_is_missing(settings: &Settings, applied: &[SimpleQueryMessage]) {
    use std::sync::atomic::AtomicBool;
    static WARNED: AtomicBool = AtomicBool::new(false);
    let applied: Vec<&str> = applied
        .iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => row.get(0),
            _ => None,
        })
        .collect();
    if !idle_session_timeout_missing(settings.idle_session_timeout, &applied) {
        return;
    }
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            component = "distlock",
            backend = BACKEND,
            server = %settings.target,
            "the server has no idle_session_timeout (Postgres 13 or older): behind a pooler \
             or proxy that keeps a vanished holder's server session open (PgBouncer, a \
             sidecar), its locks stay until that pooler notices; set its client keepalive \
             (PgBouncer: tcp_keepalive, tcp_keepidle=2, tcp_keepintvl=2, tcp_keepcnt=5, \
             tcp_user_timeout=12000), or upgrade to Postgres 14+"
        );
    }
}

/// True when an `idle_session_timeout` was asked for and the setup statement
/// did not apply it (the names of the settings it applied are `applied`).
fn idle_session_timeout_missing(wanted: Option<Duration>, applied: &[&str]) -> bool {
    wanted.is_some() && !applied.contains(&"idle_session_timeout")
}

fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_idle_session_timeout_is_noticed_only_when_one_was_asked_for() {
        let pg13 = ["statement_timeout", "lock_timeout", "tcp_keepalives_idle"];
        let pg14 = ["statement_timeout", "idle_session_timeout", "lock_timeout"];
        let ten = Some(Duration::from_secs(10));
        assert!(idle_session_timeout_missing(ten, &pg13));
        assert!(!idle_session_timeout_missing(ten, &pg14));
        assert!(!idle_session_timeout_missing(None, &pg13));
    }
}
