//! What the server says about keeping our keys, read once when the locker
//! is built: whether it evicts keys when memory fills (`maxmemory`,
//! `maxmemory-policy`) and whether it persists them (`appendonly`,
//! `appendfsync`, `save`), and how many replicas it has. The eviction
//! check refuses (or, with [`Config::allow_eviction`](super::Config::allow_eviction),
//! warns); the persistence facts become [`crate::Locker::durability_warnings`].
//!
//! Managed Redis (ElastiCache, Azure Cache, Memorystore) often refuses
//! `CONFIG` to its users (an ACL, or the command renamed), while `INFO`
//! still reports `maxmemory`, `maxmemory_policy` and `aof_enabled` (Redis'
//! `INFO` documentation, sections "memory" and "persistence":
//! <https://redis.io/docs/latest/commands/info/>), so `INFO` is the
//! fallback. Both are sent at once.

use std::collections::HashMap;
use std::fmt;

use super::connection::{Connection, ScanNode};
use super::{RedisLocker, BACKEND};
use crate::{Error, Result};

/// What one Redis server (a master) reported about the settings that decide
/// whether a lock, its fence counter or a mark can vanish, read when the
/// locker was built ([`RedisLocker::server_facts`](super::RedisLocker::server_facts)).
/// `None` where the server did not say.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerFacts {
    /// The server, as a URL without password (or `host:port` for a
    /// cluster's master).
    pub node: String,
    /// Where the facts came from: `CONFIG GET`, or `INFO` when `CONFIG` was
    /// refused (ACL, renamed or disabled command).
    pub source: FactsSource,
    /// `maxmemory` in bytes; 0 means no limit (nothing is ever evicted).
    pub maxmemory: Option<u64>,
    /// `maxmemory-policy`: `noeviction`, `volatile-lru`, `allkeys-lru`, ...
    pub maxmemory_policy: Option<String>,
    /// `appendonly` (`aof_enabled` in `INFO`): every write goes to the
    /// append-only file.
    pub appendonly: Option<bool>,
    /// `appendfsync` (`always`, `everysec`, `no`); `CONFIG GET` only.
    pub appendfsync: Option<String>,
    /// `save` (the RDB snapshot schedule; empty: none); `CONFIG GET` only.
    pub save: Option<String>,
    /// `connected_slaves` of `INFO replication`: replicas attached now.
    pub connected_replicas: Option<u32>,
}

/// Which command [`ServerFacts`] were read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FactsSource {
    /// `CONFIG GET` answered (replicas from `INFO replication`).
    ConfigGet,
    /// `CONFIG GET` was refused; `INFO` answered.
    Info,
}

impl fmt::Display for FactsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FactsSource::ConfigGet => "CONFIG GET",
            FactsSource::Info => "INFO memory (CONFIG GET is refused here)",
        })
    }
}

/// The `CONFIG GET` parameters read (one call: several parameters per
/// `CONFIG GET` need Redis 7; an older server refuses it and `INFO` answers).
const CONFIG_PARAMETERS: [&str; 5] = [
    "maxmemory",
    "maxmemory-policy",
    "appendonly",
    "appendfsync",
    "save",
];

