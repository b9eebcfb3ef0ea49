//! The one configuration layer every backend's `Config` is read through:
//! one parser per kind of value, one table of parameters per backend, and
//! one name for one concept on every backend.
//!
//! Every source of a backend's settings (URL query parameters,
//! `DISTLOCK_<BACKEND>_*` environment variables, JSON and YAML fields)
//! reaches the same field table, so a value means the same wherever it is
//! written, and an error names the parameter, where it was read (URL
//! parameter `x`, variable `DISTLOCK_X_Y`, field `x`) and what was expected.
//! (The shape follows object_store's `config.rs`: one parse trait, and
//! builders that funnel every source into one `with_config(key, value)`.)
//!
//! # Sources
//!
//! Every backend's `Config` is read the same ways: `from_url`, `from_env`
//! (or `from_env_vars` over given pairs), `from_json`, `from_yaml`, and
//! `set(key, value)` for one parameter; Redis's and etcd's can also be
//! written in code from `Config::default()`. JSON and YAML fields are
//! camelCase or snake_case, with the older names listed below; unknown
//! fields are rejected. `Debug` never shows a password.
//!
//! # Values
//!
//! - **Durations**: `500ms`, `5s`, `1m30s`, `2h` (humantime's syntax). A
//!   bare number is **seconds**, everywhere: `query_timeout=5` is
//!   `query_timeout=5s`, in a URL, a variable, JSON (`5` or `"5s"`) or YAML.
//!   One exception, so that a Postgres URL means the same to `psql`: the
//!   parameters libpq itself defines keep libpq's unit for a bare number
//!   (`connect_timeout` and `keepalives_idle` / `keepalives_interval`
//!   seconds, `tcp_user_timeout` **milliseconds**); they accept units too.
//!   MySQL's `ping_interval` was bare milliseconds before this rule: a bare
//!   value of 60 or more is refused with a message asking for a unit
//!   (`ping_interval=500ms`) rather than silently meaning minutes.
//! - **Booleans**: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off` (any
//!   case; empty is false).
//! - **Numbers**: decimal integers.
//! - **Address lists**: `host1:port1,host2:port2` (`[v6]:port` for IPv6;
//!   a missing port is the backend's default).
//!
//! # One name for one concept
//!
//! | concept | name | also accepted (older spellings) |
//! | --- | --- | --- |
//! | record who holds each lock, for inspection | `holder_record` (`DISTLOCK_<BACKEND>_HOLDER_RECORD`, JSON `holderRecord`) | `holder`, `record_holder` |
//! | prepended to every key (the namespace) | `key_prefix` (`DISTLOCK_<BACKEND>_KEY_PREFIX`, JSON `keyPrefix`) | `prefix`, `namespace` |
//! | the CA file that verifies the server | `tls_ca` on Redis, `ca_file` on etcd | `ca`, `ca_file` / `tls_ca` |
//!
//! libpq's and MySQL's own parameters (`sslmode`, `sslrootcert`,
//! `ssl-mode`, `ssl-ca`, ...) keep their names. The README lists every
//! parameter of every backend.

// Each piece serves the backends that use it; with fewer backends compiled
// some are idle.
#![cfg_attr(
    not(all(
        feature = "redis",
        feature = "etcd",
        feature = "zookeeper",
        feature = "postgres",
        feature = "mysql"
    )),
    allow(dead_code, unused_imports)
)]

mod address;
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub(crate) mod constructors;
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
mod hosts;
mod password;
mod serde_value;
mod source;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod sql;
mod text;

pub(crate) use address::{
    display_url, format_address, host_of, parse_address, resolve_addresses, split_authority,
    split_list, HostsUrl,
};
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub(crate) use constructors::{config_struct, serde_config};
#[cfg(any(feature = "redis", feature = "etcd", feature = "zookeeper"))]
pub(crate) use hosts::{check_hosts, hosts_url, require_hosts, require_user, HostList};
pub(crate) use password::duration_text;
pub use password::Password;
pub(crate) use serde_value::{camel_to_snake, Settings, YamlSettings};
pub(crate) use source::{
    check_positive, env_vars, optional_password, optional_text, parse, parse_duration_bare,
    read_env, set_by_name, set_url_query, Checked, FieldTable, Param, Parse, Source, Table,
};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use sql::{
    reason, sql_builder_options, sql_config, SqlBackend, SqlConfig, SqlOptions, SqlSettings,
    SQL_PARAMETERS,
};
pub(crate) use text::{decode, decoded, decoded_credentials, redact};

/// The most sessions a locker of a backend with a `sessions` setting
/// (Postgres, MySQL, ZooKeeper) may be configured with: each session is a
/// server connection, and a pool's slots are made when it is built.
pub const MAX_SESSIONS: usize = 1024;

