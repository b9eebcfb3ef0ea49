//! Durable marks ([`crate::Locker::advance_mark`]): one row per mark in a
//! table beside the fencing table, raised by one upsert.

use super::fencing::FencingTable;

/// The statements on the marks table, built once per locker.
#[derive(Debug, Clone)]
pub(super) struct MarksSql {
    pub(super) create: String,
    /// `$1` the mark's key (hashed like a lock key), `$2` the value, `$3`
    /// the caller's name (kept for operators reading the table). Returns the
    /// stored mark and the mark before this statement (NULL if it inserted
    /// the row), and no row when the mark already was at or past `$2`.
    ///
    /// The conflict arm runs under the row lock the upsert takes, on the
    /// latest committed row, so `previous` is the value this statement
    /// replaced even when a concurrent upsert committed first (a CTE reading
    /// the old row would see the statement's snapshot instead, which a
    /// racing writer may have already moved past). A mark that does not
    /// advance is not rewritten: the scheduler peeks at marks on every tick.
    pub(super) advance: String,
    /// `$1` the mark's key: the stored mark. Read after an advance that
    /// changed nothing; marks only grow, so it is at or past that value.
    pub(super) current: String,
}

impl MarksSql {
    pub(super) fn new(fencing: Option<&FencingTable>) -> Self {
        let table = FencingTable::marks_beside(fencing).quoted();
        MarksSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                    mark_key bigint PRIMARY KEY, \
                    mark bigint NOT NULL, \
                    previous bigint, \
                    name text NOT NULL, \
                    updated_at timestamptz NOT NULL DEFAULT now())"
            ),
            advance: format!(
                "INSERT INTO {table} AS m (mark_key, mark, previous, name) \
                 VALUES ($1::int8, $2::int8, NULL, $3::text) \
                 ON CONFLICT (mark_key) DO UPDATE SET previous = m.mark, \
                 mark = EXCLUDED.mark, updated_at = now() \
                 WHERE m.mark < EXCLUDED.mark \
                 RETURNING mark, previous"
            ),
            current: format!("SELECT mark FROM {table} WHERE mark_key = $1::int8"),
        }
    }
}
