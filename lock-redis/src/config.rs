//! Configuration of the Redis and Redlock backends, and their connection URLs.
//!
//! [`RedisConfig`] (one server) and [`RedlockConfig`] (several) share their lease settings,
//! [`LeaseOptions`]: the same setters, bounds and URL parameters (`prefix`, `ttl`, `timeout`;
//! and `tls_ca` for the servers).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::LockError;
use lock_core::url::{LockUrl, duration};
use serde::Deserialize;

mod cluster;
mod lease;
mod redlock;
mod sentinel;
mod server;

pub use cluster::RedisCluster;
pub use lease::LeaseOptions;
pub use redlock::RedlockConfig;
pub use sentinel::RedisSentinel;
pub use server::RedisServer;
use server::servers;

pub(crate) fn config_error(backend: &str, message: impl fmt::Display) -> LockError {
    LockError::config(format!("{backend}: {message}"))
}

lock_core::url_enum! {
    /// How a Redis lock's waiters learn that it may be free.
    ///
    /// All three are kept because the benchmark compares them.
    ///
    /// In a URL: `strategy=polling`, `strategy=pubsub` or `strategy=queue`.
    ///
    /// ```
    /// use lock_redis::RedisStrategy;
    /// assert_eq!("pubsub".parse::<RedisStrategy>()?, RedisStrategy::PubSub);
    /// assert_eq!(RedisStrategy::default().to_string(), "queue");
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    #[non_exhaustive]
    pub enum RedisStrategy for "strategy" {
        /// Waiters retry with jittered back-off (not FIFO; load grows with the waiters).
        Polling = "polling",
        /// A release is broadcast on a channel and every waiter retries (a herd; not FIFO).
        /// A provider's waiters share one subscription connection per server.
        PubSub = "pubsub",
        /// Waiters join a queue in Redis and a release hands the lock to the head waiter
        /// (herd-free and FIFO). The default.
        #[default]
        Queue = "queue",
    }
}

/// How to lock on one Redis server.
///
/// Build one with [`RedisConfig::new`] and the `with_*` setters, or from a URL with
/// [`RedisConfig::from_url`]. The setters do not check their arguments;
/// [`RedisConfig::validate`] does (and `from_url` calls it). `Deserialize` reads the URL
/// parameters that are its own fields (`strategy`, `wait_replicas`, `wait_timeout`).
///
/// ```
/// use std::time::Duration;
/// use lock_redis::{RedisConfig, RedisServer, RedisStrategy};
///
/// let config = RedisConfig::new(RedisServer::new("localhost"))
///     .with_key_prefix("billing")
///     .with_ttl(Duration::from_secs(5))
///     .with_strategy(RedisStrategy::Polling);
/// config.validate()?;
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default = "RedisConfig::url_defaults", deny_unknown_fields)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The server; with [`sentinel`](Self::sentinel), its login and database only; with
    /// [`cluster`](Self::cluster), its login only.
    #[serde(skip)]
    pub server: RedisServer,
    /// Find the primary through Redis Sentinel and follow its failovers; `None` (the
    /// default) connects to `server`.
    #[serde(skip)]
    pub sentinel: Option<RedisSentinel>,
    /// Lock on a Redis Cluster, each lock on the primary serving its slot; `None` (the
    /// default) connects to `server`. Not with `sentinel`, TLS, a database other than 0
    /// or `wait_replicas` (see [`RedisCluster`]).
    #[serde(skip)]
    pub cluster: Option<RedisCluster>,
    /// The key prefix, the lease and the request timeout.
    #[serde(skip)]
    pub lease: LeaseOptions,
    /// How waiters wait. Default [`RedisStrategy::Queue`].
    pub strategy: RedisStrategy,
    /// How many replicas must have a grant and each renewal before it counts (`WAIT`
    /// after it); 0, the default, waits for none. A grant not acknowledged within
    /// [`wait_timeout`](Self::wait_timeout) is given back and the acquisition fails with a
    /// retryable error; a renewal not acknowledged counts as failed (the lock is lost if
    /// none succeeds within the lease). Narrows, does not close, the failover window (see
    /// the [crate docs](crate#failover-restarts-and-tokens)). At most 100.
    pub wait_replicas: u32,
    /// How long `WAIT` waits for the replicas: from 1 ms to the request timeout (checked
    /// when `wait_replicas` is set). Default 100 ms.
    #[serde(with = "duration")]
    pub wait_timeout: Duration,
}

