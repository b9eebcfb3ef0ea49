//! The Postgres builder's settings from every source, and what they
//! promise a holder.

use super::super::fencing::FencingTable;
use super::*;
use crate::config::SqlConfig;

fn settings(url: &str) -> Result<Settings> {
    PostgresLockerBuilder::from_url(url)?.into_settings()
}

#[test]
fn own_parameters_are_read_and_the_rest_passed_on() {
    let s = settings(
        "postgresql://app:pw@db:6543/jobs?namespace=billing&sessions=2&fencing_table=ops.fence\
         &sslmode=disable&application_name=cron&connect_timeout=3&tcp_user_timeout=2500",
    )
    .unwrap();
    assert_eq!(s.namespace, "billing");
    assert_eq!(s.sessions, 2);
    assert_eq!(s.fencing, Some(FencingTable::parse("ops.fence").unwrap()));
    assert_eq!(s.pg.get_application_name(), Some("cron"));
    assert_eq!(s.pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
    assert_eq!(
        s.pg.get_tcp_user_timeout(),
        Some(&Duration::from_millis(2500))
    );
    assert_eq!(s.target, "postgres://app@db:6543/jobs");
}

#[test]
fn defaults_are_short_keepalives_and_read_write_sessions() {
    let s = settings("postgres://u@h/d?sslmode=disable").unwrap();
    assert_eq!(s.pg.get_keepalives_idle(), TcpKeepalive::CLIENT.idle);
    assert_eq!(s.pg.get_keepalives_retries(), Some(3));
    assert_eq!(
        s.pg.get_target_session_attrs(),
        TargetSessionAttrs::ReadWrite
    );
    assert_eq!(s.pg.get_application_name(), Some(DEFAULT_APPLICATION_NAME));
    assert_eq!(s.fencing, Some(FencingTable::default()));
    assert_eq!(s.server_keepalive, Some(TcpKeepalive::SERVER));
    let s = settings(
        "postgres://u@h/d?sslmode=disable&keepalives_idle=30&fencing=off&server_keepalives=off",
    )
    .unwrap();
    assert_eq!(s.pg.get_keepalives_idle(), Duration::from_secs(30));
    assert_eq!(s.fencing, None);
    assert_eq!(s.server_keepalive, None);
}

#[test]
fn bad_urls_are_invalid_input_without_the_password() {
    for url in [
        "mysql://u:hunter2@h/d",
        "postgres://u:hunter2@h/d?sslmode=allow",
        "postgres://u:hunter2@h/d?sessions=many",
        "postgres://u:hunter2@h/d?sslcert=/c.pem",
        "postgres://u:hunter2@h:notaport/d",
        "postgres://u:hunter2@h/d?fencing_table=a.b.c",
        "postgres://u:hunter2@h/d?sessions=0",
        // A pool of a billion slots would be allocated up front.
        "postgres://u:hunter2@h/d?sessions=1000000000",
    ] {
        let err = settings(url).unwrap_err();
        assert!(err.to_string().contains("invalid"), "{url}: {err}");
        assert!(!err.to_string().contains("hunter2"), "{url}: {err}");
    }
    let builder = PostgresLockerBuilder::from_url("postgres://u:hunter2@h/d").unwrap();
    let s = builder.clone().into_settings().unwrap();
    crate::config::assert_hidden("hunter2", &[&builder, &s]);
}

#[test]
fn max_waiters_is_read_from_the_url_and_must_be_positive() {
    assert_eq!(
        settings("postgres://u@h/d").unwrap().max_waiters,
        DEFAULT_MAX_WAITERS
    );
    let s = settings("postgres://u@h/d?max_waiters=2&idle_waiters=1").unwrap();
    assert_eq!((s.max_waiters, s.idle_waiters), (2, 1));
    for value in ["0", "-1", "many", "", "2.5", "99999999999999999999999"] {
        let url = format!("postgres://u:hunter2@h/d?max_waiters={value}");
        match settings(&url) {
            Err(Error::InvalidInput {
                what: "url",
                reason,
            }) => {
                assert!(reason.contains("max_waiters"), "{value:?}: {reason}");
                assert!(!reason.contains("hunter2"), "{value:?}: {reason}");
            }
            other => panic!("{value:?}: {other:?}"),
        }
    }
    // The builder overrides the URL, and checks the same range.
    let builder = PostgresLockerBuilder::from_url("postgres://u@h/d?max_waiters=2").unwrap();
    assert_eq!(
        builder
            .clone()
            .max_waiters(5)
            .into_settings()
            .unwrap()
            .max_waiters,
        5
    );
    assert!(matches!(
        builder.max_waiters(0).into_settings(),
        Err(Error::InvalidInput {
            what: "max_waiters",
            ..
        })
    ));
}

#[test]
fn the_defaults_leave_a_grace_of_six_seconds_after_a_silent_server_is_noticed() {
    assert_eq!(
        TcpKeepalive::SERVER.earliest_detection(),
        Duration::from_secs(12)
    );
    let s = settings("postgres://u@h/d").unwrap();
    assert_eq!(s.pg.get_tcp_user_timeout(), Some(&Duration::from_secs(4)));
    assert_eq!(s.silence_limit(), Duration::from_secs(4));
    assert_eq!(s.server_window(), Duration::from_secs(10));
    assert_eq!(s.grace_at_silence_limit(), Duration::from_secs(6));
    assert_eq!(s.session_lock_timeout_ms(), 1500);
    // The client's own TCP timers no longer set the bound: the pings do.
    for url in [
        "postgres://u@h/d?tcp_user_timeout=0",
        "postgres://u@h/d?keepalives_idle=30",
    ] {
        assert_eq!(
            settings(url).unwrap().grace_at_silence_limit(),
            Duration::from_secs(6),
            "{url}"
        );
    }
    // The server's keepalive left alone: nothing known, no grace.
    let s = settings("postgres://u@h/d?server_keepalives=off").unwrap();
    assert_eq!(s.server_window(), Duration::ZERO);
    // A shorter idle_session_timeout shortens the window; off leaves
    // the keepalive's.
    let s = settings("postgres://u@h/d?idle_session_timeout=7s").unwrap();
    assert_eq!(s.server_window(), Duration::from_secs(7));
    assert_eq!(s.grace_at_silence_limit(), Duration::from_secs(3));
    let s = settings("postgres://u@h/d?idle_session_timeout=off").unwrap();
    assert_eq!(s.idle_session_timeout, None);
    assert_eq!(s.server_window(), Duration::from_secs(10));
    // Pings slower than the server window are refused: the holder
    // would hear of a silent server only after its locks may be freed.
    let err =
        settings("postgres://u@h/d?ping_interval=5s&ping_timeout=6s&idle_session_timeout=off")
            .unwrap_err()
            .to_string();
    assert!(err.contains("not shorter than the 10s"), "{err}");
    // With the server's keepalive left alone nothing is promised: no check.
    let s = settings(
        "postgres://u@h/d?ping_interval=5s&ping_timeout=6s&idle_session_timeout=off\
         &server_keepalives=off",
    )
    .unwrap();
    assert_eq!(s.silence_limit(), Duration::from_secs(11));
    assert_eq!(s.grace_at_silence_limit(), Duration::ZERO);
}

#[test]
fn durations_take_units_and_bare_seconds() {
    let s = settings("postgres://u@h/d?ping_interval=500ms&ping_timeout=2&idle_session_timeout=1m")
        .unwrap();
    assert_eq!(s.ping_interval, Duration::from_millis(500));
    assert_eq!(s.ping_timeout, Duration::from_secs(2));
    assert_eq!(s.idle_session_timeout, Some(Duration::from_secs(60)));
    for url in [
        "postgres://u:hunter2@h/d?ping_interval=soon",
        "postgres://u:hunter2@h/d?ping_interval=0",
        "postgres://u:hunter2@h/d?ping_timeout=0s",
    ] {
        let err = settings(url).unwrap_err().to_string();
        assert!(err.contains("ping_"), "{url}: {err}");
        assert!(!err.contains("hunter2"), "{url}: {err}");
    }
    // An idle_session_timeout the pings could not stay inside.
    let err = settings("postgres://u@h/d?idle_session_timeout=5s")
        .unwrap_err()
        .to_string();
    assert!(err.contains("idle_session_timeout is 5s"), "{err}");
}

/// What the four sources must agree on.
fn summary(
    s: &Settings,
) -> (
    String,
    bool,
    Duration,
    Duration,
    usize,
    Option<Duration>,
    Option<Duration>,
) {
    (
        s.namespace.clone(),
        s.holder_record,
        s.query_timeout,
        s.ping_interval,
        s.max_waiters,
        s.pg.get_tcp_user_timeout().copied(),
        s.pg.get_connect_timeout().copied(),
    )
}

#[test]
fn every_source_reaches_the_same_settings() {
    let want = (
        "billing".to_owned(),
        false,
        Duration::from_secs(5),
        Duration::from_millis(500),
        3,
        Some(Duration::from_millis(2500)),
        Some(Duration::from_secs(3)),
    );
    let sources = [
        "postgres://u@h/d?key_prefix=billing&holder_record=off&query_timeout=5&ping_interval=500ms\
         &max_waiters=3&tcp_user_timeout=2500&connect_timeout=3",
        r#"{"url": "postgres://u@h/d", "keyPrefix": "billing", "holderRecord": false,
            "queryTimeout": 5, "pingInterval": "500ms", "maxWaiters": 3,
            "tcpUserTimeout": "2500ms", "connectTimeout": 3}"#,
        "url: postgres://u@h/d\nnamespace: billing\nrecord_holder: off\nquery_timeout: 5s\n\
         ping_interval: 500ms\nmax_waiters: 3\ntcp_user_timeout: 2500\nconnect_timeout: 3s\n",
    ];
    let built = |config: &SqlConfig<sources::Postgres>| {
        Config(config.clone())
            .builder()
            .unwrap()
            .into_settings()
            .unwrap()
    };
    let [.., env] = crate::config::sql::assert_every_source_reaches(
        |config| summary(&built(config)),
        want,
        sources,
        &[
            (
                "DISTLOCK_POSTGRES_URL",
                "postgres://u@h/d?connect_timeout=3",
            ),
            ("DISTLOCK_POSTGRES_KEY_PREFIX", "billing"),
            ("DISTLOCK_POSTGRES_HOLDER", "off"),
            ("DISTLOCK_POSTGRES_QUERY_TIMEOUT", "5s"),
            ("DISTLOCK_POSTGRES_PING_INTERVAL", "500ms"),
            ("DISTLOCK_POSTGRES_MAX_WAITERS", "3"),
            ("DISTLOCK_POSTGRES_TCP_USER_TIMEOUT", "2500"),
            ("DISTLOCK_POSTGRES_PASSWORD", "pw"),
            ("DISTLOCK_REDIS_PASSWORD", "not ours"),
        ],
    );
    assert_eq!(built(&env).pg.get_password(), Some(&b"pw"[..]));
    assert!(!format!("{env:?}").contains("pw\""), "{env:?}");
}

