//! Choosing and configuring a backend from a URL.

use std::sync::Arc;

use lock_core::url::LockUrl;
use lock_core::{LockError, LockProvider};

/// The features of this crate that are enabled, for error messages.
const ENABLED_FEATURES: &[&str] = &[
    #[cfg(feature = "memory")]
    "memory",
    #[cfg(feature = "zookeeper")]
    "zookeeper",
    #[cfg(feature = "redis")]
    "redis",
    #[cfg(feature = "etcd")]
    "etcd",
    #[cfg(feature = "postgres")]
    "postgres",
];

/// The configuration of one backend: what [`BackendConfig::from_url`] makes of a URL.
///
/// Each variant exists only when its feature is enabled.
///
/// ```
/// # #[cfg(feature = "memory")] {
/// use distlock::BackendConfig;
/// let config = BackendConfig::from_url("memory://jobs?namespace=tests")?;
/// assert_eq!(config.backend(), "memory");
/// # }
/// # Ok::<(), distlock::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum BackendConfig {
    /// The in-memory backend (`memory://`).
    #[cfg(feature = "memory")]
    #[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
    Memory(MemoryConfig),
    /// The ZooKeeper backend (`zk://`, `zookeeper://`).
    #[cfg(feature = "zookeeper")]
    #[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
    ZooKeeper(lock_zookeeper::ZkConfig),
    /// The Redis backend on one server (`redis://`, `rediss://`).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redis(lock_redis::RedisConfig),
    /// Redlock over several independent Redis servers (`redlock://`).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redlock(lock_redis::RedlockConfig),
    /// The etcd backend (`etcd://`, `etcds://`).
    #[cfg(feature = "etcd")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    Etcd(lock_etcd::EtcdConfig),
    /// The PostgreSQL backend (`postgres://`, `postgresql://`).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(lock_postgres::PostgresConfig),
}

impl BackendConfig {
    /// Parses and validates a connection URL, choosing the backend by its scheme:
    /// `memory`, `zk`, `zookeeper` or `zks`, `redis` or `rediss`, `redlock`, `etcd`, `postgres` or
    /// `postgresql`. See the
    /// [crate docs](crate#connection-urls) for each form.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a malformed URL or an invalid setting (from the backend's
    /// parser, naming the bad part), an unknown scheme (listing the supported ones), or a
    /// known scheme whose feature is not enabled (naming the feature).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        // The scheme alone: each backend reads the rest its own way (PostgreSQL's libpq
        // URL is not lock-core's), and a password file once.
        let scheme = match url.trim().split_once("://") {
            Some((scheme, _)) => scheme.to_ascii_lowercase(),
            None => LockUrl::parse(url)?.scheme,
        };
        match scheme.as_str() {
            "memory" => memory_from_url(url),
            "zk" | "zookeeper" | "zks" => zookeeper_from_url(url, &scheme),
            "redis" | "rediss" | "redis+sentinel" | "redis+cluster" => redis_from_url(url, &scheme),
            "redlock" => redlock_from_url(url, &scheme),
            "etcd" | "etcds" => etcd_from_url(url, &scheme),
            "postgres" | "postgresql" => postgres_from_url(url, &scheme),
            _ => Err(LockError::config(format!(
                "unknown URL scheme {scheme:?}; distlock supports memory://, zk:// (or \
                 zookeeper://), zks://, redis://, rediss://, redis+sentinel://, redis+cluster://, \
                 redlock://, etcd://, etcds:// and postgres:// (or postgresql://) (enabled \
                 features: {})",
                enabled_features()
            ))),
        }
    }

    /// The backend's name: `"memory"`, `"zookeeper"`, `"redis"`, `"redlock"`, `"etcd"` or
    /// `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match *self {
            #[cfg(feature = "memory")]
            BackendConfig::Memory(_) => "memory",
            #[cfg(feature = "zookeeper")]
            BackendConfig::ZooKeeper(_) => "zookeeper",
            #[cfg(feature = "redis")]
            BackendConfig::Redis(_) => "redis",
            #[cfg(feature = "redis")]
            BackendConfig::Redlock(_) => "redlock",
            #[cfg(feature = "etcd")]
            BackendConfig::Etcd(_) => "etcd",
            #[cfg(feature = "postgres")]
            BackendConfig::Postgres(_) => "postgres",
        }
    }

    /// Connects to the backend and returns its lock provider.
    ///
    /// # Errors
    ///
    /// [`LockError::Connection`] (retryable) when the servers cannot be reached, and
    /// authentication errors from the backend.
    pub async fn connect(self) -> Result<Arc<dyn LockProvider>, LockError> {
        match self {
            #[cfg(feature = "memory")]
            BackendConfig::Memory(config) => Ok(config.connect()),
            #[cfg(feature = "zookeeper")]
            BackendConfig::ZooKeeper(config) => Ok(Arc::new(
                lock_zookeeper::ZkLockProvider::connect(config).await?,
            )),
            #[cfg(feature = "redis")]
            BackendConfig::Redis(config) => Ok(Arc::new(
                lock_redis::RedisLockProvider::connect(config).await?,
            )),
            #[cfg(feature = "redis")]
            BackendConfig::Redlock(config) => Ok(Arc::new(
                lock_redis::RedlockProvider::connect(config).await?,
            )),
            #[cfg(feature = "etcd")]
            BackendConfig::Etcd(config) => Ok(Arc::new(
                lock_etcd::EtcdLockProvider::connect(config).await?,
            )),
            #[cfg(feature = "postgres")]
            BackendConfig::Postgres(config) => Ok(Arc::new(
                lock_postgres::PostgresLockProvider::connect(config).await?,
            )),
        }
    }
}

