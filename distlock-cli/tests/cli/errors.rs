//! Issue 29: every error a new user can hit names the input, the reason and
//! the next step. Each test triggers one with the real binary (against a
//! private server or a local listener on 127.0.0.1) and holds its text, so
//! this file reads as the list of messages:
//!
//! | input | message (after `distlock: `) |
//! | --- | --- |
//! | an unknown URL parameter | `invalid url: unknown parameter "bogus"; known: ...` (distlock's and the driver's) |
//! | a server that accepts and never answers | `... backend failed during connect: URL did not finish connecting within 2s (the bound is connect_timeout= ...): check that the server is running there and that this is its port; ...` |
//! | a Redis URL on another service's port | `redis backend failed during connect: URL did not answer as a Redis server (...): check the port, and the scheme (rediss:// if the server expects TLS)` |
//! | an etcd URL on another service's port | `etcd backend failed during connect: URL: connection closed during the gRPC handshake: is this an etcd client port (2379)? is TLS needed (etcd+https://)?` (or `the server's answer is not HTTP/2 (h2 protocol error: ...): is this ...`) |
//! | a cron field out of range | `invalid cron schedule: job "x": schedule "61 * * * *": ... in the minute field "61"; the minute field takes 0-59` |
//! | a TOML config error | `FILE: TOML parse error at line 5, column 1` then toml's own lines (caret diagram) |
//! | a Redis ACL user lacking a command | `... permission denied at URL: the ACL user may not run a command ... (the rules it needs: ...) (NOPERM ... 'evalsha' ...)` |
//! | a Postgres role without CREATE on the schema | `... create the fencing table "distlock_fencing": ERROR 42501: permission denied for schema public; ... have the schema's owner run once ..., or set fencing_table=..., or fencing=off ...` |
//! | a lock directory others can write | `invalid lock directory: DIR is writable by its group ...: remove that permission (chmod go-w DIR)` |
//!
//! A backend whose cargo feature is not built in (`... needs distlock's
//! cargo feature `redis`, which this build does not have; rebuild with it:
//! `cargo install distlock-cli --features redis` ...`) needs a binary built
//! without it, which this test binary is not: the text is tested in
//! `distlock/src/parse.rs`.

use std::process::{Command, Output, Stdio};

use crate::support::{code, stderr, BIN};

/// Exit code for bad input (sysexits EX_USAGE).
const USAGE: i32 = 64;
/// Exit code for an unreachable or failing backend (EX_UNAVAILABLE).
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "etcd",
    feature = "mysql"
))]
const UNAVAILABLE: i32 = 69;

/// `distlock ARGS`, stdin closed, waited for.
fn distlock(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run distlock")
}

/// `distlock run --key k --url URL -- true`.
fn run_true(url: &str) -> Output {
    distlock(&["run", "--key", "k", "--url", url, "--", "true"])
}

/// Asserts that `output` exited `exit` with exactly one line,
/// `distlock: ...`, holding every one of `parts` (the input, the reason,
/// the next step) and none of `hidden` (passwords); returns it.
fn one_line(output: &Output, exit: i32, parts: &[&str], hidden: &[&str]) -> String {
    let message = stderr(output);
    assert_eq!(code(output), exit, "{message}");
    assert_eq!(message.lines().count(), 1, "one line: {message}");
    assert!(message.starts_with("distlock: "), "{message}");
    for part in parts {
        assert!(message.contains(part), "missing {part:?} in: {message}");
    }
    for secret in hidden {
        assert!(!message.contains(secret), "{secret:?} shown in: {message}");
    }
    message
}

/// A port on 127.0.0.1 whose listener accepts every connection, writes
/// `banner` on it (nothing if empty) and then never answers: a silent
/// server, or another service on the port a URL names.
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "etcd",
    feature = "mysql"
))]
fn listener(banner: &'static [u8]) -> u16 {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    let port = listener.local_addr().expect("local address").port();
    std::thread::spawn(move || {
        // Held open until the test binary exits: closing would answer.
        let mut held = Vec::new();
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(banner);
            held.push(stream);
        }
    });
    port
}

#[cfg(any(feature = "redis", feature = "etcd"))]
const SSH_BANNER: &[u8] = b"SSH-2.0-OpenSSH_9.2\r\n";

#[cfg(feature = "postgres")]
#[test]
fn an_unknown_postgres_parameter_is_named_with_the_known_ones() {
    let output = run_true("postgres://app:secret@127.0.0.1:1/db?bogus=1");
    one_line(
        &output,
        USAGE,
        &[
            "invalid url: unknown parameter \"bogus\"; known: key_prefix (or prefix, namespace), ",
            // distlock's own, then tokio-postgres's.
            "query_timeout",
            "connect_timeout",
            "application_name",
            "target_session_attrs",
        ],
        &["secret"],
    );
    // A tokio-postgres parameter still reaches the driver.
    let output = run_true("postgres://app:secret@127.0.0.1:1/db?application_name=x&bogus=1");
    one_line(
        &output,
        USAGE,
        &["unknown parameter \"bogus\""],
        &["secret"],
    );
}

