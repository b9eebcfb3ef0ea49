//! Durable marks ([`crate::Locker::advance_mark`]): one row per mark in a
//! table beside the fencing table, raised by one upsert that reports the
//! value it replaced.

use super::fencing::FencingTable;
use super::names::{hex_literal, LockName};

pub(super) fn create_table(table: &FencingTable) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
            mark_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY, \
            mark BIGINT NOT NULL, \
            name VARBINARY(1024) NOT NULL, \
            updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB",
        table.quoted()
    )
}

/// The upsert, in one round trip: the conflict arm copies the stored mark
/// into a session variable as it computes the new one, under the row lock
/// the upsert holds, so the variable is the value this statement replaced
/// even when a concurrent upsert committed just before (and NULL when it
/// inserted the row). Assignments in `ON DUPLICATE KEY UPDATE` run left to
/// right, so `updated_at` sees the variable already set.
pub(super) fn advance_sql(table: &FencingTable, name: &LockName<'_>, value: i64) -> String {
    let table = table.quoted();
    let lit = name.literal();
    let raw = hex_literal(name.key.as_bytes());
    format!(
        "SET @distlock_prev = NULL; \
         INSERT INTO {table} (mark_name, mark, name) VALUES ({lit}, {value}, {raw}) \
         ON DUPLICATE KEY UPDATE mark = GREATEST((@distlock_prev := mark), VALUES(mark)), \
         updated_at = IF(VALUES(mark) > @distlock_prev, CURRENT_TIMESTAMP(6), updated_at); \
         SELECT @distlock_prev"
    )
}
