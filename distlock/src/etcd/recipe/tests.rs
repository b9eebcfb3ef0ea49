//! Unit tests of `recipe.rs`: key layout, tokens and values, without a server.

use super::*;

#[test]
fn only_a_value_that_is_not_ours_is_foreign() {
    let secret = "0123456789abcdef0123456789abcdef";
    assert_eq!(
        foreign_value(b"10.0.0.7:8080").as_deref(),
        Some("10.0.0.7:8080")
    );
    assert_eq!(foreign_value(b""), None, "etcdctl lock writes nothing");
    assert_eq!(
        foreign_value(secret.as_bytes()),
        None,
        "an older distlock's bare secret"
    );
    let ours = contender_value(secret, None);
    assert_eq!(foreign_value(ours.as_bytes()), None);
    assert_eq!(foreign_value(&[0xff, 0xfe]), None, "not text");
}

#[test]
fn keys_are_those_of_etcds_mutex() {
    assert_eq!(
        contender_key("lock:k", 0x694d_77a1_b2c3),
        "lock:k/694d77a1b2c3"
    );
    assert_eq!(queue_prefix("lock:k"), "lock:k/");
}

#[test]
fn reader_keys_are_members_that_writers_wait_for() {
    assert_eq!(
        Role::Reader(3).key("lock:k", 0x694d_77a1_b2c3),
        "lock:k/read-694d77a1b2c3-3"
    );
    let prefix = queue_prefix("lock:k");
    let prefix = prefix.as_bytes();
    let reader = b"lock:k/read-694d77a1b2c3-3";
    assert!(is_member(prefix, reader) && is_reader(prefix, reader));
    assert!(!is_writer(prefix, reader));
    assert_each_key(
        &[
            &b"lock:k/694d77a1b2c3"[..],
            b"lock:k/foreign",
            b"lock:k/read",
        ],
        |writer| is_writer(prefix, writer) && !is_reader(prefix, writer),
    );
    // Go's experimental RWMutex writes nested names' keys.
    for nested in [&b"lock:k/read/1700000000"[..], b"lock:k/read-x/1"] {
        assert!(!is_reader(prefix, nested) && !is_writer(prefix, nested));
    }
}

/// The writer ranges cover every key under the queue's prefix but the
/// readers' range, and nothing outside the prefix.
#[test]
fn writer_ranges_leave_out_only_the_readers() {
    let [(from1, end1), (from2, end2)] = writer_ranges("lock:k");
    let in_writer_ranges = |key: &[u8]| {
        (from1.as_slice() <= key && key < end1.as_slice())
            || (from2.as_slice() <= key && key < end2.as_slice())
    };
    assert_each_key(
        &[
            &b"lock:k/0"[..],
            b"lock:k/694d77a1b2c3",
            b"lock:k/ffffffffffffffff",
            b"lock:k/read",
            b"lock:k/read.",
            b"lock:k/reae",
            b"lock:k/zzz",
            b"lock:k/\xff",
        ],
        in_writer_ranges,
    );
    assert_each_key(
        &[
            &b"lock:k/read-1-1"[..],
            b"lock:k/read-",
            b"lock:k",
            b"lock:k0",
            b"lock:j/1",
        ],
        |other| !in_writer_ranges(other),
    );
}

#[test]
fn a_queue_is_its_direct_members_only() {
    let prefix = queue_prefix("lock:jobs");
    let prefix = prefix.as_bytes();
    assert!(is_member(prefix, b"lock:jobs/694d77a1b2c3"));
    assert_each_key(
        &[
            &b"lock:jobs/nightly/694d77a1b2c3"[..],
            b"lock:jobs/",
            b"lock:jobs",
            b"lock:jobsx/1",
            b"lock:job/1",
        ],
        |other| !is_member(prefix, other),
    );
}

#[test]
fn a_member_scan_skips_each_nested_subtree_in_one_hop() {
    let prefix = b"lock:k/";
    assert_eq!(member_scan_next(prefix, b"lock:k/1f"), b"lock:k/1f\0");
    assert_eq!(member_scan_next(prefix, b"lock:k/x/1f"), b"lock:k/x0");
    assert_eq!(member_scan_next(prefix, b"lock:k/x/y/1f"), b"lock:k/x0");
    // Nothing of x's subtree is at or after the next start, nothing
    // outside it is skipped.
    let next = member_scan_next(prefix, b"lock:k/x/1f");
    assert!(b"lock:k/x/zzzz/ffff".as_slice() < next.as_slice());
    assert!(b"lock:k/x0".as_slice() >= next.as_slice());
    assert!(b"lock:k/x.".as_slice() < b"lock:k/x/".as_slice());
}

