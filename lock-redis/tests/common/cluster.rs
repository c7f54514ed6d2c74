//! The conformance harness on Redis Cluster: three primaries with a replica each, of the
//! case's own; every client reaches the cluster as an ACL user of its own, so that one
//! client can be cut off (its user disabled and its connections killed on every node)
//! while the others go on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_conformance::{
    Client, Entries, FaultError, FaultResult, Faults, Harness, Inspector, LockKind, Property,
    SessionExpiry, Timing, Unproven, async_trait,
};
use lock_core::{LockError, LockProvider};
use lock_redis::{RedisConfig, RedisLockProvider, RedisStrategy};
use lock_testbed::servers::{
    RedisClusterOptions, RedisClusterSet, RedisOptions, RedisServer, free_port,
};
use redis::AsyncCommands;

use super::{
    ADMIN_PASSWORD, AdminFor, CLIENT_PASSWORD, TIMEOUT, admin_of, entries_by, failed, on_each,
    replicated, session_cut, tag, timing, user_rules,
};

/// The lease of the clients: longer than a failover (a primary called failing after the
/// cluster's node timeout, 1 s, then its replica's election, which waits 0.5 to 1 s; all
/// slower on a loaded machine), so that a holder keeps its lock through one, as H5 asks.
pub(crate) const CLUSTER_TTL: Duration = Duration::from_secs(8);

/// Three primaries with a replica each, started for a test; the admin password only.
pub(crate) async fn start_cluster() -> RedisClusterSet {
    let server = RedisOptions::default().with_password(ADMIN_PASSWORD);
    RedisClusterSet::start(RedisClusterOptions::default().with_server(server))
        .await
        .unwrap_or_else(|error| panic!("a Redis Cluster: {error}"))
}

/// The addresses of the cluster's nodes that run.
pub(crate) fn running(set: &RedisClusterSet) -> Vec<std::net::SocketAddr> {
    let nodes = set.nodes().iter().filter(|node| node.pid().is_some());
    nodes.map(RedisServer::socket_addr).collect()
}

/// An admin connection to the primary serving `key`'s slot.
pub(crate) async fn admin_for_key(
    set: &RedisClusterSet,
    key: &str,
) -> Result<redis::aio::ConnectionManager, String> {
    let slot = set.slot_of(key).await.map_err(|error| error.to_string())?;
    let owner = set
        .owner_of(slot)
        .await
        .map_err(|error| error.to_string())?;
    Ok(admin_of(set.nodes()[owner].socket_addr()).await)
}

async fn set_user(set: &RedisClusterSet, user: &str, on: bool) -> FaultResult {
    let rules = user_rules(user, on);
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    on_each(running(set), &rules).await
}

/// The conformance harness on a Redis Cluster; see the module docs.
pub(crate) struct ClusterHarness {
    strategy: RedisStrategy,
    set: Arc<tokio::sync::Mutex<RedisClusterSet>>,
    url: String,
    clients: AtomicUsize,
}

impl ClusterHarness {
    pub(crate) async fn new(strategy: RedisStrategy) -> Self {
        let set = start_cluster().await;
        ClusterHarness {
            strategy,
            url: set.url(None),
            set: Arc::new(tokio::sync::Mutex::new(set)),
            clients: AtomicUsize::new(0),
        }
    }

    /// The cluster, to act on it.
    pub(crate) fn set(&self) -> Arc<tokio::sync::Mutex<RedisClusterSet>> {
        Arc::clone(&self.set)
    }

    /// The configuration of a client logging in as `user`.
    fn config(&self, user: &str, password: &str) -> RedisConfig {
        let login = self.url.replacen(
            "redis+cluster://",
            &format!("redis+cluster://{user}:{password}@"),
            1,
        );
        RedisConfig::from_url(&login)
            .unwrap()
            .with_ttl(CLUSTER_TTL)
            .with_strategy(self.strategy)
            .with_timeout(TIMEOUT)
    }

    async fn client_with(&self, prefix: &str) -> Result<Client, LockError> {
        let user = format!("client-{}", self.clients.fetch_add(1, Ordering::SeqCst));
        set_user(&*self.set.lock().await, &user, true)
            .await
            .unwrap_or_else(|error| panic!("the client's user: {error}"));
        let config = self.config(&user, CLIENT_PASSWORD).with_key_prefix(prefix);
        let provider = RedisLockProvider::connect(config).await?;
        let expiry = Arc::new(CutOff {
            set: Arc::clone(&self.set),
            user,
        });
        Ok(Client::new(Arc::new(provider), expiry))
    }
}

