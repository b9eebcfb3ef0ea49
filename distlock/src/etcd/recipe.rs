//! etcd's mutex recipe, as `concurrency.Mutex` writes it
//! (<https://github.com/etcd-io/etcd/blob/main/client/v3/concurrency/mutex.go>),
//! so that our locks, `etcdctl lock` and Go services order themselves in one
//! queue:
//!
//! - the lock name `P` has one key per contender, `P/<lease id in hex>`,
//!   attached to the contender's lease and written in a transaction only if
//!   absent;
//! - the holder is the key under `P/` with the lowest create revision;
//! - a waiter watches the key just ahead of it (the highest create revision
//!   below its own) until it is deleted, then looks again, until none is
//!   left ahead.
//!
//! One difference: `P/` also contains the queues of every name under `P`
//! (`P/x/<lease>` is a contender for `P/x`), and `mutex.go` counts them as
//! contenders for `P` too. Here the queue of `P` is its *direct members*
//! only, the keys with no `/` after `P/` ([`is_member`]): a range over `P/`
//! that answers with a nested name's key first is followed by a scan of the
//! direct members ([`members`]). Every read of a queue goes through these
//! two, so acquiring, waiting, inspecting, forgetting and force-releasing
//! agree on who is in it.
//!
//! Our keys' values start with the secret part of the owner token and a
//! line break, followed by the grant's holder record
//! ([`HolderRecord::encode`]; nothing with recording off). etcd's mutex
//! writes an empty value and never reads it. Release and refresh check the
//! grant's create revision *and* that the value starts with a secret nobody
//! else has (two range compares, [`secret_compares`]: etcd compares whole
//! values only). An election candidate's key holds what it proclaims
//! instead, as etcd's election's does, and its secret and record go to an
//! owner key beside it ([`super::owner`]): then the secret compared is the
//! owner key's ([`SecretAt`]).
//!
//! Shared (reader) locks follow etcd's reader-writer recipe
//! (<https://github.com/etcd-io/etcd/blob/main/client/v3/experimental/recipes/rwmutex.go>)
//! inside the same queue: a reader's key is `P/read-<lease id in hex>-<n>`
//! ([`Role::Reader`]; `n` tells apart the readers of one lease), a direct
//! member like every other, so a writer (ours, `etcdctl lock`, Go's mutex)
//! waits for it as for any older key. A reader waits only for the *writers*
//! ahead of it: every direct member that is not a reader key
//! ([`is_reader`]), whoever wrote it. Reader keys sort in one range
//! (`P/read-` up to `P/read.`), so the newest writer ahead is the newer of
//! two sorted reads around it ([`writer_ranges`]).

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

#[cfg(doc)]
use super::owner::SecretAt;
use crate::inspect::HolderRecord;

mod release;
mod watch;

pub(super) use release::{
    delete_if_ours, delete_orphan, still_ours, still_ours_many, Grant, MAX_TXN_OPS,
};
pub(super) use watch::{wait_deleted, WatchFailure, Watched};

/// The prefix of every contender's key of lock name `name`: `name/`.
pub(super) fn queue_prefix(name: &str) -> String {
    format!("{name}/")
}

/// Whether `key` is a direct member of the queue whose prefix is `prefix`
/// ([`queue_prefix`]): something follows the prefix, and no `/`. A key with
/// a `/` after the prefix belongs to the queue of a nested name.
pub(super) fn is_member(prefix: &[u8], key: &[u8]) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
}

/// The end of the range of every key that starts with `prefix`: the prefix
/// with its last byte below `0xff` incremented and the rest cut (etcd's own
/// `GetPrefixRangeEnd`); `\0`, "to the end of the key space", if there is
/// no such byte.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&byte| byte < 0xff) {
        Some(last) => {
            let mut end = prefix[..=last].to_vec();
            end[last] = end[last].saturating_add(1);
            end
        }
        None => vec![0],
    }
}

/// How many keys one page of a scan asks for ([`members`], and the
/// listing's). Our keys are at most about 2.5 KiB with their values (a
/// 1 KiB name, a 32-byte secret, a record with a 256-byte label), so a page
/// stays far below the 4 MiB a gRPC answer may have (tonic's default limit,
/// which etcd-client keeps): a single read of a whole prefix failed past
/// about 10,000 held locks.
pub(super) const PAGE: i64 = 512;

