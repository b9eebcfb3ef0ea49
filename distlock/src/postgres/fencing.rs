//! The fencing-token table and every SQL statement the backend sends.
//!
//! One row per advisory key; its `token` is bumped in the statement that takes
//! the lock, while the lock is held, in a committed transaction. Tokens
//! therefore strictly increase across grants, clients and restarts of either
//! side (the row is durable like any other). The `owner_digest` column records
//! a digest of the holder's owner token (never the token itself), so another
//! client can tell "held under that owner" from "not held by that owner".

use tokio_postgres::Client;

use super::errors::{self, is_concurrent_create, is_insufficient_privilege};
pub(super) use crate::inspect::GrantRecord;
use crate::sql::fencing::{Identifiers, RecordLiterals};
use crate::Result;

/// The default table name, in the connection's current schema.
pub const DEFAULT_TABLE: &str = crate::sql::fencing::DEFAULT_TABLE;

/// Postgres identifiers: 1 to 63 bytes (longer ones are silently truncated
/// by the server, which would make two names one table), quoted in double
/// quotes with inner quotes doubled, so any name (mixed case, spaces,
/// keywords) means exactly itself.
#[derive(Debug)]
pub(crate) enum PostgresIdentifiers {}

impl Identifiers for PostgresIdentifiers {
    const MAX_LEN: usize = 63;
    const TOO_LONG: &'static str = "is longer than Postgres' 63-byte identifier limit";
    fn len(name: &str) -> usize {
        name.len()
    }
    fn quote(identifier: &str) -> String {
        format!("\"{}\"", identifier.replace('"', "\"\""))
    }
}

/// Where fencing counters live: a table, optionally schema-qualified.
pub(super) type FencingTable = crate::sql::fencing::FencingTable<PostgresIdentifiers>;

/// Creates the table if it does not exist yet.
///
/// Checks first, so a role without `CREATE` on the schema works once the
/// table exists. Concurrent creation by several clients is expected (tests,
/// a fleet starting at once): Postgres reports the loser of that race as a
/// unique or duplicate-table violation, which here means "it exists now".
pub(super) async fn ensure_table(client: &Client, table: &FencingTable) -> Result<()> {
    let name = table.quoted();
    let context = || format!("create the fencing table {name}");
    let (exists, record_columns) = table_state(client, &name)
        .await
        .map_err(|e| errors::backend("connect", context(), e))?;
    if exists {
        return upgrade_table(client, &name, record_columns).await;
    }
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {name} (\
            lock_key bigint PRIMARY KEY, \
            token bigint NOT NULL, \
            owner_digest text NOT NULL, \
            granted_at timestamptz NOT NULL DEFAULT now(), \
            {RECORD_COLUMN_DEFINITIONS})"
    );
    match client.batch_execute(&create).await {
        Ok(()) => Ok(()),
        Err(e) if is_concurrent_create(&e) => match table_state(client, &name).await {
            Ok((true, columns)) => upgrade_table(client, &name, columns).await,
            _ => Err(errors::backend("connect", context(), e)),
        },
        Err(e) if is_insufficient_privilege(&e) => Err(errors::backend_with_next_step(
            "connect",
            context(),
            e,
            cannot_create(&name, &create),
        )),
        Err(e) => Err(errors::backend("connect", context(), e)),
    }
}

/// What to do when the role may not create the fencing table `name`
/// (`create` is the statement): Postgres 15 took `CREATE` on schema
/// `public` from every role, so an application role often cannot.
fn cannot_create(name: &str, create: &str) -> String {
    format!(
        "the role may not create tables in that schema (Postgres 15 and later grant no \
         CREATE on schema public): have the schema's owner run once `{create}; GRANT SELECT, \
         INSERT, UPDATE, DELETE ON {name} TO <the role>`, or set fencing_table=<schema>.<table> \
         to a schema the role may create in, or fencing=off to lock without fencing tokens"
    )
}

/// The columns of a grant's record (see [`GrantRecord`]), added after the
/// table's first release: nullable, so rows written before them (and by
/// older clients, which leave them alone) read as "no record".
const RECORD_COLUMNS: [(&str, &str); 6] = [
    ("key_name", "text"),
    ("session_pid", "integer"),
    ("ttl_ms", "bigint"),
    ("holder_host", "text"),
    ("holder_pid", "bigint"),
    ("holder_label", "text"),
];

