//! The fencing-token table and every SQL statement the backend sends.
//!
//! One row per lock name; its `token` is bumped in the same round trip that
//! takes the lock, only if the lock was taken, and committed at once
//! (autocommit): tokens strictly increase across grants, clients and
//! restarts of either side. `owner_digest` records a digest of the holder's
//! owner token (never the token itself), so another client can tell "held
//! under that owner" from "held by somebody else".
//!
//! Statements are sent as text (a multi-statement query is one round trip)
//! and inline only values generated here: lock names (plain characters and
//! `~`, see [`super::lock_name`]), hex digests, integers, backquoted
//! identifiers and hex literals. Never caller text.

use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::errors;
use super::names::{hex_literal, name_literal, LockName};
use crate::inspect::GrantRecord;
use crate::sql::fencing::{Identifiers, RecordLiterals};
use crate::{Error, Result};

/// The default table name, in the URL's database.
pub const DEFAULT_TABLE: &str = crate::sql::fencing::DEFAULT_TABLE;

/// MySQL identifiers: 1 to 64 characters, no trailing space (MySQL refuses
/// those), backquoted with inner backquotes doubled.
#[derive(Debug)]
pub(crate) enum MysqlIdentifiers {}

impl Identifiers for MysqlIdentifiers {
    const MAX_LEN: usize = 64;
    const TOO_LONG: &'static str = "is longer than MySQL's 64-character identifier limit";
    fn len(name: &str) -> usize {
        name.chars().count()
    }
    fn other_problem(name: &str) -> Option<&'static str> {
        name.ends_with(' ').then_some("ends with a space")
    }
    fn quote(identifier: &str) -> String {
        format!("`{}`", identifier.replace('`', "``"))
    }
}

/// Where fencing counters live: a table, optionally in another database.
pub(super) type FencingTable = crate::sql::fencing::FencingTable<MysqlIdentifiers>;

/// The names of `table`'s columns.
fn columns_sql(table: &FencingTable) -> String {
    exists_sql(table).replacen(
        "SELECT COUNT(*) FROM information_schema.TABLES",
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS",
        1,
    )
}

/// `information_schema` condition matching `table`.
fn exists_sql(table: &FencingTable) -> String {
    let schema = match table.schema() {
        Some(schema) => format!("CONVERT({} USING utf8mb4)", hex_literal(schema.as_bytes())),
        None => "DATABASE()".to_owned(),
    };
    format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = {schema} \
         AND TABLE_NAME = CONVERT({} USING utf8mb4)",
        hex_literal(table.table().as_bytes())
    )
}

/// Creates `table` with `create` (a `CREATE TABLE IF NOT EXISTS`) unless it
/// exists. Checks first, so a user without `CREATE` works once the table
/// exists (MySQL checks the privilege even when the table is there).
/// `upgrade` lists columns added to the table after its first release
/// (name, definition): those missing from an existing table are added with
/// `ALTER TABLE` (MySQL has no `ADD COLUMN IF NOT EXISTS`, and checks the
/// privilege anyway, so only when some are missing).
pub(super) async fn ensure_table(
    conn: &mut mysql_async::Conn,
    table: &FencingTable,
    create: &str,
    upgrade: &[(&str, &str)],
    limit: Duration,
) -> Result<()> {
    let context = || format!("create the table {}", table.quoted());
    let work = async {
        let exists: Option<u64> = conn.query_first(exists_sql(table)).await?;
        if exists.unwrap_or(0) == 0 {
            conn.query_drop(create).await?;
            return Ok(());
        }
        upgrade_table(conn, table, upgrade).await
    };
    match tokio::time::timeout(limit, work).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(errors::driver("connect", context(), e)),
        Err(_) => Err(Error::DeadlineExceeded {
            backend: errors::BACKEND,
            operation: "connect",
            after: limit,
        }),
    }
}