/// Checks a `sessions` setting: 1 to [`MAX_SESSIONS`]; the reason if not.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "zookeeper"))]
pub(crate) fn check_sessions(sessions: usize) -> std::result::Result<(), String> {
    match sessions {
        0 => Err(
            "sessions is 0: a locker needs at least one session (sessions=1 puts every \
                  lock on one)"
                .to_owned(),
        ),
        n if n > MAX_SESSIONS => Err(format!(
            "sessions is {n}: at most {MAX_SESSIONS} (each session is a server connection)"
        )),
        _ => Ok(()),
    }
}

/// Builder methods that each set one field and return the builder, from
/// their docs, names, argument types and fields (`common.sessions`): the
/// plain options of the SQL builders and of a cron job, each written once.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "cron"))]
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident($ty:ty) => $($field:ident).+;)*) => {$(
        $(#[$attr])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.$($field).+ = value;
            self
        }
    )*};
}
#[cfg(any(feature = "postgres", feature = "mysql", feature = "cron"))]
pub(crate) use setters;

/// Fails if the `Debug` text of any of `values` shows `secret`.
#[cfg(test)]
pub(crate) fn assert_hidden(secret: &str, values: &[&dyn std::fmt::Debug]) {
    for value in values {
        let text = format!("{value:?}");
        assert!(!text.contains(secret), "{text}");
    }
}

/// Fails unless README.md's parameter table has a row
/// `| <backend> | `name` | ...` for each URL parameter of `table`, naming
/// each of its older spellings: the README's list is checked against the
/// one field table.
#[cfg(test)]
pub(crate) fn assert_in_readme(backend: &str, table: Table) {
    let names = table.params().filter(|p| p.in_url);
    for param in names {
        let row = readme_row(backend, param.name);
        for alias in param.aliases {
            assert!(
                row.contains(&format!("`{alias}`")),
                "README.md's row for {backend} `{}` does not name `{alias}`",
                param.name
            );
        }
    }
}

/// Fails unless `from_url` refuses every URL of `cases` with
/// [`Error::InvalidInput`](crate::Error::InvalidInput) (`what: "url"`)
/// whose message contains the case's text and never `secret` (the URL's
/// password).
#[cfg(test)]
pub(crate) fn assert_url_errors<T: std::fmt::Debug>(
    from_url: impl Fn(&str) -> crate::Result<T>,
    secret: &str,
    cases: &[(&str, &str)],
) {
    for &(url, expected) in cases {
        let err = from_url(url).unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, crate::Error::InvalidInput { what: "url", .. }),
            "{message}"
        );
        assert!(message.contains(expected), "{url}: {message}");
        assert!(!message.contains(secret), "leaks the password: {message}");
    }
}

/// Fails unless `result` is an error whose message contains `expected`.
#[cfg(test)]
pub(crate) fn assert_error<T: std::fmt::Debug>(result: crate::Result<T>, expected: &str) {
    let err = result.unwrap_err().to_string();
    assert!(err.contains(expected), "{err}");
}

/// Fails unless the `Debug` text of `value` hides `secret` behind `***`.
#[cfg(test)]
pub(crate) fn assert_redacted(value: &dyn std::fmt::Debug, secret: &str) {
    let debug = format!("{value:?}");
    assert!(!debug.contains(secret) && debug.contains("***"), "{debug}");
}

/// The parameters every serde-derived config shares, as
/// [`HostList::shared`] reads them: what the shared tests compare.
#[cfg(all(test, any(feature = "redis", feature = "etcd", feature = "zookeeper")))]
#[derive(Debug, PartialEq)]
pub(crate) struct Shared {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Password>,
    pub(crate) key_prefix: String,
    pub(crate) tls: bool,
    pub(crate) connect_timeout: std::time::Duration,
    pub(crate) holder_record: bool,
}

/// The public constructors of a serde-derived config, for the shared tests
/// to read each source through (written by
/// [`serde_config!`](constructors::serde_config)).
#[cfg(all(test, any(feature = "redis", feature = "etcd", feature = "zookeeper")))]
pub(crate) trait Sources: HostList + PartialEq + std::fmt::Debug {
    fn url(url: &str) -> crate::Result<Self>;
    fn env(vars: Vec<(String, String)>) -> crate::Result<Self>;
    fn json(text: &str) -> crate::Result<Self>;
    fn yaml(text: &str) -> crate::Result<Self>;
}