impl ServerFacts {
    /// Reads the facts of `node` on `connection`, named `name` in messages.
    /// `Err` with both commands' errors when neither answered. Not bounded:
    /// the caller bounds it.
    pub(crate) async fn read(
        connection: &Connection,
        node: &ScanNode,
        name: String,
    ) -> Result<ServerFacts, String> {
        let mut config_get = redis::cmd("CONFIG");
        config_get.arg("GET").arg(&CONFIG_PARAMETERS[..]);
        let (mut on_config, mut on_info) = (connection.clone(), connection.clone());
        let (config, info) = futures_util::future::join(
            on_config.query_node::<HashMap<String, String>>(node, config_get),
            on_info.query_node::<String>(node, redis::cmd("INFO")),
        )
        .await;
        let info = info.map(|text| parse_info(&text));
        let connected_replicas = info
            .as_ref()
            .ok()
            .and_then(|info| info.get("connected_slaves")?.parse().ok());
        match (config, info) {
            (Ok(config), _) if config.contains_key("maxmemory-policy") => Ok(ServerFacts {
                node: name,
                source: FactsSource::ConfigGet,
                maxmemory: config.get("maxmemory").and_then(|v| v.parse().ok()),
                maxmemory_policy: config.get("maxmemory-policy").cloned(),
                appendonly: config.get("appendonly").map(|v| v == "yes"),
                appendfsync: config.get("appendfsync").cloned(),
                save: config.get("save").cloned(),
                connected_replicas,
            }),
            (_, Ok(info)) if info.contains_key("maxmemory_policy") => Ok(ServerFacts {
                node: name,
                source: FactsSource::Info,
                maxmemory: info.get("maxmemory").and_then(|v| v.parse().ok()),
                maxmemory_policy: info.get("maxmemory_policy").cloned(),
                appendonly: info.get("aof_enabled").map(|v| v == "1"),
                appendfsync: None,
                save: None,
                connected_replicas,
            }),
            (config, info) => {
                let say = |answer: Result<(), String>| match answer {
                    Ok(()) => "answered without the setting".to_owned(),
                    Err(error) => error,
                };
                Err(format!(
                    "CONFIG GET: {}; INFO: {}",
                    say(config.map(drop).map_err(|e| e.to_string())),
                    say(info.map(drop).map_err(|e| e.to_string()))
                ))
            }
        }
    }

    /// The eviction this server may do to our keys, if any: `Some` when
    /// `maxmemory` is set and the policy is not `noeviction`.
    pub(crate) fn eviction_risk(&self) -> Option<String> {
        let maxmemory = self.maxmemory?;
        let policy = self.maxmemory_policy.as_deref()?;
        if maxmemory == 0 || policy == "noeviction" {
            return None;
        }
        let what = if policy.starts_with("volatile-") {
            "keys with a ttl first: a held lock's key can vanish while its holder works, and the \
             next caller's SET NX then succeeds (two holders)"
        } else {
            "any key: a held lock's key can vanish while its holder works (two holders), and so \
             can its fence counter (fencing tokens restart at 1) and the cron marks (finished \
             ticks run again)"
        };
        Some(format!(
            "{}: maxmemory-policy is {policy} with maxmemory {maxmemory} bytes (read with {}): \
             when memory fills, Redis evicts {what}. Set `CONFIG SET maxmemory-policy \
             noeviction` (on managed Redis, in the parameter group; writes then fail with OOM, \
             which distlock reports as an outage), or `maxmemory 0`",
            self.node, self.source
        ))
    }

    /// What makes marks and fence counters on this server less durable than
    /// they look: no append-only file (a restart rolls back to the last RDB
    /// snapshot, or to nothing), `appendfsync no`, and replicas without
    /// `min_replicas` (a failover can lose the last writes).
    pub(crate) fn durability_warnings(&self, min_replicas: u32) -> Vec<String> {
        let mut warnings = Vec::new();
        match self.appendonly {
            Some(false) => {
                let snapshots = match self.save.as_deref() {
                    Some("") => " and takes no RDB snapshots (save \"\")".to_owned(),
                    Some(save) => format!(
                        "; its RDB snapshots (save \"{save}\") roll a restart back to the last one"
                    ),
                    None => String::new(),
                };
                warnings.push(format!(
                    "{}: appendonly is no (read with {}){snapshots}: a restart forgets which cron \
                     ticks ran (a finished tick can run again) and resets fencing tokens to 1. Set \
                     `appendonly yes` (appendfsync everysec loses at most about 1 s of writes, \
                     always none)",
                    self.node, self.source
                ));
            }
            Some(true) if self.appendfsync.as_deref() == Some("no") => {
                warnings.push(format!(
                    "{}: appendfsync is no: the append-only file is flushed when the OS decides \
                     (about every 30 s), so a crash of the machine can forget the last cron \
                     marks and fence counters. Set `appendfsync everysec` or `always`",
                    self.node
                ));
            }
            Some(true) | None => {}
        }
        if let Some(replicas @ 1..) = self.connected_replicas {
            if min_replicas == 0 {
                warnings.push(format!(
                    "{}: {replicas} replica(s) and min_replicas is 0: replication is \
                     asynchronous, so a failover can lose the last cron mark (that tick can run \
                     again) and the last grants. Set min_replicas to make each grant and mark \
                     wait for replicas",
                    self.node
                ));
            }
        }
        warnings
    }
}

/// `INFO`'s `field:value` lines.
fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .map(|(field, value)| (field.to_owned(), value.to_owned()))
        .collect()
}

