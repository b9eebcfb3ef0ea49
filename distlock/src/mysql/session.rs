//! One MySQL session: a connection owned by a task of its own (its actor),
//! the statements sent to it, and the news of its death.
//!
//! A mysql_async `Conn` answers one statement at a time and is not safe to
//! abandon halfway through a statement (its next user would read the rest
//! of the old answer). So no caller ever touches it: callers queue requests
//! to the actor and wait for the answer, and a caller that stops waiting
//! (cancelled, timed out) abandons only its wait, never the statement. What
//! the statement did is undone by the actor if nobody takes the answer
//! (see [`Answer`]).
//!
//! The actor also keeps the session alive and watched: a connection that
//! has been idle for `ping_interval` is pinged, which keeps it inside the
//! `wait_timeout` it set for itself and finds out within about a second
//! that it was killed; a ping or statement unanswered for its bound closes
//! the connection. When the connection is gone, the actor reports it once,
//! so every lease held on it fires its lost signal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::config::Settings;
use super::errors::{self, is_fatal, ExecError};
use crate::deadline::bounded;
use crate::sql::dialect::Context;
use crate::Result;

pub(super) use crate::sql::pool::{OnClosed, Role};

/// Something to drop once a request is settled: the reservation of the key
/// an attempt took, released only after its undo (if any) has run.
pub(super) type Keep = Box<dyn Send>;

pub(crate) struct Session {
    pub(super) id: u64,
    pub(super) role: Role,
    /// The server's id of this connection (`CONNECTION_ID()`), for `KILL`.
    pub(super) connection_id: u32,
    requests: mpsc::UnboundedSender<Queued>,
    closed: Arc<AtomicBool>,
}

/// A statement for the actor.
pub(super) struct Request {
    pub(super) sql: String,
    /// How long the statement may run before the session is closed.
    pub(super) limit: Duration,
    /// Run if the statement fails on the server, or if nobody takes its
    /// answer: releases whatever lock it may have taken.
    pub(super) undo: Option<String>,
    /// Dropped once the request is settled (answer taken, or undo run).
    pub(super) keep: Option<Keep>,
    /// A native wait: if its caller gives up while it runs, close the
    /// connection rather than wait for the server to answer.
    pub(super) close_if_abandoned: bool,
}

impl Request {
    /// A plain statement, with nothing to undo.
    pub(super) fn new(sql: String, limit: Duration) -> Self {
        Request {
            sql,
            limit,
            undo: None,
            keep: None,
            close_if_abandoned: false,
        }
    }
}

struct Queued {
    request: Request,
    reply: oneshot::Sender<Result<Answer, ExecError>>,
}

/// The rows of a statement's last result set, and what the last statement
/// wrote. Dropped without [`settle`](Answer::settle), it has the actor run
/// the request's undo (a caller that got a grant but could not record it,
/// or a caller gone before it read the answer, leaves nothing held).
pub(super) struct Answer {
    pub(super) rows: Vec<Row>,
    pub(super) written: Written,
    settle: Settle,
}

/// The OK packet of a query's last statement: what a write answers
/// without a result set (`INSERT … ON DUPLICATE KEY UPDATE`: 1 inserted,
/// 2 updated, 0 nothing; the value of its last `LAST_INSERT_ID(expr)`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Written {
    pub(super) affected_rows: u64,
    /// `None` for 0: the server sends 0 when nothing set it.
    pub(super) last_insert_id: Option<u64>,
}

impl Answer {
    /// The answer is acted on: nothing to undo; the request's `keep` is
    /// dropped now.
    pub(super) fn settle(mut self) {
        self.settle.undo = None;
    }

    /// A column of the first (only) row, as an integer (`None` for NULL).
    pub(super) fn int(&self, column: usize) -> Result<Option<i64>, String> {
        let Some(row) = self.rows.first() else {
            return Err("the server returned no row".into());
        };
        match row.get_opt::<Option<i64>, usize>(column) {
            Some(Ok(value)) => Ok(value),
            Some(Err(e)) => Err(format!("column {column} is not an integer: {e}")),
            None => Err(format!("the answer has no column {column}")),
        }
    }

    /// [`int`](Self::int), a problem being an error of `operation`.
    pub(super) fn int_in(
        &self,
        column: usize,
        operation: &'static str,
        context: Context<'_>,
    ) -> Result<Option<i64>> {
        self.int(column)
            .map_err(|why| errors::malformed(operation, context, why))
    }
}

struct Settle {
    undo: Option<(String, Duration, mpsc::UnboundedSender<Queued>)>,
    keep: Option<Keep>,
}