/// One page of a scan: the keys read, whether the range has more, and the
/// revision read at.
pub(super) struct Page {
    pub(super) kvs: Vec<KeyValue>,
    pub(super) more: bool,
    pub(super) at: i64,
}

/// Reads up to `limit` keys of `[from, end)` in key order at revision `at`
/// (the newest if 0). A page the client cannot take in one answer (values
/// far bigger than ours, written by another program) is asked again with
/// half the limit, which stays halved for the pages after it.
pub(super) async fn page(
    client: &mut etcd_client::KvClient,
    from: &[u8],
    end: &[u8],
    at: i64,
    keys_only: bool,
    limit: &mut i64,
) -> Result<Page, etcd_client::Error> {
    loop {
        let mut options = GetOptions::new()
            .with_range(end)
            .with_limit(*limit)
            .with_revision(at);
        if keys_only {
            options = options.with_keys_only();
        }
        match client.get(from, Some(options)).await {
            Ok(mut response) => {
                return Ok(Page {
                    more: response.more(),
                    at: response.header().map_or(at, |h| h.revision()),
                    kvs: response.take_kvs(),
                })
            }
            // tonic's "decoded message length too large" (etcd's own
            // OutOfRange, a compacted revision, is not helped by halving).
            Err(etcd_client::Error::GRpcStatus(status))
                if status.code() == tonic::Code::OutOfRange
                    && status.message().contains("message length too large")
                    && *limit > 1 =>
            {
                *limit /= 2;
            }
            Err(error) => return Err(error),
        }
    }
}

/// `next`, where a scan's next page would start, if that is still inside
/// the range ending at `end`; `None` once the range is done.
pub(super) fn continue_after(next: Vec<u8>, end: &[u8]) -> Option<Vec<u8>> {
    // `\0` as the end is "to the end of the key space".
    (end == [0] || next.as_slice() < end).then_some(next)
}

/// Every direct member of `name`'s queue ([`is_member`]) at revision `at`
/// (the newest if 0), and the revision read at: `name/` read in key order,
/// [`PAGE`] keys at a time ([`page`]), every page at the revision of the
/// first (one snapshot). Each nested name's subtree is skipped at once
/// (after `P/x/...` the next page starts at `P/x0`, `0` being the byte
/// after `/`), so there is about one page per [`PAGE`] direct members plus
/// one per nested name met.
pub(super) async fn members(
    client: &mut etcd_client::KvClient,
    name: &str,
    mut at: i64,
    keys_only: bool,
) -> Result<(Vec<KeyValue>, i64), etcd_client::Error> {
    let prefix = queue_prefix(name).into_bytes();
    let end = prefix_end(&prefix);
    let mut found = Vec::new();
    let mut from = prefix.clone();
    let mut limit = PAGE;
    loop {
        let read = page(client, &from, &end, at, keys_only, &mut limit).await?;
        at = read.at;
        let next = read
            .kvs
            .last()
            .map(|last| member_scan_next(&prefix, last.key()));
        found.extend(
            read.kvs
                .into_iter()
                .filter(|kv| is_member(&prefix, kv.key())),
        );
        match next.and_then(|next| continue_after(next, &end)) {
            Some(next) if read.more => from = next,
            _ => return Ok((found, at)),
        }
    }
}

/// Where a scan of the queue `prefix` goes on after a page ending in `key`:
/// just past it if it is a direct member; past the whole subtree of the
/// nested name it belongs to otherwise (`P/x/...` goes on at `P/x0`, `0`
/// being the byte after `/`, so `P/x` and `P/x.` came before and `P/x0`
/// is next).
fn member_scan_next(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let rest = key.get(prefix.len()..).unwrap_or_default();
    match rest.iter().position(|&byte| byte == b'/') {
        Some(slash) => [key.get(..prefix.len() + slash).unwrap_or(key), b"0"].concat(),
        None => [key, b"\0"].concat(),
    }
}