const RECORD_COLUMN_DEFINITIONS: &str = "key_name text, session_pid integer, ttl_ms bigint, \
     holder_host text, holder_pid bigint, holder_label text";

/// Adds the record columns to a table created before them. Only when some
/// are missing: `ALTER TABLE` needs the table's owner even with
/// `IF NOT EXISTS`, so a role that only writes rows keeps working on an
/// upgraded table. Concurrent upgrades queue on the table's lock, and
/// `IF NOT EXISTS` makes the later ones no-ops.
async fn upgrade_table(client: &Client, quoted_name: &str, present: i64) -> Result<()> {
    if present == RECORD_COLUMNS.len() as i64 {
        return Ok(());
    }
    let add: Vec<String> = RECORD_COLUMNS
        .iter()
        .map(|(column, kind)| format!("ADD COLUMN IF NOT EXISTS {column} {kind}"))
        .collect();
    let alter = format!("ALTER TABLE {quoted_name} {}", add.join(", "));
    client.batch_execute(&alter).await.map_err(|e| {
        errors::backend(
            "connect",
            format!(
                "add the holder record columns to the fencing table {quoted_name} \
                 (once, by its owner; or run: {alter})"
            ),
            e,
        )
    })
}

/// Whether the table exists, and how many of the record columns it has.
async fn table_state(
    client: &Client,
    quoted_name: &str,
) -> Result<(bool, i64), tokio_postgres::Error> {
    let columns: Vec<&str> = RECORD_COLUMNS.iter().map(|(column, _)| *column).collect();
    let row = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL, (SELECT count(*) FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attname = ANY($2) AND NOT attisdropped)",
            &[&quoted_name, &columns],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// Any text as a SQL expression made only of hex digits and SQL words, so
/// it can be inlined into a simple-protocol message whatever it contains
/// and whatever `standard_conforming_strings` says.
fn text_literal(text: &str) -> String {
    let mut literal = String::with_capacity(2 * text.len() + 40);
    literal.push_str("convert_from(decode('");
    crate::util::push_hex(&mut literal, text.as_bytes());
    literal.push_str("', 'hex'), 'UTF8')");
    literal
}

/// The columns every grant writes after `lock_key, token, owner_digest`.
const GRANT_COLUMNS: &str = "key_name, ttl_ms, holder_host, holder_pid, holder_label, session_pid";

/// What a repeated grant of a key overwrites: everything but the key.
const GRANT_UPDATE: &str = "ON CONFLICT (lock_key) DO UPDATE SET token = f.token + 1, \
     owner_digest = EXCLUDED.owner_digest, granted_at = now(), key_name = EXCLUDED.key_name, \
     ttl_ms = EXCLUDED.ttl_ms, holder_host = EXCLUDED.holder_host, \
     holder_pid = EXCLUDED.holder_pid, holder_label = EXCLUDED.holder_label, \
     session_pid = EXCLUDED.session_pid RETURNING token";

/// Every statement text, built once per locker from its fencing table.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    table: Option<String>,
    /// Takes the lock if free and, when fencing, bumps the counter and
    /// writes the grant's record in the same statement. Returns one row (the
    /// token, or NULL without fencing) when acquired and none when held
    /// elsewhere: one round trip per try. Parameters with fencing: the key,
    /// the owner digest, then the [`GrantRecord`] as `key_name, host, pid,
    /// label, ttl_ms`; without: the key.
    pub(super) try_lock: String,
    /// [`Sql::try_lock`] over the keys of the array `$1` in order, in one
    /// statement that takes **at most one** of them: the first that
    /// `pg_try_advisory_lock` grants (see [`TRY_ANY_STEPS`] for why never
    /// two). With fencing it bumps that key's counter and writes the
    /// grant's record as `try_lock` does, the key's name taken from the
    /// text array `$3` at the key's position; other parameters as
    /// `try_lock`'s. Returns one row `(token, lock_key)` (the token NULL
    /// without fencing) when a key was taken and none when every key was
    /// held.
    pub(super) try_lock_any: String,
    /// Releases every key of the array `$1` this session holds
    /// exclusively, one hold each, without the server warning
    /// `pg_advisory_unlock` logs for a key not held: one row per key
    /// released. The cleanup of an abandoned attempt, which cannot tell
    /// which of its keys (if any) it took.
    pub(super) unlock_any_if_held: String,
    /// Releases one hold of the key on this session: `true` if it held it.
    /// With fencing it first clears the holder columns of the key's row if
    /// this session's grant wrote them (see [`CLEAR_HOLDER`]).
    pub(super) unlock: String,
    /// True if this session holds the key.
    pub(super) holds: String,
    /// Which of the bigint keys in the array `$1` this session does *not*
    /// hold: one scan of `pg_locks`, taken from the array (the keepalive's
    /// batch, see `Inner::verify_many`).
    pub(super) lost_among: String,
    /// Releases the key only if this session holds it exclusively, without
    /// the server warning `pg_advisory_unlock` logs otherwise.
    pub(super) unlock_if_held: String,
    /// Takes the key shared if no session holds it exclusively and no
    /// exclusive request waits for it: `true` if taken. Nothing is
    /// written: a reader's fencing token is read by [`Sql::reader_token`].
    pub(super) try_lock_shared: String,
    /// With fencing: the key's counter (0 without a row), read, never
    /// advanced: a reader's token. Sent after the grant, in a statement
    /// (and snapshot) of its own, so it sees the bump of every writer that
    /// released the key before the reader got it.
    pub(super) reader_token: Option<String>,
    /// Releases one shared hold of the key on this session: `true` if it
    /// held it shared.
    pub(super) unlock_shared: String,
    /// Releases the key's shared hold only if this session has one.
    pub(super) unlock_shared_if_held: String,
    /// True if an exclusive request for the key waits on the server: the
    /// server would then refuse a new reader from any session but one that
    /// already holds the key shared (re-entrant requests skip the queue).
    pub(super) writer_queued: String,
    /// With fencing: the pid of the session holding the key if its last
    /// grant was to this owner digest. Without fencing: the holder's pid.
    pub(super) holder: String,
    /// Takes the key's transaction-scoped advisory lock if free and, under
    /// it, deletes the key's fencing row: one statement, whose lock is held
    /// until the delete commits, so no session can be granted the key (and
    /// bump the row) in between. Returns whether the key was free.
    pub(super) forget: String,
    /// Who holds key `$1`: one row per granted hold: the holding
    /// pid, then the row's record (see `RECORD_SELECT`).
    pub(super) inspect: String,
    /// Every held key whose recorded name starts with `$1`, as
    /// [`Sql::inspect`] reports a hold.
    pub(super) list: String,
    /// Ends the session with pid `$2` if it still holds key `$1` and is not
    /// the session running the statement: `(own, terminated)`, no row if it
    /// no longer holds the key.
    pub(super) terminate: String,
}