impl RedisConfig {
    /// The default [`wait_timeout`](Self::wait_timeout), 100 ms.
    pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(100);

    /// A configuration for `server` with every other setting at its default.
    pub fn new(server: RedisServer) -> Self {
        RedisConfig {
            server,
            sentinel: None,
            cluster: None,
            lease: LeaseOptions::default(),
            strategy: RedisStrategy::default(),
            wait_replicas: 0,
            wait_timeout: Self::DEFAULT_WAIT_TIMEOUT,
        }
    }

    /// The settings a URL's parameters start from: [`new`](Self::new)'s.
    fn url_defaults() -> Self {
        Self::new(RedisServer::url_defaults())
    }

    /// Parses a `redis://` or `rediss://` (TLS) connection URL, a `redis+sentinel://` one
    /// (see [`RedisSentinel`]) or a `redis+cluster://` one (see [`RedisCluster`]), and
    /// [validates](Self::validate) the result.
    ///
    /// ```text
    /// redis://[user[:password]@]host[:port][/db]?prefix=lock&ttl=30s&strategy=queue
    /// redis+sentinel://[user[:password]@]sentinel1[:26379],sentinel2/SERVICE[/db]?ttl=30s
    /// redis+cluster://[user[:password]@]node1[:6379],node2?ttl=30s&strategy=queue
    /// ```
    ///
    /// `rediss://` connects with TLS; `user:password@` is the ACL user and password
    /// (`:password@` alone for the `default` user); the host is exactly one server (port
    /// 6379; with `redis+sentinel://`, the sentinels, port 26379; with `redis+cluster://`,
    /// nodes of the cluster); the path is the logical database (`/SERVICE/db` with
    /// `redis+sentinel://`, none with `redis+cluster://`), 0 by default. Each parameter
    /// sets the field of its name, of this struct, of its [`LeaseOptions`] or (`tls_ca`,
    /// with `rediss://`) of its [`RedisServer`], with the default and bounds that field's
    /// docs give.
    ///
    /// User, password and parameter values are percent-decoded.
    ///
    /// ```
    /// use lock_redis::RedisConfig;
    /// let config = RedisConfig::from_url("redis://locker:s3cret@localhost:6380/1?prefix=jobs")?;
    /// assert_eq!(config.server.address(), "localhost:6380");
    /// assert_eq!(config.server.username.as_deref(), Some("locker"));
    /// assert_eq!(config.server.db, 1);
    /// assert_eq!(config.lease.key_prefix, "jobs");
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the bad part (never repeating the password): another
    /// scheme, a malformed URL, no host or several, a bad database, a user name without a
    /// password, an unknown parameter or value, a prefix or ttl out of bounds.
    pub fn from_url(url: &str) -> Result<RedisConfig, LockError> {
        let url = LockUrl::parse(url)?;
        let parts = || -> Result<_, LockError> {
            let (lease, server, mut config): (LeaseOptions, RedisServer, RedisConfig) =
                url.query_parts()?;
            config.lease = lease;
            Ok((config, server.tls_ca))
        };
        let tls = match url.scheme.as_str() {
            "redis" => false,
            "rediss" => true,
            "redis+sentinel" => return sentinel::from_url(&url, parts()?),
            "redis+cluster" => return cluster::from_url(&url, parts()?),
            other => {
                let message = format!(
                    "the URL scheme is {other:?}; expected redis://, rediss://, \
                     redis+sentinel:// or redis+cluster:// (redlock:// URLs are parsed by \
                     RedlockConfig)"
                );
                return Err(config_error("redis", message));
            }
        };
        let (mut config, tls_ca) = parts()?;
        if url.hosts.len() > 1 {
            let message = format!(
                "the URL names {} hosts; redis:// takes exactly one \
                 (use redlock:// for several independent servers)",
                url.hosts.len()
            );
            return Err(config_error("redis", message));
        }
        config.server = servers(&url, tls, tls_ca, "redis")?.remove(0);
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the bad setting: see [`RedisServer::validate`], and a
    /// key prefix, ttl or timeout out of bounds.
    pub fn validate(&self) -> Result<(), LockError> {
        self.server.validate()?;
        if let Some(sentinel) = &self.sentinel {
            sentinel.validate(&self.server)?;
        }
        if let Some(cluster) = &self.cluster {
            if self.sentinel.is_some() {
                return Err(config_error("redis", "a cluster or Sentinel, not both"));
            }
            cluster.validate(self)?;
        }
        self.lease.validate_for("redis")?;
        if self.wait_replicas > 100 {
            let message = format!("wait_replicas is {}; at most 100", self.wait_replicas);
            return Err(config_error("redis", message));
        }
        let (wait, most) = (self.wait_timeout, self.lease.timeout);
        if self.wait_replicas > 0 && !(Duration::from_millis(1)..=most).contains(&wait) {
            let rule = "it must be from 1ms to the request timeout";
            let message = format!("wait_timeout is {wait:?}; {rule}");
            return Err(config_error("redis", message));
        }
        Ok(())
    }
}

lock_core::setters! { RedisConfig {
    /// Sets the waiting strategy.
    with_strategy(strategy: RedisStrategy) => strategy = strategy;
    /// Finds the primary through Redis Sentinel.
    with_sentinel(sentinel: RedisSentinel) => sentinel = Some(sentinel);
    /// Locks on a Redis Cluster.
    with_cluster(cluster: RedisCluster) => cluster = Some(cluster);
    /// Sets how many replicas must acknowledge each grant and renewal
    /// ([`wait_replicas`](Self::wait_replicas)).
    with_wait_replicas(replicas: u32) => wait_replicas = replicas;
    /// Sets how long `WAIT` waits for them ([`wait_timeout`](Self::wait_timeout)).
    with_wait_timeout(timeout: Duration) => wait_timeout = timeout;
    /// Sets the lease settings: key prefix, lease and request timeout.
    with_lease(lease: LeaseOptions) => lease = lease;
}}

/// What a URL's parameters give a `redis+sentinel://` or `redis+cluster://` URL: the
/// configuration with its lease settings, and the `tls_ca` they do not support.
type UrlParts = (RedisConfig, Option<PathBuf>);

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Checks that `parse` rejects the URL before the first `|` of `case` with a `Config`
    /// error containing each `|`-separated part after it, and not the password `topsecret`.
    pub(super) fn rejects<T: fmt::Debug>(parse: fn(&str) -> Result<T, LockError>, case: &str) {
        let (url, parts) = case.split_once('|').unwrap();
        let Err(LockError::Config { message }) = parse(url) else {
            panic!("{url} is not a Config error");
        };
        assert!(
            parts.split('|').all(|p| message.contains(p)),
            "{url}: {message}"
        );
        assert!(!message.contains("topsecret"), "{url}: {message}");
    }

