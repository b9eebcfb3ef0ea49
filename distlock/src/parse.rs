//! Choosing a backend by URL, like a database driver.

use std::sync::Arc;

use futures_util::future::BoxFuture;
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
    "zookeeper",
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
/// | `zookeeper://[user:pass@]host[:port][,host2...][/chroot][?session_timeout=..]` | `distlock::zookeeper::ZooKeeperLocker` (feature `zookeeper`; see `distlock::zookeeper::Config::from_url`) |
///
/// Fails with [`Error::InvalidInput`] for a malformed URL or an unknown scheme
/// (the message lists the supported ones, and the cargo feature that enables a
/// known but missing one), and with the backend's error if it cannot be opened.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let err = distlock::connect("consul://consul:8500").await.unwrap_err();
/// assert!(err.to_string().contains("unsupported scheme"));
/// # }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn Locker>> {
    // Before `Url::parse`, which rejects multi-host forms (`h1:5432,h2:5432`).
    if let Some((scheme, _)) = url.split_once("://") {
        if let Some(backend) = backend_of(scheme).filter(|b| b.before_parsing) {
            return backend.open(scheme, url).await;
        }
    }
    let parsed = Url::parse(url)
        .map_err(|e| Error::invalid("url", format!("{:?} is not a URL: {e}", redact(url))))?;
    match parsed.scheme() {
        "memory" => Ok(Arc::new(crate::memory::MemoryLocker::new())),
        "file" => open_file(url, &parsed),
        scheme => match backend_of(scheme) {
            Some(backend) => backend.open(scheme, url).await,
            None => Err(unsupported_scheme(scheme)),
        },
    }
}

/// A `file://` URL's locker: a local directory only; `file://` alone (path
/// `/`) is the default directory.
fn open_file(url: &str, parsed: &Url) -> Result<Arc<dyn Locker>> {
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
    let dir = parsed
        .to_file_path()
        .map_err(|()| Error::invalid("url", format!("{url:?} does not name a local directory")))?;
    Ok(Arc::new(crate::file::FileLocker::new(dir)?))
}

/// Opens a backend's locker from its URL.
type Open = for<'a> fn(&'a str) -> BoxFuture<'a, Result<Arc<dyn Locker>>>;

/// A backend behind a cargo feature, and the URL schemes that name it.
struct FeatureBackend {
    schemes: &'static [&'static str],
    feature: &'static str,
    /// Matched on the URL's text before `Url::parse`, which rejects the
    /// several comma-separated hosts these schemes accept.
    before_parsing: bool,
    /// `None` when distlock was built without `feature`.
    open: Option<Open>,
}

impl FeatureBackend {
    /// Opens `url`, or says which cargo feature `scheme` needs.
    async fn open(&self, scheme: &str, url: &str) -> Result<Arc<dyn Locker>> {
        match self.open {
            Some(open) => open(url).await,
            None => Err(Error::invalid(
                "url",
                format!(
                    "{scheme}:// needs distlock's cargo feature `{feature}`, which this build \
                     does not have; rebuild with it: `cargo install distlock-cli --features \
                     {feature}` for the CLI, `distlock = {{ features = [\"{feature}\"] }}` in \
                     Cargo.toml for the library",
                    feature = self.feature
                ),
            )),
        }
    }
}

/// `Some` opener for `$locker::from_url` when `$feature` is compiled in.
macro_rules! opener {
    ($feature:literal, $($locker:ident)::+) => {{
        #[cfg(feature = $feature)]
        let open: Option<Open> = Some(|url| {
            Box::pin(async move {
                Ok(Arc::new($($locker)::+::from_url(url).await?) as Arc<dyn Locker>)
            })
        });
        #[cfg(not(feature = $feature))]
        let open: Option<Open> = None;
        open
    }};
}

/// Every backend behind a cargo feature: one row per backend, in
/// [`SUPPORTED_SCHEMES`] order (`memory` and `file` are always built in).
const FEATURE_BACKENDS: &[FeatureBackend] = &[
    FeatureBackend {
        schemes: &["redis", "rediss"],
        feature: "redis",
        before_parsing: false,
        open: opener!("redis", crate::redis::RedisLocker),
    },
    FeatureBackend {
        schemes: &[
            "redis+cluster",
            "rediss+cluster",
            "redis+sentinel",
            "rediss+sentinel",
        ],
        feature: "redis",
        before_parsing: true,
        open: opener!("redis", crate::redis::RedisLocker),
    },
    FeatureBackend {
        schemes: &["redlock"],
        feature: "redlock",
        before_parsing: true,
        open: opener!("redlock", crate::redlock::RedlockLocker),
    },
    FeatureBackend {
        schemes: &["postgres", "postgresql"],
        feature: "postgres",
        before_parsing: true,
        open: opener!("postgres", crate::postgres::PostgresLocker),
    },
    FeatureBackend {
        schemes: &["etcd", "etcd+https"],
        feature: "etcd",
        before_parsing: true,
        open: opener!("etcd", crate::etcd::EtcdLocker),
    },
    FeatureBackend {
        schemes: &["mysql", "mariadb"],
        feature: "mysql",
        before_parsing: false,
        open: opener!("mysql", crate::mysql::MysqlLocker),
    },
    FeatureBackend {
        schemes: &["zookeeper"],
        feature: "zookeeper",
        before_parsing: true,
        open: opener!("zookeeper", crate::zookeeper::ZooKeeperLocker),
    },
];

/// The row of `scheme`, if a feature-gated backend has it.
fn backend_of(scheme: &str) -> Option<&'static FeatureBackend> {
    FEATURE_BACKENDS
        .iter()
        .find(|backend| backend.schemes.contains(&scheme))
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
    fn every_supported_scheme_has_one_row() {
        let mut tabled: Vec<&str> = vec!["memory", "file"];
        tabled.extend(
            FEATURE_BACKENDS
                .iter()
                .flat_map(|b| b.schemes.iter().copied()),
        );
        assert_eq!(tabled, SUPPORTED_SCHEMES);
    }

    #[tokio::test]
    async fn a_scheme_without_its_feature_names_the_feature() {
        let missing = FeatureBackend {
            schemes: &["etcd+https"],
            feature: "etcd",
            before_parsing: true,
            open: None,
        };
        let err = missing
            .open("etcd+https", "etcd+https://h")
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid url: etcd+https:// needs distlock's cargo feature `etcd`, which this build \
             does not have; rebuild with it: `cargo install distlock-cli --features etcd` for \
             the CLI, `distlock = { features = [\"etcd\"] }` in Cargo.toml for the library"
        );
    }

    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert!(!redact("redis://u:se cret@[bad").contains("se cret"));
    }
}
