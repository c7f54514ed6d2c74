//! [`RedisCluster`]: the nodes of a Redis Cluster, and `redis+cluster://` URLs.

use lock_core::LockError;
use lock_core::url::LockUrl;

use super::server::servers;
use super::{RedisConfig, RedisServer, UrlParts, config_error};

/// Where a Redis Cluster is: some of its nodes (the others are found from them).
///
/// With it, a [`RedisConfig`]'s `server` gives only the login: each request goes to the
/// primary that serves its lock's slot (every key of a lock shares one hash tag, so one
/// slot), following `MOVED` and `ASK` redirections as slots move and primaries fail over.
/// Every strategy: [`PubSub`](crate::RedisStrategy::PubSub) waits on sharded pub/sub
/// (`SSUBSCRIBE` and `SPUBLISH` on the primary serving the lock's slot), which needs
/// Redis 7: an older cluster answers the waiters' `SSUBSCRIBE` with an error, and their
/// `acquire` returns it. Not yet with TLS or `wait_replicas`; only database 0. While a lock's
/// slot migrates, its scripts are answered `TRYAGAIN` once some of its keys have moved:
/// the lock's requests are retried until the move ends, and a holder whose lease runs out
/// meanwhile loses its lock. A node without a port is reached on 6379.
///
/// ```
/// use lock_redis::{RedisCluster, RedisConfig, RedisServer};
///
/// let config = RedisConfig::new(RedisServer::new("unused").with_password("s3cret"))
///     .with_cluster(RedisCluster::new(["10.0.0.1:7000", "10.0.0.2:7001"]));
/// config.validate()?;
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisCluster {
    /// Nodes to learn the cluster from, `host:port` (an IPv6 host in brackets).
    pub nodes: Vec<String>,
}

impl RedisCluster {
    /// The cluster that `nodes` (`host:port` each) belong to.
    pub fn new(nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        RedisCluster {
            nodes: nodes.into_iter().map(Into::into).collect(),
        }
    }

    /// A `redis://host:port` URL per node (without the login).
    ///
    /// ```
    /// use lock_redis::RedisCluster;
    ///
    /// let cluster = RedisCluster::new(["10.0.0.1:7000", "[::1]:7001"]);
    /// assert_eq!(cluster.urls(), ["redis://10.0.0.1:7000", "redis://[::1]:7001"]);
    /// ```
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| format!("redis://{node}"))
            .collect()
    }

    pub(super) fn validate(&self, config: &RedisConfig) -> Result<(), LockError> {
        let server = &config.server;
        let problem = if server.tls || server.tls_ca.is_some() {
            "TLS is not supported with Redis Cluster yet".to_owned()
        } else if server.db != 0 {
            format!(
                "database {} is not 0: a cluster has only database 0",
                server.db
            )
        } else if config.wait_replicas > 0 {
            // WAIT must follow the write on the same connection to the same primary, which a
            // redirection between the two would break.
            "wait_replicas is not supported with Redis Cluster yet".to_owned()
        } else if self.nodes.is_empty() {
            "no cluster node is given".to_owned()
        } else if let Some(bad) = self.nodes.iter().find(|node| {
            node.is_empty() || node.contains(|c: char| c.is_whitespace() || c == ',' || c == '/')
        }) {
            format!("cluster node {bad:?} is not host:port")
        } else {
            return Ok(());
        };
        Err(config_error("redis", problem))
    }
}

/// A `redis+cluster://[user:password@]n1[:port],n2[:port][/]?…` URL: the lease
/// parameters of `redis://`, but not `tls_ca`.
pub(super) fn from_url(url: &LockUrl, parts: UrlParts) -> Result<RedisConfig, LockError> {
    let (mut config, tls_ca) = parts;
    if url.hosts.is_empty() {
        let form = "redis+cluster://[user:password@]node1:6379,node2:6379";
        let message = format!("the URL names no node; expected {form}");
        return Err(config_error("redis", message));
    }
    if !matches!(url.path.as_str(), "" | "/") {
        let message = "a redis+cluster:// URL takes no path: a cluster has only database 0";
        return Err(config_error("redis", message));
    }
    if tls_ca.is_some() {
        let message = "tls_ca is not supported with redis+cluster:// (no TLS to a cluster yet)";
        return Err(config_error("redis", message));
    }
    // The login, as `redis://` reads it; the host is the first node's.
    let server: RedisServer = servers(url, false, None, "redis")?.remove(0);
    let nodes = url.hosts.iter();
    let cluster = RedisCluster::new(nodes.map(|host| host.to_address(RedisServer::DEFAULT_PORT)));
    config.server = server;
    config.cluster = Some(cluster);
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
    fn cluster_urls() {
        let config =
            RedisConfig::from_url("redis+cluster://locker:p%40ss@n1:7000,[::1]:7001,n3?ttl=5s")
                .unwrap();
        let cluster = config.cluster.clone().unwrap();
        assert_eq!(cluster.nodes, ["n1:7000", "[::1]:7001", "n3:6379"]);
        assert_eq!(config.server.username.as_deref(), Some("locker"));
        assert_eq!(config.server.password.as_deref(), Some("p@ss"));
        assert_eq!(config.lease.ttl, Duration::from_secs(5));
        assert_eq!(config.strategy, RedisStrategy::Queue);
        let polling = RedisConfig::from_url("redis+cluster://n1/?strategy=polling").unwrap();
        assert_eq!(polling.strategy, RedisStrategy::Polling);
        let pubsub = RedisConfig::from_url("redis+cluster://n1?strategy=pubsub").unwrap();
        assert_eq!(pubsub.strategy, RedisStrategy::PubSub);
        for case in [
            "redis+cluster://|names no node",
            "redis+cluster://n1/2|takes no path",
            "redis+cluster://n1?tls_ca=/ca.pem|tls_ca is not supported",
            "redis+cluster://n1?wait_replicas=1|wait_replicas is not supported",
            "redis+cluster://topsecret@n1|without a password",
        ] {
            rejects(RedisConfig::from_url, case);
        }
        let hand_built = |cluster: RedisCluster| {
            RedisConfig::new(RedisServer::new("h"))
                .with_cluster(cluster)
                .validate()
        };
        assert!(hand_built(RedisCluster::new(["n:1"])).is_ok());
        assert!(hand_built(RedisCluster::new(Vec::<String>::new())).is_err());
        assert!(hand_built(RedisCluster::new(["a b"])).is_err());
        let both = RedisConfig::new(RedisServer::new("h"))
            .with_cluster(RedisCluster::new(["n:1"]))
            .with_sentinel(crate::RedisSentinel::new("jobs", ["s:1"]));
        let refused = both.validate().unwrap_err().to_string();
        assert!(refused.contains("not both"), "{refused}");
    }
}