impl Drop for Settle {
    fn drop(&mut self) {
        let Some((sql, limit, requests)) = self.undo.take() else {
            return;
        };
        let (reply, _) = oneshot::channel();
        let request = Request {
            sql,
            limit,
            undo: None,
            keep: self.keep.take(),
            close_if_abandoned: false,
        };
        // If the actor is gone, so is the connection: the server has
        // released the lock (or will, once it notices).
        let _ = requests.send(Queued { request, reply });
    }
}

impl Session {
    /// Connects: with TLS unless `ssl-mode=DISABLED`, and under `PREFERRED`
    /// without it if the server offers none. The caller may use the
    /// connection (to create tables) before it hands it to
    /// [`start`](Self::start).
    ///
    /// The connection is opened as the `ssl-mode` says (see
    /// [`ConnectOptions::connect`](super::config::ConnectOptions::connect));
    /// both attempts of `PREFERRED` share one bound, `connect_timeout +
    /// query_timeout`.
    pub(super) async fn open(
        settings: &Settings,
        id: u64,
        role: Role,
    ) -> Result<(Arc<Session>, Conn, Incoming)> {
        let limit = settings
            .connect_timeout
            .saturating_add(settings.query_timeout);
        let context = || format!("cannot connect to {}", settings.target);
        let bound_by = "connect_timeout= plus query_timeout= in the URL";
        let connecting = settings.connect.connect(context);
        let conn = crate::deadline::connect::bounded_connect(
            errors::BACKEND,
            &settings.target,
            bound_by,
            limit,
            connecting,
        )
        .await?;
        let (requests, incoming) = mpsc::unbounded_channel();
        let closed = Arc::new(AtomicBool::new(false));
        let session = Arc::new(Session {
            id,
            role,
            connection_id: conn.id(),
            requests,
            closed: closed.clone(),
        });
        Ok((session, conn, Incoming(incoming)))
    }

    /// Starts the actor on `conn` (see [`open`](Self::open)).
    /// `waiter_permit` is held for as long as the connection is open.
    pub(super) fn start(
        self: &Arc<Self>,
        conn: Conn,
        incoming: Incoming,
        settings: Arc<Settings>,
        waiter_permit: Option<OwnedSemaphorePermit>,
        on_closed: OnClosed,
    ) {
        let actor = Actor {
            conn,
            incoming: incoming.0,
            requests: self.requests.downgrade(),
            closed: self.closed.clone(),
            settings,
            id: self.id,
            last_heard: Instant::now(),
            kept: Vec::new(),
        };
        tokio::spawn(actor.run(waiter_permit, on_closed));
    }

