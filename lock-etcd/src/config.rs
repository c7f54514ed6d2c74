//! Configuration of the etcd backend, and its connection URL.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::LockError;
use lock_core::url::{LockUrl, duration};
use serde::Deserialize;

const DEFAULT_PORT: u16 = 2379;
const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);

fn config_error(message: impl fmt::Display) -> LockError {
    LockError::config(format!("etcd: {message}"))
}

lock_core::url_enum! {
    /// How waiters wait for the lock.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    #[non_exhaustive]
    pub enum EtcdStrategy for "strategy" {
        /// The naive lock: one key, created if absent; every waiter watches it (a herd).
        Single = "single",
        /// One key per contender, ordered by create revision; every waiter watches the whole
        /// queue (the lock's key prefix) and looks again at every deletion (a herd). In a
        /// URL: `whole-queue`, or its earlier name `prefix`.
        #[serde(alias = "prefix")]
        WholeQueue = "whole-queue",
        /// One key per contender, ordered by create revision; each waiter watches only the
        /// deletion of the key just before its own (herd-free, the layout of etcd's
        /// `concurrency.Mutex`, so `etcdctl lock` and distlock exclude each other).
        #[default]
        Predecessor = "predecessor",
    }
}

impl EtcdStrategy {
    /// The earlier name of [`WholeQueue`](EtcdStrategy::WholeQueue).
    #[deprecated(note = "renamed EtcdStrategy::WholeQueue, the word ZooKeeper's strategy uses too")]
    #[allow(non_upper_case_globals)]
    pub const Prefix: EtcdStrategy = EtcdStrategy::WholeQueue;
}

/// How to reach etcd and how to lock there.
///
/// `Deserialize` reads a URL's parameters: every field but the endpoints and the user, which
/// the rest of the URL gives.
///
/// ```
/// use std::time::Duration;
/// use lock_etcd::{EtcdConfig, EtcdStrategy};
///
/// let config = EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2/apps?lease_ttl=6s")?;
/// assert_eq!(config.endpoints, ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
/// assert_eq!(config.prefix, "/apps");
/// assert_eq!(config.lease_ttl, Duration::from_secs(6));
/// assert_eq!(config.strategy, EtcdStrategy::Predecessor);
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default = "EtcdConfig::url_defaults", deny_unknown_fields)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// The servers' client endpoints: `http://host:port`, or `https://host:port` for TLS
    /// (`etcds://` URLs); all of one scheme. In a URL, its hosts.
    #[serde(skip)]
    pub endpoints: Vec<String>,
    /// With TLS, a PEM file of the certificate authorities to trust instead of the system's
    /// (URL: `tls_ca=/path/ca.pem`). Default none.
    pub tls_ca: Option<PathBuf>,
    /// The user and password, when the cluster has authentication on. In a URL, its
    /// `user:password@`.
    #[serde(skip)]
    pub user: Option<(String, String)>,
    /// The key prefix under which every lock lives: lock `N` is `{prefix}/{N escaped}/`.
    /// Starts with `/` and does not end with one; a URL's path, when it has one, sets it
    /// too. Default `/distlock`.
    pub prefix: String,
    /// The lease of the provider's session: a crashed client's locks are freed this long
    /// after its last keep-alive. Whole seconds, from 2 s to 1 h; default 10 s.
    #[serde(with = "duration")]
    pub lease_ttl: Duration,
    /// How waiters wait. Default [`EtcdStrategy::Predecessor`].
    pub strategy: EtcdStrategy,
    /// The bound on connecting and on every request: more than 0, at most 1 h; default 5 s.
    #[serde(with = "duration")]
    pub timeout: Duration,
}

impl EtcdConfig {
    /// The default lease: 10 s.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
    /// The default bound on connecting and on a request: 5 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default key prefix: `/distlock`.
    pub const DEFAULT_PREFIX: &'static str = "/distlock";

