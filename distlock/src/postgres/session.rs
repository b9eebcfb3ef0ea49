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
//!
//! Split by role: the session and its opening here, the statements it sends
//! in [`statements`], the setup statement in [`setup`], and the driver task
//! and the watch in [`liveness`].

mod liveness;
mod setup;
mod statements;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_postgres::{CancelToken, Client};

use self::liveness::{spawn_driver, spawn_watch, Liveness};
use self::setup::{session_setup_sql, warn_if_idle_session_timeout_is_missing};
use self::statements::Statements;
use super::config::Settings;
use super::errors::{self, BACKEND};
use super::fencing::{self, Sql};
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
        let (client, driver) = crate::deadline::connect::bounded_connect(
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
            // Pipelined: the setup statement is sent first, then every
            // statement to prepare, before any answer is awaited.
            let ((), statements) = tokio::try_join!(setup, Statements::prepare(&client, sql))
                .map_err(|e| {
                    errors::backend(
                        "connect",
                        format!("set up a session on {}", settings.target),
                        e,
                    )
                })?;
            Ok::<_, Error>(statements)
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
