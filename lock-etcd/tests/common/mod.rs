//! What the etcd test binaries share: one etcd server per binary, a raw client for looking
//! at and acting on the keys, and the conformance harness.
#![allow(dead_code, reason = "each test binary uses a part of this module")]
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    reason = "test fixtures: a failed set-up must fail the test"
)]

use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client as EtcdClient, GetOptions, SortOrder, SortTarget};
use lock_conformance::{
    Client, Entries, FaultError, FaultResult, Faults, Harness, Inspector, LockKind, SessionExpiry,
    Timing, async_trait,
};
use lock_core::{LockError, LockName, LockProvider};
use lock_etcd::{EtcdConfig, EtcdLockProvider, EtcdStrategy};
use lock_testbed::servers::{free_port, shared_etcd};

/// Short leases so that crash and expiry cases finish quickly (etcd's leases are whole
/// seconds; its minimum is a few election timeouts, well under this).
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(2);

/// A raw client of `endpoint`.
pub(crate) async fn admin_client(endpoint: &str) -> EtcdClient {
    EtcdClient::connect([endpoint], None)
        .await
        .expect("an admin client")
}

/// The keys of the lock `name` under `prefix`, in create-revision order.
pub(crate) async fn contenders(admin: &EtcdClient, prefix: &str, name: &str) -> Vec<String> {
    keys(admin, &dir_of(prefix, name, "")).await
}

/// The directory of `name`'s lock of the kind whose directory ends in `suffix`.
fn dir_of(prefix: &str, name: &str, suffix: &str) -> String {
    let escaped = LockName::new(name).expect("a valid name").escaped();
    format!("{prefix}/{escaped}{suffix}/")
}