fn enabled_features() -> String {
    if ENABLED_FEATURES.is_empty() {
        "none".to_owned()
    } else {
        ENABLED_FEATURES.join(", ")
    }
}

#[cfg(any(
    not(feature = "memory"),
    not(feature = "zookeeper"),
    not(feature = "redis"),
    not(feature = "etcd"),
    not(feature = "postgres")
))]
fn feature_off(scheme: &str, feature: &str) -> LockError {
    LockError::config(format!(
        "the {scheme:?} scheme needs the {feature:?} feature of distlock (enabled features: {})",
        enabled_features()
    ))
}

#[cfg(feature = "memory")]
fn memory_from_url(url: &str) -> Result<BackendConfig, LockError> {
    MemoryConfig::from_url(url).map(BackendConfig::Memory)
}

#[cfg(not(feature = "memory"))]
fn memory_from_url(_url: &str) -> Result<BackendConfig, LockError> {
    Err(feature_off("memory", "memory"))
}

#[cfg(feature = "zookeeper")]
fn zookeeper_from_url(url: &str, _scheme: &str) -> Result<BackendConfig, LockError> {
    lock_zookeeper::ZkConfig::from_url(url).map(BackendConfig::ZooKeeper)
}

#[cfg(not(feature = "zookeeper"))]
fn zookeeper_from_url(_url: &str, scheme: &str) -> Result<BackendConfig, LockError> {
    Err(feature_off(scheme, "zookeeper"))
}

#[cfg(feature = "redis")]
fn redis_from_url(url: &str, _scheme: &str) -> Result<BackendConfig, LockError> {
    lock_redis::RedisConfig::from_url(url).map(BackendConfig::Redis)
}

#[cfg(not(feature = "redis"))]
fn redis_from_url(_url: &str, scheme: &str) -> Result<BackendConfig, LockError> {
    Err(feature_off(scheme, "redis"))
}

#[cfg(feature = "redis")]
fn redlock_from_url(url: &str, _scheme: &str) -> Result<BackendConfig, LockError> {
    lock_redis::RedlockConfig::from_url(url).map(BackendConfig::Redlock)
}

