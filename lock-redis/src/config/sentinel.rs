//! [`RedisSentinel`]: the primary found through Redis Sentinel, and `redis+sentinel://` URLs.

use lock_core::LockError;
use lock_core::url::LockUrl;

use super::server::servers;
use super::{RedisConfig, RedisServer, UrlParts, config_error};

/// Where to ask which server is the primary: Redis Sentinel.
///
/// With it, a [`RedisConfig`]'s `server` gives only the login and the database: the
/// primary's address is what the sentinels name (`SENTINEL MASTERS`, the first answer in
/// the order the sentinels are listed, confirmed by the primary's `ROLE`; an ACL user needs
/// `+role`). The provider moves to the primary a sentinel announces (`+switch-master`), and
/// asks again after a connection error or a refusal by a replica (`READONLY`,
/// `UNBLOCKED`), so that it follows a failover. Neither the sentinels nor the data servers
/// are reached with TLS yet, and the sentinels without credentials. A sentinel without a
/// port is reached on 26379.
///
/// ```
/// use lock_redis::{RedisConfig, RedisSentinel, RedisServer};
///
/// let config = RedisConfig::new(RedisServer::new("unused").with_password("s3cret"))
///     .with_sentinel(RedisSentinel::new("jobs", ["10.0.0.1:26379", "10.0.0.2:26379"]));
/// config.validate()?;
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisSentinel {
    /// The name the sentinels monitor the primary under.
    pub service: String,
    /// The sentinels, `host:port` (an IPv6 host in brackets).
    pub sentinels: Vec<String>,
}

impl RedisSentinel {
    /// Sentinel's default port, 26379.
    pub const DEFAULT_PORT: u16 = 26379;

    /// The primary monitored as `service` by `sentinels` (`host:port` each).
    pub fn new(
        service: impl Into<String>,
        sentinels: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        RedisSentinel {
            service: service.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
        }
    }

    /// A `redis://host:port` URL per sentinel, port 26379 where none is given.
    pub(crate) fn urls(&self) -> Vec<String> {
        let with_port = |address: &str| match address.rsplit_once(':') {
            // A port after the host (an IPv6 host is in brackets).
            Some((_, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                address.to_owned()
            }
            _ => format!("{address}:{}", Self::DEFAULT_PORT),
        };
        let urls = self.sentinels.iter().map(|address| with_port(address));
        urls.map(|address| format!("redis://{address}")).collect()
    }

    pub(super) fn validate(&self, server: &RedisServer) -> Result<(), LockError> {
        let service = &self.service;
        let problem = if server.tls || server.tls_ca.is_some() {
            "TLS is not supported with Redis Sentinel yet".to_owned()
        } else if self.sentinels.is_empty() {
            "no sentinel is given".to_owned()
        } else if service.is_empty()
            || service.contains(|c: char| c.is_whitespace() || c.is_control())
        {
            format!("the service name {service:?} is empty or has white space")
        } else if let Some(bad) = self.sentinels.iter().find(|sentinel| {
            sentinel.is_empty() || sentinel.contains(|c: char| c.is_whitespace() || c == ',')
        }) {
            format!("sentinel {bad:?} is not host:port")
        } else {
            return Ok(());
        };
        Err(config_error("redis", problem))
    }
}

/// A `redis+sentinel://[user:password@]s1[:port],s2[:port]/SERVICE[/db]?…` URL: the lease
/// parameters of `redis://`, but not `tls_ca`.
pub(super) fn from_url(url: &LockUrl, parts: UrlParts) -> Result<RedisConfig, LockError> {
    let (mut config, tls_ca) = parts;
    let form = "redis+sentinel://[user:password@]sentinel1:26379,sentinel2:26379/SERVICE[/db]";
    let path = url.path.strip_prefix('/').unwrap_or(&url.path);
    let (service, db) = path.split_once('/').unwrap_or((path, ""));
    if url.hosts.is_empty() || service.is_empty() {
        let message = format!("the URL names no sentinel or no service; expected {form}");
        return Err(config_error("redis", message));
    }
    if tls_ca.is_some() {
        let message = "tls_ca is not supported with redis+sentinel:// (no TLS to Sentinel yet)";
        return Err(config_error("redis", message));
    }
    // The login and database, as `redis://` reads them; the host is the first sentinel's
    // (it only names the configuration: the sentinels name the primary).
    let mut at_db = url.clone();
    at_db.path = format!("/{db}");
    let server: RedisServer = servers(&at_db, false, None, "redis")?.remove(0);
    let sentinels = url.hosts.iter();
    let sentinels = sentinels.map(|host| host.to_address(RedisSentinel::DEFAULT_PORT));
    config.server = server;
    config.sentinel = Some(RedisSentinel::new(service, sentinels));
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::rejects;
    use super::*;
    use crate::RedisStrategy;

    #[test]
    fn sentinel_urls() {
        let config = RedisConfig::from_url(
            "redis+sentinel://locker:p%40ss@s1,[::1]:26380/jobs/2?ttl=5s&strategy=pubsub",
        )
        .unwrap();
        let sentinel = config.sentinel.clone().unwrap();
        assert_eq!(sentinel.service, "jobs");
        assert_eq!(sentinel.sentinels, ["s1:26379", "[::1]:26380"]);
        assert_eq!(config.server.username.as_deref(), Some("locker"));
        assert_eq!(config.server.password.as_deref(), Some("p@ss"));
        assert_eq!(config.server.db, 2);
        assert_eq!(config.lease.ttl, Duration::from_secs(5));
        assert_eq!(config.strategy, RedisStrategy::PubSub);
        let plain = RedisConfig::from_url("redis+sentinel://s1/jobs").unwrap();
        assert_eq!(plain.server.db, 0);
        assert_eq!(plain.sentinel.unwrap().sentinels, ["s1:26379"]);
        for case in [
            "redis+sentinel://s1|no sentinel or no service",
            "redis+sentinel://s1/|no sentinel or no service",
            "redis+sentinel:///jobs|no sentinel or no service",
            "redis+sentinel://u:topsecret@s1/jobs/x|database",
            "redis+sentinel://topsecret@s1/jobs|without a password",
            "redis+sentinel://s1/jobs?tls_ca=/ca.pem|tls_ca is not supported",
            "redis+sentinel://s1/jobs?db=1|unknown parameter \"db\"",
        ] {
            rejects(RedisConfig::from_url, case);
        }
        let hand_built = |sentinel: RedisSentinel| {
            RedisConfig::new(RedisServer::new("h"))
                .with_sentinel(sentinel)
                .validate()
        };
        assert!(hand_built(RedisSentinel::new("jobs", ["s:1"])).is_ok());
        let hand_ports = RedisSentinel::new("jobs", ["s", "s:1", "[::1]", "[::1]:2"]).urls();
        assert_eq!(
            hand_ports,
            [
                "redis://s:26379",
                "redis://s:1",
                "redis://[::1]:26379",
                "redis://[::1]:2"
            ]
        );
        assert!(hand_built(RedisSentinel::new("jobs", Vec::<String>::new())).is_err());
        assert!(hand_built(RedisSentinel::new("", ["s:1"])).is_err());
        assert!(hand_built(RedisSentinel::new("jobs", ["a b"])).is_err());
        let with_tls = RedisConfig::new(RedisServer::new("h").with_tls(true))
            .with_sentinel(RedisSentinel::new("jobs", ["s:1"]));
        let refused = with_tls.validate().unwrap_err().to_string();
        assert!(refused.contains("TLS is not supported"), "{refused}");
    }
}