#[cfg(feature = "mysql")]
#[test]
fn an_unknown_mysql_parameter_is_named_with_the_known_ones() {
    let output = run_true("mysql://app:secret@127.0.0.1:1/db?bogus=1");
    one_line(
        &output,
        USAGE,
        &[
            "invalid url: unknown parameter \"bogus\"; known: key_prefix (or prefix, namespace), ",
            "ssl-mode (or ssl_mode)",
        ],
        &["secret"],
    );
}

#[cfg(feature = "etcd")]
#[test]
fn an_unknown_etcd_parameter_is_named_with_the_known_ones() {
    let output = run_true("etcd://app:secret@127.0.0.1:1?bogus=1");
    one_line(
        &output,
        USAGE,
        &["unknown parameter \"bogus\"; known: key_prefix (or prefix), connect_timeout"],
        &["secret"],
    );
}

#[cfg(feature = "zookeeper")]
#[test]
fn an_unknown_zookeeper_parameter_is_named_with_the_known_ones() {
    let output = run_true("zookeeper://127.0.0.1:1?bogus=1");
    one_line(
        &output,
        USAGE,
        &["unknown parameter \"bogus\"; known: key_prefix (or prefix), session_timeout"],
        &[],
    );
}

/// What every silent-server message says after the address.
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
const SILENT: [&str; 2] = [
    "check that the server is running there and that this is its port",
    "another service on that port that never answers, looks like this",
];

#[cfg(feature = "postgres")]
#[test]
fn a_silent_postgres_server_is_named_with_the_bound_and_what_to_check() {
    let port = listener(b"");
    let url =
        format!("postgres://app:secret@127.0.0.1:{port}/db?connect_timeout=1&query_timeout=1s");
    let target = format!("postgres://app@127.0.0.1:{port}/db did not finish connecting within 2s");
    one_line(
        &run_true(&url),
        UNAVAILABLE,
        &[
            "postgres backend failed during connect: ",
            &target,
            "(the bound is connect_timeout= in the URL, per host, plus query_timeout=)",
            SILENT[0],
            SILENT[1],
        ],
        &["secret"],
    );
}

#[cfg(feature = "mysql")]
#[test]
fn a_silent_mysql_server_is_named_with_the_bound_and_what_to_check() {
    let port = listener(b"");
    let url = format!("mysql://app:secret@127.0.0.1:{port}/db?connect_timeout=1s&query_timeout=1s");
    let target = format!("mysql://app@127.0.0.1:{port}/db did not finish connecting within 2s");
    one_line(
        &run_true(&url),
        UNAVAILABLE,
        &[
            "mysql backend failed during connect: ",
            &target,
            "(the bound is connect_timeout= plus query_timeout= in the URL)",
            SILENT[0],
            SILENT[1],
        ],
        &["secret"],
    );
}

#[cfg(feature = "redis")]
#[test]
fn a_silent_redis_server_is_named_with_the_bound_and_what_to_check() {
    let port = listener(b"");
    let url = format!("redis://app:secret@127.0.0.1:{port}?connect_timeout=1s&response_timeout=1s");
    let target = format!("127.0.0.1:{port}/0 did not finish connecting within");
    one_line(
        &run_true(&url),
        UNAVAILABLE,
        &[
            "redis backend failed during connect: redis://app",
            &target,
            "(the bound is connect_timeout= plus response_timeout= in the URL)",
            SILENT[0],
            SILENT[1],
        ],
        &["secret"],
    );
}

#[cfg(feature = "redis")]
#[test]
fn a_redis_url_on_another_services_port_says_it_is_not_redis() {
    let port = listener(SSH_BANNER);
    let target = format!("redis://127.0.0.1:{port}/0 did not answer as a Redis server (");
    one_line(
        &run_true(&format!("redis://127.0.0.1:{port}")),
        UNAVAILABLE,
        &[
            "redis backend failed during connect: ",
            &target,
            "): check the port, and the scheme (rediss:// if the server expects TLS)",
        ],
        &[],
    );
}

#[cfg(feature = "etcd")]
#[test]
fn an_etcd_url_on_another_services_port_says_what_to_check() {
    let port = listener(SSH_BANNER);
    let target = format!("etcd backend failed during connect: etcd://127.0.0.1:{port}: ");
    let message = one_line(
        &run_true(&format!("etcd://127.0.0.1:{port}?connect_timeout=5s")),
        UNAVAILABLE,
        &[
            &target,
            ": is this an etcd client port (2379)? is TLS needed (etcd+https://)?",
        ],
        &[],
    );
    // The client either reads the banner as a malformed HTTP/2 frame or
    // sees the connection close, depending on which comes first.
    let reason = message
        .strip_prefix(&format!("distlock: {target}"))
        .unwrap_or_default();
    assert!(
        reason.starts_with("connection closed during the gRPC handshake: ")
            || reason.starts_with("the server's answer is not HTTP/2 (h2 protocol error: "),
        "{message}"
    );
    assert!(
        !message.contains("tonic::"),
        "no tonic debug output: {message}"
    );
}