#[cfg(not(feature = "redis"))]
fn redlock_from_url(_url: &str, scheme: &str) -> Result<BackendConfig, LockError> {
    Err(feature_off(scheme, "redis"))
}

#[cfg(feature = "etcd")]
fn etcd_from_url(url: &str, _scheme: &str) -> Result<BackendConfig, LockError> {
    lock_etcd::EtcdConfig::from_url(url).map(BackendConfig::Etcd)
}

#[cfg(not(feature = "etcd"))]
fn etcd_from_url(_url: &str, scheme: &str) -> Result<BackendConfig, LockError> {
    Err(feature_off(scheme, "etcd"))
}

#[cfg(feature = "postgres")]
fn postgres_from_url(url: &str, _scheme: &str) -> Result<BackendConfig, LockError> {
    lock_postgres::PostgresConfig::from_url(url).map(BackendConfig::Postgres)
}

#[cfg(not(feature = "postgres"))]
fn postgres_from_url(_url: &str, scheme: &str) -> Result<BackendConfig, LockError> {
    Err(feature_off(scheme, "postgres"))
}

/// The configuration of the in-memory backend.
///
/// In a URL: `memory://` for a new private server, `memory://NAME` for the process-wide
/// server called `NAME` (so that two `connect("memory://jobs")` calls in one process contend
/// for the same locks), and `?namespace=NS` to keep lock names apart from other namespaces
/// on the same server.
///
/// ```
/// use distlock::MemoryConfig;
/// let config = MemoryConfig::from_url("memory://jobs?namespace=tests")?;
/// assert_eq!(config, MemoryConfig::new().with_server("jobs").with_namespace("tests"));
/// assert_eq!(MemoryConfig::from_url("memory://")?.server, None);
/// # Ok::<(), distlock::LockError>(())
/// ```
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MemoryConfig {
    /// The name of the process-wide server to use, or `None` for a new private server
    /// (the URL's host).
    #[serde(skip)]
    pub server: Option<String>,
    /// The namespace of the lock names; default `""`.
    pub namespace: String,
}

#[cfg(feature = "memory")]
impl MemoryConfig {
    /// A new private server, default namespace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses the process-wide server called `name`.
    #[must_use]
    pub fn with_server(mut self, name: impl Into<String>) -> Self {
        self.server = Some(name.into());
        self
    }

    /// Sets the namespace.
    #[must_use]
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Parses a `memory://[NAME][?namespace=NS]` URL.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a malformed URL, another scheme, credentials, several
    /// server names, a port, a path, or a parameter other than `namespace`.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let url = LockUrl::parse(url)?;
        let bad = |message: &str| LockError::config(format!("memory: {message}"));
        if url.scheme != "memory" {
            return Err(bad(&format!(
                "the URL scheme is {:?}; expected memory://",
                url.scheme
            )));
        }
        let mut config: MemoryConfig = url.query()?;
        if url.username.is_some() || url.password.is_some() {
            return Err(bad("memory:// URLs take no user name or password"));
        }
        if !url.path.is_empty() && url.path != "/" {
            return Err(bad(
                "memory:// URLs take no path; write memory://NAME?namespace=NS",
            ));
        }
        config.server = match url.hosts.as_slice() {
            [] => None,
            [host] if host.port.is_none() => Some(host.host.clone()),
            [host] => {
                return Err(bad(&format!(
                    "the server name {:?} must not have a port",
                    host.host
                )));
            }
            _ => {
                return Err(bad(
                    "memory:// URLs name at most one server (memory://NAME)",
                ));
            }
        };
        Ok(config)
    }

    /// A new client (session) of the configured server.
    fn connect(self) -> Arc<dyn LockProvider> {
        use lock_core::memory::MemoryServer;
        let server = match &self.server {
            Some(name) => MemoryServer::named(name),
            None => MemoryServer::new(),
        };
        Arc::new(server.provider_in(&self.namespace))
    }
}
