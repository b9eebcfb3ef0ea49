//! What a [`RedlockLocker`](super::RedlockLocker) connects to and how:
//! [`Config`], read from a `redlock://` URL, environment variables, JSON or
//! YAML.

use std::collections::HashSet;
use std::time::Duration;

use crate::config::{
    camel_to_snake, check_positive, decode, env_vars, parse, redact, split_authority, Checked,
    Source,
};
use crate::redis;
use crate::{Error, Result};

/// How long one node may take to answer one call, unless configured
/// otherwise: the Redis backend's default response timeout. It costs
/// little: a call returns as soon as a majority has answered, so the
/// timeout only delays calls that cannot be decided without a slow node.
/// antirez suggests 5–50 ms for a 10 s ttl on a fast network; the default
/// is larger so that a loaded host's scheduling stalls are not mistaken for
/// failed nodes.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(500);
/// The clock-drift allowance per unit of ttl, unless configured otherwise:
/// 1 %, as antirez's description, redsync and node-redlock use.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// The least validity a grant may have left when the majority is reached,
/// unless configured otherwise.
pub const DEFAULT_MIN_VALIDITY: Duration = Duration::from_millis(10);
/// Environment variables read by [`Config::from_env`] for the Redlock
/// settings start with this (the nodes' settings are
/// [`redis::ENV_PREFIX`]'s).
pub const ENV_PREFIX: &str = "DISTLOCK_REDLOCK_";

/// The query parameters of a `redlock://` URL that are Redlock's own; the
/// others are the Redis backend's (see [`redis::Config::from_url`]).
const REDLOCK_PARAMETERS: [&str; 4] = ["node_timeout", "drift_factor", "min_validity", "tls"];

/// The independent Redis nodes of a Redlock and the algorithm's settings.
///
/// `nodes` is a [`redis::Config`] whose [`addresses`](redis::Config::addresses)
/// list the nodes (one per independent server: not replicas of each other,
/// not a cluster); its other fields (user, password, TLS and its files,
/// database, key prefix, connect and response timeouts) apply to every
/// node.
///
/// ```
/// use std::time::Duration;
/// use distlock::redlock::Config;
///
/// let config = Config::from_url(
///     "redlock://:s3cret@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379?node_timeout=50ms&prefix=jobs:",
/// )?;
/// assert_eq!(config.nodes.addresses.len(), 3);
/// assert_eq!(config.nodes.key_prefix, "jobs:");
/// assert_eq!(config.node_timeout, Duration::from_millis(50));
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), distlock::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The nodes and how to reach each of them.
    pub nodes: redis::Config,
    /// The bound on one call to one node (an acquire, release, refresh or
    /// subscribe there), [`DEFAULT_NODE_TIMEOUT`] by default: keep it much
    /// smaller than the ttl, so a node that is down or slow costs little of
    /// the lease's validity. An acquire bounds each node by the smaller of
    /// this and the ttl. A node that does not answer within it counts as
    /// failed for that call; calls return once a majority has decided them,
    /// so a slow minority costs nothing but its own share.
    pub node_timeout: Duration,
    /// The clock-drift allowance per unit of ttl: a grant's validity is
    /// `ttl - elapsed - (ttl × drift_factor + 2 ms)`. Between 0 and 0.5.
    pub drift_factor: f64,
    /// A grant whose remaining validity at the moment the majority was
    /// reached is not above this is refused (and released).
    pub min_validity: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nodes: redis::Config::default(),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            min_validity: DEFAULT_MIN_VALIDITY,
        }
    }
}

