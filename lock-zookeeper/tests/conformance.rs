//! The conformance suite against a real ZooKeeper server, for every strategy.
#![allow(clippy::expect_used, reason = "test fixture set-up")]

use std::sync::Arc;
use std::time::Duration;

use lock_conformance::proxy::{FaultProxy, ReplyKind};
use lock_conformance::servers::{free_port, shared_zk};
use lock_conformance::{
    Client, ClientFaults, Entries, FaultError, FaultResult, Faults, Harness, Inspector, Timing,
    async_trait,
};
use lock_core::{LockError, LockName};
use lock_zookeeper::{AclPolicy, DigestAuth, ZkConfig, ZkLockProvider, ZkStrategy};
use zookeeper_client::Client as ZkClient;

/// Short sessions so that crash and expiry cases finish quickly (the shared server's
/// tickTime is 500 ms, so 1 s is the shortest session it grants).
const SESSION_TIMEOUT: Duration = Duration::from_secs(2);

struct ZkHarness {
    strategy: ZkStrategy,
    connect_string: String,
    admin: ZkClient,
}

impl ZkHarness {
    async fn new(strategy: ZkStrategy) -> Self {
        let server = shared_zk().expect("a ZooKeeper server for the tests");
        let connect_string = server.connect_string();
        let admin = ZkClient::connect(&connect_string)
            .await
            .expect("admin client");
        ZkHarness {
            strategy,
            connect_string,
            admin,
        }
    }

    fn config(&self, root: &str) -> ZkConfig {
        ZkConfig::new(self.connect_string.split(','))
            .with_strategy(self.strategy)
            .with_session_timeout(SESSION_TIMEOUT)
            .with_root(root)
    }

    /// A client that reaches the server through its own fault proxy.
    async fn client_with(&self, config: ZkConfig) -> Result<Client, LockError> {
        let upstream = self
            .connect_string
            .parse()
            .expect("the shared server's address");
        let proxy = FaultProxy::start(upstream).expect("a fault proxy");
        let mut config = config;
        config.hosts = vec![proxy.address().to_string()];
        let provider = ZkLockProvider::connect(config).await?;
        let faults = Arc::new(ConnectionFaults { proxy });
        Ok(Client::new(Arc::new(provider)).with_faults(faults))
    }

    /// The contenders of `name`'s directory, in queue order.
    async fn contenders(&self, name: &str) -> Result<Vec<String>, LockError> {
        let dir = format!(
            "{}/{}",
            ZkConfig::DEFAULT_ROOT,
            LockName::new(name)?.escaped()
        );
        let children = match self.admin.list_children(&dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(error) => {
                return Err(LockError::Backend {
                    backend: "test",
                    name: Some(name.into()),
                    message: error.to_string(),
                    retryable: false,
                    source: None,
                });
            }
        };
        let mut queue: Vec<(i64, String)> = children
            .into_iter()
            .filter_map(|child| {
                let head = child.trim_end_matches(|c: char| c.is_ascii_digit());
                let digits = &child[head.len()..];
                (digits.len() >= 10).then(|| {
                    digits
                        .parse()
                        .ok()
                        .map(|seq| (seq, format!("{dir}/{child}")))
                })?
            })
            .collect();
        queue.sort();
        let single = format!("{dir}/lock");
        if matches!(self.admin.check_stat(&single).await, Ok(Some(_))) {
            queue.insert(0, (i64::MIN, single));
        }
        Ok(queue.into_iter().map(|(_, path)| path).collect())
    }
}

/// Faults on one client's connection, through its proxy.
struct ConnectionFaults {
    proxy: FaultProxy,
}

#[async_trait]
impl ClientFaults for ConnectionFaults {
    /// A partition longer than the session: the server expires the session, and the client
    /// learns it when it reconnects.
    async fn expire_session(&self) -> FaultResult {
        self.proxy.cut();
        // The server expires sessions on tick boundaries (tickTime 500 ms).
        tokio::time::sleep(SESSION_TIMEOUT + Duration::from_millis(1500)).await;
        self.proxy.pass();
        Ok(())
    }

