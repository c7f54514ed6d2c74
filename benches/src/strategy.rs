//! The strategies the herd scenario compares, and the clients that run them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Capabilities, DistributedLock, FencingToken, Guard, GuardBackend, LockError, LockName,
    LockProvider, Metrics, MetricsSnapshot, WaitKind, lost_signal,
};
use lock_redis::{RedisConfig, RedisLockProvider, RedisStrategy};
use lock_zookeeper::{ZkConfig, ZkLockProvider, ZkStrategy};
use zookeeper_client::{Acls, CreateMode, LockOptions, LockPrefix};

/// One way of waiting for a lock, on one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// ZooKeeper, one ephemeral node, every waiter watches it (herd).
    ZkSingle,
    /// ZooKeeper sequential nodes, every waiter watches the directory (herd).
    ZkChildren,
    /// ZooKeeper sequential nodes, each waiter watches its predecessor (herd-free).
    ZkPredecessor,
    /// The peer: zookeeper-client's own lock recipe (Curator-compatible, predecessor watch).
    ZkRecipe,
    /// Redis, retry with jittered back-off.
    RedisPolling,
    /// Redis, a release broadcasts and every waiter retries (herd).
    RedisPubSub,
    /// Redis, a release hands the lock to the head of a queue (herd-free).
    RedisQueue,
}

impl Strategy {
    /// Every strategy, in the order reports list them.
    pub const ALL: [Strategy; 7] = [
        Strategy::ZkSingle,
        Strategy::ZkChildren,
        Strategy::ZkPredecessor,
        Strategy::ZkRecipe,
        Strategy::RedisPolling,
        Strategy::RedisPubSub,
        Strategy::RedisQueue,
    ];

    /// The name on the command line and in reports, e.g. `zk-predecessor`.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::ZkSingle => "zk-single",
            Strategy::ZkChildren => "zk-children",
            Strategy::ZkPredecessor => "zk-predecessor",
            Strategy::ZkRecipe => "zk-recipe",
            Strategy::RedisPolling => "redis-polling",
            Strategy::RedisPubSub => "redis-pubsub",
            Strategy::RedisQueue => "redis-queue",
        }
    }

    /// `zookeeper` or `redis`.
    pub fn backend(self) -> Backend {
        match self {
            Strategy::ZkSingle
            | Strategy::ZkChildren
            | Strategy::ZkPredecessor
            | Strategy::ZkRecipe => Backend::ZooKeeper,
            _ => Backend::Redis,
        }
    }

    /// Whether a release wakes only the next waiter (reports list these as herd-free).
    pub fn herd_free(self) -> bool {
        matches!(
            self,
            Strategy::ZkPredecessor | Strategy::ZkRecipe | Strategy::RedisQueue
        )
    }

    /// Whether a release wakes every waiter (reports list these as herd). Polling is
    /// neither: its waiters wake on their own clock.
    pub fn herd(self) -> bool {
        matches!(
            self,
            Strategy::ZkSingle | Strategy::ZkChildren | Strategy::RedisPubSub
        )
    }

    /// A new client (its own session or connection) running this strategy.
    ///
    /// # Errors
    ///
    /// The backend's connection errors.
    pub async fn connect(self, servers: &Servers) -> Result<Arc<dyn LockProvider>, LockError> {
        let zk = || {
            servers.zk.clone().ok_or_else(|| LockError::Config {
                message: format!("{self} needs a ZooKeeper server"),
            })
        };
        let redis = || {
            servers.redis.clone().ok_or_else(|| LockError::Config {
                message: format!("{self} needs a Redis server"),
            })
        };
        let zk_strategy = match self {
            Strategy::ZkSingle => Some(ZkStrategy::SingleNode),
            Strategy::ZkChildren => Some(ZkStrategy::SequentialChildren),
            Strategy::ZkPredecessor => Some(ZkStrategy::SequentialPredecessor),
            _ => None,
        };
        if let Some(strategy) = zk_strategy {
            let config = ZkConfig::new(zk()?.split(','))
                .with_strategy(strategy)
                .with_session_timeout(Duration::from_secs(10));
            return Ok(Arc::new(ZkLockProvider::connect(config).await?));
        }
        let redis_strategy = match self {
            Strategy::RedisPolling => Some(RedisStrategy::Polling),
            Strategy::RedisPubSub => Some(RedisStrategy::PubSub),
            Strategy::RedisQueue => Some(RedisStrategy::Queue),
            _ => None,
        };
        if let Some(strategy) = redis_strategy {
            let mut config = RedisConfig::from_url(&redis()?)?;
            config.strategy = strategy;
            config.lease.ttl = Duration::from_secs(10);
            return Ok(Arc::new(RedisLockProvider::connect(config).await?));
        }
        Ok(Arc::new(RecipeProvider::connect(&zk()?).await?))
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|strategy| strategy.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<_> = Strategy::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown strategy {s:?}; known: {}", known.join(", "))
            })
    }
}

/// The two backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// ZooKeeper.
    ZooKeeper,
    /// Redis.
    Redis,
}

impl Backend {
    /// `zookeeper` or `redis`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::ZooKeeper => "zookeeper",
            Backend::Redis => "redis",
        }
    }
}

/// Where the servers are: a ZooKeeper connect string and a Redis URL.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Servers {
    /// `host:port[,host:port…]`.
    pub zk: Option<String>,
    /// `redis://host:port`.
    pub redis: Option<String>,
}

impl Servers {
    /// The servers at `zk` (a connect string) and `redis` (a URL).
    pub fn new(zk: Option<String>, redis: Option<String>) -> Self {
        Servers { zk, redis }
    }
}

/// The peer: zookeeper-client's lock recipe behind the distlock contract, so that the
/// scenario drives it exactly as it drives ours. It keeps no wake-up counts.
#[derive(Debug)]
struct RecipeProvider {
    client: zookeeper_client::Client,
    metrics: Metrics,
}

impl RecipeProvider {
    async fn connect(connect_string: &str) -> Result<Self, LockError> {
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
    LockError::Backend {
        backend: "zk-recipe",
        name: None,
        message: error.to_string(),
        retryable: true,
        source: Some(Box::new(error)),
    }
}

#[async_trait]
impl DistributedLock for RecipeLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
        match self.acquire(Some(Duration::from_millis(1))).await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        let options = LockOptions::new(Acls::anyone_all())
            .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
            .map_err(recipe_error)?;
        let prefix = LockPrefix::new_curator(&self.dir, "lock-").map_err(recipe_error)?;
        let locking = self.client.lock(prefix, b"", options);
        let held = match timeout {
            None => locking.await,
            Some(timeout) => match tokio::time::timeout(timeout, locking).await {
                Ok(held) => held,
                Err(_) => {
                    return Err(LockError::Timeout {
                        backend: "zk-recipe",
                        name: self.name.to_string(),
                        waited: timeout,
                    });
                }
            },
        }
        .map_err(recipe_error)?
        .into_owned();
        let token = held
            .lock_path()
            .rsplit('-')
            .next()
            .and_then(|digits| digits.parse().ok())
            .unwrap_or_default();
        let (_notifier, lost) = lost_signal();
        Ok(Guard::new(
            self.name.clone(),
            FencingToken(token),
            lost,
            Box::new(RecipeGuard(Some(held))),
        ))
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
