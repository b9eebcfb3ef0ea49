//! The Redis `Config`'s sources: URLs, variables, JSON and YAML, and
//! the names and units they share with every backend.

use super::*;
use crate::config::assert_error;

/// A switch that is on by default, turned off from a URL (`url_param`),
/// a variable (`env_var`) and JSON (`json_field`), and refused when its
/// URL value is not a boolean.
fn assert_switch_off_in_every_source(
    url_param: &str,
    env_var: &str,
    json_field: &str,
    switch: fn(&Config) -> bool,
) {
    assert!(switch(&Config::default()), "on by default");
    assert!(switch(&Config::from_url("redis://h/").unwrap()));
    let off = Config::from_url(&format!("redis://h/?{url_param}=false")).unwrap();
    assert!(!switch(&off), "{url_param}=false");
    let error = Config::from_url(&format!("redis://h/?{url_param}=maybe")).unwrap_err();
    assert!(error.to_string().contains("not a boolean"), "{error}");
    let env = Config::from_env_vars([(env_var, "no")]).unwrap();
    assert!(!switch(&env), "{env_var}=no");
    let json =
        Config::from_json(&format!(r#"{{"addresses": ["h"], "{json_field}": false}}"#)).unwrap();
    assert!(!switch(&json), "{json_field}: false");
}

#[test]
fn holder_records_are_on_unless_turned_off() {
    assert_switch_off_in_every_source(
        "holder",
        "DISTLOCK_REDIS_RECORD_HOLDER",
        "recordHolder",
        |c| c.record_holder,
    );
}

#[test]
fn the_server_checks_are_configured_from_every_source() {
    let defaults = Config::default();
    assert!(!defaults.allow_eviction && !defaults.require_appendonly);
    let url = Config::from_url("redis://h/?allow_eviction=true&require_appendonly=yes").unwrap();
    assert!(url.allow_eviction && url.require_appendonly);
    let error = Config::from_url("redis://h/?allow_eviction=sure").unwrap_err();
    assert!(error.to_string().contains("not a boolean"), "{error}");
    let env = Config::from_env_vars([
        ("DISTLOCK_REDIS_ALLOW_EVICTION", "1"),
        ("DISTLOCK_REDIS_REQUIRE_APPENDONLY", "true"),
    ])
    .unwrap();
    assert!(env.allow_eviction && env.require_appendonly);
    let json = Config::from_json(r#"{"allowEviction": true, "require_appendonly": true}"#).unwrap();
    assert!(json.allow_eviction && json.require_appendonly);
    let yaml = Config::from_yaml("allow_eviction: true\nrequireAppendonly: true").unwrap();
    assert_eq!(yaml, json);
}

#[test]
fn urls_give_every_field() {
    let config =
        Config::from_url("redis://alice:p%40ss%3Aword@cache.local:6380/3?prefix=app:").unwrap();
    assert_eq!(config.username.as_deref(), Some("alice"));
    assert_eq!(config.password, Some(Password::new("p@ss:word")));
    assert_eq!(config.addresses, ["cache.local:6380"]);
    assert_eq!(config.db, 3);
    assert!(!config.tls);
    assert_eq!(config.key_prefix, "app:");
    assert_eq!(config.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
}

#[test]
fn url_defaults_and_password_only_auth() {
    let config = Config::from_url("rediss://:secret@10.1.2.3").unwrap();
    assert_eq!(config.username, None);
    assert_eq!(config.password, Some(Password::new("secret")));
    assert_eq!(config.addresses, ["10.1.2.3:6379"]);
    assert_eq!((config.db, config.tls), (0, true));
    assert_eq!(config.key_prefix, DEFAULT_KEY_PREFIX);
    let config = Config::from_url("redis://h/?prefix=").unwrap();
    assert_eq!(config.key_prefix, "");
}

#[test]
fn url_timeouts_are_human_durations() {
    let config = Config::from_url("redis://h:1?connect_timeout=3s&response_timeout=150ms").unwrap();
    assert_eq!(config.connect_timeout, Duration::from_secs(3));
    assert_eq!(config.response_timeout, Duration::from_millis(150));
}

#[test]
fn bad_urls_say_why_without_the_password() {
    let cases = [
        ("redis://u:topsecret@h/notadb", "not a database number"),
        (
            "redis://u:topsecret@h/1?pool=3",
            "unknown parameter \"pool\"",
        ),
        (
            "redis://u:topsecret@h?connect_timeout=soon",
            "not a duration",
        ),
        ("redis://:topsecret@/0", "host"),
        ("http://u:topsecret@h", "is not one of redis, rediss"),
        (
            "redis://u:topsecret@h1:1,h2:2",
            "names one server; for several use redis+cluster://",
        ),
        ("redis+cluster://u:topsecret@h1:1,h2:2/3", "only database 0"),
        ("redis+sentinel://u:topsecret@s1,s2", "must name the master"),
        (
            "redis+sentinel://u:topsecret@s1/m?min_replicas=x",
            "not a number",
        ),
        (
            "redis+cluster://u:topsecret@h1,u:pw@h2",
            "must not carry credentials",
        ),
    ];
    crate::config::assert_url_errors(Config::from_url, "topsecret", &cases);
}

#[test]
fn debug_never_shows_the_password() {
    let config = Config::from_url("redis://bob:hunter2@h:1").unwrap();
    let debug = format!("{config:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(debug.contains("***") && debug.contains("bob"), "{debug}");
    let endpoint = config.endpoint().unwrap().to_string();
    assert_eq!(endpoint, "redis://bob@h:1/0");
}

#[test]
fn env_vars_override_the_defaults() {
    let config: Config = crate::config::assert_shared_env("DB=4 RESPONSE_TIMEOUT=50ms");
    assert_eq!(config.db, 4);
    assert_eq!(config.response_timeout, Duration::from_millis(50));
    let untouched = Config::from_env_vars(Vec::<(String, String)>::new()).unwrap();
    assert_eq!(untouched, Config::default());
    let empty_password = Config::from_env_vars([("DISTLOCK_REDIS_PASSWORD", "")]).unwrap();
    assert_eq!(empty_password.password, None);
}

#[test]
fn malformed_env_vars_name_the_variable() {
    let err = Config::from_env_vars([("DISTLOCK_REDIS_TLS", "maybe")]).unwrap_err();
    assert!(err.to_string().contains("DISTLOCK_REDIS_TLS"), "{err}");
    // A bare number is seconds now (it was refused for want of a unit);
    // text that is no duration still names the variable.
    let err = Config::from_env_vars([("DISTLOCK_REDIS_RESPONSE_TIMEOUT", "soon")]).unwrap_err();
    assert!(
        err.to_string().contains("DISTLOCK_REDIS_RESPONSE_TIMEOUT"),
        "{err}"
    );
    let bare = Config::from_env_vars([("DISTLOCK_REDIS_RESPONSE_TIMEOUT", "5")]).unwrap();
    assert_eq!(bare.response_timeout, Duration::from_secs(5));
}

#[test]
fn json_and_yaml_read_the_seed_field_names() {
    let json = r#"{"username":"u","password":"p","keyPrefix":"x:","addresses":["h:1"],
                   "db":1,"tls":true,"connectTimeout":"2s","responseTimeout":"100ms"}"#;
    let yaml = "
username: u
password: p
key_prefix: 'x:'
addresses: ['h:1']
db: 1
tls: true
connect_timeout: 2s
responseTimeout: 100ms
";
    let from_json = Config::from_json(json).unwrap();
    assert_eq!(from_json, Config::from_yaml(yaml).unwrap());
    assert_eq!(from_json.response_timeout, Duration::from_millis(100));
    assert_eq!(from_json.key_prefix, "x:");
    // Round trip.
    let text = serde_json::to_string(&from_json).unwrap();
    assert_eq!(Config::from_json(&text).unwrap(), from_json);
}

#[test]
fn config_files_reject_typos_and_never_echo_the_password() {
    assert_error(Config::from_yaml("adresses: [h]"), "adresses");
    // YAML hands a plain scalar over as the text it was written as.
    let config = Config::from_yaml("password: 0123456789").unwrap();
    assert_eq!(config.password, Some(Password::new("0123456789")));
    let err = Config::from_json(r#"{"password": 9876543210}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must be a string"), "{err}");
    assert!(!err.contains("9876543210"), "{err}");
}

#[test]
fn every_source_reaches_the_same_settings() {
    let url = Config::from_url(
        "redis://h:1?key_prefix=app:&response_timeout=5&connect_timeout=1500ms\
         &holder_record=off&min_replicas=1&replica_timeout=50ms",
    )
    .unwrap();
    let env = Config::from_env_vars([
        ("DISTLOCK_REDIS_ADDRESSES", "h:1"),
        ("DISTLOCK_REDIS_KEY_PREFIX", "app:"),
        ("DISTLOCK_REDIS_RESPONSE_TIMEOUT", "5"),
        ("DISTLOCK_REDIS_CONNECT_TIMEOUT", "1500ms"),
        ("DISTLOCK_REDIS_HOLDER_RECORD", "off"),
        ("DISTLOCK_REDIS_MIN_REPLICAS", "1"),
        ("DISTLOCK_REDIS_REPLICA_TIMEOUT", "50ms"),
    ])
    .unwrap();
    let json = Config::from_json(
        r#"{"addresses": ["h:1"], "keyPrefix": "app:", "responseTimeout": 5,
            "connectTimeout": "1500ms", "holderRecord": false, "minReplicas": 1,
            "replicaTimeout": "50ms"}"#,
    )
    .unwrap();
    let yaml = Config::from_yaml(
        "addresses: ['h:1']\nkey_prefix: 'app:'\nresponse_timeout: 5\n\
         connect_timeout: 1500ms\nholder_record: false\nmin_replicas: 1\n\
         replica_timeout: 50ms\n",
    )
    .unwrap();
    assert_eq!(url, env);
    assert_eq!(url, json);
    assert_eq!(url, yaml);
    assert_eq!(url.response_timeout, Duration::from_secs(5));
    assert_eq!(url.connect_timeout, Duration::from_millis(1500));
    assert!(!url.record_holder);
    let mut set = Config::default();
    set.set("response_timeout", "500ms").unwrap();
    assert_eq!(set.response_timeout, Duration::from_millis(500));
    assert!(set.set("pool", "3").is_err());
}

#[test]
fn older_spellings_are_aliases() {
    for param in ["holder_record", "holder", "record_holder"] {
        let url = Config::from_url(&format!("redis://h?{param}=off")).unwrap();
        assert!(!url.record_holder, "{param}");
        let var = format!("DISTLOCK_REDIS_{}", param.to_ascii_uppercase());
        assert!(!Config::from_env_vars([(var, "off")]).unwrap().record_holder);
        let json = Config::from_json(&format!(r#"{{"{param}": false}}"#)).unwrap();
        assert!(!json.record_holder, "{param}");
    }
    for param in ["key_prefix", "prefix"] {
        let url = Config::from_url(&format!("rediss://h?{param}=x:&ca=/ca.pem")).unwrap();
        assert_eq!(url.key_prefix, "x:", "{param}");
        assert_eq!(url.tls_ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
    }
    let tls =
        Config::from_url("rediss://h?tls_ca=/a.pem&tls_client_cert=/c&tls_client_key=/k").unwrap();
    assert!(tls.tls_ca.is_some() && tls.tls_client_cert.is_some() && tls.tls_client_key.is_some());
    // `db` is the path's outside Sentinel.
    assert!(Config::from_url("redis://h?db=1").is_err());
}

#[test]
fn every_url_parameter_is_in_the_readme() {
    crate::config::assert_in_readme("Redis", PARAMETERS);
}

#[test]
fn fencing_is_on_unless_turned_off_in_every_source() {
    assert_switch_off_in_every_source("fencing", "DISTLOCK_REDIS_FENCING", "fencing", |c| {
        c.fencing
    });
    assert!(!Config::from_url("redis://h/?fencing=off").unwrap().fencing);
}
