//! The MySQL builder's settings from every source, and what they promise
//! a holder.

use super::super::fencing::FencingTable;
use super::*;
use crate::config::SqlConfig;

fn settings(url: &str) -> Result<Settings> {
    MysqlLockerBuilder::from_url(url)?.into_settings()
}

#[test]
fn parameters_are_read() {
    let s = settings(
        "mariadb://app:pw@db:3307/jobs?sessions=2&fencing_table=ops.fence&ssl-mode=REQUIRED\
         &query_timeout=3&wait_timeout=20&ping_interval=500ms&max_waiters=3&idle_waiters=1",
    )
    .unwrap();
    assert_eq!(s.sessions, 2);
    assert_eq!(
        s.fencing,
        Some(FencingTable::new(Some("ops"), "fence").unwrap())
    );
    assert_eq!(s.connect.ssl_mode, SslMode::Required);
    assert!(s.connect.with_tls.is_some());
    assert_eq!(s.query_timeout, Duration::from_secs(3));
    assert_eq!(s.ping_interval, Duration::from_millis(500));
    assert_eq!((s.max_waiters, s.idle_waiters), (3, 1));
    assert_eq!(s.target, "mysql://app@db:3307/jobs");
    assert_eq!(s.connect.plain.db_name(), Some("jobs"));
    assert_eq!(s.connect.plain.tcp_port(), 3307);
    assert!(!s.connect.plain.prefer_socket());
}

#[test]
fn defaults_leave_a_partition_grace_of_eight_seconds_and_debug_hides_the_password() {
    let builder = MysqlLockerBuilder::from_url("mysql://u:hunter2@h/d").unwrap();
    let s = builder.clone().into_settings().unwrap();
    crate::config::assert_hidden("hunter2", &[&builder, &s]);
    assert_eq!(s.partition_grace(), Duration::from_secs(8));
    assert_eq!(s.connect.ssl_mode, SslMode::Preferred);
    assert_eq!(s.fencing, Some(FencingTable::default()));
    assert_eq!(s.connect.plain.tcp_keepalive(), Some(TCP_KEEPALIVE_IDLE));
    assert!(s.connect.plain.init()[0].contains("wait_timeout = 15"));
    let s = settings("mysql://u@h/d?fencing=off&ssl-mode=disabled").unwrap();
    assert_eq!(s.fencing, None);
    assert!(s.connect.with_tls.is_none());
}

#[test]
fn the_namespace_defaults_to_the_database_and_can_be_chosen_or_emptied() {
    assert_eq!(settings("mysql://u@h/svc_a").unwrap().namespace, "svc_a");
    assert_eq!(settings("mysql://u@h").unwrap().namespace, "");
    for param in ["prefix", "key_prefix", "namespace"] {
        let s = settings(&format!("mysql://u@h/svc_a?{param}=shared")).unwrap();
        assert_eq!(s.namespace, "shared", "{param}");
        let s = settings(&format!("mysql://u@h/svc_a?{param}=")).unwrap();
        assert_eq!(s.namespace, "", "{param}");
    }
    let s = MysqlLockerBuilder::from_url("mysql://u@h/svc_a?prefix=x")
        .unwrap()
        .namespace("billing")
        .into_settings()
        .unwrap();
    assert_eq!(s.namespace, "billing");
    let err = settings("mysql://u@h/d?prefix=a%00b").unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                what: "namespace",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_urls_are_invalid_input_without_the_password() {
    for url in [
        "postgres://u:hunter2@h/d",
        "mysql://u:hunter2@h/d?ssl-mode=sometimes",
        "mysql://u:hunter2@h/d?sessions=many",
        "mysql://u:hunter2@h/d?sessions=0",
        // A pool of a billion slots would be allocated up front.
        "mysql://u:hunter2@h/d?sessions=1000000000",
        "mysql://u:hunter2@h/d?max_waiters=0",
        "mysql://u:hunter2@h/d?fencing_table=a.b.c",
        "mysql://u:hunter2@h/d?wait_timeout=5",
        "mysql://u:hunter2@h/d?bogus=1",
        "mysql://u:hunter2@h:notaport/d",
        "mysql://u:hunter2@h/d?ssl-ca=/nonexistent/ca.pem",
        "mysql://u:hunter2@h/d?ssl-mode=VERIFY_CA",
    ] {
        let err = settings(url).unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{url}: {err}");
        assert!(!err.to_string().contains("hunter2"), "{url}: {err}");
    }
}

#[test]
fn every_source_reaches_the_same_settings() {
    let summary = |config: &SqlConfig<sources::Mysql>| {
        let s = Config(config.clone())
            .builder()
            .unwrap()
            .into_settings()
            .unwrap();
        (
            s.namespace.clone(),
            s.holder_record,
            s.query_timeout,
            s.ping_interval,
            s.wait_timeout,
            s.connect.ssl_mode,
        )
    };
    let want = (
        "jobs".to_owned(),
        false,
        Duration::from_secs(3),
        Duration::from_millis(500),
        Duration::from_secs(20),
        SslMode::Required,
    );
    let sources = [
        "mysql://u@h/d?key_prefix=jobs&holder_record=off&query_timeout=3&ping_interval=500ms\
         &wait_timeout=20s&ssl-mode=REQUIRED",
        r#"{"url": "mysql://u@h/d", "namespace": "jobs", "holderRecord": false,
            "queryTimeout": 3, "pingInterval": "500ms", "waitTimeout": 20, "ssl_mode": "REQUIRED"}"#,
        "url: mysql://u@h/d\nkey_prefix: jobs\nrecord_holder: false\nquery_timeout: 3s\n\
         ping_interval: 500ms\nwait_timeout: 20s\nssl-mode: REQUIRED\n",
    ];
    crate::config::sql::assert_every_source_reaches(
        summary,
        want,
        sources,
        &[
            ("DISTLOCK_MYSQL_URL", "mysql://u@h/d"),
            ("DISTLOCK_MYSQL_PREFIX", "jobs"),
            ("DISTLOCK_MYSQL_HOLDER", "off"),
            ("DISTLOCK_MYSQL_QUERY_TIMEOUT", "3s"),
            ("DISTLOCK_MYSQL_PING_INTERVAL", "500ms"),
            ("DISTLOCK_MYSQL_WAIT_TIMEOUT", "20"),
            ("DISTLOCK_MYSQL_SSL_MODE", "required"),
        ],
    );
}

#[test]
fn a_bare_ping_interval_is_seconds_and_a_millisecond_count_is_refused() {
    let s = settings("mysql://u@h/d?ping_interval=2").unwrap();
    assert_eq!(s.ping_interval, Duration::from_secs(2));
    for value in ["500", "60", "1000"] {
        let err = settings(&format!("mysql://u:hunter2@h/d?ping_interval={value}")).unwrap_err();
        let message = err.to_string();
        assert!(message.contains(&format!("write {value}ms")), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
    }
    for (value, want) in [("5s", 5), ("5", 5)] {
        let s = settings(&format!("mysql://u@h/d?query_timeout={value}")).unwrap();
        assert_eq!(s.query_timeout, Duration::from_secs(want), "{value}");
    }
}

#[test]
fn every_url_parameter_is_in_the_readme() {
    crate::config::assert_in_readme("MySQL", sources::PARAMETERS);
}