impl Config {
    /// Reads `redlock://[user:password@]host1[:port],host2[:port],...[/db][?params]`.
    ///
    /// Parameters: Redlock's own `node_timeout`, `drift_factor`,
    /// `min_validity` and `tls` (`true` connects to every node with TLS), and
    /// those of [`redis::Config::from_url`] (`prefix`, `connect_timeout`,
    /// `response_timeout`, `ca`, `client_cert`, `client_key`), which apply to
    /// every node. Malformed input is [`Error::InvalidInput`]; messages never
    /// contain the password.
    pub fn from_url(url: &str) -> Result<Config> {
        let bad = |reason: String| Error::invalid("url", format!("{}: {reason}", redact(url)));
        let rest = url
            .strip_prefix("redlock://")
            .ok_or_else(|| bad("a Redlock URL starts with redlock://".into()))?;
        let (userinfo, hosts, tail) = split_authority(rest);
        let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err(bad("list the nodes as host:port,host:port,...".into()));
        }
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let mut config = Config::default();
        let mut tls = false;
        let mut node_query = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode(value).map_err(|e| bad(format!("{name}: {e}")))?;
            let source = Source::Url(name);
            if name == "tls" {
                tls = parse(source, &value).map_err(bad)?;
            } else if !config.set_own(name, &value, source).map_err(bad)? {
                node_query.push(pair);
            }
        }
        // Everything the nodes share is read by the Redis backend's own
        // parser, from a URL naming the first node.
        let scheme = if tls { "rediss" } else { "redis" };
        let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let query = if node_query.is_empty() {
            String::new()
        } else {
            format!("?{}", node_query.join("&"))
        };
        let node_url = format!("{scheme}://{userinfo}{}{path}{query}", hosts[0]);
        config.nodes = redis::Config::from_url(&node_url).map_err(|e| match e {
            Error::InvalidInput { reason, .. } => {
                // The reason starts with the rewritten URL: name the caller's.
                let prefix = format!("{}: ", redact(&node_url));
                let reason = reason.strip_prefix(&prefix).unwrap_or(&reason).to_owned();
                let reason = if reason.contains("unknown parameter") {
                    format!("{reason}, {}", REDLOCK_PARAMETERS.join(", "))
                } else {
                    reason
                };
                bad(reason)
            }
            other => other,
        })?;
        config.nodes.addresses = hosts.into_iter().map(str::to_owned).collect();
        Ok(config)
    }

    /// The nodes' settings from the `DISTLOCK_REDIS_*` variables
    /// ([`redis::Config::from_env`]: `DISTLOCK_REDIS_ADDRESSES` lists the
    /// nodes, comma-separated), and Redlock's from
    /// `DISTLOCK_REDLOCK_NODE_TIMEOUT`, `DISTLOCK_REDLOCK_DRIFT_FACTOR` and
    /// `DISTLOCK_REDLOCK_MIN_VALIDITY`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the variable whose value is malformed
    /// or not UTF-8.
    pub fn from_env() -> Result<Config> {
        let mut vars = env_vars(redis::ENV_PREFIX)?;
        vars.extend(env_vars(ENV_PREFIX)?);
        Config::from_env_vars(vars)
    }

    /// [`from_env`](Config::from_env) over the given `(name, value)` pairs.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::redlock::Config;
    ///
    /// let config = Config::from_env_vars([
    ///     ("DISTLOCK_REDIS_ADDRESSES", "n1:6379,n2:6379,n3:6379"),
    ///     ("DISTLOCK_REDLOCK_NODE_TIMEOUT", "40ms"),
    /// ])?;
    /// assert_eq!(config.nodes.addresses, ["n1:6379", "n2:6379", "n3:6379"]);
    /// assert_eq!(config.node_timeout, Duration::from_millis(40));
    /// # Ok::<(), distlock::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_env`](Config::from_env).
    pub fn from_env_vars<I, K, V>(vars: I) -> Result<Config>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: Into<String>,
    {
        let vars: Vec<(String, String)> = vars
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.into()))
            .collect();
        let mut config = Config {
            nodes: redis::Config::from_env_vars(vars.clone())?,
            ..Config::default()
        };
        for (name, value) in &vars {
            if let Some(field) = name.strip_prefix(ENV_PREFIX) {
                let key = field.to_ascii_lowercase();
                config
                    .set_own(&key, value, Source::Env(name))
                    .map_err(|e| Error::invalid("config", e))?;
            }
        }
        Ok(config)
    }

    /// Reads a JSON object: the fields of [`redis::Config`] (`addresses`
    /// lists the nodes) and `nodeTimeout`, `driftFactor`, `minValidity`
    /// (snake_case accepted too).
    ///
    /// ```
    /// use distlock::redlock::Config;
    ///
    /// let config = Config::from_json(
    ///     r#"{"addresses": ["n1:6379", "n2:6379", "n3:6379"], "nodeTimeout": "30ms"}"#,
    /// )?;
    /// assert_eq!(config.nodes.addresses.len(), 3);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for malformed JSON, an unknown field or a
    /// malformed value.
    pub fn from_json(text: &str) -> Result<Config> {
        Config::from_value(
            serde_json::from_str(text).map_err(|e| e.to_string()),
            "JSON",
        )
    }

    /// Reads a YAML mapping with the fields [`from_json`](Config::from_json)
    /// reads.
    ///
    /// ```
    /// use distlock::redlock::Config;
    ///
    /// let config = Config::from_yaml("
    /// addresses: [n1, n2, n3, n4, n5]
    /// driftFactor: 0.02
    /// ")?;
    /// assert_eq!(config.drift_factor, 0.02);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_json`](Config::from_json), for YAML.
    pub fn from_yaml(text: &str) -> Result<Config> {
        Config::from_value(
            serde_yaml_ng::from_str(text).map_err(|e| e.to_string()),
            "YAML",
        )
    }

    /// A JSON object or YAML mapping, read as one value: Redlock's own
    /// fields are taken out, the rest are the nodes' ([`redis::Config`]'s
    /// strict parser).
    fn from_value(value: Checked<serde_json::Value>, format: &str) -> Result<Config> {
        let bad =
            |e: String| Error::invalid("config", format!("invalid Redlock config {format}: {e}"));
        let mut value = value.map_err(bad)?;
        let mut config = Config::default();
        if let Some(object) = value.as_object_mut() {
            for name in own_fields(object.keys().map(String::as_str)) {
                let text = match object.remove(&name) {
                    Some(serde_json::Value::String(text)) => text,
                    other => other.map(|v| v.to_string()).unwrap_or_default(),
                };
                let key = camel_to_snake(&name);
                config
                    .set_own(&key, &text, Source::Field(&name))
                    .map_err(bad)?;
            }
        }
        config.nodes = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        Ok(config)
    }

    /// Sets Redlock's own setting `key` (`node_timeout`, `drift_factor`,
    /// `min_validity`) from text; `Ok(false)` if `key` is none of them (it
    /// is the nodes').
    fn set_own(&mut self, key: &str, text: &str, source: Source<'_>) -> Checked<bool> {
        match key {
            "node_timeout" => self.node_timeout = parse(source, text)?,
            "min_validity" => self.min_validity = parse(source, text)?,
            "drift_factor" => self.drift_factor = parse_factor(source, text)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks the settings: at least one node, none named twice, a positive
    /// node timeout, a drift factor in range.
    pub(crate) fn check(&self) -> Result<()> {
        let bad = |reason: String| Error::invalid("config", reason);
        if self.nodes.addresses.is_empty() {
            return Err(bad(
                "no Redlock nodes: list them in `addresses` (or DISTLOCK_REDIS_ADDRESSES), \
                 or use a redlock://host1:port,host2:port,host3:port URL"
                    .into(),
            ));
        }
        let mut seen = HashSet::new();
        for address in &self.nodes.addresses {
            let normalized = address.trim().to_ascii_lowercase();
            // A node listed twice would vote twice: a "majority" of one
            // server would grant the lock.
            if !seen.insert(normalized) {
                return Err(bad(format!(
                    "the Redlock node {address:?} is listed twice; each node must be a \
                     different, independent server"
                )));
            }
        }
        check_positive(&[("node_timeout", self.node_timeout)]).map_err(bad)?;
        parse_factor(
            Source::Field("drift_factor"),
            &self.drift_factor.to_string(),
        )
        .map_err(bad)?;
        // The nodes are independent standalone servers: a cluster or a
        // Sentinel deployment per node is not Redlock, and Redlock's acquire
        // does not wait for replicas, so accepting these would ignore them.
        if self.nodes.cluster || self.nodes.sentinel_master.is_some() {
            return Err(bad(
                "`cluster` and `sentinel_master` do not apply to Redlock: each node is one \
                 independent server"
                    .into(),
            ));
        }
        if self.nodes.min_replicas > 0 {
            return Err(bad(format!(
                "min_replicas is {}; Redlock does not wait for replicas (its nodes are \
                 independent servers), leave it 0",
                self.nodes.min_replicas
            )));
        }
        Ok(())
    }
}

/// Redlock's own fields among a JSON object's or YAML mapping's names
/// (camelCase or snake_case); the others are the nodes'.
fn own_fields<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let own = ["node_timeout", "drift_factor", "min_validity"];
    names
        .filter(|name| own.contains(&camel_to_snake(name).as_str()))
        .map(str::to_owned)
        .collect()
}

