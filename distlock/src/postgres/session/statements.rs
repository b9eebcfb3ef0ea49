//! The statements a session sends: prepared once when it opens (pipelined,
//! about one round trip), then each sent with its answer recorded on the
//! session's [`Liveness`](super::liveness::Liveness), which is how the watch
//! knows the server is there.

use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, SimpleQueryMessage, Statement};

use super::liveness::{WaitInFlight, ANSWER_TRAVEL_ALLOWANCE};
use super::{Session, WaitError};
use crate::postgres::fencing::{GrantRecord, Sql};

pub(super) struct Statements {
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

impl Statements {
    /// Prepares every statement of a session, pipelined: all are sent before
    /// any answer is awaited. The fencing table, which they name, must
    /// exist.
    pub(super) async fn prepare(client: &Client, sql: &Sql) -> Result<Self, tokio_postgres::Error> {
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
            try_lock,
            (try_lock_any, unlock_any_if_held),
            unlock,
            holds,
            lost_among,
            unlock_if_held,
            grant_token,
            shared,
        ) = tokio::try_join!(
            client.prepare(&sql.try_lock),
            any,
            client.prepare(&sql.unlock),
            client.prepare(&sql.holds),
            client.prepare(&sql.lost_among),
            client.prepare(&sql.unlock_if_held),
            grant_token,
            shared,
        )?;
        Ok(Statements {
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
    }
}

impl Session {
    /// Sends a prepared statement expecting one row, and records its answer.
    async fn query_one(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        let sent = Instant::now();
        let row = self.client.query_one(statement, params).await;
        self.liveness.observe(sent, row)
    }

    /// Sends a prepared statement expecting at most one row, and records
    /// its answer.
    async fn query_opt(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        let sent = Instant::now();
        let row = self.client.query_opt(statement, params).await;
        self.liveness.observe(sent, row)
    }

    /// A yes-or-no question about one key: the first column of the one
    /// row `statement` answers.
    async fn ask(&self, statement: &Statement, key: i64) -> Result<bool, tokio_postgres::Error> {
        self.query_one(statement, &[&key]).await?.try_get(0)
    }

    /// True if `statement` about one key returns any row (the `..._if_held`
    /// releases return a row only where they released something).
    async fn any_row(
        &self,
        statement: &Statement,
        key: i64,
    ) -> Result<bool, tokio_postgres::Error> {
        Ok(!self.query(statement, &[&key]).await?.is_empty())
    }

    /// Sends a statement (prepared, or not on rare paths) returning rows,
    /// and records its answer.
    pub(in crate::postgres) async fn query(
        &self,
        statement: &(impl tokio_postgres::ToStatement + ?Sized),
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let sent = Instant::now();
        let rows = self.client.query(statement, params).await;
        self.liveness.observe(sent, rows)
    }

    /// One attempt: `Some(token)` if acquired (`token` is `None` without
    /// fencing), `None` if held elsewhere. With fencing the grant writes
    /// `record` into the key's row.
    pub(in crate::postgres) async fn try_lock(
        &self,
        key: i64,
        owner_digest: &str,
        record: &GrantRecord<'_>,
        fencing: bool,
    ) -> Result<Option<Option<i64>>, tokio_postgres::Error> {
        let statement = &self.statements.try_lock;
        let row = if fencing {
            let params = record_params(&key, &owner_digest, record);
            self.query_opt(statement, &params).await?
        } else {
            self.query_opt(statement, &[&key]).await?
        };
        row.map(|row| row.try_get::<_, Option<i64>>(0)).transpose()
    }

    /// One attempt over `keys` in order ([`Sql::try_lock_any`]): the key
    /// taken and its token (`None` without fencing), or `None` if every key
    /// was held elsewhere. `names` are the keys' recorded names, in the
    /// same order; with fencing the grant writes `record` (whose own
    /// `key_name` is not used) and the taken key's name into its row.
    pub(in crate::postgres) async fn try_lock_any(
        &self,
        keys: &[i64],
        names: &[Option<&str>],
        owner_digest: &str,
        record: &GrantRecord<'_>,
        fencing: bool,
    ) -> Result<Option<(i64, Option<i64>)>, tokio_postgres::Error> {
        let statement = &self.statements.try_lock_any;
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
            self.query_opt(statement, &params).await?
        } else {
            self.query_opt(statement, &[&keys]).await?
        };
        row.map(|row| Ok((row.try_get(1)?, row.try_get(0)?)))
            .transpose()
    }