/// The variables `NAME=value ...` of `text` (space-separated), each name
/// after the backend's prefix.
#[cfg(all(test, any(feature = "redis", feature = "etcd", feature = "zookeeper")))]
fn env_of<C: Sources>(text: &str) -> Vec<(String, String)> {
    text.split_whitespace()
        .map(|var| var.split_once('=').unwrap())
        .map(|(name, value)| (format!("{}{name}", C::ENV_PREFIX), value.to_owned()))
        .collect()
}

/// The config read from the variables of the parameters every serde-derived
/// config shares (the user, the password, the key prefix, the list of
/// servers, TLS, the connect timeout and the holder record by its older
/// name) and from `extra` (`NAME=value ...` without the prefix), failing
/// unless the shared ones hold what was written, each variable set what
/// [`set_by_name`] sets and nothing else, other variables (with the prefix
/// or not) were ignored, and a malformed variable is named in the error.
#[cfg(all(test, any(feature = "redis", feature = "etcd", feature = "zookeeper")))]
pub(crate) fn assert_shared_env<C: Sources>(extra: &str) -> C {
    let shared = "USERNAME=svc PASSWORD=pw KEY_PREFIX=jobs: TLS=yes CONNECT_TIMEOUT=2s HOLDER=off";
    let mut written = env_of::<C>(&format!("{shared} {extra}"));
    // A list as a variable holds it, spaces and a trailing comma included.
    let list = format!("{}{}", C::ENV_PREFIX, C::LIST.to_ascii_uppercase());
    written.push((list, " a:1 , b:2,".into()));
    let mut want = C::default();
    for (name, value) in &written {
        let key = name[C::ENV_PREFIX.len()..].to_ascii_lowercase();
        set_by_name(&mut want, &key, value).unwrap();
    }
    let mut vars = written;
    vars.extend(env_of::<C>("SOMETHING_ELSE=ignored"));
    vars.push(("HOME".into(), "/root".into()));
    let config = C::env(vars).unwrap();
    assert_eq!(config, want);
    assert_eq!(config.hosts(), ["a:1", "b:2"]);
    let shared = Shared {
        username: Some("svc".into()),
        password: Some(Password::new("pw")),
        key_prefix: "jobs:".into(),
        tls: true,
        connect_timeout: std::time::Duration::from_secs(2),
        holder_record: false,
    };
    assert_eq!(config.shared(), shared);
    let tls = format!("{}TLS", C::ENV_PREFIX);
    let err = C::env(vec![(tls.clone(), "maybe".into())]).unwrap_err();
    assert!(err.to_string().contains(&tls), "{err}");
    config
}

/// The config read from `url`, failing unless the variables `vars`
/// (`NAME=value ...` without the prefix), the JSON `json` and the YAML `yaml`
/// give the same.
#[cfg(all(test, any(feature = "redis", feature = "etcd", feature = "zookeeper")))]
pub(crate) fn assert_every_source<C: Sources>(url: &str, vars: &str, json: &str, yaml: &str) -> C {
    let config = C::url(url).unwrap();
    assert_eq!(config, C::env(env_of::<C>(vars)).unwrap(), "{vars}");
    assert_eq!(config, C::json(json).unwrap(), "{json}");
    assert_eq!(config, C::yaml(yaml).unwrap(), "{yaml}");
    config
}

/// `url` read, failing unless it has the user `alice`, the `password` and
/// the `hosts` the URL names, and unless the faults every multi-host URL of
/// its scheme may have are refused (as [`assert_url_errors`] checks): an
/// unknown parameter, a malformed duration, no host, a malformed port.
#[cfg(all(test, any(feature = "etcd", feature = "zookeeper")))]
pub(crate) fn assert_hosts_url<C: Sources>(url: &str, password: &str, hosts: &[&str]) -> C {
    let config = C::url(url).unwrap();
    assert_eq!(config.username(), Some("alice"));
    assert_eq!(config.password(), Some(&Password::new(password)));
    assert_eq!(config.hosts(), hosts);
    let scheme = url.split_once("://").unwrap().0;
    let cases = [
        ("u:topsecret@h?pool=3", "unknown parameter \"pool\""),
        ("u:topsecret@h?request_timeout=soon", "not a duration"),
        ("u:topsecret@/", "no endpoint"),
        ("u:topsecret@h:notaport", "not a host:port"),
    ];
    for (rest, expected) in cases {
        let url = format!("{scheme}://{rest}");
        assert_url_errors(C::url, "topsecret", &[(&url, expected)]);
    }
    config
}

/// README.md's row for the URL parameter `name` of `backend`.
#[cfg(test)]
pub(crate) fn readme_row(backend: &str, name: &str) -> &'static str {
    const README: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
    let start = format!("| {backend} | `{name}` |");
    README
        .lines()
        .find(|line| line.starts_with(&start))
        .unwrap_or_else(|| panic!("README.md has no row starting {start:?}"))
}