    fn redis(url: &str) -> RedisConfig {
        RedisConfig::from_url(url).unwrap()
    }

    #[test]
    fn minimal_redis_url_takes_every_default() {
        let config = redis("redis://localhost");
        assert_eq!(config, RedisConfig::new(RedisServer::new("localhost")));
        assert_eq!(redis("redis://localhost/"), config);
        assert_eq!(config.lease.key_prefix, "lock");
        assert_eq!(config.lease.ttl, Duration::from_secs(30));
        assert_eq!(config.strategy, RedisStrategy::Queue);
        assert_eq!(config.lease.timeout, Duration::from_secs(5));
    }

    #[test]
    fn full_redis_url() {
        let config = redis(
            "rediss://locker:p%40ss@[::1]:6380/7?prefix=billing%3Alocks&ttl=5s&strategy=polling\
             &timeout=2s&tls_ca=/etc/ca.pem",
        );
        let server = RedisServer::new("::1")
            .with_port(6380)
            .with_tls(true)
            .with_tls_ca("/etc/ca.pem")
            .with_username("locker")
            .with_password("p@ss")
            .with_db(7);
        let expected = RedisConfig::new(server)
            .with_key_prefix("billing:locks")
            .with_ttl(Duration::from_secs(5))
            .with_strategy(RedisStrategy::Polling)
            .with_timeout(Duration::from_secs(2));
        assert_eq!(config, expected);
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("p@ss") && debug.contains("<redacted>"),
            "{debug}"
        );
    }

    #[test]
    fn replica_acknowledgements() {
        let config = redis("redis://h?wait_replicas=2&wait_timeout=50ms");
        assert_eq!(config.wait_replicas, 2);
        assert_eq!(config.wait_timeout, Duration::from_millis(50));
        assert_eq!(redis("redis://h").wait_replicas, 0);
        let built = RedisConfig::new(RedisServer::new("h"))
            .with_wait_replicas(1)
            .with_wait_timeout(Duration::from_millis(20));
        assert!(built.validate().is_ok());
        for case in [
            "redis://h?wait_replicas=101|wait_replicas is 101",
            "redis://h?wait_replicas=-1|wait_replicas",
            "redis://h?wait_replicas=1&wait_timeout=0ms|wait_timeout|from 1ms to the request",
            "redis://h?wait_replicas=1&wait_timeout=6s|wait_timeout|from 1ms to the request",
        ] {
            rejects(RedisConfig::from_url, case);
        }
    }

    #[test]
    fn each_strategy() {
        use RedisStrategy as S;
        let cases = [
            ("polling", S::Polling),
            ("pubsub", S::PubSub),
            ("queue", S::Queue),
        ];
        for (value, strategy) in cases.into_iter().chain([("PubSub", S::PubSub)]) {
            let config = redis(&format!("redis://h?strategy={value}"));
            assert_eq!(config.strategy, strategy);
            assert_eq!(strategy.to_string(), value.to_ascii_lowercase());
            assert_eq!(strategy.as_str().parse::<S>().unwrap(), strategy);
        }
    }

    #[test]
    fn lease_bounds() {
        let (ms, lease) = (Duration::from_millis, LeaseOptions::default());
        let prefix = "p".repeat(128);
        for (query, expected) in [
            ("ttl=100ms", lease.clone().with_ttl(ms(100))),
            ("ttl=1day", lease.clone().with_ttl(ms(86_400_000))),
            ("timeout=10ms", lease.clone().with_timeout(ms(10))),
            ("timeout=10m", lease.clone().with_timeout(ms(600_000))),
            (&format!("prefix={prefix}"), lease.with_key_prefix(&prefix)),
        ] {
            let config = redis(&format!("redis://h?{query}"));
            assert_eq!(config.lease, expected, "{query}");
        }
        let config = || RedisConfig::new(RedisServer::new("h"));
        assert!(config().validate().is_ok());
        for bad in [
            config().with_key_prefix(""),
            config().with_ttl(ms(10)),
            config().with_timeout(Duration::ZERO),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rejected_redis_urls() {
        let long = "p".repeat(129);
        let mut cases = vec![format!("redis://h?prefix={long}|longer than 128 bytes")];
        let ttl = |ttl: &str| format!("redis://u:topsecret@h?ttl={ttl}|ttl|at least 100ms");
        cases.extend(["0s", "99ms", "1day 1s", "2days"].map(ttl));
        let timeout = |t: &str| format!("redis://h?timeout={t}|timeout|from 10ms to 10 minutes");
        cases.extend(["9ms", "11m"].map(timeout));
        let table = [
            "redis://h?ttl=forever|ttl|not a duration",
            "redis://h?prefix=|prefix|must not be empty",
            "redis://u:topsecret@h?prefix=a%7Bb|prefix|'{' or '}'",
            "redis://h?prefix=a}|prefix|'{' or '}'",
            "redis://h?prefix=a%0Ab|prefix|control",
            "redlock://h|\"redlock\"|redis://",
            "zk://u:topsecret@h|\"zk\"",
            "redis://|no host",
            "redis:///1|no host",
            "redis://u:topsecret@a,b|2 hosts|redlock://",
            "localhost:6379|no scheme",
            "redis://u:topsecret@h:0|1 to 65535",
            "redis://u:topsecret@h:99999|port",
            "redis://h?ttl|no value",
            "redis://u:topsecret@h?retry_count=3|unknown parameter \"retry_count\" for redis://\
             |known: prefix, ttl, timeout, tls_ca, strategy, wait_replicas, wait_timeout",
            "redis://u:topsecret@h?strategy=herd|strategy|\"herd\"|polling, pubsub or queue",
        ];
        cases.extend(table.map(str::to_owned));
        for case in &cases {
            rejects(RedisConfig::from_url, case);
        }
    }
}