async fn upgrade_table(
    conn: &mut mysql_async::Conn,
    table: &FencingTable,
    columns: &[(&str, &str)],
) -> Result<(), mysql_async::Error> {
    if columns.is_empty() {
        return Ok(());
    }
    let missing = |present: Vec<String>| -> Vec<String> {
        columns
            .iter()
            .filter(|(name, _)| !present.iter().any(|p| p.eq_ignore_ascii_case(name)))
            .map(|(name, definition)| format!("ADD COLUMN {name} {definition}"))
            .collect()
    };
    let add = missing(conn.query(columns_sql(table)).await?);
    if add.is_empty() {
        return Ok(());
    }
    let alter = format!("ALTER TABLE {} {}", table.quoted(), add.join(", "));
    match conn.query_drop(&alter).await {
        Ok(()) => Ok(()),
        // Another client added them first (duplicate column, 1060).
        Err(e) if missing(conn.query(columns_sql(table)).await?).is_empty() => {
            tracing::debug!(component = "distlock", backend = errors::BACKEND, error = %e, "the record columns were added concurrently");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The columns of a grant's record ([`GrantRecord`]), added after the
/// table's first release: nullable, so rows written before them (and by
/// older clients, which leave them alone) read as "no record".
pub(super) const RECORD_COLUMNS: [(&str, &str); 6] = [
    (
        "key_name",
        "TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
    ),
    ("session_id", "BIGINT UNSIGNED NULL"),
    ("ttl_ms", "BIGINT NULL"),
    (
        "holder_host",
        "TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
    ),
    ("holder_pid", "BIGINT NULL"),
    (
        "holder_label",
        "TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
    ),
];

/// Text as a SQL expression of hex digits: any characters, nothing to
/// escape, whatever the session's `sql_mode`.
fn text_literal(text: &str) -> String {
    format!("CONVERT({} USING utf8mb4)", hex_literal(text.as_bytes()))
}

/// What inspection reads of a hold, in this order: the holding connection
/// (NULL: free), then the lock's row, all NULL without one: `session_id`
/// (the row is the holder's only if it equals the holding connection),
/// `token`, the grant time in Unix milliseconds, `ttl_ms`, `holder_host`,
/// `holder_pid`, `holder_label`, `key_name`.
const RECORD_SELECT: &str =
    "f.session_id, f.token, CAST(UNIX_TIMESTAMP(f.granted_at) * 1000 AS SIGNED), \
     f.ttl_ms, f.holder_host, f.holder_pid, f.holder_label, f.key_name";

/// Where an attempt's answer is (see [`Sql::acquire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reading {
    /// One row: `GET_LOCK`'s answer, then the token (NULL without fencing
    /// or unless taken).
    Row,
    /// The OK packet of the fenced upsert: rows written (0: not taken) and
    /// the token as `LAST_INSERT_ID`.
    Written,
}

/// Every statement text, built from the locker's fencing table.
#[derive(Debug, Clone)]
pub(super) struct Sql {
    table: Option<String>,
    /// Grants write the holder's host, pid and label, which a release
    /// clears (`holder_record`, on by default).
    records_holder: bool,
}

impl Sql {
    pub(super) fn new(fencing: Option<&FencingTable>, records_holder: bool) -> Self {
        Sql {
            table: fencing.map(FencingTable::quoted),
            records_holder,
        }
    }

    /// True when leases get fencing tokens.
    pub(super) fn fencing(&self) -> bool {
        self.table.is_some()
    }

    /// `CREATE TABLE IF NOT EXISTS` for the fencing table.
    pub(super) fn create_table(table: &FencingTable) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\
                lock_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY, \
                token BIGINT NOT NULL, \
                owner_digest CHAR(32) CHARACTER SET ascii NOT NULL, \
                granted_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
                {}) ENGINE=InnoDB",
            table.quoted(),
            RECORD_COLUMNS
                .iter()
                .map(|(name, definition)| format!("{name} {definition}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// One attempt, waiting up to `wait` on the server (zero: not at all),
    /// and where its answer is ([`Reading`]). Without fencing it is
    /// `SELECT GET_LOCK(name, wait), NULL`.
    ///
    /// With fencing and no wait it is **one statement**, the lock taken in
    /// its `WHERE` and the counter bumped in its write:
    /// `INSERT … SELECT … FROM DUAL WHERE GET_LOCK(name, 0) = 1 ON DUPLICATE
    /// KEY UPDATE token = LAST_INSERT_ID(token + 1), …`. Taken, it inserts
    /// the row (token 1) or bumps it, and the OK packet carries the token
    /// (`LAST_INSERT_ID(expr)`, the documented counter idiom:
    /// <https://dev.mysql.com/doc/refman/8.0/en/information-functions.html#function_last-insert-id>)
    /// and a row count of 1 or 2; not taken, it writes nothing (count 0). A
    /// duplicate *primary key* takes an index-record lock, not a next-key
    /// lock (<https://dev.mysql.com/doc/refman/8.0/en/innodb-locks-set.html>),
    /// so grants of neighbouring names do not wait for each other's gaps.
    /// Against the five statements below it halves a fenced cycle's time on
    /// MariaDB. `VALUES(col)` reads the inserted row's values in the update
    /// arm (MySQL 8.0.20 deprecates it for a row alias MariaDB lacks; both
    /// accept it).
    ///
    /// With fencing and a wait it is five statements in one round trip:
    /// take the lock into a session variable; only if it was taken, bump the
    /// counter row, or insert it when there was none; read both back (one
    /// row: `GET_LOCK`'s answer, 1 taken, 0 timed out, NULL an error such as
    /// `KILL QUERY`, then the token). The wait is a statement of its own,
    /// before any table is touched: a write waiting on `GET_LOCK` in its
    /// `WHERE` would hold the table's metadata lock for the whole wait, and
    /// a `FLUSH TABLES WITH READ LOCK` (a backup) queued behind it would
    /// stall every writer of the server.
    ///
    /// Nobody else writes the row meanwhile: every writer holds the named
    /// lock. A failure after the lock was taken (the row locked by another
    /// client past `innodb_lock_wait_timeout`) leaves the lock held; the
    /// session runs [`Sql::undo`] before answering.
    pub(super) fn acquire(
        &self,
        name: &LockName<'_>,
        owner_digest: &str,
        wait: Duration,
        record: &GrantRecord<'_>,
    ) -> (String, Reading) {
        debug_assert!(owner_digest.bytes().all(|b| b.is_ascii_hexdigit()));
        let lit = name.literal();
        let seconds = wait_seconds(wait);
        let Some(table) = &self.table else {
            return (
                format!("SELECT GET_LOCK({lit}, {seconds}), NULL"),
                Reading::Row,
            );
        };
        let RecordLiterals {
            key_name,
            host,
            pid,
            label,
        } = RecordLiterals::new(record, text_literal);
        let ttl_ms = record.ttl_ms;
        let columns = "lock_name, token, owner_digest, key_name, ttl_ms, holder_host, holder_pid, \
                       holder_label, session_id";
        if wait.is_zero() {
            let sql = format!(
                "INSERT INTO {table} ({columns}) \
                 SELECT {lit}, LAST_INSERT_ID(1), '{owner_digest}', {key_name}, {ttl_ms}, {host}, \
                 {pid}, {label}, CONNECTION_ID() FROM DUAL WHERE GET_LOCK({lit}, 0) = 1 \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), \
                 owner_digest = VALUES(owner_digest), granted_at = CURRENT_TIMESTAMP(6), \
                 key_name = VALUES(key_name), ttl_ms = VALUES(ttl_ms), \
                 holder_host = VALUES(holder_host), holder_pid = VALUES(holder_pid), \
                 holder_label = VALUES(holder_label), session_id = VALUES(session_id)"
            );
            return (sql, Reading::Written);
        }
        // The record's text goes into session variables once, in the first
        // statement, for both the UPDATE and the INSERT to read.
        let sql = format!(
            "SET @distlock_got = GET_LOCK({lit}, {seconds}), @distlock_key = {key_name}, \
             @distlock_host = {host}, @distlock_label = {label}; \
             UPDATE {table} SET token = token + 1, owner_digest = '{owner_digest}', \
             granted_at = CURRENT_TIMESTAMP(6), key_name = @distlock_key, ttl_ms = {ttl_ms}, \
             holder_host = @distlock_host, holder_pid = {pid}, holder_label = @distlock_label, \
             session_id = CONNECTION_ID() WHERE lock_name = {lit} AND @distlock_got = 1; \
             SET @distlock_bumped = ROW_COUNT(); \
             INSERT INTO {table} ({columns}) \
             SELECT {lit}, 1, '{owner_digest}', @distlock_key, {ttl_ms}, @distlock_host, {pid}, \
             @distlock_label, CONNECTION_ID() FROM DUAL WHERE @distlock_got = 1 AND @distlock_bumped = 0; \
             SELECT @distlock_got, (SELECT token FROM {table} WHERE lock_name = {lit} AND @distlock_got = 1)"
        );
        (sql, Reading::Row)
    }

    /// Who holds `name`: one row, the holding connection (NULL: free) and
    /// the lock's record (see [`RECORD_SELECT`]).
    pub(super) fn inspect(&self, name: &LockName<'_>) -> String {
        let lit = name.literal();
        match &self.table {
            Some(table) => format!(
                "SELECT h.conn, {RECORD_SELECT} FROM (SELECT IS_USED_LOCK({lit}) AS conn) h \
                 LEFT JOIN {table} f ON f.lock_name = {lit}"
            ),
            None => format!(
                "SELECT IS_USED_LOCK({lit}), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"
            ),
        }
    }

    /// Every held lock whose recorded key starts with `prefix`, as
    /// [`Sql::inspect`] reports one, and then its lock name (whose
    /// namespace the caller checks: a table may be shared by several);
    /// `None` without the table (nothing names the locks). Scans the table:
    /// one row per name ever locked.
    pub(super) fn list(&self, prefix: &str) -> Option<String> {
        let table = self.table.as_ref()?;
        let prefix = format!("{} COLLATE utf8mb4_bin", text_literal(prefix));
        Some(format!(
            "SELECT * FROM (SELECT IS_USED_LOCK(f.lock_name) AS conn, {RECORD_SELECT}, f.lock_name FROM {table} f \
             WHERE LEFT(f.key_name, CHAR_LENGTH({prefix})) = {prefix}) h WHERE h.conn IS NOT NULL"
        ))
    }

    /// Ends connection `connection` if it still holds `name` (the check and
    /// the `KILL` in one round trip, through a prepared statement): answers
    /// 1 if it was killed, 0 if it no longer held the lock.
    pub(super) fn kill_holder(name: &LockName<'_>, connection: u64) -> String {
        let lit = name.literal();
        format!(
            "SET @distlock_kill = IF(IS_USED_LOCK({lit}) = {connection}, 'KILL {connection}', 'DO 0'); \
             PREPARE distlock_kill FROM @distlock_kill; EXECUTE distlock_kill; \
             DEALLOCATE PREPARE distlock_kill; SELECT @distlock_kill <> 'DO 0'"
        )
    }

    /// 1 while connection `connection` still holds `name`.
    pub(super) fn held_by(name: &LockName<'_>, connection: u64) -> String {
        format!(
            "SELECT COALESCE(IS_USED_LOCK({}) = {connection}, 0)",
            name.literal()
        )
    }

    /// Releases the lock if this session holds it, answering nothing: what
    /// an attempt whose outcome is unknown leaves behind. This session
    /// never holds the name for anyone else (see the registry), so this
    /// releases only what the attempt took.
    pub(super) fn undo(name: &LockName<'_>) -> String {
        format!("DO RELEASE_LOCK({})", name.literal())
    }

    /// 1 released, 0 held by another session, NULL no such lock. With
    /// fencing and the holder recorded it first clears the holder columns
    /// of the name's row if this session holds the lock and its grant wrote
    /// the row: host, pid and label (taken from a command line) describe a
    /// holder and are kept no longer than the grant; the token, grant time,
    /// key name, ttl and session id stay. The row is cleared while the lock
    /// is still held, so a next holder's record is never touched. (A session
    /// that dies holding the lock frees it without a statement: its record
    /// stays until the next grant overwrites it.) With `holder_record=off`
    /// this locker's grants wrote no holder, so there is nothing to clear:
    /// the release is the `RELEASE_LOCK` alone, a round trip without a row
    /// read or a commit.
    pub(super) fn release(&self, server: &str) -> String {
        let lit = name_literal(server);
        match self.table.as_ref().filter(|_| self.records_holder) {
            Some(table) => format!(
                "UPDATE {table} SET holder_host = NULL, holder_pid = NULL, holder_label = NULL \
                 WHERE lock_name = {lit} AND session_id = CONNECTION_ID() \
                 AND IS_USED_LOCK({lit}) = CONNECTION_ID() \
                 AND (holder_host IS NOT NULL OR holder_pid IS NOT NULL OR holder_label IS NOT NULL); \
                 SELECT RELEASE_LOCK({lit})"
            ),
            None => format!("SELECT RELEASE_LOCK({lit})"),
        }
    }

    /// The release alone, without clearing the holder record: what a
    /// release falls back to when the clearing `UPDATE` failed (and so the
    /// `RELEASE_LOCK` after it never ran). 1 released, 0 held by another
    /// session, NULL no such lock.
    pub(super) fn release_only(server: &str) -> String {
        format!("SELECT RELEASE_LOCK({})", name_literal(server))
    }

    /// 1 if this session holds the lock (and so, that it is alive).
    pub(super) fn holds(server: &str) -> String {
        format!(
            "SELECT COALESCE(IS_USED_LOCK({}) = CONNECTION_ID(), 0)",
            name_literal(server)
        )
    }

    /// [`Sql::holds`] of every server name in `servers` (as
    /// [`lock_name`](super::names::lock_name) makes them), one column each,
    /// in order: one statement for many locks (the keepalive's batch).
    pub(super) fn holds_many<'a>(servers: impl IntoIterator<Item = &'a str>) -> String {
        let columns: Vec<String> = servers
            .into_iter()
            .map(|server| {
                format!(
                    "COALESCE(IS_USED_LOCK({}) = CONNECTION_ID(), 0)",
                    name_literal(server)
                )
            })
            .collect();
        format!("SELECT {}", columns.join(", "))
    }

    /// The connection holding the lock (NULL if free) and, with fencing,
    /// whether its last grant was to `owner_digest` (NULL without a row).
    pub(super) fn holder(&self, server: &str, owner_digest: &str) -> String {
        let lit = name_literal(server);
        match &self.table {
            Some(table) => format!(
                "SELECT IS_USED_LOCK({lit}), \
                 (SELECT owner_digest = '{owner_digest}' FROM {table} WHERE lock_name = {lit})"
            ),
            None => format!("SELECT IS_USED_LOCK({lit}), NULL"),
        }
    }

    /// Takes the lock if free and, under it, deletes the counter row, then
    /// releases it; answers 1 if the name was free. Without fencing only
    /// says whether it is free.
    pub(super) fn forget(&self, name: &LockName<'_>) -> String {
        let lit = name.literal();
        match &self.table {
            Some(table) => format!(
                "SET @distlock_free = GET_LOCK({lit}, 0); \
                 DELETE FROM {table} WHERE lock_name = {lit} AND @distlock_free = 1; \
                 SELECT @distlock_free, IF(@distlock_free = 1, RELEASE_LOCK({lit}), NULL)"
            ),
            None => format!("SELECT IS_FREE_LOCK({lit}), NULL"),
        }
    }
}

/// The largest `GET_LOCK` timeout sent: a year. Longer waits are several.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(31_536_000);

/// `GET_LOCK`'s timeout in seconds with millisecond precision, rounded up
/// (a wait must not end before the caller's deadline), at most
/// [`MAX_WAIT`]. MariaDB and MySQL 5.7+ take fractional seconds.
fn wait_seconds(wait: Duration) -> String {
    if wait.is_zero() {
        return "0".to_owned();
    }
    let ms = wait.min(MAX_WAIT).as_nanos().div_ceil(1_000_000);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked_and_quoted() {
        let table = FencingTable::new(Some("ops"), "fence `v1`").unwrap();
        assert_eq!(table.quoted(), "`ops`.`fence ``v1```");
        assert_eq!(FencingTable::default().quoted(), "`distlock_fencing`");
        for (schema, table) in [
            (None, ""),
            (Some(""), "t"),
            (None, "a.b"),
            (None, "nul\0"),
            (None, "trailing "),
        ] {
            assert!(
                FencingTable::new(schema, table).is_err(),
                "{schema:?} {table:?}"
            );
        }
        assert!(FencingTable::new(None, &"x".repeat(65)).is_err());
    }

    #[test]
    fn wait_timeouts_round_up_to_milliseconds() {
        assert_eq!(wait_seconds(Duration::ZERO), "0");
        assert_eq!(wait_seconds(Duration::from_micros(1)), "0.001");
        assert_eq!(wait_seconds(Duration::from_millis(1500)), "1.500");
        assert_eq!(wait_seconds(Duration::MAX), "31536000.000");
    }

    #[test]
    fn a_fenced_attempt_is_one_statement_unless_it_waits() {
        let table = FencingTable::new(None, "distlock_fencing").expect("valid");
        let sql = Sql::new(Some(&table), true);
        let name = LockName::new("", "k");
        let record = GrantRecord::new("k;", Duration::from_secs(1), true);
        let (tried, reading) = sql.acquire(&name, "ab", Duration::ZERO, &record);
        assert_eq!(reading, Reading::Written);
        assert!(!tried.contains(';'), "one statement: {tried}");
        assert!(tried.contains("WHERE GET_LOCK('"), "{tried}");
        let (waited, reading) = sql.acquire(&name, "ab", Duration::from_secs(2), &record);
        assert_eq!(reading, Reading::Row);
        assert!(
            waited.starts_with("SET @distlock_got = GET_LOCK(") && waited.contains(", 2.000)"),
            "the wait before any table is touched: {waited}"
        );
        assert!(sql.release("n").starts_with("UPDATE"), "clears the holder");
        let unrecorded = Sql::new(Some(&table), false);
        let release = unrecorded.release("n");
        assert!(
            release.starts_with("SELECT RELEASE_LOCK(") && !release.contains(';'),
            "holder_record=off: nothing to clear, {release}"
        );
    }

    #[test]
    fn without_fencing_no_statement_names_a_table() {
        let sql = Sql::new(None, true);
        let name = LockName::new("", "k");
        let record = GrantRecord::new("k", Duration::from_secs(1), true);
        for wait in [Duration::ZERO, Duration::from_secs(1)] {
            let (acquire, reading) = sql.acquire(&name, "ab", wait, &record);
            assert!(
                !acquire.contains("INSERT") && reading == Reading::Row,
                "{acquire}"
            );
        }
        assert!(!sql.forget(&name).contains("DELETE"));
    }
}
