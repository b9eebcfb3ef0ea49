//! The fencing-token table and every SQL statement the backend sends.
//!
//! One row per advisory key; its `token` is bumped in the statement that takes
//! the lock, while the lock is held, in a committed transaction. Tokens
//! therefore strictly increase across grants, clients and restarts of either
//! side (the row is durable like any other). The `owner_digest` column records
//! a digest of the holder's owner token (never the token itself), so another
//! client can tell "held under that owner" from "not held by that owner".

use tokio_postgres::Client;

use super::errors::{self, is_concurrent_create};
use crate::{Error, Result};

/// The default table name, in the connection's current schema.
pub const DEFAULT_TABLE: &str = "distlock_fencing";

/// Where fencing counters live: a table, optionally schema-qualified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FencingTable {
    schema: Option<String>,
    table: String,
}

impl Default for FencingTable {
    fn default() -> Self {
        FencingTable {
            schema: None,
            table: DEFAULT_TABLE.to_owned(),
        }
    }
}

impl FencingTable {
    /// A table named `table` in `schema` (or the current schema), checked.
    pub(super) fn new(schema: Option<&str>, table: &str) -> Result<Self> {
        if let Some(schema) = schema {
            check_identifier("schema", schema)?;
        }
        check_identifier("table", table)?;
        Ok(FencingTable {
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
        })
    }

    /// Splits `table` or `schema.table` (the URL form) into its parts,
    /// unchecked: [`FencingTable::new`] checks them.
    pub(super) fn split(qualified: &str) -> (Option<String>, String) {
        match qualified.split_once('.') {
            Some((schema, table)) => (Some(schema.to_owned()), table.to_owned()),
            None => (None, qualified.to_owned()),
        }
    }

    #[cfg(test)]
    pub(super) fn parse(qualified: &str) -> Result<Self> {
        let (schema, table) = Self::split(qualified);
        Self::new(schema.as_deref(), &table)
    }

    /// The table `table` in this table's schema.
    pub(super) fn sibling(&self, table: &str) -> Self {
        FencingTable {
            schema: self.schema.clone(),
            table: table.to_owned(),
        }
    }

    /// The name to put in SQL: each part double-quoted.
    pub(super) fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote(schema), quote(&self.table)),
            None => quote(&self.table),
        }
    }
}

/// Postgres identifiers: 1 to 63 bytes (longer ones are silently truncated
/// by the server, which would make two names one table), no zero byte, no
/// dot (the URL form splits on it).
fn check_identifier(what: &str, name: &str) -> Result<()> {
    let problem = if name.is_empty() {
        "is empty"
    } else if name.len() > 63 {
        "is longer than Postgres' 63-byte identifier limit"
    } else if name.contains('\0') {
        "contains a zero byte"
    } else if name.contains('.') {
        "contains a dot"
    } else {
        return Ok(());
    };
    Err(Error::invalid(
        "fencing table",
        format!("the {what} name {name:?} {problem}"),
    ))
}

/// An identifier quoted for SQL: in double quotes, inner quotes doubled, so
/// any name (mixed case, spaces, keywords) means exactly itself.
fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// Creates the table if it does not exist yet.
///
/// Checks first, so a role without `CREATE` on the schema works once the
/// table exists. Concurrent creation by several clients is expected (tests,
/// a fleet starting at once): Postgres reports the loser of that race as a
/// unique or duplicate-table violation, which here means "it exists now".
pub(super) async fn ensure_table(client: &Client, table: &FencingTable) -> Result<()> {
    let name = table.quoted();
    let context = || format!("create the fencing table {name}");
    if table_exists(client, &name)
        .await
        .map_err(|e| errors::backend("connect", context(), e))?
    {
        return Ok(());
    }
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {name} (\
            lock_key bigint PRIMARY KEY, \
            token bigint NOT NULL, \
            owner_digest text NOT NULL, \
            granted_at timestamptz NOT NULL DEFAULT now())"
    );
    match client.batch_execute(&create).await {
        Ok(()) => Ok(()),
        Err(e) if is_concurrent_create(&e) => match table_exists(client, &name).await {
            Ok(true) => Ok(()),
            _ => Err(errors::backend("connect", context(), e)),
        },
        Err(e) => Err(errors::backend("connect", context(), e)),
    }
}

async fn table_exists(client: &Client, quoted_name: &str) -> Result<bool, tokio_postgres::Error> {
    client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&quoted_name])
        .await?
        .try_get(0)
}

/// Every statement text, built once per locker from its fencing table.
#[derive(Debug, Clone)]
pub(super) struct Sql {
    table: Option<String>,
    /// Takes the lock if free and, when fencing, bumps the counter in the
    /// same statement. Returns one row (the token, or NULL without fencing)
    /// when acquired and none when held elsewhere: one round trip per try.
    pub(super) try_lock: String,
    /// Releases one hold of the key on this session: `true` if it held it.
    pub(super) unlock: &'static str,
    /// True if this session holds the key.
    pub(super) holds: String,
    /// Which of the bigint keys in the array `$1` this session does *not*
    /// hold: one scan of `pg_locks`, taken from the array (the keepalive's
    /// batch, see `Inner::verify_many`).
    pub(super) lost_among: String,
    /// Releases the key only if this session holds it, without the server
    /// warning `pg_advisory_unlock` logs otherwise.
    pub(super) unlock_if_held: String,
    /// With fencing: the pid of the session holding the key if its last
    /// grant was to this owner digest. Without fencing: the holder's pid.
    pub(super) holder: String,
    /// Takes the key's transaction-scoped advisory lock if free and, under
    /// it, deletes the key's fencing row: one statement, whose lock is held
    /// until the delete commits, so no session can be granted the key (and
    /// bump the row) in between. Returns whether the key was free.
    pub(super) forget: String,
}

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