/// What [`RedisLocker::check_server`] learnt: each master's facts, and a
/// message per master whose settings could not be read.
#[derive(Debug, Default)]
pub(super) struct ServerReport {
    facts: Vec<ServerFacts>,
    unread: Vec<String>,
}

impl ServerReport {
    /// Nothing read, for `reason`.
    fn unread(reason: impl ToString) -> Self {
        ServerReport {
            facts: Vec::new(),
            unread: vec![reason.to_string()],
        }
    }
}

impl RedisLocker {
    /// What each master this locker writes to reported, when the locker
    /// was built, about eviction (`maxmemory`, `maxmemory-policy`) and
    /// persistence (`appendonly`, `appendfsync`, `save`, replicas): one
    /// entry for one server or the sentinel-managed master, one per master
    /// of a cluster. Empty where nothing could be read (`CONFIG GET` and
    /// `INFO` both refused) or not read yet (a Redlock node that did not
    /// answer when the Redlock locker was built). A snapshot: a master that
    /// a failover or `CONFIG SET` changes later is not read again (see the
    /// [module docs](super), "What the server must be configured with").
    pub fn server_facts(&self) -> &[ServerFacts] {
        self.inner
            .server
            .get()
            .map(|report| report.facts.as_slice())
            .unwrap_or_default()
    }

    /// Reads what each master reports about eviction and persistence
    /// (`CONFIG GET`, with `INFO` as the fallback), keeps it for
    /// [`server_facts`](Self::server_facts), and refuses a server that may
    /// evict our keys unless [`Config::allow_eviction`] (then it warns), or
    /// one without `appendonly yes` under [`Config::require_appendonly`]. A
    /// master whose settings cannot be read is logged at `warn` (once, here)
    /// and accepted, unless `require_appendonly` asks for proof.
    pub(crate) async fn check_server(&self) -> Result<()> {
        let mut connection = self.connection();
        let nodes = match tokio::time::timeout(self.inner.operation_bound, connection.nodes()).await
        {
            Ok(Ok(nodes)) => nodes,
            Ok(Err(error)) => return self.keep_server_report(ServerReport::unread(error)),
            Err(_) => {
                let reason = format!("no answer within {:?}", self.inner.operation_bound);
                return self.keep_server_report(ServerReport::unread(reason));
            }
        };
        let reads = futures_util::future::join_all(nodes.into_iter().map(|(address, node)| {
            let connection = &connection;
            async move {
                let name = address
                    .clone()
                    .unwrap_or_else(|| self.inner.target.endpoint.clone());
                let read = ServerFacts::read(connection, &node, name);
                let failure = match tokio::time::timeout(self.inner.operation_bound, read).await {
                    Ok(Ok(facts)) => return Ok(facts),
                    Ok(Err(reason)) => reason,
                    Err(_) => format!("no answer within {:?}", self.inner.operation_bound),
                };
                // A cluster's master is named; the one server is named by
                // the message these reasons go into.
                Err(match address {
                    Some(address) => format!("{address}: {failure}"),
                    None => failure,
                })
            }
        }))
        .await;
        let mut report = ServerReport::default();
        for read in reads {
            match read {
                Ok(facts) => report.facts.push(facts),
                Err(reason) => report.unread.push(reason),
            }
        }
        for facts in &report.facts {
            if let Some(risk) = facts.eviction_risk() {
                if !self.inner.allow_eviction {
                    return Err(Error::invalid(
                        "server configuration",
                        format!(
                            "{risk}; or, accepting that risk, set allow_eviction=true (URL \
                             parameter; Config::allow_eviction)"
                        ),
                    ));
                }
                tracing::warn!(component = "distlock", backend = BACKEND, node = %facts.node,
                    "{risk} (accepted: allow_eviction is set)");
            }
            if self.inner.require_appendonly && facts.appendonly != Some(true) {
                return Err(Error::invalid(
                    "server configuration",
                    format!(
                        "{}: appendonly is {} and require_appendonly is set: a restart of this \
                         server would forget which cron ticks ran and reset fencing tokens to \
                         1. Set `CONFIG SET appendonly yes` (and in its config file), or drop \
                         require_appendonly",
                        facts.node,
                        match facts.appendonly {
                            Some(_) => "no",
                            None => "not reported",
                        }
                    ),
                ));
            }
        }
        self.keep_server_report(report)
    }