#[test]
fn a_cron_field_out_of_range_is_named_with_its_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}", dir.path().display());
    for (schedule, field) in [
        (
            "61 * * * *",
            "in the minute field \"61\"; the minute field takes 0-59",
        ),
        (
            "0 24 * * *",
            "in the hour field \"24\"; the hour field takes 0-23",
        ),
        (
            "0 0 32 * *",
            "in the day-of-month field \"32\"; the day-of-month field takes 1-31",
        ),
    ] {
        let output = distlock(&[
            "cron",
            "--url",
            &url,
            "--name",
            "x",
            "--schedule",
            schedule,
            "--",
            "true",
        ]);
        let job = format!("invalid cron schedule: job \"x\": schedule \"{schedule}\": ");
        one_line(&output, USAGE, &[&job, field], &[]);
    }
}

#[test]
fn a_toml_error_keeps_tomls_lines_after_the_file_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("jobs.toml");
    std::fs::write(
        &config,
        "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\ncolour = \"red\"\n",
    )
    .expect("write");
    let url = format!("file://{}", dir.path().display());
    let output = distlock(&[
        "cron",
        "--url",
        &url,
        "--config",
        config.to_str().expect("UTF-8"),
    ]);
    let message = stderr(&output);
    assert_eq!(code(&output), USAGE, "{message}");
    let lines: Vec<&str> = message.lines().collect();
    // As toml formats it: where, the line, a caret under the field, why.
    assert_eq!(
        lines.first().copied(),
        Some(
            format!(
                "distlock: {}: TOML parse error at line 5, column 1",
                config.display()
            )
            .as_str()
        ),
        "{message}"
    );
    assert!(lines.contains(&"5 | colour = \"red\""), "{message}");
    assert!(lines.contains(&"  | ^^^^^^"), "{message}");
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("unknown field `colour`, expected one of")),
        "{message}"
    );
    assert_eq!(
        message.matches("jobs.toml").count(),
        1,
        "the file named once: {message}"
    );
}

#[test]
fn a_lock_directory_others_can_write_is_named_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let locks = dir.path().join("locks");
    std::fs::create_dir(&locks).expect("create");
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o770)).expect("chmod");
    let shown = locks.display().to_string();
    let refused = format!("invalid lock directory: {shown} is writable by its group");
    let fix = format!("remove that permission (chmod go-w {shown})");
    one_line(
        &run_true(&format!("file://{shown}")),
        USAGE,
        &[&refused, &fix],
        &[],
    );
}

#[cfg(feature = "redis")]
#[test]
fn a_redis_acl_user_without_a_command_is_told_the_rules_it_needs() {
    let server = test_servers::RedisServer::start();
    let rules = distlock::redis::ACL_RULES.replace("+evalsha ", "");
    let mut args = vec![
        "ACL", "SETUSER", "app", "reset", "on", ">secret", "~lock:*", "&lock:*",
    ];
    args.extend(rules.split_whitespace());
    assert_eq!(server.cli(&args), "OK");
    let url = format!("redis://app:secret@127.0.0.1:{}", server.port());
    let at = format!(
        "permission denied at redis://app@127.0.0.1:{}/0: ",
        server.port()
    );
    let needs = format!("(the rules it needs: {})", distlock::redis::ACL_RULES);
    one_line(
        &run_true(&url),
        UNAVAILABLE,
        &[
            &at,
            "the ACL user may not run a command, or use a key or channel, that the backend needs",
            &needs,
            "evalsha",
        ],
        &["secret"],
    );
}

#[cfg(feature = "postgres")]
#[test]
fn a_postgres_role_without_create_is_told_how_to_make_the_fencing_table() {
    let server = test_servers::PostgresServer::start();
    // Postgres 15 and later grant no CREATE on public; older ones do, so
    // it is taken away here to be the same everywhere.
    server.psql("CREATE ROLE app LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    let url = format!(
        "postgres://app@127.0.0.1:{}/postgres?sslmode=disable",
        server.port()
    );
    one_line(
        &run_true(&url),
        UNAVAILABLE,
        &[
            "postgres backend failed during connect: create the fencing table \"distlock_fencing\": ",
            "permission denied for schema public",
            "the role may not create tables in that schema",
            "have the schema's owner run once `CREATE TABLE IF NOT EXISTS \"distlock_fencing\" (",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON \"distlock_fencing\" TO <the role>`",
            "or set fencing_table=<schema>.<table> to a schema the role may create in",
            "or fencing=off to lock without fencing tokens",
        ],
        &[],
    );
    // The statement the message gives works: run by the owner, the role
    // locks.
    let message = stderr(&run_true(&url));
    let create = message
        .split('`')
        .nth(1)
        .expect("the statement between backquotes")
        .replace("<the role>", "app");
    server.psql(&create);
    let output = run_true(&url);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
}
