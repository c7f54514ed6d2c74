//! The peers the herd scenario measures ours against, behind the distlock contract so that
//! the scenario drives them exactly as it drives ours: zookeeper-client's lock recipe, and
//! etcd's own lock service. Neither keeps wake-up counts.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::LockOptions as EtcdLockOptions;
use lock_core::kit::MutexAttempt;
use lock_core::{
    Capabilities, Deadline, DistributedLock, FencingToken, Guard, GuardBackend, LockError,
    LockName, LockProvider, Metrics, MetricsSnapshot, WaitKind, lost_signal,
};
use zookeeper_client::{Acls, CreateMode, LockOptions, LockPrefix};

/// The peer: zookeeper-client's lock recipe behind the distlock contract, so that the
/// scenario drives it exactly as it drives ours. It keeps no wake-up counts.
#[derive(Debug)]
pub(crate) struct RecipeProvider {
    client: zookeeper_client::Client,
    metrics: Metrics,
}

impl RecipeProvider {
    pub(crate) async fn connect(connect_string: &str) -> Result<Self, LockError> {
        let client = zookeeper_client::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(connect_string)
            .await
            .map_err(|error| LockError::Connection {
                backend: "zk-recipe",
                name: None,
                message: error.to_string(),
                source: Some(Box::new(error)),
            })?;
        Ok(RecipeProvider {
            client,
            metrics: Metrics::new(),
        })
    }
}

impl LockProvider for RecipeProvider {
    fn backend(&self) -> &'static str {
        "zk-recipe"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(WaitKind::NotifyOne)
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let name = LockName::new(name)?;
        Ok(Arc::new(RecipeLock {
            client: self.client.clone(),
            dir: format!("/distlock-recipe/{}", name.escaped()),
            name,
        }))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }
}

#[derive(Debug)]
struct RecipeLock {
    client: zookeeper_client::Client,
    name: LockName,
    dir: String,
}

fn recipe_error(error: zookeeper_client::Error) -> LockError {
    LockError::other("zk-recipe", error.to_string())
        .retryable(true)
        .with_source(error)
}

#[async_trait]
impl MutexAttempt for RecipeLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "zk-recipe"
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let options = LockOptions::new(Acls::anyone_all())
            .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
            .map_err(recipe_error)?;
        let prefix = LockPrefix::new_curator(&self.dir, "lock-").map_err(recipe_error)?;
        let locking = self.client.lock(prefix, b"", options);
        let Some(held) = until(&deadline, locking).await else {
            return Ok(None);
        };
        let held = held.map_err(recipe_error)?.into_owned();
        let token = held
            .lock_path()
            .rsplit('-')
            .next()
            .and_then(|digits| digits.parse().ok())
            .unwrap_or_default();
        let (_notifier, lost) = lost_signal();
        Ok(Some(Guard::new(
            self.name.clone(),
            FencingToken(token),
            lost,
            Box::new(RecipeGuard(Some(held))),
        )))
    }
}

/// `locking`'s outcome, or `None` at `deadline`. A try gets a millisecond: the peers'
/// locks have no try of their own.
async fn until<T>(deadline: &Deadline, locking: impl Future<Output = T>) -> Option<T> {
    if deadline.is_immediate() {
        return tokio::time::timeout(Duration::from_millis(1), locking)
            .await
            .ok();
    }
    tokio::select! {
        held = locking => Some(held),
        () = deadline.sleep() => None,
    }
}

/// A held recipe lock: dropping it deletes the node in the background, as the recipe does.
#[derive(Debug)]
struct RecipeGuard(Option<zookeeper_client::OwnedLockClient>);

#[async_trait]
impl GuardBackend for RecipeGuard {
    fn backend(&self) -> &'static str {
        "zk-recipe"
    }

    async fn release(&mut self) -> Result<(), LockError> {
        drop(self.0.take());
        Ok(())
    }

    fn release_on_drop(self: Box<Self>) {}
}

/// The etcd peer: the server's lock service (`v3lock`: the server runs etcd's
/// `concurrency.Mutex` for the client, a key per contender under the lock's name, each
/// waiter watching its predecessor). One lease per provider, kept alive at a third of its
/// ttl, as `etcdctl lock` does.
#[derive(Debug)]
pub(crate) struct V3LockProvider {
    client: EtcdHandle,
    lease: i64,
    keep_alive: tokio::task::JoinHandle<()>,
    metrics: Metrics,
}