    /// Keeps `report` for [`server_facts`](Self::server_facts) and
    /// [`Locker::durability_warnings`]; settings that could not be read are
    /// logged at `warn` (or refused under [`Config::require_appendonly`]),
    /// and their message kept as one durability warning.
    fn keep_server_report(&self, mut report: ServerReport) -> Result<()> {
        if !report.unread.is_empty() {
            let reasons = report.unread.join("; ");
            if self.inner.require_appendonly {
                return Err(Error::invalid(
                    "server configuration",
                    format!(
                        "{}: require_appendonly is set, but the server's settings cannot be \
                         read ({reasons}); allow this user `INFO` (or `CONFIG GET`), or drop \
                         require_appendonly",
                        self.inner.target.endpoint
                    ),
                ));
            }
            let message = format!(
                "{}: cannot read the server's maxmemory-policy and appendonly ({reasons}), so \
                 neither eviction (an evicted lock has two holders) nor persistence (a restart \
                 forgets cron marks and resets fencing tokens to 1) was checked; make sure it \
                 runs with maxmemory-policy noeviction and appendonly yes, and allow this user \
                 `INFO`",
                self.inner.target.endpoint
            );
            tracing::warn!(component = "distlock", backend = BACKEND, "{message}");
            report.unread = vec![message];
        }
        // Set once: a locker is checked when it is built.
        let _ = self.inner.server.set(report);
        Ok(())
    }

    /// What makes this locker's marks and fence counters less durable than
    /// they look (see [`Locker::durability_warnings`]).
    pub(super) fn durability_report(&self) -> Vec<String> {
        let Some(report) = self.inner.server.get() else {
            return Vec::new();
        };
        let min_replicas = self.inner.replicas.map_or(0, |ack| ack.min_replicas);
        report
            .facts
            .iter()
            .flat_map(|facts| facts.durability_warnings(min_replicas))
            .chain(report.unread.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(maxmemory: u64, policy: &str) -> ServerFacts {
        ServerFacts {
            node: "redis://h:1/0".into(),
            source: FactsSource::ConfigGet,
            maxmemory: Some(maxmemory),
            maxmemory_policy: Some(policy.into()),
            appendonly: Some(true),
            appendfsync: Some("everysec".into()),
            save: Some(String::new()),
            connected_replicas: Some(0),
        }
    }

    #[test]
    fn only_a_limit_with_an_evicting_policy_is_a_risk() {
        assert_eq!(facts(0, "allkeys-lru").eviction_risk(), None);
        assert_eq!(facts(10 << 20, "noeviction").eviction_risk(), None);
        let volatile = facts(10 << 20, "volatile-lru").eviction_risk().unwrap();
        assert!(
            volatile.contains("maxmemory-policy is volatile-lru"),
            "{volatile}"
        );
        assert!(volatile.contains("two holders"), "{volatile}");
        assert!(!volatile.contains("fence counter"), "{volatile}");
        let allkeys = facts(1, "allkeys-lfu").eviction_risk().unwrap();
        assert!(allkeys.contains("fencing tokens restart at 1"), "{allkeys}");
        assert!(allkeys.contains("CONFIG SET maxmemory-policy noeviction"));
    }

    #[test]
    fn persistence_warnings_name_the_setting() {
        let durable = facts(0, "noeviction");
        assert!(durable.durability_warnings(0).is_empty());
        let volatile = ServerFacts {
            appendonly: Some(false),
            connected_replicas: Some(2),
            ..durable.clone()
        };
        let warnings = volatile.durability_warnings(0);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("appendonly is no"), "{warnings:?}");
        assert!(warnings[0].contains("resets fencing tokens to 1"));
        assert!(warnings[1].contains("2 replica(s) and min_replicas is 0"));
        assert_eq!(volatile.durability_warnings(1).len(), 1);
        let lazy = ServerFacts {
            appendfsync: Some("no".into()),
            ..durable
        };
        assert!(lazy.durability_warnings(0)[0].contains("appendfsync is no"));
    }

    #[test]
    fn info_lines_are_fields() {
        let info = parse_info("# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n");
        assert_eq!(info["maxmemory_policy"], "noeviction");
        assert_eq!(info["maxmemory"], "0");
    }
}