const ANY_HOLD: &str = "locktype = 'advisory' AND granted AND objsubid = 1 \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND classid::int8 = ($1::int8 >> 32) & 4294967295 \
     AND objid::int8 = $1::int8 & 4294967295";

impl Sql {
    pub(super) fn new(fencing: Option<&FencingTable>) -> Self {
        let table = fencing.map(FencingTable::quoted);
        let try_lock = match &table {
            // The WHERE clause of a FROM-less SELECT runs once: the row is
            // inserted (or the counter bumped) only if the lock was taken.
            Some(table) => format!(
                "INSERT INTO {table} AS f (lock_key, token, owner_digest) \
                 SELECT $1::int8, 1, $2::text WHERE pg_try_advisory_lock($1::int8) \
                 ON CONFLICT (lock_key) DO UPDATE SET token = f.token + 1, \
                 owner_digest = EXCLUDED.owner_digest, granted_at = now() \
                 RETURNING token"
            ),
            None => "SELECT NULL::int8 WHERE pg_try_advisory_lock($1::int8)".to_owned(),
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
        Sql {
            forget,
            table,
            try_lock,
            unlock: "SELECT pg_advisory_unlock($1::int8)",
            holds: format!("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE {OWN_HOLD})"),
            // A set operation, not a join: the planner estimates pg_locks at
            // one row and picks a nested loop, 20 million comparisons for
            // 1,000 keys against 20,000 locks (3.2 s here); EXCEPT hashes
            // both sides (35 ms, most of it reading pg_locks), and answers
            // with the keys *not* held: usually no row at all.
            lost_among: format!("SELECT unnest($1::int8[]) EXCEPT ALL {OWN_HOLDS}"),
            unlock_if_held: format!(
                "SELECT pg_advisory_unlock($1::int8) FROM pg_locks WHERE {OWN_HOLD}"
            ),
            holder,
        }
    }

    /// True when leases get fencing tokens.
    pub(super) fn fencing(&self) -> bool {
        self.table.is_some()
    }

    /// Bumps the counter of a lock already held (after a native wait):
    /// returns the token. `None` without fencing.
    pub(super) fn grant_token(&self) -> Option<String> {
        self.table.as_ref().map(|table| {
            format!(
                "INSERT INTO {table} AS f (lock_key, token, owner_digest) VALUES ($1::int8, 1, $2::text) \
                 ON CONFLICT (lock_key) DO UPDATE SET token = f.token + 1, \
                 owner_digest = EXCLUDED.owner_digest, granted_at = now() \
                 RETURNING token"
            )
        })
    }

    /// The native wait, as one simple-protocol message: its statements run
    /// in one implicit transaction that stops at the first error, so the
    /// counter is bumped only if the lock was granted. The wait runs under
    /// `lock_timeout_ms`; the session's own `session_lock_timeout_ms` is
    /// restored right after it, so the counter bump (and everything the
    /// session runs later) is under the session's bound, not the wait's
    /// remainder. On an error the implicit transaction rolls back, and with
    /// it both `SET`s. Every inlined value is generated here (integers, hex
    /// digits, a quoted identifier), never caller text; the key is a quoted
    /// literal so that `i64::MIN` (whose digits alone overflow bigint before
    /// negation) parses.
    pub(super) fn wait(
        &self,
        key: i64,
        lock_timeout_ms: u64,
        session_lock_timeout_ms: u64,
        owner_digest: &str,
    ) -> String {
        debug_assert!(owner_digest.bytes().all(|b| b.is_ascii_hexdigit()));
        let mut sql = format!(
            "SET lock_timeout = {lock_timeout_ms}; SELECT pg_advisory_lock('{key}'::int8); \
             SET lock_timeout = {session_lock_timeout_ms};"
        );
        if let Some(table) = &self.table {
            sql.push_str(&format!(
                " INSERT INTO {table} AS f (lock_key, token, owner_digest) VALUES ('{key}'::int8, 1, '{owner_digest}') \
                 ON CONFLICT (lock_key) DO UPDATE SET token = f.token + 1, \
                 owner_digest = EXCLUDED.owner_digest, granted_at = now() \
                 RETURNING token;"
            ));
        }
        sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(!sql.wait(7, 100, 5000, "ab").contains("INSERT"));
        assert!(!sql.try_lock.contains("INSERT"));
    }

    #[test]
    fn the_wait_inlines_only_generated_values() {
        let sql = Sql::new(Some(&FencingTable::default()));
        let text = sql.wait(-5, 250, 5000, "00ff");
        assert!(text.starts_with(
            "SET lock_timeout = 250; SELECT pg_advisory_lock('-5'::int8); SET lock_timeout = 5000;"
        ));
        assert!(text.contains("VALUES ('-5'::int8, 1, '00ff')"));
    }
}