/// What a release clears of the key's fencing row, in the statement that
/// unlocks it, if this session's grant wrote the row: the holder's host,
/// pid and label describe a holder, and the label is taken from a command
/// line, so they are kept no longer than the grant. The token, grant time,
/// key name, ttl and session pid stay: the token must, and the others
/// describe the last grant without naming anyone. (A session that dies
/// holding the lock frees it without a statement: its record stays until
/// the next grant overwrites it.)
const CLEAR_HOLDER: &str = "SET holder_host = NULL, holder_pid = NULL, holder_label = NULL \
     WHERE lock_key = $1::int8 AND session_pid = pg_backend_pid() \
     AND (holder_host IS NOT NULL OR holder_pid IS NOT NULL OR holder_label IS NOT NULL)";

/// Matches this session's granted hold of the bigint advisory key `$1` in
/// `pg_locks`, which shows a bigint key as its high and low 32-bit halves
/// (classid, objid) with objsubid 1.
const OWN_HOLD: &str = "locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
     AND objsubid = 1 AND classid::int8 = ($1::int8 >> 32) & 4294967295 \
     AND objid::int8 = $1::int8 & 4294967295";

/// This session's granted holds of bigint advisory keys (the halves of
/// [`OWN_HOLD`] put together again; `<<` on int8 wraps, so negative keys
/// come out right).
const OWN_HOLDS: &str = "SELECT (classid::int8 << 32) | objid::int8 FROM pg_locks \
     WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted AND objsubid = 1";