#[test]
fn units_and_older_spellings_are_accepted() {
    for (value, want) in [
        ("5s", 5_000),
        ("5", 5_000),
        ("1m30s", 90_000),
        ("500ms", 500),
    ] {
        let s = settings(&format!(
            "postgres://u@h/d?query_timeout={value}&ping_timeout=2"
        ))
        .unwrap();
        assert_eq!(s.query_timeout, Duration::from_millis(want), "{value}");
    }
    for param in ["key_prefix", "namespace", "prefix"] {
        let s = settings(&format!("postgres://u@h/d?{param}=billing")).unwrap();
        assert_eq!(s.namespace, "billing", "{param}");
    }
    for param in ["holder_record", "holder", "record_holder"] {
        assert!(
            !settings(&format!("postgres://u@h/d?{param}=off"))
                .unwrap()
                .holder_record
        );
    }
    // libpq's parameters keep libpq's units for a bare number, and take units.
    let s =
        settings("postgres://u@h/d?tcp_user_timeout=2s&connect_timeout=1500ms&keepalives_idle=2")
            .unwrap();
    assert_eq!(s.pg.get_tcp_user_timeout(), Some(&Duration::from_secs(2)));
    assert_eq!(
        s.pg.get_connect_timeout(),
        Some(&Duration::from_millis(1500))
    );
    assert_eq!(s.pg.get_keepalives_idle(), Duration::from_secs(2));
    let err = settings("postgres://u:hunter2@h/d?query_timeout=soon")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("URL parameter `query_timeout`") && !err.contains("hunter2"),
        "{err}"
    );
    let err = Config::from_json(r#"{"url": "postgres://h/d", "quer_timeout": 5}"#).unwrap_err();
    assert!(err.to_string().contains("quer_timeout"), "{err}");
    let err = Config::from_env_vars([("DISTLOCK_POSTGRES_SESSIONS", "many")]).unwrap_err();
    assert!(
        err.to_string().contains("DISTLOCK_POSTGRES_SESSIONS"),
        "{err}"
    );
    assert!(Config::from_env_vars(Vec::<(String, String)>::new())
        .unwrap()
        .builder()
        .is_err());
}

