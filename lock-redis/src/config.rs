//! Configuration of the Redis and Redlock backends, and their connection URLs.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lock_core::LockError;
use lock_core::url::LockUrl;

/// The parameters `redis://` and `rediss://` understand.
const REDIS_PARAMS: &[&str] = &["prefix", "ttl", "strategy", "timeout", "tls_ca"];
/// The parameters `redlock://` understands.
const REDLOCK_PARAMS: &[&str] = &[
    "prefix",
    "ttl",
    "retry_count",
    "retry_delay",
    "drift_factor",
    "tls",
    "tls_ca",
    "timeout",
];
/// Longest accepted key prefix, in bytes.
const MAX_PREFIX_LEN: usize = 128;
/// Shortest accepted lease: the watchdog renews at ttl/3, which must leave time for a round
/// trip.
const MIN_TTL: Duration = Duration::from_millis(100);
/// Longest accepted lease.
const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Shortest and longest accepted request timeout.
const MIN_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// The default request timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest accepted Redlock retry delay.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);
/// Largest accepted Redlock clock drift factor.
const MAX_DRIFT_FACTOR: f64 = 0.5;

fn config_error(backend: &str, message: impl fmt::Display) -> LockError {
    LockError::config(format!("{backend}: {message}"))
}

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
pub enum RedisStrategy {
    /// Waiters retry with jittered back-off (not FIFO; load grows with the waiters).
    Polling,
    /// A release is broadcast on a channel and every waiter retries (a herd; not FIFO).
    /// A provider's waiters share one subscription connection per server.
    PubSub,
    /// Waiters join a queue in Redis and a release hands the lock to the head waiter
    /// (herd-free and FIFO). The default.
    #[default]
    Queue,
}

impl RedisStrategy {
    /// The value used in URLs: `polling`, `pubsub` or `queue`.
    pub fn as_str(self) -> &'static str {
        match self {
            RedisStrategy::Polling => "polling",
            RedisStrategy::PubSub => "pubsub",
            RedisStrategy::Queue => "queue",
        }
    }
}

impl fmt::Display for RedisStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RedisStrategy {
    type Err = LockError;

    /// Parses a URL value, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            RedisStrategy::Polling,
            RedisStrategy::PubSub,
            RedisStrategy::Queue,
        ]
        .into_iter()
        .find(|v| v.as_str().eq_ignore_ascii_case(s))
        .ok_or_else(|| {
            config_error(
                "redis",
                format!("unknown strategy {s:?} (expected polling, pubsub or queue)"),
            )
        })
    }
}

/// One Redis server and how to log in to it.
///
/// `Debug` never shows the password.
///
/// ```
/// use lock_redis::RedisServer;
/// let server = RedisServer::new("cache.internal")
///     .with_username("locker")
///     .with_password("s3cret")
///     .with_db(2);
/// assert_eq!(server.address(), "cache.internal:6379");
/// assert!(!format!("{server:?}").contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisServer {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port. Default 6379.
    pub port: u16,
    /// Whether to connect with TLS (`rediss://`).
    pub tls: bool,
    /// With TLS, a PEM file of the certificate authorities to trust instead of the
    /// system's (URL: `tls_ca=/path/ca.pem`).
    pub tls_ca: Option<std::path::PathBuf>,
    /// The ACL user name, if any (Redis 6+); with only a password, the `default` user.
    pub username: Option<String>,
    /// The password, if any.
    pub password: Option<String>,
    /// The logical database. Default 0.
    pub db: i64,
}

impl RedisServer {
    /// Redis's default port, 6379.
    pub const DEFAULT_PORT: u16 = 6379;

    /// The server at `host`, port 6379, without TLS or credentials, database 0.
    pub fn new(host: impl Into<String>) -> Self {
        RedisServer {
            host: host.into(),
            port: Self::DEFAULT_PORT,
            tls: false,
            tls_ca: None,
            username: None,
            password: None,
            db: 0,
        }
    }

    /// Trusts the certificate authorities in the PEM file at `path` (implies nothing
    /// without [`with_tls`](Self::with_tls)).
    #[must_use]
    pub fn with_tls_ca(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls_ca = Some(path.into());
        self
    }