/// The key a contender holding lease `lease` writes for `name`:
/// `name/<lease in lowercase hex>`, as Go's `fmt.Sprintf("%s%x", pfx, lease)`.
pub(super) fn contender_key(name: &str, lease: i64) -> String {
    format!("{name}/{lease:x}")
}

/// What a contender of a queue asks for, which names its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Role {
    /// An exclusive lock: the key `name/<lease hex>`, as etcd's mutex writes
    /// it; one per lease and name. Waits for every older key.
    Writer,
    /// A shared lock: the key `name/read-<lease hex>-<n>`, `n` unique among
    /// this locker's readers. Waits only for the older writers' keys.
    Reader(u64),
}

impl Role {
    /// The key this contender writes for `name` under lease `lease`.
    pub(super) fn key(self, name: &str, lease: i64) -> String {
        match self {
            Role::Writer => contender_key(name, lease),
            Role::Reader(n) => format!("{name}/{READER_MARK}{lease:x}-{n}"),
        }
    }
}

/// What starts the last segment of every reader's key.
const READER_MARK: &str = "read-";

/// Whether a contender key's last segment (after its queue's prefix) is a
/// reader's: it starts with [`READER_MARK`]. Every other member, ours or
/// not, is a writer to readers.
pub(super) fn is_reader_segment(segment: &[u8]) -> bool {
    segment.starts_with(READER_MARK.as_bytes())
}

/// Whether `key` is a reader's key among the direct members of the queue
/// whose prefix is `prefix`.
pub(super) fn is_reader(prefix: &[u8], key: &[u8]) -> bool {
    is_member(prefix, key) && key.get(prefix.len()..).is_some_and(is_reader_segment)
}

/// Whether `key` is a writer's key among the direct members of the queue
/// whose prefix is `prefix`: a member that is not a reader's.
pub(super) fn is_writer(prefix: &[u8], key: &[u8]) -> bool {
    is_member(prefix, key) && !is_reader(prefix, key)
}

/// The two key ranges of `name`'s queue outside the readers' range
/// (`name/read-` up to `name/read.`): every writer's key, and nested
/// names' keys, which [`is_writer`] sorts out.
pub(super) fn writer_ranges(name: &str) -> [(Vec<u8>, Vec<u8>); 2] {
    let prefix = queue_prefix(name).into_bytes();
    let readers = [prefix.as_slice(), READER_MARK.as_bytes()].concat();
    let after_readers = prefix_end(&readers);
    [
        (prefix.clone(), readers),
        (after_readers, prefix_end(&prefix)),
    ]
}

/// A read of the newest key of `[from, end)` by create revision, at most
/// `below` if given (keys only).
fn newest_in(from: &[u8], end: &[u8], below: Option<i64>) -> TxnOp {
    let mut options = GetOptions::new()
        .with_range(end)
        .with_keys_only()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1);
    if let Some(below) = below {
        options = options.with_max_create_revision(below);
    }
    TxnOp::get(from, Some(options))
}

/// What the two [`newest_in`] reads of the writer ranges answered: the
/// newer writer key, `Ok(None)` for none, `Err(())` if a nested name's key
/// answered in one of them (it hides whether a writer is below it: scan).
fn newest_writer(prefix: &[u8], answers: [Option<&KeyValue>; 2]) -> Result<Option<KeyValue>, ()> {
    let mut newest: Option<&KeyValue> = None;
    for kv in answers.into_iter().flatten() {
        if !is_member(prefix, kv.key()) {
            return Err(());
        }
        if newest.is_none_or(|n| n.create_revision() < kv.create_revision()) {
            newest = Some(kv);
        }
    }
    Ok(newest.cloned())
}

/// The value a contender writes: its secret, a line break, then its holder
/// record (nothing after the line break without one).
pub(super) fn contender_value(secret: &str, record: Option<&HolderRecord>) -> String {
    let record = record.map(HolderRecord::encode).unwrap_or_default();
    format!("{secret}\n{record}")
}

/// The holder record in a contender key's value; `None` for a value
/// without one (`etcdctl lock` and Go's mutex write an empty value, older
/// distlock versions the bare secret, `holder=off` nothing after it).
pub(super) fn record_of(value: &[u8]) -> Option<HolderRecord> {
    let text = std::str::from_utf8(value).ok()?;
    let (_secret, record) = text.split_once('\n')?;
    HolderRecord::decode(record)
}

