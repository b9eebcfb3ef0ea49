//! What the configs that list their servers share (etcd's and ZooKeeper's
//! `endpoints`, Redis's `addresses`): reading a multi-host URL into them,
//! and the checks made before connecting, so each message reads the same
//! on every backend.

use std::time::Duration;

use super::{check_positive, display_url, redact, Checked, FieldTable, HostsUrl, Password};
use crate::{Error, Result};

/// A config that lists its servers as `host:port` and may name a user:
/// what [`HostsUrl::read`] fills in and the checks below read. Written by
/// [`serde_config!`](super::serde_config) from the fields it names.
pub(crate) trait HostList: FieldTable {
    /// The field listing the servers (`endpoints`).
    const LIST: &'static str;
    /// The prefix of the backend's variables (`DISTLOCK_ETCD_`).
    const ENV_PREFIX: &'static str;

    /// The servers, as configured.
    fn hosts(&self) -> &[String];

    /// The user name, if any.
    fn username(&self) -> Option<&str>;

    /// The password, if any.
    fn password(&self) -> Option<&Password>;

    /// The timeouts and intervals that must be positive, by name.
    fn timeouts(&self) -> Vec<(&'static str, Duration)>;

    /// Sets the user, the password and the servers a URL names.
    fn set_hosts(
        &mut self,
        username: Option<String>,
        password: Option<Password>,
        hosts: Vec<String>,
    );

    /// The parameters every backend shares, for the shared tests.
    #[cfg(test)]
    fn shared(&self) -> super::Shared;
}

/// Fails unless `config` lists a server, saying how to list one: `server`
/// is what one is called (`etcd endpoint`), `url` the scheme that names
/// them, with its article (`an etcd://`).
pub(crate) fn require_hosts<C: HostList>(config: &C, server: &str, url: &str) -> Checked {
    if config.hosts().is_empty() {
        let (list, env) = (C::LIST, C::ENV_PREFIX);
        let var = list.to_ascii_uppercase();
        return Err(format!(
            "no {server}: set `{list}` (or {env}{var}), or use {url} URL"
        ));
    }
    Ok(())
}

/// [`require_hosts`], then every timeout of `config` positive: the checks
/// every listed-servers backend starts with.
pub(crate) fn check_hosts<C: HostList>(config: &C, server: &str, url: &str) -> Checked {
    require_hosts(config, server, url)?;
    check_positive(&config.timeouts())
}

/// Fails for a password without a user name; `why` says why the backend
/// needs one.
pub(crate) fn require_user<C: HostList>(config: &C, why: &str) -> Checked {
    if config.password().is_some() && config.username().is_none() {
        return Err(format!("a password without a user name; {why}"));
    }
    Ok(())
}

/// Where `config` points, as `scheme://user@host1,host2<tail>` without the
/// password: its `Display`, for messages.
pub(crate) fn hosts_url<C: HostList>(config: &C, scheme: &str, tail: &str) -> String {
    display_url(scheme, config.username(), &config.hosts().join(","), tail)
}

impl HostsUrl<'_> {
    /// Reads `url` into a config: `start` checks the scheme and the path
    /// and makes the config they say (a TLS flag, a chroot); then the
    /// credentials, the hosts (port `default_port` where one names none)
    /// and the query are read over it, in that order, so a URL's first
    /// fault is the one reported.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (`what: "url"`) with the reason, after the
    /// URL without its password.
    pub(crate) fn read<C: HostList>(
        url: &str,
        default_port: u16,
        start: impl FnOnce(&HostsUrl<'_>) -> Checked<C>,
    ) -> Result<C> {
        let bad = |reason: String| Error::invalid("url", format!("{}: {reason}", redact(url)));
        let parts = HostsUrl::split(url).map_err(&bad)?;
        let mut config = start(&parts).map_err(&bad)?;
        let (username, password) = parts.credentials().map_err(&bad)?;
        let hosts = parts.hosts(default_port).map_err(&bad)?;
        config.set_hosts(username, password, hosts);
        parts.set_query(&mut config).map_err(&bad)?;
        Ok(config)
    }
}