    /// Releases every one of `keys` this session holds exclusively (one
    /// hold each): how many it released.
    pub(in crate::postgres) async fn unlock_any_if_held(
        &self,
        keys: &[i64],
    ) -> Result<usize, tokio_postgres::Error> {
        let rows = self
            .query(&self.statements.unlock_any_if_held, &[&keys])
            .await?;
        Ok(rows.len())
    }

    /// Releases one hold of `key`: true if this session held it.
    pub(in crate::postgres) async fn unlock(
        &self,
        key: i64,
    ) -> Result<bool, tokio_postgres::Error> {
        self.ask(&self.statements.unlock, key).await
    }

    /// True if this session holds `key` (and so, that the session is alive).
    pub(in crate::postgres) async fn holds(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        self.ask(&self.statements.holds, key).await
    }

    /// Which of `keys` this session does not hold (in no particular order).
    pub(in crate::postgres) async fn lost_among(
        &self,
        keys: &[i64],
    ) -> Result<Vec<i64>, tokio_postgres::Error> {
        let rows = self.query(&self.statements.lost_among, &[&keys]).await?;
        rows.iter().map(|row| row.try_get(0)).collect()
    }

    /// Releases `key` if this session holds it; true if it did.
    pub(in crate::postgres) async fn unlock_if_held(
        &self,
        key: i64,
    ) -> Result<bool, tokio_postgres::Error> {
        self.any_row(&self.statements.unlock_if_held, key).await
    }

    /// One shared attempt: `Some(token)` if this session now holds `key`
    /// shared (`token`, the key's counter, is `None` without fencing),
    /// `None` if it is held exclusively or an exclusive request waits for
    /// it. With fencing the counter is read by a second statement sent
    /// with the first (one round trip): its own snapshot, taken once the
    /// lock is held, sees every writer's bump before it released the key.
    pub(in crate::postgres) async fn try_lock_shared(
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
    pub(in crate::postgres) async fn reader_token(
        &self,
        key: i64,
    ) -> Result<Option<i64>, tokio_postgres::Error> {
        let Some(read) = &self.statements.shared.reader_token else {
            return Ok(None);
        };
        self.query_one(read, &[&key]).await?.try_get(0).map(Some)
    }

    /// True if an exclusive request for `key` waits on the server.
    pub(in crate::postgres) async fn writer_queued(
        &self,
        key: i64,
    ) -> Result<bool, tokio_postgres::Error> {
        self.ask(&self.statements.shared.writer_queued, key).await
    }

    /// Releases one shared hold of `key`: true if this session held it
    /// shared.
    pub(in crate::postgres) async fn unlock_shared(
        &self,
        key: i64,
    ) -> Result<bool, tokio_postgres::Error> {
        self.ask(&self.statements.shared.unlock, key).await
    }

    /// Releases `key`'s shared hold if this session has one; true if it
    /// did.
    pub(in crate::postgres) async fn unlock_shared_if_held(
        &self,
        key: i64,
    ) -> Result<bool, tokio_postgres::Error> {
        self.any_row(&self.statements.shared.unlock_if_held, key)
            .await
    }

    /// Bumps the fencing counter of `key`, held by this session, and writes
    /// `record` into its row.
    pub(in crate::postgres) async fn grant_token(
        &self,
        key: i64,
        owner_digest: &str,
        record: &GrantRecord<'_>,
    ) -> Result<Option<i64>, tokio_postgres::Error> {
        match &self.statements.grant_token {
            Some(statement) => {
                let params = record_params(&key, &owner_digest, record);
                self.query_one(statement, &params)
                    .await?
                    .try_get(0)
                    .map(Some)
            }
            None => Ok(None),
        }
    }

    /// Runs a native wait ([`Sql::wait`]); returns the fencing token of the
    /// grant (`None` without fencing).
    pub(in crate::postgres) async fn wait(
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