/// An etcd client, shown in debug output by its kind only (the client has no `Debug`).
#[derive(Clone)]
struct EtcdHandle(etcd_client::Client);

impl std::fmt::Debug for EtcdHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("etcd_client::Client")
    }
}

fn v3lock_error(error: etcd_client::Error) -> LockError {
    LockError::other("etcd-v3lock", error.to_string())
        .retryable(true)
        .with_source(error)
}

impl V3LockProvider {
    /// Connects to `endpoint`, with a lease of `ttl` kept alive at a third of it.
    pub(crate) async fn connect(endpoint: &str, ttl: Duration) -> Result<Self, LockError> {
        let client = etcd_client::Client::connect([endpoint], None)
            .await
            .map_err(v3lock_error)?;
        let seconds = i64::try_from(ttl.as_secs()).unwrap_or(30);
        let lease = client
            .lease_client()
            .grant(seconds, None)
            .await
            .map_err(v3lock_error)?
            .id();
        let mut leases = client.lease_client();
        let keep_alive = tokio::spawn(async move {
            let Ok((mut keeper, mut answers)) = leases.keep_alive(lease).await else {
                return;
            };
            loop {
                tokio::time::sleep(ttl / 3).await;
                if keeper.keep_alive().await.is_err() || answers.message().await.is_err() {
                    return;
                }
            }
        });
        Ok(V3LockProvider {
            client: EtcdHandle(client),
            lease,
            keep_alive,
            metrics: Metrics::new(),
        })
    }
}

impl Drop for V3LockProvider {
    fn drop(&mut self) {
        self.keep_alive.abort();
        let (mut leases, lease) = (self.client.0.lease_client(), self.lease);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { leases.revoke(lease).await });
        }
    }
}

impl LockProvider for V3LockProvider {
    fn backend(&self) -> &'static str {
        "etcd-v3lock"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(WaitKind::NotifyOne)
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let name = LockName::new(name)?;
        Ok(Arc::new(V3Lock {
            client: self.client.clone(),
            lease: self.lease,
            key: format!("/distlock-v3lock/{}", name.escaped()),
            name,
        }))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }
}

#[derive(Debug)]
struct V3Lock {
    client: EtcdHandle,
    lease: i64,
    name: LockName,
    key: String,
}

#[async_trait]
impl MutexAttempt for V3Lock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn backend(&self) -> &'static str {
        "etcd-v3lock"
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let mut locks = self.client.0.lock_client();
        let options = EtcdLockOptions::new().with_lease(self.lease);
        let locking = locks.lock(self.key.as_str(), Some(options));
        let Some(held) = until(&deadline, locking).await else {
            return Ok(None);
        };
        let held = held.map_err(v3lock_error)?;
        let revision = held.header().map_or(0, |header| header.revision());
        let (_notifier, lost) = lost_signal();
        Ok(Some(Guard::new(
            self.name.clone(),
            FencingToken(u64::try_from(revision).unwrap_or_default()),
            lost,
            Box::new(V3LockGuard {
                client: self.client.clone(),
                key: Some(held.key().to_vec()),
            }),
        )))
    }
}

/// A held v3lock: its key, deleted on release (on drop, in the background).
#[derive(Debug)]
struct V3LockGuard {
    client: EtcdHandle,
    key: Option<Vec<u8>>,
}

#[async_trait]
impl GuardBackend for V3LockGuard {
    fn backend(&self) -> &'static str {
        "etcd-v3lock"
    }

    async fn release(&mut self) -> Result<(), LockError> {
        if let Some(key) = self.key.take() {
            self.client
                .0
                .lock_client()
                .unlock(key)
                .await
                .map_err(v3lock_error)?;
        }
        Ok(())
    }

    fn release_on_drop(mut self: Box<Self>) {
        if let (Some(key), Ok(runtime)) = (self.key.take(), tokio::runtime::Handle::try_current()) {
            let mut locks = self.client.0.lock_client();
            runtime.spawn(async move { locks.unlock(key).await });
        }
    }
}