#[async_trait]
impl AdminFor for ClusterHarness {
    async fn admin_for(&self, tag: &str) -> Result<redis::aio::ConnectionManager, String> {
        admin_for_key(&*self.set.lock().await, tag).await
    }
}

/// One client's way to lose its session: its user disabled and its connections killed on
/// every node for longer than its lease and its waiters' places, as a partition would.
struct CutOff {
    set: Arc<tokio::sync::Mutex<RedisClusterSet>>,
    user: String,
}

#[async_trait]
impl SessionExpiry for CutOff {
    async fn expire_session(&self) -> FaultResult {
        {
            let set = self.set.lock().await;
            set_user(&set, &self.user, false).await?;
            on_each(running(&set), &["CLIENT", "KILL", "USER", &self.user]).await?;
        }
        tokio::time::sleep(session_cut(CLUSTER_TTL, TIMEOUT)).await;
        set_user(&*self.set.lock().await, &self.user, true).await
    }
}

#[async_trait]
impl Harness for ClusterHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_with("lock").await
    }

    fn timing(&self) -> Timing {
        // A failover: the node timeout, the replica's election, the clients' next try.
        let failover = Duration::from_secs(5);
        let timing = timing(CLUSTER_TTL);
        timing
            .with_loss_bound(timing.loss_bound + failover)
            .with_handoff_bound(timing.handoff_bound + failover)
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspector> {
        Some(self)
    }

    async fn client_in_other_namespace(&self) -> Option<Result<Client, LockError>> {
        Some(self.client_with("lock-other").await)
    }

    fn unproven(&self) -> Vec<Unproven> {
        vec![Unproven::new(
            Property::NoExpiredGrant,
            "the clients follow the cluster's own view of its nodes, which gives the \
             servers' own addresses, so no proxy stands between a client and its \
             server to delay; the standalone harness proves it on the same lease code",
        )]
    }
}

#[async_trait]
impl Faults for ClusterHarness {
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        let owner = format!("{}:owner", tag(name));
        let mut admin = self.admin_for(&owner).await.map_err(failed)?;
        let removed: u64 = admin.del(owner).await.map_err(failed)?;
        Ok(removed == 1)
    }

    async fn delete_first_waiter(&self, name: &str) -> FaultResult {
        if self.strategy != RedisStrategy::Queue {
            return Err(FaultError::Unsupported);
        }
        let queue = format!("{}:queue", tag(name));
        let mut admin = self.admin_for(&queue).await.map_err(failed)?;
        let waiter: Option<String> = admin.lpop(queue, None).await.map_err(failed)?;
        waiter.map(|_| ()).ok_or_else(|| failed("no waiter queued"))
    }

    /// Pauses every node: the cluster stops answering.
    async fn pause_server(&self, duration: Duration) -> FaultResult {
        let set = self.set.lock().await;
        let running = || set.nodes().iter().filter(|node| node.pid().is_some());
        for node in running() {
            node.pause().map_err(failed)?;
        }
        tokio::time::sleep(duration).await;
        for node in running() {
            node.resume().map_err(failed)?;
        }
        Ok(())
    }

    /// Kills each primary in turn, once its replica holds all it wrote, waiting after each
    /// until the replica serves its slots: which one serves the case's lock is not known
    /// here, so every one fails over.
    async fn kill_leader(&self) -> FaultResult {
        let mut set = self.set.lock().await;
        // The first slot of each primary's range as `redis-cli --cluster create` made them.
        for slot in [0, 5461, 10923] {
            let owner = set.owner_of(slot).await.map_err(failed)?;
            replicated(set.nodes()[owner].socket_addr(), 1).await?;
            set.kill_and_fail_over(owner).await.map_err(failed)?;
        }
        Ok(())
    }

    async fn unreachable_provider(&self) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let port = free_port().map_err(failed)?;
        let url = format!("redis+cluster://127.0.0.1:{port}");
        let config = RedisConfig::from_url(&url)
            .map_err(failed)?
            .with_timeout(Duration::from_secs(2));
        Ok(RedisLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }

    async fn wrong_credentials_provider(
        &self,
    ) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let config = self.config("client-0", "wrong");
        Ok(RedisLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }
}

#[async_trait]
impl Inspector for ClusterHarness {
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        entries_by(self, name).await
    }

    fn records_waiters(&self, kind: LockKind) -> bool {
        kind != LockKind::Mutex || self.strategy == RedisStrategy::Queue
    }
}