/// A contender key's value written by a client that is not distlock, as
/// text: an `etcdctl elect` candidate's proposal. `None` for an empty value
/// (`etcdctl lock`, Go's mutex), one that is not UTF-8, or one of ours (a
/// 32-hex-digit secret, alone or before a line break).
pub(super) fn foreign_value(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    let first_line = text.split('\n').next().unwrap_or_default();
    let ours = first_line.len() == 32 && first_line.bytes().all(|b| b.is_ascii_hexdigit());
    (!text.is_empty() && !ours).then(|| text.to_owned())
}

/// Compares true exactly when `key`'s value starts with `secret` and a line
/// break (see [`contender_value`]): greater than the bare secret and less
/// than the secret followed by the byte after `\n`. A secret is 32 hex
/// digits, so no other grant's value falls in between.
fn secret_compares(key: &str, secret: &str) -> [Compare; 2] {
    [
        Compare::value(key, CompareOp::Greater, secret),
        Compare::value(key, CompareOp::Less, format!("{secret}\u{b}")),
    ]
}

/// What a granted lock's owner token carries: enough to release or check
/// the lock from any process, without the lease value.
///
/// Format: `<key segment>:<create revision, decimal>:<secret, 32 hex>`,
/// the key segment being what follows the queue's prefix in the
/// contender's key: `<lease id, hex>` for a writer, `read-<lease id,
/// hex>-<n>` for a reader ([`Role::key`]); an election candidate's (a
/// writer whose secret is in its owner key, [`SecretAt::OwnerKey`]) ends in
/// [`OWNER_KEY_MARK`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Token {
    pub(super) lease: i64,
    pub(super) role: Role,
    pub(super) revision: i64,
    pub(super) secret: String,
    /// The secret is in the grant's owner key, not its contender's value.
    pub(super) in_owner_key: bool,
}

/// The last part of an owner token whose secret is in an owner key.
const OWNER_KEY_MARK: &str = "owner";

impl Token {
    pub(super) fn encode(&self) -> String {
        let segment = match self.role {
            Role::Writer => format!("{:x}", self.lease),
            Role::Reader(n) => format!("{READER_MARK}{:x}-{n}", self.lease),
        };
        let owner_key = if self.in_owner_key {
            format!(":{OWNER_KEY_MARK}")
        } else {
            String::new()
        };
        format!("{segment}:{}:{}{owner_key}", self.revision, self.secret)
    }

    /// `None` for anything not in the format: such a token holds nothing.
    pub(super) fn parse(token: &str) -> Option<Token> {
        let mut parts = token.split(':');
        let segment = parts.next()?;
        let (lease, role) = match segment.strip_prefix(READER_MARK) {
            Some(reader) => {
                let (lease, n) = reader.split_once('-')?;
                let n = n
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| n.parse().ok())??;
                (lease, Role::Reader(n))
            }
            None => (segment, Role::Writer),
        };
        let lease = lease
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
            .then(|| i64::from_str_radix(lease, 16).ok())??;
        let revision = parts.next()?.parse().ok()?;
        let secret = parts.next()?.to_owned();
        let in_owner_key = match parts.next() {
            None => false,
            // Only a writer's key is an election candidate's.
            Some(OWNER_KEY_MARK) if role == Role::Writer => true,
            Some(_) => return None,
        };
        let well_formed = parts.next().is_none()
            && lease > 0
            && revision > 0
            && secret.len() == 32
            && secret.bytes().all(|b| b.is_ascii_hexdigit());
        well_formed.then_some(Token {
            lease,
            role,
            revision,
            secret,
            in_owner_key,
        })
    }

    /// The contender key this token's grant wrote for `name`.
    pub(super) fn key(&self, name: &str) -> String {
        self.role.key(name, self.lease)
    }
}