    /// Sets the port.
    #[must_use]
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Turns TLS on or off.
    #[must_use]
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Sets the ACL user name.
    #[must_use]
    pub fn with_username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// Sets the password.
    #[must_use]
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Sets the logical database.
    #[must_use]
    pub fn with_db(mut self, db: i64) -> Self {
        self.db = db;
        self
    }

    /// `host:port`, with an IPv6 host in brackets.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Checks the server's settings.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for an empty host or one with white space, port 0, a negative
    /// database, a user name without a password, or a `tls_ca` without TLS.
    pub fn validate(&self) -> Result<(), LockError> {
        self.validate_for("redis")
    }

    /// [`validate`](Self::validate), with errors naming `backend`.
    fn validate_for(&self, backend: &str) -> Result<(), LockError> {
        if self.host.is_empty()
            || self
                .host
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || matches!(c, ',' | '/'))
        {
            return Err(config_error(
                backend,
                format!("host {:?} is not a host name or address", self.host),
            ));
        }
        if self.port == 0 {
            return Err(config_error(
                backend,
                format!("port 0 of host {:?} is not a port", self.host),
            ));
        }
        if self.db < 0 {
            return Err(config_error(
                backend,
                format!("database {} must not be negative", self.db),
            ));
        }
        if self.username.is_some() && self.password.is_none() {
            return Err(user_without_password(backend));
        }
        if self.tls_ca.is_some() && !self.tls {
            return Err(config_error(
                backend,
                "tls_ca is set but TLS is off (use rediss://, or tls=true for redlock://)",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .finish()
    }
}

/// How to lock on one Redis server.
///
/// Build one with [`RedisConfig::new`] and the `with_*` setters, or from a URL with
/// [`RedisConfig::from_url`]. The setters do not check their arguments;
/// [`RedisConfig::validate`] does (and `from_url` calls it).
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
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The server.
    pub server: RedisServer,
    /// The first part of every key: the lock called `N` uses keys tagged `{prefix:N}`.
    /// Non-empty, at most 128 bytes, without `{`, `}` or control characters. Default `lock`.
    pub key_prefix: String,
    /// The lease: how long a lock outlives its holder's crash. The watchdog renews it at
    /// ttl/3 while the guard lives. From 100 ms to 1 day; default 30 s.
    pub ttl: Duration,
    /// How waiters wait. Default [`RedisStrategy::Queue`].
    pub strategy: RedisStrategy,
    /// How long connecting, or one request, may take before it fails with a retryable
    /// [`LockError::Connection`]; from 10 ms to 10 minutes. Default 5 s.
    pub timeout: Duration,
}

impl RedisConfig {
    /// The default key prefix, `lock`.
    pub const DEFAULT_KEY_PREFIX: &'static str = "lock";
    /// The default lease, 30 s.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

