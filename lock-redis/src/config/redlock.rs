//! [`RedlockConfig`]: Redlock over several independent servers, and its URL.

use std::time::Duration;

use lock_core::LockError;
use lock_core::url::{LockUrl, duration};
use serde::Deserialize;

use super::{LeaseOptions, RedisServer, config_error, servers};

/// Longest accepted retry delay.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);
/// Largest accepted clock drift factor.
const MAX_DRIFT_FACTOR: f64 = 0.5;

/// How to lock with Redlock over several independent Redis servers.
///
/// A lock is held when a majority ([`quorum`](RedlockConfig::quorum)) of the servers
/// granted it within its validity, `ttl − elapsed − clock_drift_factor × ttl`, and those
/// servers then raised their fencing counters to the grant's token, so that tokens increase
/// from grant to grant while the servers keep their data. Use an odd number of servers, at
/// least three: with fewer, or an even number, a failed server costs more than it should
/// (the URL parser warns). `Deserialize` reads the URL parameters that are its own fields
/// (`drift_factor`, `retry_count`, `retry_delay`).
///
/// ```
/// use lock_redis::{RedisServer, RedlockConfig};
/// let config = RedlockConfig::new(["r1", "r2", "r3", "r4", "r5"].map(RedisServer::new));
/// assert_eq!(config.quorum(), 3);
/// config.validate()?;
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default = "RedlockConfig::url_defaults", deny_unknown_fields)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// The servers; at least one. In a URL, its hosts, each with the URL's credentials,
    /// database, `tls` and `tls_ca`.
    #[serde(skip)]
    pub servers: Vec<RedisServer>,
    /// The key prefix, the lease and the request timeout, as for
    /// [`RedisConfig`](super::RedisConfig).
    #[serde(skip)]
    pub lease: LeaseOptions,
    /// The share of the ttl subtracted from a grant's validity for clock drift between the
    /// servers; from 0 to 0.5. Default 0.01. URL: `drift_factor`.
    #[serde(rename = "drift_factor")]
    pub clock_drift_factor: f64,
    /// How many more rounds to try when a round reaches no quorum (contenders split the
    /// votes) before the lock counts as busy. Default 3. The contender the split is
    /// settled for (the smallest owner id among the votes) keeps trying while its votes
    /// are valid.
    pub retry_count: u32,
    /// The delay before such a retry (randomised by the provider); more than 0 and at most
    /// 1 minute. Default 200 ms.
    #[serde(with = "duration")]
    pub retry_delay: Duration,
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
            lease: LeaseOptions::default(),
            clock_drift_factor: Self::DEFAULT_CLOCK_DRIFT_FACTOR,
            retry_count: Self::DEFAULT_RETRY_COUNT,
            retry_delay: Self::DEFAULT_RETRY_DELAY,
        }
    }

    /// The settings a URL's parameters start from: [`new`](Self::new)'s, with no server.
    fn url_defaults() -> Self {
        Self::new([])
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
    /// The credentials are the same for every server; the hosts are the independent
    /// servers (port 6379, IPv6 in brackets); the path is the logical database on every
    /// server (0 by default). Each parameter sets the field of its name, of this struct, of
    /// its [`LeaseOptions`] or (`tls_ca`) of every [`RedisServer`], with the default and
    /// bounds that field's docs give; `tls=true` connects to every server with TLS (default
    /// `false`).
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
            let message = format!("the URL scheme is {:?}; expected redlock://", url.scheme);
            return Err(config_error("redlock", message));
        }
        let (lease, server, Tls { tls }, mut config): (_, RedisServer, _, RedlockConfig) =
            url.query_parts()?;
        config.lease = lease;
        config.servers = servers(&url, tls, server.tls_ca, "redlock")?;
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
    /// [`RedisServer::validate`]), a key prefix, ttl, timeout, drift factor or retry delay
    /// out of bounds.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.servers.is_empty() {
            return Err(config_error("redlock", "at least one server is required"));
        }
        for server in &self.servers {
            server.validate_for("redlock")?;
        }
        self.lease.validate_for("redlock")?;
        let factor = self.clock_drift_factor;
        if !(0.0..=MAX_DRIFT_FACTOR).contains(&factor) {
            let message =
                format!("drift_factor is {factor}; it must be from 0 to {MAX_DRIFT_FACTOR}");
            return Err(config_error("redlock", message));
        }
        let delay = self.retry_delay;
        if delay.is_zero() || delay > MAX_RETRY_DELAY {
            let message =
                format!("retry_delay is {delay:?}; it must be more than 0 and at most 1m");
            return Err(config_error("redlock", message));
        }
        Ok(())
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

lock_core::setters! { RedlockConfig {
    /// Sets the clock drift factor.
    with_clock_drift_factor(factor: f64) => clock_drift_factor = factor;
    /// Sets the retry count.
    with_retry_count(count: u32) => retry_count = count;
    /// Sets the retry delay.
    with_retry_delay(delay: Duration) => retry_delay = delay;
    /// Sets the lease settings: key prefix, lease and request timeout.
    with_lease(lease: LeaseOptions) => lease = lease;
}}