/// The answer to the acquire transaction.
#[derive(Debug)]
pub(super) enum Enqueued {
    /// Our key was written at `revision` (its create revision). `ahead`:
    /// whether a key our role waits for is older than ours, `None` if the
    /// transaction could not tell (a nested name's key answered one of its
    /// reads: then [`turn_of`] says).
    /// `fencing`: the grant's fencing token if nothing is ahead
    /// ([`fencing_token`]).
    Written {
        revision: i64,
        ahead: Option<bool>,
        fencing: i64,
    },
    /// A key of our lease for this name already existed, created at
    /// `revision`: an orphan of an earlier attempt whose clean-up failed.
    Orphan { revision: i64 },
}

/// The acquire transaction, in one request: if our key `key` is
/// absent, write it (with `value`, [`contender_value`] or an election
/// candidate's proclamation, on our lease), and `owner` (an election
/// candidate's owner key and its value, [`super::owner`]) if given, and
/// read what decides our turn; otherwise read our key. A writer reads the
/// queue's first key, as `mutex.go`'s `tryAcquire` does; a reader also the
/// newest writer's key.
pub(super) async fn enqueue(
    mut client: etcd_client::KvClient,
    name: &str,
    role: Role,
    lease: i64,
    value: &str,
    owner: Option<(&str, &str)>,
) -> Result<Enqueued, etcd_client::Error> {
    let key = role.key(name, lease);
    let prefix = queue_prefix(name);
    let first = TxnOp::get(
        prefix.as_str(),
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    );
    let put = TxnOp::put(
        key.clone(),
        value,
        Some(PutOptions::new().with_lease(lease)),
    );
    let mut reads = match role {
        Role::Writer => vec![put, first],
        Role::Reader(_) => {
            let [(from1, end1), (from2, end2)] = writer_ranges(name);
            vec![
                put,
                first,
                newest_in(&from1, &end1, None),
                newest_in(&from2, &end2, None),
            ]
        }
    };
    // Last, so that the reads' answers keep their places.
    if let Some((owner, owner_value)) = owner {
        reads.push(TxnOp::put(
            owner,
            owner_value,
            Some(PutOptions::new().with_lease(lease)),
        ));
    }
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then(reads)
        .or_else([TxnOp::get(key, None)]);
    let response = client.txn(txn).await?;
    let revision = response.header().map_or(0, |h| h.revision());
    let responses = response.op_responses();
    let first_of = |index: usize| match responses.get(index) {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    };
    if !response.succeeded() {
        return Ok(Enqueued::Orphan {
            revision: first_of(0).map_or(0, KeyValue::create_revision),
        });
    }
    let prefix = prefix.as_bytes();
    // Our own key is in the queue, so the first one exists; if it is a
    // nested name's, the first of ours is unknown.
    let first = match first_of(1) {
        Some(kv) if is_member(prefix, kv.key()) => Some(kv.create_revision()),
        Some(_) => None,
        None => Some(revision),
    };
    if role == Role::Writer {
        return Ok(Enqueued::Written {
            revision,
            ahead: first.map(|first| first != revision),
            fencing: fencing_token(revision),
        });
    }
    // A nested name's key answering hides the answer: `None`, and
    // [`reader_turn`] reads the members.
    let (ahead, fencing) = match (newest_writer(prefix, [first_of(2), first_of(3)]), first) {
        (Ok(Some(_)), _) => (Some(true), revision),
        (Ok(None), Some(first)) => (Some(false), fencing_token(first)),
        _ => (None, revision),
    };
    Ok(Enqueued::Written {
        revision,
        ahead,
        fencing,
    })
}

/// The fencing token of every grant, exclusive or shared: the create
/// revision of the queue's first key when the grant's turn came. For a
/// writer that is its own key (it is granted once every older key is
/// gone); for a reader, the oldest reader's then (its own if it is alone):
/// nothing is advanced or written for it.
///
/// Why readers' tokens sit between writers': a writer granted before the
/// reader's turn was gone by then (the reader waits for every older
/// writer, and a newer one waits for the reader), and it was granted only
/// once every older key had left, so it is older than every key still in
/// the queue, the first one included. A writer granted after it is newer
/// than the reader's key (an older one would have had to leave first),
/// which is at least the first key. And as every new key is newer than
/// all before it, the queue's first key only ever moves forward: tokens
/// never decrease over all grants, strictly increase over exclusive ones
/// (each writer's key is its own), and readers granted while one first
/// key stays share a token.
pub(super) fn fencing_token(first: i64) -> i64 {
    first
}

