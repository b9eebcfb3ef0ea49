//! The name of the fencing table: checked once, quoted by the dialect.
//!
//! Both SQL backends keep their fencing counters (and marks, beside them) in
//! a table the user may name as `table` or `schema.table`. What an
//! identifier may be and how it is quoted differ per server; what is done
//! with the name (split the URL form, check each part, quote each part,
//! derive the marks table in the same schema) does not, and lives here.

use std::fmt;
use std::marker::PhantomData;

use crate::inspect::GrantRecord;
use crate::{Error, Result};

/// The default fencing table name, in the connection's current schema or
/// database.
pub(crate) const DEFAULT_TABLE: &str = "distlock_fencing";

/// The table of durable marks ([`crate::Locker::advance_mark`]), one row a
/// mark, beside the fencing table.
pub(crate) const MARKS_TABLE: &str = "distlock_marks";

/// A server's rules for identifiers: its length limit and its quoting.
pub(crate) trait Identifiers {
    /// The longest identifier the server keeps as is.
    const MAX_LEN: usize;
    /// How the problem reads when a name exceeds [`Self::MAX_LEN`].
    const TOO_LONG: &'static str;
    /// How long `name` is by the server's measure (bytes or characters).
    fn len(name: &str) -> usize;
    /// A problem the server has with `name` besides those every server
    /// shares (empty, too long, a zero byte, a dot), if any.
    fn other_problem(_name: &str) -> Option<&'static str> {
        None
    }
    /// `identifier` quoted for SQL so that any name means exactly itself.
    fn quote(identifier: &str) -> String;
}

/// Where fencing counters live: a table, optionally schema-qualified,
/// whose parts were checked by `I`'s rules.
pub(crate) struct FencingTable<I> {
    schema: Option<String>,
    table: String,
    rules: PhantomData<fn() -> I>,
}

// Written out rather than derived: a derive would require `I` itself to be
// `Clone`, `Debug`, ... although only the two names are stored.
impl<I> Clone for FencingTable<I> {
    fn clone(&self) -> Self {
        FencingTable {
            schema: self.schema.clone(),
            table: self.table.clone(),
            rules: PhantomData,
        }
    }
}

impl<I> PartialEq for FencingTable<I> {
    fn eq(&self, other: &Self) -> bool {
        (&self.schema, &self.table) == (&other.schema, &other.table)
    }
}

impl<I> Eq for FencingTable<I> {}

impl<I> fmt::Debug for FencingTable<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencingTable")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .finish()
    }
}

impl<I> Default for FencingTable<I> {
    fn default() -> Self {
        FencingTable {
            schema: None,
            table: DEFAULT_TABLE.to_owned(),
            rules: PhantomData,
        }
    }
}

impl<I: Identifiers> FencingTable<I> {
    /// A table named `table` in `schema` (or the current one), checked.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the part the server would not take
    /// as written.
    pub(crate) fn new(schema: Option<&str>, table: &str) -> Result<Self> {
        if let Some(schema) = schema {
            check_identifier::<I>("schema", schema)?;
        }
        check_identifier::<I>("table", table)?;
        Ok(FencingTable {
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
            rules: PhantomData,
        })
    }

    /// Splits `table` or `schema.table` (the URL form) into its parts,
    /// unchecked: [`FencingTable::new`] checks them.
    pub(crate) fn split(qualified: &str) -> (Option<String>, String) {
        match qualified.split_once('.') {
            Some((schema, table)) => (Some(schema.to_owned()), table.to_owned()),
            None => (None, qualified.to_owned()),
        }
    }

    /// [`split`](Self::split), then [`new`](Self::new).
    #[cfg(test)]
    pub(crate) fn parse(qualified: &str) -> Result<Self> {
        let (schema, table) = Self::split(qualified);
        Self::new(schema.as_deref(), &table)
    }

    /// The marks table ([`MARKS_TABLE`]) in `fencing`'s schema, or in the
    /// current one when fencing is off.
    pub(crate) fn marks_beside(fencing: Option<&Self>) -> Self {
        FencingTable {
            schema: fencing.and_then(|table| table.schema.clone()),
            table: MARKS_TABLE.to_owned(),
            rules: PhantomData,
        }
    }

    /// The name to put in SQL: each part quoted.
    pub(crate) fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", I::quote(schema), I::quote(&self.table)),
            None => I::quote(&self.table),
        }
    }

    /// The schema, if the name gave one.
    // Only MySQL looks the table up by its parts (`information_schema`).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table's own name, unquoted.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn table(&self) -> &str {
        &self.table
    }
}

/// A grant record's values as SQL literals, for a statement that writes
/// them inline (a wait, sent as text): each text quoted by the dialect's
/// `text_literal`, a missing value `NULL`.
pub(crate) struct RecordLiterals {
    /// The key as the caller named it.
    pub(crate) key_name: String,
    /// The holder's host.
    pub(crate) host: String,
    /// The holder's process id.
    pub(crate) pid: String,
    /// The holder's label.
    pub(crate) label: String,
}

impl RecordLiterals {
    /// `record`'s values, texts quoted with `text_literal`.
    pub(crate) fn new(record: &GrantRecord<'_>, text_literal: fn(&str) -> String) -> Self {
        let text_or_null =
            |text: Option<&str>| text.map_or_else(|| "NULL".to_owned(), text_literal);
        RecordLiterals {
            key_name: text_or_null(record.key_name),
            host: text_or_null(record.host.as_deref()),
            pid: record
                .pid
                .map_or_else(|| "NULL".to_owned(), |pid| pid.to_string()),
            label: text_or_null(record.label.as_deref()),
        }
    }
}

/// Identifiers every server refuses or changes: empty, longer than its
/// limit (Postgres silently truncates, which would make two names one
/// table), with a zero byte, or with a dot (the URL form splits on it).
fn check_identifier<I: Identifiers>(what: &str, name: &str) -> Result<()> {
    let problem = if name.is_empty() {
        "is empty"
    } else if I::len(name) > I::MAX_LEN {
        I::TOO_LONG
    } else if name.contains('\0') {
        "contains a zero byte"
    } else if name.contains('.') {
        "contains a dot"
    } else if let Some(problem) = I::other_problem(name) {
        problem
    } else {
        return Ok(());
    };
    Err(Error::invalid(
        "fencing table",
        format!("the {what} name {name:?} {problem}"),
    ))
}

/// Hex of the first 128 bits of SHA-256 of an owner token: what a fencing
/// row records about the holder, so the token itself (a credential) is
/// never stored.
pub(crate) fn owner_digest(owner: &str) -> String {
    crate::util::sha256_hex128(owner.as_bytes())
}
