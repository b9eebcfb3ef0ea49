//! One Postgres session: a connection whose driver runs in its own task, the
//! statements the backend sends on it, and the news of its death.
//!
//! A session's advisory locks live exactly as long as its connection. The
//! driver task is what notices the end (the server closed it, TCP keepalive
//! or the user timeout gave up, or distlock closed it) and reports it, so the
//! leases held on it can fire their lost signal.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio_postgres::types::ToSql;
use tokio_postgres::{CancelToken, Client, SimpleQueryMessage, Statement};

use super::config::Settings;
use super::errors::{self, BACKEND};
use super::fencing::{self, FencingTable, GrantRecord, Sql};
use crate::deadline::bounded;
use crate::{Error, Result};

/// What a session is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// One of the locker's few long-lived sessions; carries many locks.
    Shared,
    /// A connection for one native wait, then for the one lock it won.
    Waiter,
}

/// Called once, from the driver task, when a session's connection is gone:
/// with the session's id, why, and how long its locks may still be held on
/// the server (see [`Settings::partition_grace`]; zero unless this client's
/// keepalive gave up on a silent server).
pub(super) type OnClosed = Arc<dyn Fn(u64, &str, Duration) + Send + Sync>;

pub(super) struct Session {
    pub(super) id: u64,
    pub(super) role: Role,
    client: Client,
    statements: Statements,
    liveness: Arc<Liveness>,
    /// A waiter connection's place under `max_waiters`, taken before it was
    /// opened and returned when this value is dropped, which is also what
    /// closes the connection (with the client). Tying it to the value rather
    /// than to each way a wait or a hold can end (timeout, cancellation,
    /// release, dropped lease, dead session) means no path can leak it.
    _waiter_permit: Option<OwnedSemaphorePermit>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("role", &self.role)
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Shared by a session and its driver task.
#[derive(Default)]
struct Liveness {
    closed: AtomicBool,
    close: Notify,
}

struct Statements {
    try_lock: Statement,
    unlock: Statement,
    holds: Statement,
    lost_among: Statement,
    unlock_if_held: Statement,
    grant_token: Option<Statement>,
}

impl Session {
    /// Connects, starts the driver task, creates the fencing table if asked
    /// to (`ensure_table`: the statements name it, so it must exist before
    /// they are prepared), then sets the server-side keepalive and prepares
    /// the statements (pipelined: about one round trip). `waiter_permit` is
    /// held for the session's lifetime (returned at once if opening fails).
    pub(super) async fn open(
        settings: &Settings,
        sql: &Sql,
        ensure_table: Option<&FencingTable>,
        id: u64,
        role: Role,
        waiter_permit: Option<OwnedSemaphorePermit>,
        on_closed: OnClosed,
    ) -> Result<Arc<Session>> {
        let connect_within = settings
            .pg
            .get_connect_timeout()
            .copied()
            .unwrap_or(settings.query_timeout)
            * settings.pg.get_hosts().len().max(1) as u32
            + settings.query_timeout;
        let connecting = settings.tls.connect(&settings.pg);
        let context = || format!("cannot connect to {}", settings.target);
        let (client, driver) =
            errors::within("connect", connect_within, context, connecting).await?;
        let liveness = Arc::new(Liveness::default());
        spawn_driver(
            driver,
            liveness.clone(),
            id,
            settings.partition_grace(),
            on_closed,
        );

        let prepare = async {
            if let Some(table) = ensure_table {
                fencing::ensure_table(&client, table).await?;
            }
            let setup_sql = session_setup_sql(settings);
            let setup = client.batch_execute(&setup_sql);
            let grant_token = async {
                match sql.grant_token() {
                    Some(text) => client.prepare(&text).await.map(Some),
                    None => Ok(None),
                }
            };
            let ((), try_lock, unlock, holds, lost_among, unlock_if_held, grant_token) =
                tokio::try_join!(
                    setup,
                    client.prepare(&sql.try_lock),
                    client.prepare(&sql.unlock),
                    client.prepare(&sql.holds),
                    client.prepare(&sql.lost_among),
                    client.prepare(&sql.unlock_if_held),
                    grant_token,
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
                unlock,
                holds,
                lost_among,
                unlock_if_held,
                grant_token,
            })
        };
        let statements = match bounded(BACKEND, "connect", settings.query_timeout, prepare).await {
            Ok(statements) => statements,
            Err(e) => {
                liveness.close.notify_one();
                return Err(e);
            }
        };
        Ok(Arc::new(Session {
            id,
            role,
            client,
            statements,
            liveness,
            _waiter_permit: waiter_permit,
        }))
    }