/// What decides a contender's turn.
#[derive(Debug)]
pub(super) enum Turn {
    /// `key` is ahead, as read at revision `at`: watch it for deletion.
    Wait { key: Vec<u8>, at: i64 },
    /// Nothing the contender waits for is ahead: the grant's fencing token
    /// is `fencing` ([`fencing_token`]).
    Go { fencing: i64 },
}

/// The turn of the reader with create revision `revision`, from the direct
/// members of its queue read at revision `at`: the newest writer's key
/// older than it, or with none, the first key for the token. `None` if the
/// queue is empty (the reader's own key is gone too).
fn reader_view(prefix: &[u8], members: &[KeyValue], revision: i64, at: i64) -> Option<Turn> {
    let writer = members
        .iter()
        .filter(|kv| is_writer(prefix, kv.key()) && kv.create_revision() < revision)
        .max_by_key(|kv| kv.create_revision());
    if let Some(writer) = writer {
        return Some(Turn::Wait {
            key: writer.key().to_vec(),
            at,
        });
    }
    let first = members.iter().map(KeyValue::create_revision).min()?;
    Some(Turn::Go {
        fencing: fencing_token(first),
    })
}

/// What the two [`secret_compares`] answer for `value`: it is greater than
/// `secret` and less than `secret` followed by `\x0b`, so it is `secret`
/// followed by at least one byte below `\x0b` (our line break).
fn holds_secret(value: &[u8], secret: &str) -> bool {
    value.starts_with(secret.as_bytes()) && value.get(secret.len()).is_some_and(|&byte| byte < 0x0b)
}