    async fn cut_connection(&self) -> FaultResult {
        self.proxy.cut();
        Ok(())
    }

    async fn restore(&self) -> FaultResult {
        self.proxy.pass();
        Ok(())
    }

    async fn delay_connection(&self, latency: Duration) -> FaultResult {
        self.proxy.delay(latency);
        Ok(())
    }

    async fn lose_next_create_reply(&self) -> FaultResult {
        let _armed = self.proxy.swallow_next_reply(ReplyKind::ZkCreate);
        Ok(())
    }
}

#[async_trait]
impl Harness for ZkHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_with(self.config(ZkConfig::DEFAULT_ROOT)).await
    }

    fn timing(&self) -> Timing {
        Timing::default()
            .with_operation_slack(Duration::from_secs(1))
            .with_handoff_bound(Duration::from_secs(2))
            .with_loss_bound(SESSION_TIMEOUT * 4)
            .with_crash_release_bound(SESSION_TIMEOUT * 2)
            .with_short_timeout(Duration::from_millis(300))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspector> {
        Some(self)
    }

    async fn client_in_other_namespace(&self) -> Option<Result<Client, LockError>> {
        Some(self.client_with(self.config("/distlock-other")).await)
    }
}

#[async_trait]
impl Faults for ZkHarness {
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        let queue = self
            .contenders(name)
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        let Some(holder) = queue.first() else {
            return Ok(false);
        };
        self.admin
            .delete(holder, None)
            .await
            .map_err(|e| FaultError::Failed(format!("deleting {holder}: {e}")))?;
        Ok(true)
    }

    async fn delete_first_waiter(&self, name: &str) -> FaultResult {
        let queue = self
            .contenders(name)
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        let Some(waiter) = queue.get(1) else {
            return Err(FaultError::Unsupported);
        };
        self.admin
            .delete(waiter, None)
            .await
            .map_err(|e| FaultError::Failed(format!("deleting {waiter}: {e}")))
    }

    async fn unreachable_client(&self) -> FaultResult<Result<Client, LockError>> {
        let port = free_port().map_err(|e| FaultError::Failed(e.to_string()))?;
        let config = ZkConfig::new([format!("127.0.0.1:{port}")])
            .with_strategy(self.strategy)
            .with_connect_timeout(Duration::from_secs(2));
        // Directly: a proxy would make it reachable.
        Ok(ZkLockProvider::connect(config)
            .await
            .map(|provider| Client::new(Arc::new(provider))))
    }

    async fn wrong_credentials_client(&self) -> FaultResult<Result<Client, LockError>> {
        // The root is created by the rightful user with a creator-only ACL.
        let root = "/distlock-secure";
        let rightful = self
            .config(root)
            .with_auth(DigestAuth::new("locker", "right"))
            .with_acl(AclPolicy::CreatorAll);
        let owner = ZkLockProvider::connect(rightful)
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        let probe = lock_core::LockProvider::lock(&owner, "h2-probe")
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        let mut guard = probe
            .acquire(None)
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        guard
            .release()
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        // The root stays (persistent parent of the container directories).
        let wrong = self
            .config(root)
            .with_auth(DigestAuth::new("locker", "wrong"))
            .with_acl(AclPolicy::CreatorAll);
        Ok(self.client_with(wrong).await)
    }
}

#[async_trait]
impl Inspector for ZkHarness {
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        let queue = self.contenders(name).await?;
        Ok(Entries::new(
            queue.len().min(1),
            queue.len().saturating_sub(1),
        ))
    }

    fn records_waiters(&self) -> bool {
        // The single-node lock's waiters only watch the lock node.
        self.strategy != ZkStrategy::SingleNode
    }
}

mod single_node {
    use super::*;
    lock_conformance::conformance_tests!(ZkHarness::new(ZkStrategy::SingleNode).await);
}

mod sequential_children {
    use super::*;
    lock_conformance::conformance_tests!(ZkHarness::new(ZkStrategy::SequentialChildren).await);
}

mod sequential_predecessor {
    use super::*;
    lock_conformance::conformance_tests!(ZkHarness::new(ZkStrategy::SequentialPredecessor).await);
}
