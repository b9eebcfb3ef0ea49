//! Choosing a backend by URL, like a database driver.

use std::sync::Arc;

use url::Url;

use crate::config::redact;
use crate::{Error, Locker, Result};

/// Every URL scheme distlock knows, whether or not its feature is compiled in.
pub const SUPPORTED_SCHEMES: &[&str] = &[
    "memory",
    "file",
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "redlock",
    "postgres",
    "postgresql",
    "etcd",
    "etcd+https",
    "mysql",
    "mariadb",
];

/// Opens the backend a URL names and returns it ready to use.
///
/// | URL | backend |
/// | --- | --- |
/// | `memory://` | a new, independent [`crate::memory::MemoryLocker`] |
/// | `file:///absolute/dir` | [`crate::file::FileLocker`] in that directory |
/// | `file://` (or `file:///`) | [`crate::file::FileLocker`] in [`crate::file::FileLocker::default_dir`] |
/// | `redis://[user:pass@]host[:port][/db][?prefix=..]`, `rediss://...` | `distlock::redis::RedisLocker` on one server (feature `redis`; see `distlock::redis::Config::from_url`) |
/// | `redis+cluster://host1:port,host2:port,...`, `rediss+cluster://...` | `distlock::redis::RedisLocker` on a Redis Cluster (feature `redis`) |
/// | `redis+sentinel://sentinel1:port,sentinel2:port/MASTER_NAME`, `rediss+sentinel://...` | `distlock::redis::RedisLocker` on the master Sentinel names, following failovers (feature `redis`) |
/// | `redlock://[user:pass@]host1:port,host2:port,host3:port[/db][?prefix=..&node_timeout=..]` | `distlock::redlock::RedlockLocker` (feature `redlock`; see `distlock::redlock::Config::from_url`) |
/// | `postgres://[user[:pass]@]host[:port][,host2...]/db[?...]`, `postgresql://...` | `distlock::postgres::PostgresLocker` (feature `postgres`; parameters in its module docs) |
/// | `etcd://[user:pass@]host[:port][,host2...][?prefix=..]`, `etcd+https://...` | `distlock::etcd::EtcdLocker` (feature `etcd`; see `distlock::etcd::Config::from_url`) |
/// | `mysql://[user[:pass]@]host[:port]/db[?...]`, `mariadb://...` | `distlock::mysql::MysqlLocker` (feature `mysql`; parameters in its module docs) |
///
/// Fails with [`Error::InvalidInput`] for a malformed URL or an unknown scheme
/// (the message lists the supported ones, and the cargo feature that enables a
/// known but missing one), and with the backend's error if it cannot be opened.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let err = distlock::connect("zookeeper://zk:2181").await.unwrap_err();
/// assert!(err.to_string().contains("unsupported scheme"));
/// # }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn Locker>> {
    // Before `Url::parse`, which rejects multi-host forms (`h1:5432,h2:5432`).
    #[cfg(feature = "redlock")]
    if url.starts_with("redlock://") {
        return Ok(Arc::new(
            crate::redlock::RedlockLocker::from_url(url).await?,
        ));
    }
    #[cfg(not(feature = "redlock"))]
    if url.starts_with("redlock://") {
        return Err(Error::invalid(
            "url",
            "redlock:// needs distlock's cargo feature `redlock`, which is not enabled",
        ));
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Arc::new(
            crate::postgres::PostgresLocker::from_url(url).await?,
        ));
    }
    // Before `Url::parse`, which rejects the multi-host form.
    if url.starts_with("etcd://") || url.starts_with("etcd+https://") {
        #[cfg(feature = "etcd")]
        return Ok(Arc::new(crate::etcd::EtcdLocker::from_url(url).await?));
        #[cfg(not(feature = "etcd"))]
        return Err(Error::invalid(
            "url",
            "etcd:// needs distlock's cargo feature `etcd`, which is not enabled",
        ));
    }
    // Before `Url::parse`, which rejects several comma-separated hosts.
    if let Some((
        scheme @ ("redis+cluster" | "rediss+cluster" | "redis+sentinel" | "rediss+sentinel"),
        _,
    )) = url.split_once("://")
    {
        #[cfg(feature = "redis")]
        {
            let _ = scheme;
            return Ok(Arc::new(crate::redis::RedisLocker::from_url(url).await?));
        }
        #[cfg(not(feature = "redis"))]
        return Err(Error::invalid(
            "url",
            format!("{scheme}:// needs distlock's cargo feature `redis`, which is not enabled"),
        ));
    }
    let parsed = Url::parse(url)
        .map_err(|e| Error::invalid("url", format!("{:?} is not a URL: {e}", redact(url))))?;
    match parsed.scheme() {
        "memory" => Ok(Arc::new(crate::memory::MemoryLocker::new())),
        "file" => {
            if parsed
                .host_str()
                .is_some_and(|h| !h.is_empty() && h != "localhost")
            {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "file URLs name a local directory; {url:?} names host {:?}",
                        parsed.host_str().unwrap_or_default()
                    ),
                ));
            }
            // `file://` parses with path "/": the filesystem root is never a
            // sensible lock directory, so it means the default one.
            if parsed.path() == "/" {
                return Ok(Arc::new(crate::file::FileLocker::in_default_dir()?));
            }
            let dir = parsed.to_file_path().map_err(|()| {
                Error::invalid("url", format!("{url:?} does not name a local directory"))
            })?;
            Ok(Arc::new(crate::file::FileLocker::new(dir)?))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Arc::new(crate::redis::RedisLocker::from_url(url).await?)),
        #[cfg(not(feature = "redis"))]
        scheme @ ("redis" | "rediss") => Err(Error::invalid(
            "url",
            format!("{scheme}:// needs distlock's cargo feature `redis`, which is not enabled"),
        )),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(crate::mysql::MysqlLocker::from_url(url).await?)),
        #[cfg(not(feature = "mysql"))]
        scheme @ ("mysql" | "mariadb") => Err(Error::invalid(
            "url",
            format!("{scheme}:// needs distlock's cargo feature `mysql`, which is not enabled"),
        )),
        #[cfg(not(feature = "postgres"))]
        scheme @ ("postgres" | "postgresql") => Err(Error::invalid(
            "url",
            format!("{scheme}:// needs distlock's cargo feature `postgres`, which is not enabled"),
        )),
        other => Err(unsupported_scheme(other)),
    }
}

fn unsupported_scheme(scheme: &str) -> Error {
    let supported = SUPPORTED_SCHEMES.join("://, ");
    Error::invalid(
        "url",
        format!("unsupported scheme {scheme:?}; supported: {supported}://"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_and_file_urls_open() {
        assert_eq!(connect("memory://").await.unwrap().backend(), "memory");
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("locks").display());
        assert_eq!(connect(&url).await.unwrap().backend(), "file");
        assert!(dir.path().join("locks").is_dir());
    }

    #[tokio::test]
    async fn bad_urls_say_what_is_wrong() {
        let err = connect("not a url").await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidInput { what: "url", .. }),
            "{err}"
        );
        let err = connect("zk://h").await.unwrap_err().to_string();
        assert!(
            err.contains("unsupported scheme \"zk\"") && err.contains("memory://"),
            "{err}"
        );
        let err = connect("file://remote-host/x")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("names host"), "{err}");
    }

    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert!(!redact("redis://u:se cret@[bad").contains("se cret"));
    }
}