/// How many contenders `name`'s queue has (holder included): one count
/// of the prefix, and a scan of the direct members only if that counted
/// any (they may all be nested names').
pub(super) async fn queue_length(
    mut client: etcd_client::KvClient,
    name: &str,
) -> Result<usize, etcd_client::Error> {
    let response = client
        .get(
            queue_prefix(name),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await?;
    if response.count() == 0 {
        return Ok(0);
    }
    let at = response.header().map_or(0, |h| h.revision());
    Ok(members(&mut client, name, at, true).await?.0.len())
}

/// The first contender of `name`'s queue (lowest create revision, as the
/// acquire transaction sees it), with its value unless `keys_only`, and the
/// revision read at: one sorted read of the prefix, and a scan of the
/// direct members if that answered with a nested name's key.
pub(super) async fn first_of(
    mut client: etcd_client::KvClient,
    name: &str,
    keys_only: bool,
) -> Result<(Option<KeyValue>, i64), etcd_client::Error> {
    let prefix = queue_prefix(name);
    let mut options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    if keys_only {
        options = options.with_keys_only();
    }
    let mut response = client.get(prefix.as_str(), Some(options)).await?;
    let read_at = response.header().map_or(0, |h| h.revision());
    let Some(first) = response.take_kvs().into_iter().next() else {
        return Ok((None, read_at));
    };
    if is_member(prefix.as_bytes(), first.key()) {
        return Ok((Some(first), read_at));
    }
    let (members, read_at) = members(&mut client, name, read_at, keys_only).await?;
    let first = members.into_iter().min_by_key(KeyValue::create_revision);
    Ok((first, read_at))
}

/// The key just ahead of the contender with create revision `revision`
/// (`mutex.go`'s `waitDeletes`: the last-created key below it), and the
/// revision the read was made at; `None` once nothing is ahead. One sorted
/// read, and a scan of the direct members if that answered with a nested
/// name's key (which `waitDeletes` would wait for).
pub(super) async fn ahead_of(
    mut client: etcd_client::KvClient,
    name: &str,
    revision: i64,
) -> Result<Option<(Vec<u8>, i64)>, etcd_client::Error> {
    let prefix = queue_prefix(name);
    let below = revision.saturating_sub(1);
    let response = client
        .get(
            prefix.as_str(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_max_create_revision(below)
                    .with_limit(1),
            ),
        )
        .await?;
    let read_at = response.header().map_or(0, |h| h.revision());
    let Some(last) = response.kvs().first() else {
        return Ok(None);
    };
    if is_member(prefix.as_bytes(), last.key()) {
        return Ok(Some((last.key().to_vec(), read_at)));
    }
    let (members, read_at) = members(&mut client, name, read_at, true).await?;
    Ok(members
        .into_iter()
        .filter(|kv| kv.create_revision() <= below)
        .max_by_key(KeyValue::create_revision)
        .map(|kv| (kv.key().to_vec(), read_at)))
}

/// The turn of the contender of `role` with create revision `revision`:
/// the key it waits for and the revision the read was made at, or, once
/// nothing it waits for is ahead, its fencing token. A writer reads
/// [`ahead_of`] (its token is its own revision); a reader
/// [`reader_turn`].
pub(super) async fn turn_of(
    client: etcd_client::KvClient,
    name: &str,
    revision: i64,
    role: Role,
) -> Result<Turn, etcd_client::Error> {
    match role {
        Role::Writer => Ok(match ahead_of(client, name, revision).await? {
            Some((key, at)) => Turn::Wait { key, at },
            None => Turn::Go {
                fencing: fencing_token(revision),
            },
        }),
        Role::Reader(_) => reader_turn(client, name, revision).await,
    }
}

/// The turn of the reader with create revision `revision`: the newest
/// writer's key ahead of it (`rwmutex.go`'s `waitOnLastRev` over the
/// writers), or with none, the queue's first key for its token. One
/// read-only transaction of three sorted reads (the newest key of each
/// [`writer_ranges`] below `revision`, the first key of the queue), and a
/// scan of the direct members if a nested name's key answered one of
/// them. A queue found empty (the reader's key is gone too) is `Go` with
/// `revision`: the caller's check that its key is still there answers it.
pub(super) async fn reader_turn(
    mut client: etcd_client::KvClient,
    name: &str,
    revision: i64,
) -> Result<Turn, etcd_client::Error> {
    let below = revision.saturating_sub(1);
    let prefix = queue_prefix(name);
    let [(from1, end1), (from2, end2)] = writer_ranges(name);
    let first = TxnOp::get(
        prefix.as_str(),
        Some(
            GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        ),
    );
    let txn = Txn::new().and_then([
        newest_in(&from1, &end1, Some(below)),
        newest_in(&from2, &end2, Some(below)),
        first,
    ]);
    let response = client.txn(txn).await?;
    let at = response.header().map_or(0, |h| h.revision());
    let responses = response.op_responses();
    let answer = |index: usize| match responses.get(index) {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    };
    let prefix = prefix.as_bytes();
    let gone = Turn::Go {
        fencing: fencing_token(revision),
    };
    match (newest_writer(prefix, [answer(0), answer(1)]), answer(2)) {
        (Ok(Some(writer)), _) => {
            return Ok(Turn::Wait {
                key: writer.key().to_vec(),
                at,
            })
        }
        (Ok(None), None) => return Ok(gone),
        (Ok(None), Some(first)) if is_member(prefix, first.key()) => {
            return Ok(Turn::Go {
                fencing: fencing_token(first.create_revision()),
            })
        }
        // A nested name's key answered: read the members.
        _ => {}
    }
    let (members, at) = members(&mut client, name, at, true).await?;
    Ok(reader_view(prefix, &members, revision, at).unwrap_or(gone))
}

/// Every reader holding `name` when its first key is a reader's: the
/// readers older than its oldest writer, oldest first (empty if the first
/// key is a writer's or the queue is empty). One scan of the direct
/// members, at one revision.
pub(super) async fn holding_readers(
    mut client: etcd_client::KvClient,
    name: &str,
) -> Result<Vec<KeyValue>, etcd_client::Error> {
    let prefix = queue_prefix(name);
    let prefix = prefix.as_bytes();
    let (mut members, _) = members(&mut client, name, 0, true).await?;
    members.sort_by_key(KeyValue::create_revision);
    Ok(members
        .into_iter()
        .take_while(|kv| is_reader(prefix, kv.key()))
        .collect())
}

#[cfg(test)]
mod tests;