fn parse_factor(source: Source<'_>, value: &str) -> Checked<f64> {
    match value.trim().parse::<f64>() {
        Ok(factor) if (0.0..=0.5).contains(&factor) => Ok(factor),
        _ => Err(format!(
            "{source}: {value:?} is not a number between 0 and 0.5 (0.01 is 1 %)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::assert_error;

    #[test]
    fn urls_list_nodes_and_share_the_rest() {
        let config = Config::from_url(
            "redlock://app:p%40ss@a:1,b:2,[::1]:3/2?prefix=x:&node_timeout=30ms&drift_factor=0.02&response_timeout=80ms",
        )
        .unwrap();
        assert_eq!(config.nodes.addresses, ["a:1", "b:2", "[::1]:3"]);
        assert_eq!(config.nodes.username.as_deref(), Some("app"));
        assert_eq!(
            config.nodes.password.as_ref().map(|p| p.expose()),
            Some("p@ss")
        );
        assert_eq!(config.nodes.db, 2);
        assert_eq!(config.nodes.key_prefix, "x:");
        assert_eq!(config.nodes.response_timeout, Duration::from_millis(80));
        assert_eq!(config.node_timeout, Duration::from_millis(30));
        assert_eq!(config.drift_factor, 0.02);
        assert!(!config.nodes.tls);
        let tls = Config::from_url("redlock://a,b,c?tls=true&ca=/ca.pem").unwrap();
        assert!(tls.nodes.tls);
        assert_eq!(tls.nodes.addresses, ["a", "b", "c"]);
        assert!(tls.nodes.tls_ca.is_some());
    }

    #[test]
    fn bad_urls_say_why_without_the_password() {
        crate::config::assert_url_errors(
            Config::from_url,
            "pw-secret",
            &[
                ("redis://:pw-secret@a,b", "starts with redlock://"),
                ("redlock://:pw-secret@a,,b", "host:port,host:port"),
                (
                    "redlock://:pw-secret@a,b?pool=3",
                    "unknown parameter \"pool\"",
                ),
                (
                    "redlock://:pw-secret@a,b?drift_factor=2",
                    "between 0 and 0.5",
                ),
                (
                    "redlock://:pw-secret@a,b?node_timeout=soon",
                    "not a duration",
                ),
            ],
        );
        assert_error(Config::from_url("redlock://a?x=1"), "node_timeout");
    }

    #[test]
    fn json_yaml_and_env_read_redlock_fields_beside_the_nodes() {
        let json = Config::from_json(
            r#"{"addresses":["a:1","b:2","c:3"],"password":"pw","nodeTimeout":"20ms","minValidity":"5ms","driftFactor":0.05}"#,
        )
        .unwrap();
        let yaml = Config::from_yaml(
            "addresses: ['a:1', 'b:2', 'c:3']\npassword: pw\nnode_timeout: 20ms\nmin_validity: 5ms\ndrift_factor: 0.05\n",
        )
        .unwrap();
        assert_eq!(json, yaml);
        assert_eq!(json.node_timeout, Duration::from_millis(20));
        assert_eq!(json.min_validity, Duration::from_millis(5));
        assert_eq!(json.drift_factor, 0.05);
        let env = Config::from_env_vars([
            ("DISTLOCK_REDIS_ADDRESSES", "a:1,b:2,c:3"),
            ("DISTLOCK_REDIS_PASSWORD", "pw"),
            ("DISTLOCK_REDLOCK_NODE_TIMEOUT", "20ms"),
            ("DISTLOCK_REDLOCK_MIN_VALIDITY", "5ms"),
            ("DISTLOCK_REDLOCK_DRIFT_FACTOR", "0.05"),
        ])
        .unwrap();
        assert_eq!(env, json);
        // Typos are still caught, by the nodes' strict parser.
        let typo = Config::from_json(r#"{"adresses":["a"]}"#)
            .unwrap_err()
            .to_string();
        assert!(typo.contains("adresses"), "{typo}");
    }

    #[test]
    fn a_node_listed_twice_or_no_node_is_refused() {
        let twice = Config {
            nodes: redis::Config {
                addresses: vec!["a:1".into(), "b:2".into(), "A:1".into()],
                ..redis::Config::default()
            },
            ..Config::default()
        };
        assert_error(twice.check(), "listed twice");
        assert_error(Config::default().check(), "no Redlock nodes");
    }

    #[test]
    fn redis_deployments_and_replica_waits_are_refused_for_nodes() {
        let waits = Config::from_url("redlock://a:1,b:2,c:3?min_replicas=1").unwrap();
        assert_error(waits.check(), "min_replicas is 1");
        for (cluster, sentinel_master) in [(true, None), (false, Some("m".to_owned()))] {
            let config = Config {
                nodes: redis::Config {
                    addresses: vec!["a:1".into(), "b:2".into(), "c:3".into()],
                    cluster,
                    sentinel_master,
                    ..redis::Config::default()
                },
                ..Config::default()
            };
            assert_error(config.check(), "do not apply to Redlock");
        }
    }

    #[test]
    fn every_url_parameter_is_in_the_readme() {
        for name in REDLOCK_PARAMETERS {
            crate::config::readme_row("Redlock", name);
        }
        let bare = Config::from_url("redlock://a,b,c?node_timeout=1&response_timeout=2").unwrap();
        assert_eq!(bare.node_timeout, Duration::from_secs(1));
        assert_eq!(bare.nodes.response_timeout, Duration::from_secs(2));
    }
}
