//! The holder record as one string, for backends that keep it as a value.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Clock, GrantTime, HeldLock, Holder};

/// Milliseconds since the Unix epoch on this host's clock (0 before 1970).
pub(crate) fn unix_millis(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// The instant `millis` after the Unix epoch, saturating far in the future.
pub(crate) fn from_unix_millis(millis: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(millis))
        .unwrap_or(UNIX_EPOCH)
}

/// A holder record as one string, for backends that keep it as a value
/// (a lock file's contents, an etcd value): one `name=value` line per field,
/// with `\` and line breaks in values escaped, so any label round-trips and
/// a record written by a newer version with more fields still decodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderRecord {
    pub(crate) holder: Holder,
    /// Holder's wall clock, milliseconds since the Unix epoch.
    pub(crate) granted_ms: u64,
    pub(crate) ttl_ms: u64,
}

const RECORD_MAGIC: &str = "distlock-holder 1";

impl HolderRecord {
    /// The record of a grant made now by [`Holder::current`].
    pub(crate) fn now(ttl: Duration) -> Self {
        HolderRecord {
            holder: Holder::current(),
            granted_ms: unix_millis(SystemTime::now()),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        }
    }

    pub(crate) fn encode(&self) -> String {
        let mut out = String::with_capacity(64 + self.holder.label.len());
        out.push_str(RECORD_MAGIC);
        for (name, value) in [
            ("host", self.holder.host.as_str()),
            ("pid", &self.holder.pid.to_string()),
            ("granted_ms", &self.granted_ms.to_string()),
            ("ttl_ms", &self.ttl_ms.to_string()),
            ("label", self.holder.label.as_str()),
        ] {
            push_field(&mut out, name, value);
        }
        out
    }

    /// `None` for anything that is not a record this version can read.
    pub(crate) fn decode(text: &str) -> Option<Self> {
        let mut lines = text.split('\n');
        if lines.next()? != RECORD_MAGIC {
            return None;
        }
        let (mut host, mut pid, mut granted, mut ttl, mut label) = (None, None, None, None, None);
        for line in lines {
            let (name, raw) = line.split_once('=')?;
            let value = unescape(raw)?;
            match name {
                "host" => host = Some(value),
                "pid" => pid = value.parse().ok(),
                "granted_ms" => granted = value.parse().ok(),
                "ttl_ms" => ttl = value.parse().ok(),
                "label" => label = Some(value),
                _ => {} // a field of a newer version
            }
        }
        Some(HolderRecord {
            holder: Holder {
                host: host?,
                pid: pid?,
                label: label?,
            },
            granted_ms: granted?,
            ttl_ms: ttl?,
        })
    }

    /// Fills `held` from this record, the grant time read on the holder's clock.
    pub(crate) fn fill(self, held: &mut HeldLock) {
        held.granted = Some(GrantTime {
            at: from_unix_millis(self.granted_ms),
            clock: Clock::Holder,
        });
        held.ttl = Some(Duration::from_millis(self.ttl_ms));
        held.holder = Some(self.holder);
    }
}

/// Appends `\nname=value` to a record, escaping `\` and line breaks in
/// `value`: for backends that store more fields after a [`HolderRecord`]
/// (decoding ignores fields it does not know; read them with
/// [`record_field`]).
pub(crate) fn push_field(out: &mut String, name: &str, value: &str) {
    out.push('\n');
    out.push_str(name);
    out.push('=');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
}

/// The value of field `name` in a record's `name=value` lines, if present
/// and well escaped.
pub(crate) fn record_field(text: &str, name: &str) -> Option<String> {
    text.split('\n')
        .filter_map(|line| line.split_once('='))
        .find(|(field, _)| *field == name)
        .and_then(|(_, raw)| unescape(raw))
}

fn unescape(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                '\\' => out.push('\\'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(label: &str) -> HolderRecord {
        HolderRecord {
            holder: Holder {
                host: "web-1".into(),
                pid: 4242,
                label: label.into(),
            },
            granted_ms: 1_764_000_000_123,
            ttl_ms: 30_000,
        }
    }

    #[test]
    fn a_record_round_trips_with_line_breaks_and_backslashes_in_its_label() {
        let original = record("sh -c 'echo a\\b\nrm -rf /tmp/x'\r");
        let text = original.encode();
        assert_eq!(text.lines().count(), 6, "one line per field: {text:?}");
        assert_eq!(HolderRecord::decode(&text), Some(original));
    }

    #[test]
    fn anything_else_is_not_a_record() {
        for text in [
            "",
            "7",
            "distlock-holder 2\nhost=a",
            "distlock-holder 1\nhost=a",
        ] {
            assert_eq!(HolderRecord::decode(text), None, "{text:?}");
        }
        let bad_escape = record("x").encode().replace("label=x", "label=\\q");
        assert_eq!(HolderRecord::decode(&bad_escape), None);
    }

    #[test]
    fn fields_of_a_newer_version_are_ignored_and_readable_on_their_own() {
        let mut text = record("job").encode();
        push_field(&mut text, "key", "jobs/a=b\nc");
        assert_eq!(HolderRecord::decode(&text), Some(record("job")));
        assert_eq!(record_field(&text, "key").as_deref(), Some("jobs/a=b\nc"));
        assert_eq!(record_field(&text, "zone"), None);
    }

    proptest! {
        #[test]
        fn any_record_round_trips(host in ".{0,40}", pid: u32, label in ".{0,80}", granted: u64, ttl: u64) {
            let original = HolderRecord {
                holder: Holder { host, pid, label },
                granted_ms: granted,
                ttl_ms: ttl,
            };
            prop_assert_eq!(HolderRecord::decode(&original.encode()), Some(original));
        }
    }
}