/// The attempt over several keys ([`Sql::try_lock_any`]): a recursive CTE
/// whose row `i` says whether the `i`-th key of `$1` (1-based) was taken,
/// trying the next key only while none has been. Why it can never take two:
///
/// - Postgres evaluates a recursive `WITH` by iterations over a working
///   table: the non-recursive term once, then the recursive term over the
///   rows the previous iteration produced, until it produces none ("Recursive
///   Query Evaluation", <https://www.postgresql.org/docs/current/queries-with.html#QUERIES-WITH-RECURSIVE>).
///   The non-recursive term is one row, and the recursive term reads only
///   the working table, with no join: every iteration has at most one row,
///   so each makes at most one call, in key order.
/// - The call is inside a `CASE` guarded by the row's own `taken`: "a CASE
///   expression does not evaluate any subexpressions that are not needed to
///   determine the result" (<https://www.postgresql.org/docs/current/functions-conditional.html#FUNCTIONS-CASE>,
///   and "Expression Evaluation Rules", <https://www.postgresql.org/docs/current/sql-expressions.html#SYNTAX-EXPRESS-EVAL>,
///   whose one exception, constant subexpressions folded at planning time,
///   cannot apply to the volatile `pg_try_advisory_lock`). So once a key is
///   taken, no later call is made, whether or not the planner filters the
///   row by `WHERE` before computing its columns (which it does: the
///   `WHERE` is what ends the recursion).
/// - A recursive `WITH` (and one calling a volatile function) is never folded
///   into the outer query (same page, "CTE Materialization"): its rows are
///   computed once and read back, not evaluated again for each reader, and
///   the outer query reads them all (no `LIMIT` that could stop it early
///   and no sort ahead of it that could reorder the calls).
///
/// Shaped by plain SQL alone (no function created on the server), so that
/// it needs no privilege beyond the fencing table's.
const TRY_ANY_STEPS: &str = "WITH RECURSIVE attempt (i, taken) AS (SELECT 0, false UNION ALL \
     SELECT a.i + 1, CASE WHEN NOT a.taken AND a.i < cardinality($1::int8[]) \
     THEN pg_try_advisory_lock(($1::int8[])[a.i + 1]) ELSE false END \
     FROM attempt a WHERE NOT a.taken AND a.i < cardinality($1::int8[]))";

/// [`OWN_HOLD`] in exclusive mode only (`pg_advisory_lock`).
const OWN_EXCLUSIVE_HOLD: &str = "mode = 'ExclusiveLock' AND locktype = 'advisory' \
     AND pid = pg_backend_pid() AND granted AND objsubid = 1 \
     AND classid::int8 = ($1::int8 >> 32) & 4294967295 AND objid::int8 = $1::int8 & 4294967295";

/// [`OWN_HOLD`] in shared mode only (`pg_advisory_lock_shared`).
const OWN_SHARED_HOLD: &str = "mode = 'ShareLock' AND locktype = 'advisory' \
     AND pid = pg_backend_pid() AND granted AND objsubid = 1 \
     AND classid::int8 = ($1::int8 >> 32) & 4294967295 AND objid::int8 = $1::int8 & 4294967295";

const ANY_HOLD: &str = "locktype = 'advisory' AND granted AND objsubid = 1 \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND classid::int8 = ($1::int8 >> 32) & 4294967295 \
     AND objid::int8 = $1::int8 & 4294967295";

/// An exclusive request for the bigint advisory key `$1` waiting in this
/// database.
const EXCLUSIVE_WAIT: &str = "locktype = 'advisory' AND NOT granted AND mode = 'ExclusiveLock' \
     AND objsubid = 1 \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND classid::int8 = ($1::int8 >> 32) & 4294967295 \
     AND objid::int8 = $1::int8 & 4294967295";

/// What inspection reads of a hold after the holding pid: the fencing
/// row's record (all NULL without a row), `session_pid` first (the record
/// is the current holder's only if it equals the holding pid); then
/// whether the hold is shared, and the token its readers carry (the
/// counter, 0 without a row).
const RECORD_SELECT: &str = "f.session_pid, f.token, f.granted_at, f.ttl_ms, f.holder_host, \
     f.holder_pid, f.holder_label, f.key_name, f.lock_key, l.mode = 'ShareLock', \
     COALESCE(f.token, 0)";

const NO_RECORD_SELECT: &str = "NULL::int4, NULL::int8, NULL::timestamptz, NULL::int8, \
     NULL::text, NULL::int8, NULL::text, NULL::text, NULL::int8, l.mode = 'ShareLock', NULL::int8";