/// The `tls` parameter of a `redlock://` URL: every server's [`RedisServer::tls`].
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Tls {
    tls: bool,
}

#[cfg(test)]
mod tests {
    use super::super::tests::rejects;
    use super::*;

    fn redlock(url: &str) -> RedlockConfig {
        RedlockConfig::from_url(url).unwrap()
    }

    #[test]
    fn minimal_redlock_url_takes_every_default() {
        let config = redlock("redlock://r1,r2:6380,r3");
        let r2 = RedisServer::new("r2").with_port(6380);
        let expected = RedlockConfig::new([RedisServer::new("r1"), r2, RedisServer::new("r3")]);
        assert_eq!(config, expected);
        assert_eq!(
            (config.lease.key_prefix.as_str(), config.lease.ttl),
            ("lock", Duration::from_secs(30))
        );
        assert_eq!(config.clock_drift_factor, 0.01);
        assert_eq!(config.retry_count, 3);
        assert_eq!(config.retry_delay, Duration::from_millis(200));
        assert_eq!(config.lease.timeout, Duration::from_secs(5));
        assert_eq!((config.quorum(), config.quorum_warning()), (2, None));
    }

    #[test]
    fn full_redlock_url() {
        let config = redlock(
            "redlock://locker:p%40ss@r1,r2,r3,r4,r5/3?prefix=jobs&ttl=10s&retry_count=0\
             &retry_delay=50ms&drift_factor=0.05&tls=true&tls_ca=/ca.pem&timeout=1s",
        );
        let server = |host| {
            RedisServer::new(host)
                .with_tls(true)
                .with_tls_ca("/ca.pem")
                .with_db(3)
                .with_username("locker")
                .with_password("p@ss")
        };
        let expected = RedlockConfig::new(["r1", "r2", "r3", "r4", "r5"].map(server))
            .with_key_prefix("jobs")
            .with_ttl(Duration::from_secs(10))
            .with_retry_count(0)
            .with_retry_delay(Duration::from_millis(50))
            .with_clock_drift_factor(0.05)
            .with_timeout(Duration::from_secs(1));
        assert_eq!(config, expected);
        assert_eq!(config.quorum(), 3);
        assert!(!format!("{config:?}").contains("p@ss"));
        let plain = redlock("redlock://r1,r2,r3?tls=false");
        assert!(plain.servers.iter().all(|s| !s.tls));
    }

    #[test]
    fn quorum_is_a_majority_and_weak_counts_warn() {
        for (n, quorum) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)] {
            let config = RedlockConfig::new((0..n).map(|i| RedisServer::new(format!("r{i}"))));
            assert_eq!(config.quorum(), quorum, "{n} servers");
        }
        for (url, warns) in [
            ("redlock://r1", true),
            ("redlock://r1,r2", true),
            ("redlock://r1,r2,r3", false),
            ("redlock://r1,r2,r3,r4", true),
            ("redlock://r1,r2,r3,r4,r5", false),
        ] {
            assert_eq!(redlock(url).quorum_warning().is_some(), warns, "{url}");
        }
    }

    #[test]
    fn rejected_redlock_urls() {
        for case in [
            "redis://r1,r2,r3|expected redlock://",
            "redlock://|no host",
            "redlock://r1,,r3|empty host",
            "redlock://u:topsecret@r1?strategy=queue|unknown parameter \"strategy\" for redlock://\
             |known: prefix, ttl, timeout, tls_ca, tls, drift_factor, retry_count, retry_delay",
            "redlock://r1?tls=yes|tls|true or false",
            "redlock://r1?retry_count=-1|retry_count|whole number",
            "redlock://r1?retry_delay=0s|retry_delay",
            "redlock://r1?retry_delay=2m|at most 1m",
            "redlock://r1?drift_factor=0.6|drift_factor|from 0 to 0.5",
            "redlock://r1?drift_factor=-0.1|drift_factor",
            "redlock://r1?drift_factor=NaN|drift_factor",
            "redlock://r1?drift_factor=lots|drift_factor|a number",
            "redlock://r1?ttl=50ms|at least 100ms",
            "redlock://r1?timeout=1h|timeout",
            "redlock://r1?prefix=|must not be empty",
        ] {
            rejects(RedlockConfig::from_url, case);
        }
    }

    #[test]
    fn redlock_validate_checks_hand_built_configs() {
        let ok = RedlockConfig::new([RedisServer::new("r1")]);
        assert!(ok.validate().is_ok());
        assert!(RedlockConfig::new([]).validate().is_err());
        let e = RedlockConfig::new([RedisServer::new("r1").with_port(0)]).validate();
        assert!(e.unwrap_err().to_string().contains("redlock: port 0"));
        for config in [
            ok.clone().with_clock_drift_factor(f64::INFINITY),
            ok.clone().with_retry_delay(Duration::ZERO),
            ok.clone().with_ttl(Duration::ZERO),
            ok.clone().with_timeout(Duration::ZERO),
            ok.clone().with_key_prefix("{x}"),
        ] {
            assert!(config.validate().is_err(), "{config:?}");
        }
        assert!(ok.with_retry_count(10).validate().is_ok());
    }
}