#[test]
fn a_prefix_ends_where_etcd_ends_it() {
    assert_eq!(prefix_end(b"lock:k/"), b"lock:k0");
    assert_eq!(prefix_end(b"a\xff\xff"), b"b");
    assert_eq!(prefix_end(b"\xff"), [0]);
    assert_eq!(prefix_end(b""), [0]);
}

/// The batch's client-side check answers what the server's two range
/// compares answer for one key, whatever the value.
#[test]
fn holds_secret_is_the_secret_compares() {
    let secret = "0123456789abcdef0123456789abcdef";
    let upper = format!("{secret}\u{b}");
    let by_compares = |value: &[u8]| value > secret.as_bytes() && value < upper.as_bytes();
    let values: Vec<Vec<u8>> = [
        String::new(),
        secret.to_owned(),
        secret[..31].to_owned(),
        format!("{secret}\n"),
        format!("{secret}\nhost\n1\nlabel"),
        format!("{secret}\u{0}"),
        format!("{secret}\u{b}"),
        format!("{secret}\u{b}x"),
        format!("{secret}\u{c}"),
        format!("{secret}0\n"),
        format!("1{}\n", &secret[1..]),
        format!("/{}\n", &secret[1..]),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect();
    for value in &values {
        assert_eq!(
            holds_secret(value, secret),
            by_compares(value),
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
    assert!(holds_secret(format!("{secret}\n").as_bytes(), secret));
    assert!(!holds_secret(secret.as_bytes(), secret));
}

/// Fails, naming the key, unless `holds` is true of each of `keys`.
fn assert_each_key(keys: &[&[u8]], holds: impl Fn(&[u8]) -> bool) {
    for key in keys {
        assert!(holds(key), "{}", String::from_utf8_lossy(key));
    }
}

/// `token` encodes as `text`, parses back from it, and is the contender
/// key `key` of the lock name `lock:k`.
fn assert_round_trip(token: &Token, text: &str, key: &str) {
    assert_eq!(token.encode(), text);
    assert_eq!(Token::parse(text), Some(token.clone()));
    assert_eq!(token.key("lock:k"), key);
}

#[test]
fn tokens_round_trip_and_reject_anything_else() {
    let token = Token {
        lease: 0x7587_8a1e_40b1_2c03,
        role: Role::Writer,
        revision: 42,
        secret: "0123456789abcdef0123456789abcdef".into(),
        in_owner_key: false,
    };
    assert_round_trip(
        &token,
        "75878a1e40b12c03:42:0123456789abcdef0123456789abcdef",
        "lock:k/75878a1e40b12c03",
    );
    let reader = Token {
        role: Role::Reader(7),
        ..token
    };
    assert_round_trip(
        &reader,
        "read-75878a1e40b12c03-7:42:0123456789abcdef0123456789abcdef",
        "lock:k/read-75878a1e40b12c03-7",
    );
    let candidate = Token {
        role: Role::Writer,
        in_owner_key: true,
        ..reader
    };
    assert_round_trip(
        &candidate,
        "75878a1e40b12c03:42:0123456789abcdef0123456789abcdef:owner",
        "lock:k/75878a1e40b12c03",
    );
    for bad in [
        "",
        "0123456789abcdef0123456789abcdef",
        "zz:1:0123456789abcdef0123456789abcdef",
        "+1:1:0123456789abcdef0123456789abcdef",
        "1:0:0123456789abcdef0123456789abcdef",
        "1:2:short",
        "1:2:0123456789abcdef0123456789abcdef:extra",
        "read-1:2:0123456789abcdef0123456789abcdef",
        "read-1-:2:0123456789abcdef0123456789abcdef",
        "read--1:2:0123456789abcdef0123456789abcdef",
        "read-1-x:2:0123456789abcdef0123456789abcdef",
        "read-1-+2:2:0123456789abcdef0123456789abcdef",
        "read-0-1:2:0123456789abcdef0123456789abcdef",
        "1:2:0123456789abcdef0123456789abcdef:owners",
        "1:2:0123456789abcdef0123456789abcdef:owner:x",
        "read-1-2:2:0123456789abcdef0123456789abcdef:owner",
    ] {
        assert_eq!(Token::parse(bad), None, "{bad:?}");
    }
}