impl Sql {
    pub(super) fn new(fencing: Option<&FencingTable>) -> Self {
        let table = fencing.map(FencingTable::quoted);
        let try_lock = match &table {
            // The WHERE clause of a FROM-less SELECT runs once: the row is
            // inserted (or the counter bumped) only if the lock was taken.
            Some(table) => format!(
                "INSERT INTO {table} AS f (lock_key, token, owner_digest, {GRANT_COLUMNS}) \
                 SELECT $1::int8, 1, $2::text, $3::text, $7::int8, $4::text, $5::int8, $6::text, \
                 pg_backend_pid() WHERE pg_try_advisory_lock($1::int8) {GRANT_UPDATE}"
            ),
            None => "SELECT NULL::int8 WHERE pg_try_advisory_lock($1::int8)".to_owned(),
        };
        // The key taken, if any: the one row `TRY_ANY_STEPS` marks taken.
        let try_lock_any = match &table {
            Some(table) => format!(
                "{TRY_ANY_STEPS} INSERT INTO {table} AS f (lock_key, token, owner_digest, \
                 {GRANT_COLUMNS}) SELECT ($1::int8[])[a.i], 1, $2::text, ($3::text[])[a.i], \
                 $7::int8, $4::text, $5::int8, $6::text, pg_backend_pid() \
                 FROM attempt a WHERE a.taken {GRANT_UPDATE}, lock_key" // (`GRANT_UPDATE` ends in `RETURNING token`.)
            ),
            None => format!(
                "{TRY_ANY_STEPS} SELECT NULL::int8, ($1::int8[])[a.i] FROM attempt a WHERE a.taken"
            ),
        };
        let holder = match &table {
            Some(table) => format!(
                "SELECT l.pid, EXISTS (SELECT 1 FROM {table} WHERE lock_key = $1::int8 \
                 AND owner_digest = $2::text) FROM pg_locks l WHERE {ANY_HOLD}"
            ),
            None => format!("SELECT pid, NULL::bool FROM pg_locks WHERE {ANY_HOLD}"),
        };
        let forget = match &table {
            // Referenced twice, the `lock` CTE is materialized: the lock is
            // tried exactly once, and the DELETE runs only if it was taken.
            Some(table) => format!(
                "WITH lock AS (SELECT pg_try_advisory_xact_lock($1::int8) AS free), \
                 gone AS (DELETE FROM {table} WHERE lock_key = $1::int8 AND (SELECT free FROM lock)) \
                 SELECT free FROM lock"
            ),
            // Nothing stored: only say whether the key is held.
            None => "SELECT pg_try_advisory_xact_lock($1::int8)".to_owned(),
        };
        let inspect = match &table {
            Some(table) => format!(
                "SELECT l.pid, {RECORD_SELECT} FROM pg_locks l \
                 LEFT JOIN {table} f ON f.lock_key = $1::int8 WHERE {ANY_HOLD} ORDER BY l.pid"
            ),
            None => format!(
                "SELECT l.pid, {NO_RECORD_SELECT} FROM pg_locks l WHERE {ANY_HOLD} ORDER BY l.pid"
            ),
        };
        // Without a table no lock has a name to list it by: `list` is
        // refused before this statement is ever sent.
        let list = match &table {
            Some(table) => format!(
                "SELECT DISTINCT ON (f.lock_key) l.pid, {RECORD_SELECT} FROM pg_locks l \
                 JOIN {table} f ON f.lock_key = ((l.classid::int8 << 32) | l.objid::int8) \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND starts_with(f.key_name, $1::text) ORDER BY f.lock_key, l.pid"
            ),
            None => String::new(),
        };
        // Every session holding the key: one exclusive holder, or every
        // reader (ending one reader would leave the key held). Nothing is
        // ended if this session is among them, nor if pid `$2` no longer
        // holds the key (no row: it changed hands). The `CASE` runs the
        // subquery only when it is needed.
        let terminate = format!(
            "WITH holders AS MATERIALIZED (SELECT DISTINCT pid FROM pg_locks WHERE {ANY_HOLD}), \
             checked AS (SELECT bool_or(pid = pg_backend_pid()) AS own FROM holders \
             HAVING bool_or(pid = $2::int4)) \
             SELECT c.own, CASE WHEN c.own THEN NULL \
             ELSE (SELECT bool_and(pg_terminate_backend(h.pid, $3::int8)) FROM holders h) END \
             FROM checked c"
        );
        // Read by the SELECT, the UPDATE runs before the unlock: the row is
        // cleared while this session still holds the key, so it never
        // clears a next holder's record.
        let unlock = match &table {
            Some(table) => format!(
                "WITH cleared AS (UPDATE {table} {CLEAR_HOLDER} RETURNING 1) \
                 SELECT pg_advisory_unlock($1::int8) FROM (SELECT count(*) FROM cleared) c"
            ),
            None => "SELECT pg_advisory_unlock($1::int8)".to_owned(),
        };
        Sql {
            forget,
            try_lock,
            try_lock_any,
            // `pg_locks` lists a copy of the lock table taken when it is
            // first read (`GetLockStatusData`, postgres
            // `src/backend/storage/lmgr/lock.c`), so unlocking as its rows
            // come cannot change what it lists.
            unlock_any_if_held: "SELECT pg_advisory_unlock(held.k) FROM (SELECT \
                 (classid::int8 << 32) | objid::int8 AS k FROM pg_locks \
                 WHERE mode = 'ExclusiveLock' AND locktype = 'advisory' \
                 AND pid = pg_backend_pid() AND granted AND objsubid = 1) held \
                 WHERE held.k = ANY($1::int8[])"
                .to_owned(),
            unlock,
            holds: format!("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE {OWN_HOLD})"),
            // A set operation, not a join: the planner estimates pg_locks at
            // one row and picks a nested loop, 20 million comparisons for
            // 1,000 keys against 20,000 locks (3.2 s here); EXCEPT hashes
            // both sides (35 ms, most of it reading pg_locks), and answers
            // with the keys *not* held: usually no row at all.
            lost_among: format!("SELECT unnest($1::int8[]) EXCEPT ALL {OWN_HOLDS}"),
            unlock_if_held: format!(
                "SELECT pg_advisory_unlock($1::int8) FROM pg_locks WHERE {OWN_EXCLUSIVE_HOLD}"
            ),
            try_lock_shared: "SELECT pg_try_advisory_lock_shared($1::int8)".to_owned(),
            reader_token: table.as_ref().map(|table| {
                format!("SELECT COALESCE((SELECT token FROM {table} WHERE lock_key = $1::int8), 0)")
            }),
            unlock_shared: "SELECT pg_advisory_unlock_shared($1::int8)".to_owned(),
            unlock_shared_if_held: format!(
                "SELECT pg_advisory_unlock_shared($1::int8) FROM pg_locks WHERE {OWN_SHARED_HOLD}"
            ),
            writer_queued: format!("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE {EXCLUSIVE_WAIT})"),
            holder,
            inspect,
            list,
            terminate,
            table,
        }
    }