    /// The servers at `endpoints` (`host:port` or `http://host:port`), with every other
    /// setting at its default.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let endpoints = endpoints.into_iter().map(Into::into).map(with_scheme);
        EtcdConfig {
            endpoints: endpoints.collect(),
            tls_ca: None,
            user: None,
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            strategy: EtcdStrategy::default(),
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// The settings a URL's parameters start from: [`new`](Self::new)'s.
    fn url_defaults() -> Self {
        Self::new(Vec::<String>::new())
    }

    /// Parses `etcd://[user:password@]h1:2379,h2:2379[/prefix]?lease_ttl=10s&strategy=predecessor&timeout=5s`,
    /// or `etcds://...` for TLS (`&tls_ca=/path/ca.pem` to trust that authority instead of
    /// the system's). Each parameter sets the field of its name, with the default and bounds
    /// that field's docs give; the path, when there is one, sets the prefix.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming what is wrong: another scheme, no host, an unknown
    /// parameter (the known ones are listed), a bad value, or what [`validate`](Self::validate)
    /// rejects.
    pub fn from_url(url: &str) -> Result<EtcdConfig, LockError> {
        let url = LockUrl::parse(url)?;
        let scheme = match url.scheme.as_str() {
            "etcd" => "http",
            "etcds" => "https",
            other => {
                return Err(config_error(format!(
                    "the URL scheme is {other:?}; expected etcd:// or etcds://"
                )));
            }
        };
        let mut config: EtcdConfig = url.query()?;
        if url.hosts.is_empty() {
            return Err(config_error(
                "the URL names no host; expected etcd://host[:port][,host[:port]...]",
            ));
        }
        if !url.path.is_empty() && url.path != "/" {
            config.prefix = url.path.trim_end_matches('/').to_owned();
        }
        let endpoints = url.hosts.iter().map(|h| h.to_address(DEFAULT_PORT));
        config.endpoints = endpoints
            .map(|address| format!("{scheme}://{address}"))
            .collect();
        config.user = match (url.username, url.password) {
            (Some(user), Some(password)) => Some((user, password)),
            (None, None) => None,
            _ => return Err(config_error("credentials need both user and password")),
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for no endpoint, an endpoint with white space or a path, http
    /// and https endpoints together, a `tls_ca` without TLS, a prefix that does not start
    /// with `/` or ends with one, an empty user, a lease that is not whole seconds from 2 s
    /// to 1 h, or a timeout of zero or over an hour.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.endpoints.is_empty() {
            return Err(config_error("at least one endpoint is required"));
        }
        for endpoint in &self.endpoints {
            let address = match endpoint.split_once("://") {
                Some(("http" | "https", address)) => address,
                _ => "",
            };
            if address.is_empty() || address.contains(|c: char| c.is_whitespace() || c == '/') {
                return Err(config_error(format!(
                    "endpoint {endpoint:?} is not an http://host:port or https://host:port address"
                )));
            }
        }
        let tls = self.endpoints.iter().filter(|e| e.starts_with("https://"));
        match tls.count() {
            0 if self.tls_ca.is_some() => {
                return Err(config_error(
                    "tls_ca is set but TLS is off (use etcds://, or https:// endpoints)",
                ));
            }
            0 => {}
            n if n < self.endpoints.len() => {
                return Err(config_error("endpoints mix http:// and https://"));
            }
            _ => {}
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') {
            return Err(config_error(format!(
                "prefix {:?} must start with '/' and not end with one",
                self.prefix
            )));
        }
        if let Some((user, _)) = &self.user
            && user.is_empty()
        {
            return Err(config_error("the user name is empty"));
        }
        let ttl = self.lease_ttl;
        if ttl < Duration::from_secs(2) || ttl > MAX_TIMEOUT || ttl.subsec_nanos() != 0 {
            return Err(config_error(format!(
                "lease_ttl is {ttl:?}; it must be whole seconds, from 2s to 1h"
            )));
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(config_error(format!(
                "timeout is {:?}; it must be more than 0 and at most 1h",
                self.timeout
            )));
        }
        Ok(())
    }
}

lock_core::setters! { EtcdConfig {
    /// Sets the key prefix.
    with_prefix(prefix: impl Into<String>) => prefix = prefix.into();
    /// Sets the session's lease.
    with_lease_ttl(ttl: Duration) => lease_ttl = ttl;
    /// Sets the waiting strategy.
    with_strategy(strategy: EtcdStrategy) => strategy = strategy;
    /// Sets the bound on connecting and on every request.
    with_timeout(timeout: Duration) => timeout = timeout;
    /// Trusts the certificate authorities in this PEM file instead of the system's (TLS,
    /// `https://` endpoints, only).
    with_tls_ca(path: impl Into<PathBuf>) => tls_ca = Some(path.into());
}}

impl EtcdConfig {
    /// Whether the endpoints are reached over TLS (`https://`).
    pub fn uses_tls(&self) -> bool {
        self.endpoints
            .first()
            .is_some_and(|endpoint| endpoint.starts_with("https://"))
    }
}

impl EtcdConfig {
    /// Sets the user and password.
    #[must_use]
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("tls_ca", &self.tls_ca)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("prefix", &self.prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("strategy", &self.strategy)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn with_scheme(endpoint: String) -> String {
    if endpoint.contains("://") {
        endpoint
    } else {
        format!("http://{endpoint}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(url: &str) -> String {
        match EtcdConfig::from_url(url) {
            Ok(config) => format!("accepted: {config:?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_full_url_is_read() -> Result<(), LockError> {
        let config = EtcdConfig::from_url(
            "etcd://alice:s%40cret@[::1]:2380,h2/a/b?lease_ttl=3s&strategy=prefix&timeout=2s",
        )?;
        assert_eq!(config.endpoints, ["http://[::1]:2380", "http://h2:2379"]);
        assert_eq!(config.user, Some(("alice".into(), "s@cret".into())));
        assert_eq!(config.prefix, "/a/b");
        assert_eq!(config.lease_ttl, Duration::from_secs(3));
        assert_eq!(config.strategy, EtcdStrategy::WholeQueue);
        assert_eq!(config.timeout, Duration::from_secs(2));
        assert!(!format!("{config:?}").contains("cret"));
        Ok(())
    }

    #[test]
    fn etcds_urls_are_tls() -> Result<(), LockError> {
        let config = EtcdConfig::from_url("etcds://h1,h2:2380?tls_ca=/etc/ca.pem")?;
        assert_eq!(config.endpoints, ["https://h1:2379", "https://h2:2380"]);
        assert_eq!(
            config.tls_ca.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        assert!(config.uses_tls());
        assert!(!EtcdConfig::from_url("etcd://h")?.uses_tls());
        let mixed = EtcdConfig::new(["http://a:1", "https://b:2"]).validate();
        assert!(mixed.is_err_and(|e| e.to_string().contains("mix")));
        Ok(())
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, expected) in [
            ("zk://h", "expected etcd://"),
            ("etcd://", "names no host"),
            ("etcd://h?ttl=3s", "ttl"),
            ("etcd://h?lease_ttl=1500ms", "whole seconds"),
            ("etcd://h?lease_ttl=1s", "from 2s"),
            ("etcd://h?timeout=0s", "more than 0"),
            (
                "etcd://h?strategy=herd",
                "expected single, prefix, whole-queue or predecessor",
            ),
            ("etcd://alice@h", "both user and password"),
            ("etcd://h?tls_ca=/ca.pem", "TLS is off"),
            ("redis://h", "expected etcd:// or etcds://"),
        ] {
            let message = error(url);
            assert!(message.contains(expected), "{url}: {message}");
        }
    }
}
