//! The record kept in each lock file: the fencing counter, the holder's
//! pid and owner token, its holder record and the key, read and written in
//! one positioned call each, so a reader in another process never sees an
//! empty or half-written file.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{with_path, BACKEND};
use crate::inspect::HolderRecord;
use crate::{Error, Result};

/// The first word of every record: a file that does not start with it is
/// not a distlock lock file.
pub(super) const RECORD_MAGIC: &str = "distlock-file-v1";

/// The record kept in each lock file: a first line with the fencing
/// counter, the holder's pid and owner token (all a distlock before holder
/// records wrote), then the holder record and the key.
#[derive(Debug, PartialEq)]
pub(super) struct Record {
    pub(super) fencing_token: u64,
    pub(super) pid: u32,
    pub(super) owner: String,
    /// Absent in files written before holder records.
    pub(super) holder: Option<HolderRecord>,
    /// The key the file locks (its name may be a hash of it); absent in
    /// files written before holder records.
    pub(super) key: Option<String>,
}

/// The longest record read from a lock file: the first line, a holder
/// record with a label of [`crate::inspect::MAX_LABEL_LEN`] and a key of
/// [`validate::MAX_KEY_LEN`], each escaped at worst to twice its length.
const MAX_RECORD_LEN: usize = 8192;

/// The record in `file` (at `path`, for messages): `None` for an empty
/// file, an error for one that does not hold a distlock record.
pub(super) fn read_record(file: &File, path: &Path) -> Result<Option<Record>> {
    // Never guess a counter: restarting from zero would hand out smaller
    // fencing tokens than earlier holders had.
    read_small_file(
        file,
        path,
        MAX_RECORD_LEN,
        "read the lock file",
        parse_record,
        "does not hold a distlock record; remove it only if no process uses it",
    )
}

/// What a small file of this backend (a lock file's record, a mark) holds,
/// read in one positioned call of at most `max_len` bytes: `None` for an
/// empty file (just created), what `parse` makes of its text, or an error
/// naming `path` followed by `unrecognised` when `parse` does not know it.
/// Never a guess: a lock file or mark read as empty would reset what it
/// protects.
pub(super) fn read_small_file<T>(
    file: &File,
    path: &Path,
    max_len: usize,
    operation: &'static str,
    parse: impl FnOnce(&str) -> Option<T>,
    unrecognised: &str,
) -> Result<Option<T>> {
    let mut buf = vec![0u8; max_len];
    let len = file
        .read_at(&mut buf, 0)
        .map_err(|e| Error::backend(BACKEND, operation, with_path(e, path)))?;
    let text = String::from_utf8_lossy(&buf[..len]);
    if text.trim().is_empty() {
        return Ok(None);
    }
    parse(&text).map(Some).ok_or_else(|| {
        Error::backend(
            BACKEND,
            operation,
            format!("{} {unrecognised}", path.display()),
        )
    })
}

/// The record in a lock file's text; `None` if it is not one.
pub(super) fn parse_record(text: &str) -> Option<Record> {
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let mut fields = first.split_whitespace();
    if fields.next()? != RECORD_MAGIC {
        return None;
    }
    Some(Record {
        fencing_token: fields.next()?.parse().ok()?,
        pid: fields.next()?.parse().ok()?,
        owner: fields.next()?.to_owned(),
        holder: HolderRecord::decode(rest.trim_end_matches('\n')),
        key: crate::inspect::record_field(rest, "key"),
    })
}

/// Writes `record` over the file's record.
pub(super) fn write_record(file: &File, record: &Record) -> io::Result<()> {
    // One positioned write of a record that only grows: a concurrent reader in
    // another process sees the old or the new record, never an empty file.
    let mut text = format!(
        "{RECORD_MAGIC} {:020} {:010} {}\n",
        record.fencing_token, record.pid, record.owner
    );
    if let Some(holder) = &record.holder {
        text.push_str(&holder.encode());
        if let Some(key) = &record.key {
            crate::inspect::push_field(&mut text, "key", key);
        }
        text.push('\n');
    }
    file.write_all_at(text.as_bytes(), 0)?;
    if file.metadata()?.len() > text.len() as u64 {
        file.set_len(text.len() as u64)?;
    }
    Ok(())
}