#[test]
fn an_unknown_parameter_is_named_with_distlocks_and_the_drivers() {
    let err = settings("postgres://u:hunter2@h/d?application_name=x&bogus=1").unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "invalid url: unknown parameter \"bogus\"; known: key_prefix (or prefix, namespace), "
        ),
        "{text}"
    );
    // distlock's own, then tokio-postgres', which stay in the URL for it.
    assert!(
        text.contains(", tcp_user_timeout, user, password, dbname, "),
        "{text}"
    );
    assert!(
        text.ends_with(", channel_binding, load_balance_hosts"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
    // A driver parameter with a bad value: tokio-postgres' reason, named.
    let err = settings("postgres://u@h/d?target_session_attrs=sometimes").unwrap_err();
    assert!(
        err.to_string().contains("not a valid Postgres URL: invalid connection string: invalid value for option `target_session_attrs`"),
        "{err}"
    );
}

#[test]
fn every_url_parameter_is_in_the_readme() {
    crate::config::assert_in_readme("Postgres", sources::PARAMETERS);
}

#[test]
fn an_unquoted_numeric_yaml_password_is_the_text_written() {
    let config = Config::from_yaml("url: postgres://u@h/d\npassword: 0123\n").unwrap();
    let settings = config.builder().unwrap().into_settings().unwrap();
    assert_eq!(settings.pg.get_password(), Some(&b"0123"[..]));
}