/// The keys under `dir`, in create-revision order.
pub(crate) async fn keys(admin: &EtcdClient, dir: &str) -> Vec<String> {
    let options = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let found = admin
        .kv_client()
        .get(dir, Some(options))
        .await
        .expect("a listing");
    found
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// The holders and waiters of a read-write lock's queue: the first writer holds alone;
/// otherwise the readers before the first writer hold.
fn rw_entries(queue: &[String]) -> Entries {
    let reader = |key: &String| key.contains("/read/");
    let holders = match queue.first() {
        None => 0,
        Some(first) if !reader(first) => 1,
        Some(_) => queue.iter().take_while(|key| reader(key)).count(),
    };
    Entries::new(holders, queue.len() - holders)
}

/// The holders and waiters of a semaphore: every lease is held but the one of the
/// contender holding the mutex (same last segment), which waits; every mutex contender
/// waits.
fn semaphore_entries(leases: &[String], locks: &[String]) -> Entries {
    let id = |key: &str| key.rsplit('/').next().unwrap_or_default().to_owned();
    let waiting: Vec<String> = locks.iter().map(|key| id(key)).collect();
    let holders = leases
        .iter()
        .filter(|lease| !waiting.contains(&id(lease)))
        .count();
    Entries::new(holders, locks.len())
}

/// The conformance harness over the shared server, for one strategy.
pub(crate) struct EtcdHarness {
    strategy: EtcdStrategy,
    endpoint: String,
    admin: EtcdClient,
}

impl EtcdHarness {
    pub(crate) async fn new(strategy: EtcdStrategy) -> Self {
        let endpoint = shared_etcd()
            .expect("etcd starts (Debian's etcd-server package, or a container)")
            .client_address();
        let admin = admin_client(&endpoint).await;
        EtcdHarness {
            strategy,
            endpoint,
            admin,
        }
    }

    /// The server's endpoint.
    pub(crate) fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// A raw client of the server.
    pub(crate) fn admin(&self) -> &EtcdClient {
        &self.admin
    }

    pub(crate) fn config(&self, prefix: &str) -> EtcdConfig {
        EtcdConfig::new([self.endpoint.clone()])
            .with_prefix(prefix)
            .with_strategy(self.strategy)
            .with_lease_ttl(LEASE_TTL)
            .with_timeout(Duration::from_secs(2))
    }

    async fn client_with(&self, config: EtcdConfig) -> Result<Client, LockError> {
        let provider = Arc::new(EtcdLockProvider::connect(config).await?);
        let session = Arc::new(LeaseRevoke {
            provider: Arc::downgrade(&provider),
            admin: self.admin.clone(),
        });
        Ok(Client::new(provider, session))
    }
}

/// Ends a client's session as the server would when its lease ends: the lease is revoked
/// behind the provider's back, and the provider finds out from its keep-alive.
struct LeaseRevoke {
    provider: Weak<EtcdLockProvider>,
    admin: EtcdClient,
}

#[async_trait]
impl SessionExpiry for LeaseRevoke {
    async fn expire_session(&self) -> FaultResult {
        let lease = self
            .provider
            .upgrade()
            .and_then(|provider| provider.lease_id())
            .ok_or_else(|| FaultError::Failed("the client has no session".into()))?;
        self.admin
            .lease_client()
            .revoke(lease)
            .await
            .map(drop)
            .map_err(|e| FaultError::Failed(format!("revoking lease {lease:x}: {e}")))
    }
}

#[async_trait]
impl Harness for EtcdHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_with(self.config(EtcdConfig::DEFAULT_PREFIX))
            .await
    }

    fn timing(&self) -> Timing {
        Timing::default()
            .with_operation_slack(Duration::from_secs(1))
            .with_handoff_bound(Duration::from_secs(2))
            .with_loss_bound(LEASE_TTL * 3)
            .with_crash_release_bound(LEASE_TTL * 3)
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
impl Faults for EtcdHarness {
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        let keys = contenders(&self.admin, EtcdConfig::DEFAULT_PREFIX, name).await;
        let Some(holder) = keys.first() else {
            return Ok(false);
        };
        self.admin
            .kv_client()
            .delete(holder.as_str(), None)
            .await
            .map_err(|e| FaultError::Failed(format!("deleting {holder}: {e}")))?;
        Ok(true)
    }

    async fn delete_first_waiter(&self, name: &str) -> FaultResult {
        if self.strategy == EtcdStrategy::Single {
            return Err(FaultError::Unsupported);
        }
        let keys = contenders(&self.admin, EtcdConfig::DEFAULT_PREFIX, name).await;
        let Some(waiter) = keys.get(1) else {
            return Err(FaultError::Failed(format!("no waiter in {keys:?}")));
        };
        self.admin
            .kv_client()
            .delete(waiter.as_str(), None)
            .await
            .map(drop)
            .map_err(|e| FaultError::Failed(format!("deleting {waiter}: {e}")))
    }

    async fn unreachable_provider(&self) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let port = free_port().map_err(|e| FaultError::Failed(e.to_string()))?;
        let config =
            EtcdConfig::new([format!("127.0.0.1:{port}")]).with_timeout(Duration::from_millis(500));
        Ok(EtcdLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }
}

#[async_trait]
impl Inspector for EtcdHarness {
    /// The entries of the mutex, the read-write lock and the semaphore called `name`
    /// together: a case uses one kind per name.
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        let prefix = EtcdConfig::DEFAULT_PREFIX;
        let mutex = contenders(&self.admin, prefix, name).await;
        let rw = rw_entries(&keys(&self.admin, &dir_of(prefix, name, ".rwlock")).await);
        let semaphore = dir_of(prefix, name, ".semaphore");
        let semaphore = semaphore_entries(
            &keys(&self.admin, &format!("{semaphore}leases/")).await,
            &keys(&self.admin, &format!("{semaphore}locks/")).await,
        );
        Ok(Entries::new(
            mutex.len().min(1) + rw.holders + semaphore.holders,
            mutex.len().saturating_sub(1) + rw.waiters + semaphore.waiters,
        ))
    }

    /// The single-key mutex's waiters write nothing; read-write locks and semaphores
    /// always queue.
    fn records_waiters(&self, kind: LockKind) -> bool {
        kind != LockKind::Mutex || self.strategy != EtcdStrategy::Single
    }
}