    /// True when leases get fencing tokens.
    pub(super) fn fencing(&self) -> bool {
        self.table.is_some()
    }

    /// Bumps the counter of a lock already held (after a native wait) and
    /// writes the grant's record: returns the token. Parameters as
    /// [`Sql::try_lock`]'s. `None` without fencing.
    pub(super) fn grant_token(&self) -> Option<String> {
        self.table.as_ref().map(|table| {
            format!(
                "INSERT INTO {table} AS f (lock_key, token, owner_digest, {GRANT_COLUMNS}) \
                 VALUES ($1::int8, 1, $2::text, $3::text, $7::int8, $4::text, $5::int8, $6::text, \
                 pg_backend_pid()) {GRANT_UPDATE}"
            )
        })
    }

    /// The native shared wait (`pg_advisory_lock_shared`), as one
    /// simple-protocol message under `lock_timeout_ms`, the session's own
    /// `session_lock_timeout_ms` restored after it (as [`Sql::wait`]).
    /// Nothing is written: the reader's token is read afterwards
    /// ([`Sql::reader_token`]), in a statement of its own, so that its
    /// snapshot is taken after the grant whatever the isolation level.
    pub(super) fn wait_shared(
        &self,
        key: i64,
        lock_timeout_ms: u64,
        session_lock_timeout_ms: u64,
    ) -> String {
        format!(
            "SET lock_timeout = {lock_timeout_ms}; SELECT pg_advisory_lock_shared('{key}'::int8); \
             SET lock_timeout = {session_lock_timeout_ms};"
        )
    }