    /// True once the connection is gone (or going): nothing it held is held.
    pub(super) fn is_closed(&self) -> bool {
        self.liveness.closed.load(Ordering::Acquire) || self.client.is_closed()
    }

    /// Drops the connection now, whatever is in flight on it: the server ends
    /// the session and frees every lock it held. Its leases fire
    /// `ConnectionLost` through the driver task.
    pub(super) fn close(&self) {
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
        let row = if fencing {
            self.client
                .query_opt(statement, &record_params(&key, &owner_digest, record))
                .await?
        } else {
            self.client.query_opt(statement, &[&key]).await?
        };
        row.map(|row| row.try_get::<_, Option<i64>>(0)).transpose()
    }

    /// Releases one hold of `key`: true if this session held it.
    pub(super) async fn unlock(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        self.client
            .query_one(&self.statements.unlock, &[&key])
            .await?
            .try_get(0)
    }

    /// True if this session holds `key` (and so, that the session is alive).
    pub(super) async fn holds(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        self.client
            .query_one(&self.statements.holds, &[&key])
            .await?
            .try_get(0)
    }

    /// Which of `keys` this session does not hold (in no particular order).
    pub(super) async fn lost_among(&self, keys: &[i64]) -> Result<Vec<i64>, tokio_postgres::Error> {
        let rows = self
            .client
            .query(&self.statements.lost_among, &[&keys])
            .await?;
        rows.iter().map(|row| row.try_get(0)).collect()
    }

    /// Releases `key` if this session holds it; true if it did.
    pub(super) async fn unlock_if_held(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        let rows = self
            .client
            .query(&self.statements.unlock_if_held, &[&key])
            .await?;
        Ok(!rows.is_empty())
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
            Some(statement) => self
                .client
                .query_one(statement, &record_params(&key, &owner_digest, record))
                .await?
                .try_get(0)
                .map(Some),
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
        let messages = self
            .client
            .simple_query(wait_sql)
            .await
            .map_err(WaitError::Postgres)?;
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
        self.client.query(sql, params).await
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
    partition_grace: Duration,
    on_closed: OnClosed,
) {
    tokio::spawn(async move {
        let (why, grace) = tokio::select! {
            ended = driver => match ended {
                // The server closed it (`pg_terminate_backend`, a shutdown):
                // its locks went with its session.
                Ok(()) => ("the connection was closed".to_owned(), Duration::ZERO),
                Err(e) => {
                    // Only a silent peer leaves the server holding the
                    // locks for a while; a reset or an error report means
                    // the server ended (or is ending) the session itself.
                    let grace = if gave_up_on_silent_peer(&e) {
                        partition_grace
                    } else {
                        Duration::ZERO
                    };
                    (errors::backend("hold", "the connection failed", e).to_string(), grace)
                }
            },
            () = liveness.close.notified() => ("distlock closed the connection".to_owned(), Duration::ZERO),
        };
        // The driver (and with it the socket) is dropped by now.
        liveness.closed.store(true, Ordering::Release);
        on_closed(id, &why, grace);
    });
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
/// - `statement_timeout`, `idle_session_timeout` and
///   `idle_in_transaction_session_timeout` off: a role or database default
///   would otherwise turn a native wait into an error, or end an idle
///   session that holds locks (and so free them under their holders);
/// - `lock_timeout` (see [`Settings::session_lock_timeout_ms`]);
/// - the server's keepalive for this connection, unless left alone. On a
///   Unix socket the server accepts and ignores it.
fn session_setup_sql(settings: &Settings) -> String {
    let mut values = vec![
        ("statement_timeout", "0".to_owned()),
        ("idle_session_timeout", "0".to_owned()),
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
        "SELECT set_config(s.name, s.value, false) FROM (VALUES {}) AS s(name, value) \
         WHERE s.name IN (SELECT name FROM pg_settings)",
        rows.join(", ")
    )
}

fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs().max(1)
}
