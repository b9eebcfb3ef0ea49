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
use tokio_postgres::{CancelToken, Client, SimpleQueryMessage, Statement};

use super::config::{Settings, TcpKeepalive};
use super::errors::{self, BACKEND};
use super::fencing::{self, FencingTable, Sql};
use crate::{Error, Result};

/// What a session is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// One of the locker's few long-lived sessions; carries many locks.
    Shared,
    /// A connection for one native wait, then for the one lock it won.
    Waiter,
}

/// Called once, from the driver task, when a session's connection is gone.
pub(super) type OnClosed = Arc<dyn Fn(u64, &str) + Send + Sync>;

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
        let (client, driver) = match tokio::time::timeout(connect_within, connecting).await {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) => {
                return Err(errors::backend(
                    "connect",
                    format!("cannot connect to {}", settings.target),
                    e,
                ))
            }
            Err(_) => {
                return Err(errors::no_answer(
                    "connect",
                    &format!("connect to {}", settings.target),
                    connect_within,
                ))
            }
        };
        let liveness = Arc::new(Liveness::default());
        spawn_driver(driver, liveness.clone(), id, on_closed);

        let prepare = async {
            if let Some(table) = ensure_table {
                fencing::ensure_table(&client, table).await?;
            }
            let setup = async {
                match settings.server_keepalive {
                    Some(keepalive) => client.batch_execute(&server_keepalive_sql(keepalive)).await,
                    None => Ok(()),
                }
            };
            let grant_token = async {
                match sql.grant_token() {
                    Some(text) => client.prepare(&text).await.map(Some),
                    None => Ok(None),
                }
            };
            let ((), try_lock, unlock, holds, unlock_if_held, grant_token) = tokio::try_join!(
                setup,
                client.prepare(&sql.try_lock),
                client.prepare(sql.unlock),
                client.prepare(&sql.holds),
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
                unlock_if_held,
                grant_token,
            })
        };
        let session_setup = format!("set up a session on {}", settings.target);
        let statements = match tokio::time::timeout(settings.query_timeout, prepare).await {
            Ok(Ok(statements)) => statements,
            Ok(Err(e)) => {
                liveness.close.notify_one();
                return Err(e);
            }
            Err(_) => {
                liveness.close.notify_one();
                return Err(errors::no_answer(
                    "connect",
                    &session_setup,
                    settings.query_timeout,
                ));
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
    /// fencing), `None` if held elsewhere.
    pub(super) async fn try_lock(
        &self,
        key: i64,
        owner_digest: &str,
        fencing: bool,
    ) -> Result<Option<Option<i64>>, tokio_postgres::Error> {
        let statement = &self.statements.try_lock;
        let row = if fencing {
            self.client
                .query_opt(statement, &[&key, &owner_digest])
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

    /// Releases `key` if this session holds it; true if it did.
    pub(super) async fn unlock_if_held(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        let rows = self
            .client
            .query(&self.statements.unlock_if_held, &[&key])
            .await?;
        Ok(!rows.is_empty())
    }

    /// Bumps the fencing counter of `key`, held by this session.
    pub(super) async fn grant_token(
        &self,
        key: i64,
        owner_digest: &str,
    ) -> Result<Option<i64>, tokio_postgres::Error> {
        match &self.statements.grant_token {
            Some(statement) => self
                .client
                .query_one(statement, &[&key, &owner_digest])
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

fn spawn_driver(driver: super::tls::Driver, liveness: Arc<Liveness>, id: u64, on_closed: OnClosed) {
    tokio::spawn(async move {
        let why = tokio::select! {
            ended = driver => match ended {
                Ok(()) => "the connection was closed".to_owned(),
                Err(e) => errors::backend("hold", "the connection failed", e).to_string(),
            },
            () = liveness.close.notified() => "distlock closed the connection".to_owned(),
        };
        // The driver (and with it the socket) is dropped by now.
        liveness.closed.store(true, Ordering::Release);
        on_closed(id, &why);
    });
}

/// Sets the server's keepalive for this session, skipping settings the server
/// does not have (`tcp_user_timeout` is Postgres 12+). On a Unix socket the
/// server accepts and ignores them.
fn server_keepalive_sql(keepalive: TcpKeepalive) -> String {
    format!(
        "SELECT set_config(s.name, s.value, false) FROM (VALUES \
         ('tcp_keepalives_idle', '{}s'), ('tcp_keepalives_interval', '{}s'), \
         ('tcp_keepalives_count', '{}'), ('tcp_user_timeout', '{}ms')) AS s(name, value) \
         WHERE s.name IN (SELECT name FROM pg_settings)",
        whole_seconds(keepalive.idle),
        whole_seconds(keepalive.interval),
        keepalive.retries,
        keepalive.user_timeout.as_millis(),
    )
}

fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs().max(1)
}