    /// The native wait, as one simple-protocol message: its statements run
    /// in one implicit transaction that stops at the first error, so the
    /// counter is bumped (and the record written) only if the lock was
    /// granted. The wait runs under `lock_timeout_ms`; the session's own
    /// `session_lock_timeout_ms` is restored right after it, so the counter
    /// bump (and everything the session runs later) is under the session's
    /// bound, not the wait's remainder. On an error the implicit transaction
    /// rolls back, and with it both `SET`s. Every inlined value is generated
    /// here (integers, hex digits, a quoted identifier; the record's text as
    /// hex, see [`text_literal`]), never caller text as typed; the key is a
    /// quoted literal so that `i64::MIN` (whose digits alone overflow bigint
    /// before negation) parses.
    pub(super) fn wait(
        &self,
        key: i64,
        lock_timeout_ms: u64,
        session_lock_timeout_ms: u64,
        owner_digest: &str,
        record: &GrantRecord<'_>,
    ) -> String {
        debug_assert!(owner_digest.bytes().all(|b| b.is_ascii_hexdigit()));
        let mut sql = format!(
            "SET lock_timeout = {lock_timeout_ms}; SELECT pg_advisory_lock('{key}'::int8); \
             SET lock_timeout = {session_lock_timeout_ms};"
        );
        if let Some(table) = &self.table {
            // The record's values in `GRANT_COLUMNS` order.
            let values = RecordLiterals::new(record, text_literal);
            sql.push_str(&format!(
                " INSERT INTO {table} AS f (lock_key, token, owner_digest, {GRANT_COLUMNS}) \
                 VALUES ('{key}'::int8, 1, '{owner_digest}', {}, {}, {}, {}, {}, \
                 pg_backend_pid()) {GRANT_UPDATE};",
                values.key_name, record.ttl_ms, values.host, values.pid, values.label,
            ));
        }
        sql
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Error;

    #[test]
    fn identifiers_are_checked_and_quoted() {
        let table = FencingTable::parse("locks.Fence \"v1\"").unwrap();
        assert_eq!(table.quoted(), "\"locks\".\"Fence \"\"v1\"\"\"");
        assert_eq!(FencingTable::default().quoted(), "\"distlock_fencing\"");
        for bad in ["", "a.", ".b", "a.b.c", &"x".repeat(64), "nul\0"] {
            let err = FencingTable::parse(bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidInput {
                        what: "fencing table",
                        ..
                    }
                ),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn without_fencing_no_statement_names_a_table() {
        let sql = Sql::new(None);
        assert!(!sql.fencing());
        assert!(sql.grant_token().is_none());
        let record = GrantRecord::new("k", Duration::from_secs(1), true);
        assert!(!sql.wait(7, 100, 5000, "ab", &record).contains("INSERT"));
        assert!(!sql.try_lock.contains("INSERT"));
        assert!(!sql.try_lock_any.contains("INSERT"));
        assert!(sql.reader_token.is_none());
    }

    #[test]
    fn readers_never_write_the_fencing_table() {
        let sql = Sql::new(Some(&FencingTable::default()));
        let reader_statements = [
            sql.try_lock_shared.as_str(),
            sql.reader_token.as_deref().unwrap_or_default(),
            sql.unlock_shared.as_str(),
            sql.unlock_shared_if_held.as_str(),
            sql.writer_queued.as_str(),
        ];
        for text in reader_statements
            .into_iter()
            .chain([sql.wait_shared(-5, 250, 5000).as_str()])
        {
            for write in ["INSERT", "UPDATE", "DELETE", "FOR UPDATE", "FOR SHARE"] {
                assert!(!text.contains(write), "{text}");
            }
        }
        assert_eq!(
            sql.wait_shared(-5, 250, 5000),
            "SET lock_timeout = 250; SELECT pg_advisory_lock_shared('-5'::int8); \
             SET lock_timeout = 5000;"
        );
    }

    #[test]
    fn the_wait_inlines_only_generated_values() {
        let sql = Sql::new(Some(&FencingTable::default()));
        let mut record = GrantRecord::new("k'ey\\", Duration::from_millis(1500), true);
        record.label = Some("it's; DROP TABLE x; --".into());
        let text = sql.wait(-5, 250, 5000, "00ff", &record);
        assert!(text.starts_with(
            "SET lock_timeout = 250; SELECT pg_advisory_lock('-5'::int8); SET lock_timeout = 5000;"
        ));
        assert!(text
            .contains("VALUES ('-5'::int8, 1, '00ff', convert_from(decode('6b2765795c', 'hex')"));
        assert!(text.contains(", 1500, convert_from(decode('"), "{text}");
        // Caller text never appears as typed: only its hex digits do.
        assert!(!text.contains("DROP") && !text.contains("k'ey"), "{text}");
    }
}