    /// True once the connection is gone (or going): nothing it held is held.
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.requests.is_closed()
    }

    /// Queues `request` and waits for its answer. The request is queued
    /// before the first await, so requests made one after another by one
    /// caller run in that order.
    pub(super) async fn run(&self, request: Request) -> Result<Answer, ExecError> {
        let (reply, answer) = oneshot::channel();
        if self.requests.send(Queued { request, reply }).is_err() {
            return Err(ExecError::Closed("the connection is gone".into()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(ExecError::Closed("the connection ended first".into())))
    }

    /// [`run`](Self::run)s `request` for `operation`: bounded by its
    /// `limit`, a failure described with `context`.
    pub(super) async fn ask(
        &self,
        request: Request,
        operation: &'static str,
        context: Context<'_>,
    ) -> Result<Answer> {
        bounded(errors::BACKEND, operation, request.limit, async {
            self.run(request)
                .await
                .map_err(|e| errors::backend(operation, context(), e))
        })
        .await
    }
}

/// How late a deadline may be noticed before the delay is taken for a stall
/// of this process rather than the server's silence.
const STALL_TOLERANCE: Duration = Duration::from_millis(500);

/// The receiving end of a session's requests, between open and start.
pub(super) struct Incoming(mpsc::UnboundedReceiver<Queued>);

/// Why the actor stopped.
enum End {
    /// Every handle to the session is gone: close politely.
    Dropped,
    /// The server closed or broke the connection, or a statement failed in
    /// a way that leaves the connection unusable.
    Failed(String),
    /// The server went silent (a ping or statement unanswered in time).
    Silent(String),
    /// A native wait's caller gave up while the server was still waiting.
    Abandoned,
}

struct Actor {
    conn: Conn,
    incoming: mpsc::UnboundedReceiver<Queued>,
    requests: mpsc::WeakUnboundedSender<Queued>,
    closed: Arc<AtomicBool>,
    settings: Arc<Settings>,
    id: u64,
    last_heard: Instant,
    /// `keep`s of requests that failed with the connection: dropped only
    /// after the death has been reported.
    kept: Vec<Keep>,
}

impl Actor {
    async fn run(mut self, waiter_permit: Option<OwnedSemaphorePermit>, on_closed: OnClosed) {
        let end = self.serve().await;
        self.closed.store(true, Ordering::Release);
        let (why, grace) = match &end {
            End::Dropped => ("distlock closed the connection".to_owned(), Duration::ZERO),
            End::Failed(why) => (why.clone(), Duration::ZERO),
            End::Silent(why) => (
                why.clone(),
                self.last_heard
                    .checked_add(self.settings.server_window())
                    .map_or(Duration::ZERO, |until| {
                        until.saturating_duration_since(Instant::now())
                    }),
            ),
            End::Abandoned => ("a native wait was abandoned".to_owned(), Duration::ZERO),
        };
        let Actor {
            conn,
            mut incoming,
            kept,
            settings,
            ..
        } = self;
        let conn = match end {
            End::Dropped => {
                // COM_QUIT: the server ends the session at once.
                let _ = tokio::time::timeout(settings.query_timeout, conn.disconnect()).await;
                None
            }
            // Kept open through the grace (below): closing it now would
            // free the session's locks at once if the server is alive after
            // all (slow, or stalled itself), under holders still inside it.
            End::Silent(_) => Some(conn),
            End::Failed(_) | End::Abandoned => None,
        };
        on_closed(self.id, &why, grace);
        // Requests still queued never ran: their callers learn the session
        // is gone, and their reservations end after the death was reported.
        incoming.close();
        while let Ok(queued) = incoming.try_recv() {
            let _ = queued.reply.send(Err(ExecError::Closed(why.clone())));
        }
        if let Some(conn) = conn {
            tokio::time::sleep(grace).await;
            drop(conn);
        }
        drop(waiter_permit);
        drop(kept);
    }

    async fn serve(&mut self) -> End {
        loop {
            let ping_at = self.last_heard + self.settings.ping_interval;
            let queued = tokio::select! {
                queued = self.incoming.recv() => match queued {
                    Some(queued) => queued,
                    None => return End::Dropped,
                },
                () = tokio::time::sleep_until(ping_at) => {
                    if let Some(end) = self.ping().await {
                        return end;
                    }
                    continue;
                }
            };
            if let Some(end) = self.handle(queued).await {
                return end;
            }
        }
    }

    /// Pings the server. Unanswered for `query_timeout`, the server went
    /// silent, unless the deadline itself was noticed more than
    /// [`STALL_TOLERANCE`] late: then this process stalled (SIGSTOP, a
    /// frozen VM, a starved runtime), the answer may be waiting unread, and
    /// the same ping is given another `query_timeout` (a ping cannot be
    /// abandoned halfway: the connection would read its answer as the next
    /// statement's).
    async fn ping(&mut self) -> Option<End> {
        let limit = self.settings.query_timeout;
        // An answer later than the server window would come too late to
        // matter: the server may free the locks first. Give up now, while
        // the leases still have what is left of it (this also bounds how
        // long stalls of this process can put the verdict off).
        let window_left = self
            .last_heard
            .checked_add(self.settings.server_window())
            .map_or(Duration::ZERO, |until| {
                until.saturating_duration_since(Instant::now())
            });
        if window_left < limit {
            return Some(End::Silent(format!(
                "no answer from the server for {:?}, too long to wait for a ping",
                self.last_heard.elapsed()
            )));
        }
        let ping = self.conn.ping();
        tokio::pin!(ping);
        loop {
            let waiting_since = Instant::now();
            tokio::select! {
                // An answer that is ready wins over a deadline noticed at the
                // same time.
                biased;
                answered = &mut ping => {
                    return match answered {
                        Ok(()) => {
                            self.last_heard = Instant::now();
                            None
                        }
                        Err(e) => Some(End::Failed(format!("a ping failed: {e}"))),
                    };
                }
                () = tokio::time::sleep(limit) => {
                    let late = waiting_since.elapsed().saturating_sub(limit);
                    if late <= STALL_TOLERANCE {
                        return Some(End::Silent(format!(
                            "the server did not answer a ping within {limit:?}"
                        )));
                    }
                }
            }
        }
    }

    async fn handle(&mut self, queued: Queued) -> Option<End> {
        let Queued { request, mut reply } = queued;
        if reply.is_closed() {
            // Nobody waits for it any more and nothing was sent: skip it.
            return None;
        }
        let Request {
            sql,
            limit,
            undo,
            keep,
            close_if_abandoned,
        } = request;
        let outcome = {
            let statement = tokio::time::timeout(limit, execute(&mut self.conn, &sql));
            if close_if_abandoned {
                tokio::select! {
                    outcome = statement => outcome,
                    () = reply.closed() => return Some(End::Abandoned),
                }
            } else {
                statement.await
            }
        };
        match outcome {
            Ok(Ok((rows, written))) => {
                self.last_heard = Instant::now();
                let settle = Settle {
                    undo: undo.and_then(|sql| {
                        Some((sql, self.settings.query_timeout, self.requests.upgrade()?))
                    }),
                    keep,
                };
                // Undelivered, the answer drops here and queues its undo.
                let _ = reply.send(Ok(Answer {
                    rows,
                    written,
                    settle,
                }));
                None
            }
            Ok(Err(e)) if !is_fatal(&e) => {
                self.last_heard = Instant::now();
                // The statement may have taken the lock before it failed.
                let end = match undo {
                    Some(undo) => self.undo(&undo).await,
                    None => None,
                };
                let _ = reply.send(Err(ExecError::Mysql(e)));
                self.kept.extend(keep.filter(|_| end.is_some()));
                end
            }
            Ok(Err(e)) => {
                let why = format!("the connection failed: {e}");
                let _ = reply.send(Err(ExecError::Mysql(e)));
                self.kept.extend(keep);
                Some(End::Failed(why))
            }
            Err(_) => {
                let _ = reply.send(Err(ExecError::Timeout(limit)));
                self.kept.extend(keep);
                Some(End::Silent(format!(
                    "a statement went unanswered for {limit:?}"
                )))
            }
        }
    }

    /// Runs an undo; if it fails, the connection is closed, which frees
    /// every lock on it.
    async fn undo(&mut self, sql: &str) -> Option<End> {
        let limit = self.settings.query_timeout;
        match tokio::time::timeout(limit, execute(&mut self.conn, sql)).await {
            Ok(Ok(_)) => {
                self.last_heard = Instant::now();
                None
            }
            Ok(Err(e)) => Some(End::Failed(format!(
                "releasing the lock of a failed or abandoned attempt failed ({e}); \
                 closing the session, which frees every lock on it"
            ))),
            Err(_) => Some(End::Silent(format!(
                "releasing the lock of a failed or abandoned attempt went unanswered for {limit:?}"
            ))),
        }
    }
}

/// Runs a (multi-)statement query and returns the rows of its last result
/// set that has columns and the last statement's OK packet, or the error of
/// the statement that failed (the server runs none after it).
async fn execute(conn: &mut Conn, sql: &str) -> Result<(Vec<Row>, Written), mysql_async::Error> {
    let mut result = conn.query_iter(sql).await?;
    let mut last = Vec::new();
    loop {
        let has_columns = !result.columns_ref().is_empty();
        let rows: Vec<Row> = result.collect().await?;
        if has_columns {
            last = rows;
        }
        if result.is_empty() {
            break;
        }
    }
    // A later statement's error is kept as the result's pending state,
    // which `is_empty` does not report: read it out now, or it would fail
    // the next, unrelated statement on this connection.
    result.drop_result().await?;
    let written = Written {
        affected_rows: conn.affected_rows(),
        last_insert_id: conn.last_insert_id(),
    };
    Ok((last, written))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure in the middle of a multi-statement query is that query's
    /// error (mysql_async keeps it pending where `is_empty` does not see
    /// it), and the next query on the connection is unaffected.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_statement_fails_its_own_query_only() {
        let server = test_servers::MariaDbServer::start();
        let url = server.url().replace("?ssl-mode=DISABLED", "");
        let mut conn = Conn::from_url(url).await.unwrap();
        let text = |rows: Vec<Row>| -> Vec<Vec<Option<String>>> {
            rows.into_iter()
                .map(|row| (0..row.len()).map(|i| row.get(i)).collect())
                .collect()
        };
        let (rows, _) = execute(&mut conn, "SET @a = 2; DO 1; SELECT @a, 5")
            .await
            .unwrap();
        assert_eq!(text(rows), [[Some("2".into()), Some("5".into())]]);
        let err = execute(&mut conn, "SET @a = 3; SELECT nosuchcolumn; SELECT @a")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, mysql_async::Error::Server(e) if e.code == 1054),
            "{err}"
        );
        let (rows, _) = execute(&mut conn, "SELECT 7").await.unwrap();
        assert_eq!(text(rows), [[Some("7".into())]]);
    }
}
