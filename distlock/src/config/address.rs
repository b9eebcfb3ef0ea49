//! The one address-list parser: `host1:port1,host2:port2`, IPv6 in
//! brackets, a missing port the backend's default.

use std::net::IpAddr;

use url::{form_urlencoded, Host, Url};

use super::{decoded_credentials, set_url_query, Checked, FieldTable, Password};

/// Splits `host`, `host:port`, `[v6]` or `[v6]:port` (port `default_port` if
/// none; IPv6 without brackets in the result).
///
/// # Errors
///
/// Why the text is not an address, never echoing credentials.
pub(crate) fn parse_address(
    address: &str,
    default_port: u16,
) -> std::result::Result<(String, u16), String> {
    if address.contains('@') {
        // Do not echo it: it may carry a password.
        return Err(
            "an address must not carry credentials; set username and password instead".into(),
        );
    }
    if address.contains("://") {
        return Err(format!(
            "{address:?} is a URL; addresses are host:port (set tls for TLS)"
        ));
    }
    let not_an_address = || format!("{address:?} is not a host:port address");
    // A scheme without a default port: the url crate then reports every
    // port written (for `http` it would hide `:80`).
    let url =
        Url::parse(&format!("distlock://{}", address.trim())).map_err(|_| not_an_address())?;
    if !url.path().is_empty() || url.query().is_some() || url.fragment().is_some() {
        return Err(not_an_address());
    }
    let host = host_of(&url).ok_or_else(not_an_address)?;
    Ok((host, url.port().unwrap_or(default_port)))
}

/// The host of a parsed URL, IPv6 without brackets; `None` if it has none.
pub(crate) fn host_of(url: &Url) -> Option<String> {
    match url.host()? {
        Host::Domain("") => None,
        Host::Domain(domain) => Some(domain.to_owned()),
        Host::Ipv4(ip) => Some(ip.to_string()),
        Host::Ipv6(ip) => Some(ip.to_string()),
    }
}

/// `host:port`, bracketing IPv6 hosts.
pub(crate) fn format_address(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// What follows `scheme://` in a URL that may list several hosts
/// (`u:p@h1,h2/db?x=1`), which the url crate cannot parse: the user
/// information before the authority's last `@`, the hosts, and the rest
/// (path, query, fragment).
pub(crate) fn split_authority(rest: &str) -> (Option<&str>, &str, &str) {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((user_info, hosts)) => (Some(user_info), hosts, tail),
        None => (None, authority, tail),
    }
}

/// `scheme://user@hosts<tail>`: where a config points, for messages and
/// `Debug`, never with a password.
pub(crate) fn display_url(scheme: &str, user: Option<&str>, hosts: &str, tail: &str) -> String {
    let user = user.map(|u| format!("{u}@")).unwrap_or_default();
    format!("{scheme}://{user}{hosts}{tail}")
}

/// A comma-separated list as a variable holds it (`" a:1 , b:2,"`): the
/// items trimmed, empty ones dropped. Checked later, against the
/// deployment's default port.
pub(crate) fn split_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `host:port` of each of `addresses`, the port `default_port` where one
/// names none, IPv6 hosts bracketed: the list a client connects to.
pub(crate) fn resolve_addresses<'a>(
    addresses: impl IntoIterator<Item = &'a str>,
    default_port: u16,
) -> Checked<Vec<String>> {
    addresses
        .into_iter()
        .map(|address| {
            let (host, port) = parse_address(address, default_port)?;
            Ok(format_address(&host, port))
        })
        .collect()
}

/// A URL that lists several hosts and no database
/// (`scheme://[user:password@]host1[:port][,host2[:port]...][/path][?query]`,
/// etcd's and ZooKeeper's), cut into its parts, each read when the backend
/// asks for it, so a URL's first fault is the one reported.
pub(crate) struct HostsUrl<'a> {
    pub(crate) scheme: &'a str,
    user_info: Option<&'a str>,
    hosts: &'a str,
    /// What follows the hosts before the query (empty, `/` or a path), still
    /// percent-encoded.
    pub(crate) path: &'a str,
    query: &'a str,
}

impl<'a> HostsUrl<'a> {
    /// Cuts `url` at `://`, its authority's last `@`, its path and its query.
    pub(crate) fn split(url: &'a str) -> Checked<HostsUrl<'a>> {
        let (scheme, rest) = url.split_once("://").ok_or("not a URL")?;
        let (user_info, hosts, tail) = split_authority(rest);
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        Ok(HostsUrl {
            scheme,
            user_info,
            hosts,
            path,
            query,
        })
    }

    /// The user name and password, percent-decoded; empty ones are `None`.
    pub(crate) fn credentials(&self) -> Checked<(Option<String>, Option<Password>)> {
        let Some(user_info) = self.user_info else {
            return Ok((None, None));
        };
        let (user, password) = match user_info.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (user_info, None),
        };
        decoded_credentials(user, password)
    }

    /// `host:port` of each host ([`resolve_addresses`]); at least one.
    pub(crate) fn hosts(&self, default_port: u16) -> Checked<Vec<String>> {
        let hosts = self.hosts.split(',').filter(|h| !h.is_empty());
        let hosts = resolve_addresses(hosts, default_port)?;
        if hosts.is_empty() {
            return Err("the URL names no endpoint".into());
        }
        Ok(hosts)
    }

    /// Sets `config`'s parameters from the query (any a URL may set).
    pub(crate) fn set_query<C: FieldTable>(&self, config: &mut C) -> Checked {
        let pairs = form_urlencoded::parse(self.query.as_bytes());
        set_url_query(config, pairs, |_| true, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_host_and_port_only() {
        assert_eq!(parse_address("h", 6379).unwrap(), ("h".to_owned(), 6379));
        assert_eq!(parse_address("h:80", 2379).unwrap(), ("h".to_owned(), 80));
        assert_eq!(parse_address("[::1]:7", 1).unwrap(), ("::1".to_owned(), 7));
        assert_eq!(format_address("::1", 7), "[::1]:7");
        assert!(parse_address("redis://h:1", 1)
            .unwrap_err()
            .contains("is a URL"));
        assert!(parse_address("h:1/2", 1).is_err());
        assert!(parse_address("h:notaport", 1).is_err());
        let err = parse_address("u:pw@h:1", 1).unwrap_err();
        assert!(!err.contains("pw"), "{err}");
        assert_eq!(split_list(" a:1 , b:2,"), ["a:1", "b:2"]);
    }
}