    /// A configuration for `server` with every other setting at its default.
    pub fn new(server: RedisServer) -> Self {
        RedisConfig {
            server,
            key_prefix: Self::DEFAULT_KEY_PREFIX.to_owned(),
            ttl: Self::DEFAULT_TTL,
            strategy: RedisStrategy::default(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Sets the request timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the key prefix.
    #[must_use]
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets the lease.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the waiting strategy.
    #[must_use]
    pub fn with_strategy(mut self, strategy: RedisStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Parses a `redis://` or `rediss://` (TLS) connection URL and
    /// [validates](Self::validate) the result.
    ///
    /// ```text
    /// redis://[user[:password]@]host[:port][/db]?prefix=lock&ttl=30s&strategy=queue
    /// ```
    ///
    /// | part | meaning | default |
    /// |---|---|---|
    /// | `rediss://` | connect with TLS | plain TCP |
    /// | `user:password@` | ACL user and password; `:password@` alone for the `default` user | none |
    /// | host, port | exactly one server | port 6379 |
    /// | `/db` | logical database, a non-negative integer | 0 |
    /// | `prefix` | key prefix: non-empty, ≤ 128 bytes, no `{`, `}` or control characters | `lock` |
    /// | `ttl` | lease, from 100ms to 1 day | `30s` |
    /// | `strategy` | `polling`, `pubsub` or `queue` ([`RedisStrategy`]) | `queue` |
    /// | `timeout` | connecting, or one request, from 10ms to 10 minutes | `5s` |
    /// | `tls_ca` | with `rediss://`, a PEM file of the authorities to trust | the system's |
    ///
    /// User, password and parameter values are percent-decoded.
    ///
    /// ```
    /// use lock_redis::RedisConfig;
    /// let config = RedisConfig::from_url("redis://locker:s3cret@localhost:6380/1?prefix=jobs")?;
    /// assert_eq!(config.server.address(), "localhost:6380");
    /// assert_eq!(config.server.username.as_deref(), Some("locker"));
    /// assert_eq!(config.server.db, 1);
    /// assert_eq!(config.key_prefix, "jobs");
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
        let tls = match url.scheme.as_str() {
            "redis" => false,
            "rediss" => true,
            other => {
                return Err(config_error(
                    "redis",
                    format!(
                        "the URL scheme is {other:?}; expected redis:// or rediss:// \
                         (redlock:// URLs are parsed by RedlockConfig)"
                    ),
                ));
            }
        };
        url.check_params(REDIS_PARAMS)?;
        let host = match url.hosts.as_slice() {
            [host] => host,
            [] => {
                return Err(config_error(
                    "redis",
                    "the URL names no host; expected redis://host[:port]",
                ));
            }
            hosts => {
                return Err(config_error(
                    "redis",
                    format!(
                        "the URL names {} hosts; redis:// takes exactly one \
                         (use redlock:// for several independent servers)",
                        hosts.len()
                    ),
                ));
            }
        };
        let server = server_from_url(&url, host, tls, "redis")?;
        let mut config = RedisConfig::new(server);
        if let Some(prefix) = url.param("prefix") {
            config.key_prefix = prefix.to_owned();
        }
        if let Some(ttl) = url.duration_param("ttl")? {
            config.ttl = ttl;
        }
        if let Some(strategy) = url.param("strategy") {
            config.strategy = strategy.parse()?;
        }
        if let Some(timeout) = url.duration_param("timeout")? {
            config.timeout = timeout;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the bad setting: see [`RedisServer::validate`], and a
    /// key prefix or ttl out of bounds.
    pub fn validate(&self) -> Result<(), LockError> {
        self.server.validate()?;
        check_prefix("redis", &self.key_prefix)?;
        check_ttl("redis", self.ttl)?;
        check_timeout("redis", self.timeout)
    }
}

/// How to lock with Redlock over several independent Redis servers.
///
/// A lock is held when a majority ([`quorum`](RedlockConfig::quorum)) of the servers
/// granted it within its validity, `ttl − elapsed − clock_drift_factor × ttl`. Fencing
/// tokens are not monotonic under Redlock. Use an odd number of servers, at least three:
/// with fewer, or an even number, a failed server costs more than it should (the URL
/// parser warns).
///
/// ```
/// use lock_redis::{RedisServer, RedlockConfig};
/// let config = RedlockConfig::new(["r1", "r2", "r3", "r4", "r5"].map(RedisServer::new));
/// assert_eq!(config.quorum(), 3);
/// config.validate()?;
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// The servers; at least one.
    pub servers: Vec<RedisServer>,
    /// The key prefix, as for [`RedisConfig::key_prefix`]. Default `lock`.
    pub key_prefix: String,
    /// The lease, as for [`RedisConfig::ttl`]. Default 30 s.
    pub ttl: Duration,
    /// The share of the ttl subtracted from a grant's validity for clock drift between the
    /// servers; from 0 to 0.5. Default 0.01.
    pub clock_drift_factor: f64,
    /// How many more rounds to try when a round reaches no quorum (contenders split the
    /// votes) before the lock counts as busy. Default 3.
    pub retry_count: u32,
    /// The delay before such a retry (randomised by the provider); more than 0 and at most
    /// 1 minute. Default 200 ms.
    pub retry_delay: Duration,
    /// The request timeout, as for [`RedisConfig::timeout`]. Default 5 s.
    pub timeout: Duration,
}

impl RedlockConfig {
    /// The default clock drift factor, 0.01.
    pub const DEFAULT_CLOCK_DRIFT_FACTOR: f64 = 0.01;
    /// The default retry count, 3.
    pub const DEFAULT_RETRY_COUNT: u32 = 3;
    /// The default retry delay, 200 ms.
    pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(200);

    /// A configuration for `servers` with every other setting at its default.
    pub fn new(servers: impl IntoIterator<Item = RedisServer>) -> Self {
        RedlockConfig {
            servers: servers.into_iter().collect(),
            key_prefix: RedisConfig::DEFAULT_KEY_PREFIX.to_owned(),
            ttl: RedisConfig::DEFAULT_TTL,
            clock_drift_factor: Self::DEFAULT_CLOCK_DRIFT_FACTOR,
            retry_count: Self::DEFAULT_RETRY_COUNT,
            retry_delay: Self::DEFAULT_RETRY_DELAY,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Sets the request timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the key prefix.
    #[must_use]
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets the lease.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the clock drift factor.
    #[must_use]
    pub fn with_clock_drift_factor(mut self, factor: f64) -> Self {
        self.clock_drift_factor = factor;
        self
    }

    /// Sets the retry count.
    #[must_use]
    pub fn with_retry_count(mut self, count: u32) -> Self {
        self.retry_count = count;
        self
    }

    /// Sets the retry delay.
    #[must_use]
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// The number of servers that must grant a lock: N/2 + 1 for N servers.
    pub fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// Parses a `redlock://` connection URL and [validates](Self::validate) the result.
    ///
    /// ```text
    /// redlock://[user[:password]@]host1[:port],host2[:port],host3[:port][/db]?prefix=lock&ttl=30s
    ///     &retry_count=3&retry_delay=200ms&drift_factor=0.01&tls=false
    /// ```
    ///
    /// | part | meaning | default |
    /// |---|---|---|
    /// | `user:password@` | credentials, the same for every server | none |
    /// | hosts | the independent servers, comma-separated, IPv6 in brackets | port 6379 |
    /// | `/db` | logical database on every server | 0 |
    /// | `prefix` | key prefix, as for `redis://` | `lock` |
    /// | `ttl` | lease, from 100ms to 1 day | `30s` |
    /// | `retry_count` | retries of a round without quorum | `3` |
    /// | `retry_delay` | delay before such a retry, more than 0 and at most 1m | `200ms` |
    /// | `drift_factor` | clock drift share of the ttl, from 0 to 0.5 | `0.01` |
    /// | `tls` | `true` to connect to every server with TLS | `false` |
    /// | `tls_ca` | with `tls=true`, a PEM file of the authorities to trust | the system's |
    /// | `timeout` | connecting, or one request to one server, from 10ms to 10 minutes | `5s` |
    ///
    /// Fewer than three servers, or an even number, is accepted with a `tracing` warning.
    ///
    /// ```
    /// use lock_redis::RedlockConfig;
    /// let config = RedlockConfig::from_url("redlock://:s3cret@r1,r2:6380,r3/4?tls=true&retry_count=5")?;
    /// assert_eq!(config.servers.len(), 3);
    /// assert!(config.servers.iter().all(|s| s.tls && s.db == 4));
    /// assert_eq!(config.servers[1].address(), "r2:6380");
    /// assert_eq!(config.retry_count, 5);
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the bad part (never repeating the password): another
    /// scheme, a malformed URL, no host, a bad database, a user name without a password,
    /// an unknown parameter or value, a setting out of bounds.
    pub fn from_url(url: &str) -> Result<RedlockConfig, LockError> {
        let url = LockUrl::parse(url)?;
        if url.scheme != "redlock" {
            return Err(config_error(
                "redlock",
                format!("the URL scheme is {:?}; expected redlock://", url.scheme),
            ));
        }
        url.check_params(REDLOCK_PARAMS)?;
        if url.hosts.is_empty() {
            return Err(config_error(
                "redlock",
                "the URL names no host; expected redlock://host1[:port],host2[:port],host3[:port]",
            ));
        }
        let tls = url
            .parsed_param::<bool>("tls", "true or false")?
            .unwrap_or(false);
        let servers = url
            .hosts
            .iter()
            .map(|host| server_from_url(&url, host, tls, "redlock"))
            .collect::<Result<Vec<_>, _>>()?;
        let mut config = RedlockConfig::new(servers);
        if let Some(prefix) = url.param("prefix") {
            config.key_prefix = prefix.to_owned();
        }
        if let Some(ttl) = url.duration_param("ttl")? {
            config.ttl = ttl;
        }
        if let Some(count) = url.parsed_param("retry_count", "a whole number from 0")? {
            config.retry_count = count;
        }
        if let Some(delay) = url.duration_param("retry_delay")? {
            config.retry_delay = delay;
        }
        if let Some(factor) = url.parsed_param("drift_factor", "a number from 0 to 0.5")? {
            config.clock_drift_factor = factor;
        }
        if let Some(timeout) = url.duration_param("timeout")? {
            config.timeout = timeout;
        }
        config.validate()?;
        if let Some(warning) = config.quorum_warning() {
            tracing::warn!(servers = config.servers.len(), "redlock: {warning}");
        }
        Ok(config)
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the bad setting: no server, a bad server (see
    /// [`RedisServer::validate`]), a key prefix, ttl, drift factor or retry delay out of
    /// bounds.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.servers.is_empty() {
            return Err(config_error("redlock", "at least one server is required"));
        }
        for server in &self.servers {
            server.validate_for("redlock")?;
        }
        check_prefix("redlock", &self.key_prefix)?;
        check_ttl("redlock", self.ttl)?;
        if !(0.0..=MAX_DRIFT_FACTOR).contains(&self.clock_drift_factor) {
            return Err(config_error(
                "redlock",
                format!(
                    "drift_factor is {}; it must be from 0 to {MAX_DRIFT_FACTOR}",
                    self.clock_drift_factor
                ),
            ));
        }
        if self.retry_delay.is_zero() || self.retry_delay > MAX_RETRY_DELAY {
            return Err(config_error(
                "redlock",
                format!(
                    "retry_delay is {:?}; it must be more than 0 and at most 1m",
                    self.retry_delay
                ),
            ));
        }
        check_timeout("redlock", self.timeout)
    }

    /// Why the number of servers is a poor choice, if it is.
    fn quorum_warning(&self) -> Option<String> {
        let n = self.servers.len();
        if n < 3 {
            Some(format!(
                "{n} server(s): Redlock tolerates no server failure with fewer than 3; use 3 or 5"
            ))
        } else if n.is_multiple_of(2) {
            Some(format!(
                "{n} servers (an even number): the quorum is {}, so it tolerates no more \
                 failures than {} servers would",
                self.quorum(),
                n - 1
            ))
        } else {
            None
        }
    }
}

/// The server at `host` with the URL's credentials and database.
fn server_from_url(
    url: &LockUrl,
    host: &lock_core::url::HostPort,
    tls: bool,
    backend: &str,
) -> Result<RedisServer, LockError> {
    if url.username.is_some() && url.password.is_none() {
        return Err(user_without_password(backend));
    }
    Ok(RedisServer {
        host: host.host.clone(),
        port: host.port.unwrap_or(RedisServer::DEFAULT_PORT),
        tls,
        tls_ca: url.param("tls_ca").map(std::path::PathBuf::from),
        username: url.username.clone(),
        password: url.password.clone(),
        db: parse_db(&url.path, backend)?,
    })
}

/// The database in a URL path: empty or `/` for 0, `/N` for N.
fn parse_db(path: &str, backend: &str) -> Result<i64, LockError> {
    let digits = path.strip_prefix('/').unwrap_or(path);
    if digits.is_empty() {
        return Ok(0);
    }
    let invalid = || {
        config_error(
            backend,
            format!("the URL path {path:?} is not a database number (expected /0, /1, ...)"),
        )
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    digits.parse().map_err(|_| invalid())
}

fn user_without_password(backend: &str) -> LockError {
    // The "user name" may be a password written without its leading ':', so never show it.
    config_error(
        backend,
        "a user name is given without a password; write user:password@, \
         or :password@ for the default user",
    )
}

fn check_prefix(backend: &str, prefix: &str) -> Result<(), LockError> {
    let problem = if prefix.is_empty() {
        "must not be empty"
    } else if prefix.len() > MAX_PREFIX_LEN {
        "is longer than 128 bytes"
    } else if prefix.contains(['{', '}']) {
        "must not contain '{' or '}' (they would break the key's hash tag)"
    } else if prefix.chars().any(char::is_control) {
        "must not contain control characters"
    } else {
        return Ok(());
    };
    let shown: String = prefix.chars().take(40).collect();
    Err(config_error(backend, format!("prefix {shown:?} {problem}")))
}

fn check_timeout(backend: &str, timeout: Duration) -> Result<(), LockError> {
    if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&timeout) {
        return Err(config_error(
            backend,
            format!("timeout is {timeout:?}; it must be from 10ms to 10 minutes"),
        ));
    }
    Ok(())
}

fn check_ttl(backend: &str, ttl: Duration) -> Result<(), LockError> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(config_error(
            backend,
            format!(
                "ttl is {ttl:?}; it must be at least 100ms (the watchdog renews at ttl/3) \
                 and at most 1 day"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis_err(url: &str) -> String {
        match RedisConfig::from_url(url) {
            Err(LockError::Config { message }) => message,
            other => panic!("expected a Config error for {url}, got {other:?}"),
        }
    }

    fn redlock_err(url: &str) -> String {
        match RedlockConfig::from_url(url) {
            Err(LockError::Config { message }) => message,
            other => panic!("expected a Config error for {url}, got {other:?}"),
        }
    }

    #[test]
    fn minimal_redis_url_takes_every_default() {
        let config = RedisConfig::from_url("redis://localhost").unwrap();
        assert_eq!(config, RedisConfig::new(RedisServer::new("localhost")));
        assert_eq!(config.server.port, 6379);
        assert!(!config.server.tls);
        assert_eq!(config.server.username, None);
        assert_eq!(config.server.password, None);
        assert_eq!(config.server.db, 0);
        assert_eq!(config.key_prefix, "lock");
        assert_eq!(config.ttl, Duration::from_secs(30));
        assert_eq!(config.strategy, RedisStrategy::Queue);
        assert_eq!(RedisConfig::from_url("redis://localhost/").unwrap(), config);
    }

    #[test]
    fn full_redis_url() {
        let config = RedisConfig::from_url(
            "rediss://locker:p%40ss@[::1]:6380/7?prefix=billing%3Alocks&ttl=5s&strategy=polling",
        )
        .unwrap();
        let server = &config.server;
        assert_eq!(server.host, "::1");
        assert_eq!(server.port, 6380);
        assert_eq!(server.address(), "[::1]:6380");
        assert!(server.tls);
        assert_eq!(server.username.as_deref(), Some("locker"));
        assert_eq!(server.password.as_deref(), Some("p@ss"));
        assert_eq!(server.db, 7);
        assert_eq!(config.key_prefix, "billing:locks");
        assert_eq!(config.ttl, Duration::from_secs(5));
        assert_eq!(config.strategy, RedisStrategy::Polling);
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("p@ss") && debug.contains("<redacted>"),
            "{debug}"
        );
    }

    #[test]
    fn password_only() {
        let config = RedisConfig::from_url("redis://:s3cret@h").unwrap();
        assert_eq!(config.server.username, None);
        assert_eq!(config.server.password.as_deref(), Some("s3cret"));
    }

    #[test]
    fn each_strategy() {
        for (value, strategy) in [
            ("polling", RedisStrategy::Polling),
            ("pubsub", RedisStrategy::PubSub),
            ("queue", RedisStrategy::Queue),
            ("PubSub", RedisStrategy::PubSub),
        ] {
            let config = RedisConfig::from_url(&format!("redis://h?strategy={value}")).unwrap();
            assert_eq!(config.strategy, strategy);
            assert_eq!(strategy.to_string(), value.to_ascii_lowercase());
            assert_eq!(
                strategy.as_str().parse::<RedisStrategy>().unwrap(),
                strategy
            );
        }
    }

    #[test]
    fn ttl_bounds() {
        assert_eq!(
            RedisConfig::from_url("redis://h?ttl=100ms").unwrap().ttl,
            Duration::from_millis(100)
        );
        assert_eq!(
            RedisConfig::from_url("redis://h?ttl=1day").unwrap().ttl,
            Duration::from_secs(86_400)
        );
        for ttl in ["0s", "99ms", "1day 1s", "2days"] {
            let e = redis_err(&format!("redis://h?ttl={ttl}"));
            assert!(
                e.contains("ttl") && e.contains("at least 100ms"),
                "{ttl}: {e}"
            );
        }
        let e = redis_err("redis://h?ttl=forever");
        assert!(e.contains("ttl") && e.contains("not a duration"), "{e}");
    }

    #[test]
    fn prefix_rules() {
        assert_eq!(
            RedisConfig::from_url(&format!("redis://h?prefix={}", "p".repeat(128)))
                .unwrap()
                .key_prefix
                .len(),
            128
        );
        for (prefix, why) in [
            ("", "must not be empty"),
            (&"p".repeat(129), "longer than 128 bytes"),
            ("a%7Bb", "'{' or '}'"),
            ("a}", "'{' or '}'"),
            ("a%0Ab", "control"),
        ] {
            let e = redis_err(&format!("redis://h?prefix={prefix}"));
            assert!(e.contains("prefix") && e.contains(why), "{prefix}: {e}");
        }
    }

    #[test]
    fn database_forms() {
        assert_eq!(RedisConfig::from_url("redis://h/0").unwrap().server.db, 0);
        assert_eq!(RedisConfig::from_url("redis://h/15").unwrap().server.db, 15);
        for path in [
            "/-1",
            "/+1",
            "/x",
            "/1/2",
            "/1.5",
            "/99999999999999999999",
            "/%201",
        ] {
            let e = redis_err(&format!("redis://h{path}"));
            assert!(e.contains("database number"), "{path}: {e}");
        }
    }

    #[test]
    fn redis_wrong_scheme() {
        let e = redis_err("redlock://h");
        assert!(e.contains("\"redlock\"") && e.contains("redis://"), "{e}");
        assert!(redis_err("zk://h").contains("\"zk\""));
    }

    #[test]
    fn redis_host_count() {
        assert!(redis_err("redis://").contains("no host"));
        assert!(redis_err("redis:///1").contains("no host"));
        let e = redis_err("redis://a,b");
        assert!(e.contains("2 hosts") && e.contains("redlock://"), "{e}");
    }

    #[test]
    fn redis_malformed_url() {
        assert!(redis_err("localhost:6379").contains("no scheme"));
        assert!(redis_err("redis://h:0").contains("1 to 65535"));
        assert!(redis_err("redis://h?ttl").contains("no value"));
    }

    #[test]
    fn redis_user_without_password() {
        let e = redis_err("redis://mysecret@h");
        assert!(
            e.contains("without a password") && !e.contains("mysecret"),
            "{e}"
        );
    }

    #[test]
    fn redis_unknown_parameter_and_value() {
        let e = redis_err("redis://h?retry_count=3");
        assert!(e.contains("unknown parameter \"retry_count\""), "{e}");
        let e = redis_err("redis://h?strategy=herd");
        assert!(e.contains("strategy") && e.contains("\"herd\""), "{e}");
    }

    #[test]
    fn no_redis_error_repeats_the_password() {
        for url in [
            "redis://u:topsecret@h?ttl=0s",
            "redis://u:topsecret@h/x",
            "redis://u:topsecret@a,b",
            "redis://u:topsecret@h?nope=1",
            "redis://u:topsecret@h?prefix=%7B",
            "redis://u:topsecret@h:99999",
            "zk://u:topsecret@h",
        ] {
            assert!(!redis_err(url).contains("topsecret"), "{url}");
        }
    }

    #[test]
    fn redis_validate_checks_hand_built_configs() {
        assert!(RedisConfig::new(RedisServer::new("h")).validate().is_ok());
        for server in [
            RedisServer::new(""),
            RedisServer::new("a b"),
            RedisServer::new("h").with_port(0),
            RedisServer::new("h").with_db(-1),
            RedisServer::new("h").with_username("u"),
        ] {
            let e = RedisConfig::new(server.clone()).validate();
            assert!(matches!(e, Err(LockError::Config { .. })), "{server:?}");
        }
        assert!(
            RedisConfig::new(RedisServer::new("h"))
                .with_key_prefix("")
                .validate()
                .is_err()
        );
        assert!(
            RedisConfig::new(RedisServer::new("h"))
                .with_ttl(Duration::from_millis(10))
                .validate()
                .is_err()
        );
    }

    #[test]
    fn minimal_redlock_url_takes_every_default() {
        let config = RedlockConfig::from_url("redlock://r1,r2:6380,r3").unwrap();
        assert_eq!(
            config.servers,
            vec![
                RedisServer::new("r1"),
                RedisServer::new("r2").with_port(6380),
                RedisServer::new("r3"),
            ]
        );
        assert_eq!(config.key_prefix, "lock");
        assert_eq!(config.ttl, Duration::from_secs(30));
        assert_eq!(config.clock_drift_factor, 0.01);
        assert_eq!(config.retry_count, 3);
        assert_eq!(config.retry_delay, Duration::from_millis(200));
        assert_eq!(config.quorum(), 2);
        assert_eq!(config.quorum_warning(), None);
    }

    #[test]
    fn full_redlock_url() {
        let config = RedlockConfig::from_url(
            "redlock://locker:p%40ss@r1,r2,r3,r4,r5/3?prefix=jobs&ttl=10s&retry_count=0\
             &retry_delay=50ms&drift_factor=0.05&tls=true",
        )
        .unwrap();
        assert_eq!(config.servers.len(), 5);
        for server in &config.servers {
            assert!(server.tls);
            assert_eq!(server.db, 3);
            assert_eq!(server.username.as_deref(), Some("locker"));
            assert_eq!(server.password.as_deref(), Some("p@ss"));
        }
        assert_eq!(config.key_prefix, "jobs");
        assert_eq!(config.ttl, Duration::from_secs(10));
        assert_eq!(config.retry_count, 0);
        assert_eq!(config.retry_delay, Duration::from_millis(50));
        assert_eq!(config.clock_drift_factor, 0.05);
        assert_eq!(config.quorum(), 3);
        assert!(!format!("{config:?}").contains("p@ss"));
        let plain = RedlockConfig::from_url("redlock://r1,r2,r3?tls=false").unwrap();
        assert!(plain.servers.iter().all(|s| !s.tls));
    }

    #[test]
    fn quorum_is_a_majority() {
        for (n, quorum) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)] {
            let config = RedlockConfig::new((0..n).map(|i| RedisServer::new(format!("r{i}"))));
            assert_eq!(config.quorum(), quorum, "{n} servers");
        }
    }

    #[test]
    fn weak_server_counts_are_accepted_with_a_warning() {
        for (url, warns) in [
            ("redlock://r1", true),
            ("redlock://r1,r2", true),
            ("redlock://r1,r2,r3", false),
            ("redlock://r1,r2,r3,r4", true),
            ("redlock://r1,r2,r3,r4,r5", false),
        ] {
            let config = RedlockConfig::from_url(url).unwrap();
            assert_eq!(config.quorum_warning().is_some(), warns, "{url}");
        }
    }

    #[test]
    fn redlock_errors() {
        for (url, expected) in [
            ("redis://r1,r2,r3", "expected redlock://"),
            ("redlock://", "no host"),
            ("redlock://r1,,r3", "empty host"),
            ("redlock://r1,r2,r3/x", "database number"),
            ("redlock://secret@r1,r2,r3", "without a password"),
            (
                "redlock://r1?strategy=queue",
                "unknown parameter \"strategy\"",
            ),
            ("redlock://r1?tls=yes", "true or false"),
            ("redlock://r1?retry_count=-1", "retry_count"),
            ("redlock://r1?retry_delay=0s", "retry_delay"),
            ("redlock://r1?retry_delay=2m", "at most 1m"),
            ("redlock://r1?drift_factor=0.6", "drift_factor"),
            ("redlock://r1?drift_factor=-0.1", "drift_factor"),
            ("redlock://r1?drift_factor=NaN", "drift_factor"),
            ("redlock://r1?drift_factor=lots", "drift_factor"),
            ("redlock://r1?ttl=50ms", "at least 100ms"),
            ("redlock://r1?prefix=", "must not be empty"),
        ] {
            let e = redlock_err(url);
            assert!(e.contains(expected), "{url}: {e}");
            assert!(!e.contains("secret"), "{url}: {e}");
        }
    }

    #[test]
    fn redlock_validate_checks_hand_built_configs() {
        let ok = RedlockConfig::new([RedisServer::new("r1")]);
        assert!(ok.validate().is_ok());
        assert!(RedlockConfig::new([]).validate().is_err());
        let e = RedlockConfig::new([RedisServer::new("r1").with_port(0)])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("redlock: port 0"), "{e}");
        assert!(
            ok.clone()
                .with_clock_drift_factor(f64::INFINITY)
                .validate()
                .is_err()
        );
        assert!(
            ok.clone()
                .with_retry_delay(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(ok.clone().with_ttl(Duration::ZERO).validate().is_err());
        assert!(ok.clone().with_key_prefix("{x}").validate().is_err());
        assert!(ok.with_retry_count(10).validate().is_ok());
    }
}
