//! The Redis lock provider: one server, one shared connection.

use std::fmt;
use std::sync::Arc;

use lock_core::kit::{Closed, SessionOwner, check_permits};
use lock_core::observe::{observe_election, observe_lock, observe_rw_lock, observe_semaphore};
use lock_core::{
    Capabilities, DistributedLock, DistributedRwLock, DistributedSemaphore, Election, Fencing,
    LockError, LockName, LockProvider, Metrics, MetricsSnapshot, WaitKind,
};

use crate::claim::refresh_period;
use crate::config::{RedisConfig, RedisStrategy};
use crate::connection::Settings;
use crate::election::RedisElection;
use crate::error::BACKEND;
use crate::holders::RedisHolders;
use crate::keys::LockKeys;
use crate::lock::RedisLock;
use crate::node::Node;
use crate::permits::{RedisRwLock, RedisSemaphore};
use crate::session::Session;

/// The strategy the metrics name for the read-write locks, semaphores and elections: they
/// wait as the mutex's queue strategy does, whatever the configured strategy.
const QUEUED: &str = "queue";

/// A distlock provider on one Redis server.
///
/// **Efficiency-grade**: see the [crate docs](crate) for what a failover or a paused
/// process does to a Redis lock. Each lock is an owner key with the lease as its expiry,
/// renewed at ttl/3 by the provider's renewal timer while its guard lives; tokens come from a counter bumped
/// in the same script.
///
/// The provider is the session (see [`LockProvider`]): dropping its last handle releases
/// its locks (best effort) and fires their guards' lost signals.
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_redis::RedisLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locks = RedisLockProvider::connect_url("redis://127.0.0.1:6379?ttl=10s").await?;
/// let mut guard = locks.lock("reports/nightly")?.acquire(None).await?;
/// // ... while guard.valid_until() is in the future ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLockProvider {
    shared: Arc<Session>,
    _owner: SessionOwner,
}

impl RedisLockProvider {
    /// Connects to the server.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for an invalid configuration; [`LockError::Connection`] when
    /// the server cannot be reached within the request timeout (or its TLS certificate is
    /// not trusted); [`LockError::Auth`] for wrong credentials.
    pub async fn connect(config: RedisConfig) -> Result<Self, LockError> {
        config.validate()?;
        let metrics = Arc::new(Metrics::new());
        let server = &config.server;
        let settings = Settings {
            timeout: config.lease.timeout,
            backend: BACKEND,
            metrics: Arc::clone(&metrics),
        };
        let node = match (&config.sentinel, &config.cluster) {
            (Some(sentinel), _) => Node::connect_sentinel(sentinel, server, settings).await?,
            (None, Some(cluster)) => Node::connect_cluster(cluster, server, settings).await?,
            (None, None) => Node::connect(server, settings, false).await?,
        };
        let shared = Arc::new(Session {
            config,
            node,
            metrics,
            closed: Closed::new(),
        });
        let closing = Arc::clone(&shared);
        Ok(RedisLockProvider {
            _owner: SessionOwner::new(move || {
                closing.closed.close();
            }),
            shared,
        })
    }

    /// Parses a `redis://` URL (see [`RedisConfig::from_url`]) and connects.
    ///
    /// # Errors
    ///
    /// As for [`RedisConfig::from_url`] and [`connect`](Self::connect).
    pub async fn connect_url(url: &str) -> Result<Self, LockError> {
        Self::connect(RedisConfig::from_url(url)?).await
    }

    /// The configuration the provider was made with.
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    /// Who holds the lock called `name` and who waits for it, as the server records it now.
    ///
    /// One atomic read (`MULTI` with `GET`, `PTTL`, `LRANGE` and `GET`) of the lock's owner
    /// key, its waiter queue and its fencing counter: the holder's owner id (a random id
    /// per acquisition) and the lease left on it, the waiters' owner ids in the order the
    /// queue strategy will grant them, and the last token handed out. Only the
    /// [`Queue`](RedisStrategy::Queue) strategy queues its waiters on the server; under the
    /// other strategies the waiters are not visible and the queue is empty. The mutex only:
    /// a read-write lock's or semaphore's holders are not shown. Not counted in the
    /// provider's [metrics](LockProvider::metrics).
    ///
    /// An ACL user limited to the lock commands (see the [crate docs](crate)) also needs
    /// `+pttl +lrange +multi +exec` for this.
    ///
    /// ```no_run
    /// use lock_redis::RedisLockProvider;
    ///
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locks = RedisLockProvider::connect_url("redis://127.0.0.1:6379").await?;
    /// let holders = locks.holders("reports/nightly").await?;
    /// match &holders.owner {
    ///     Some(owner) => println!("held by {owner} (token {}), {} waiting", holders.fence, holders.queue.len()),
    ///     None => println!("free"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] for a bad name; [`LockError::Connection`] when the server
    /// does not answer within the request timeout; [`LockError::PermissionDenied`] when the
    /// user may not run these commands on the lock's keys.
    pub async fn holders(&self, name: &str) -> Result<RedisHolders, LockError> {
        let name = LockName::new(name)?;
        let keys = LockKeys::new(&self.shared.config.lease.key_prefix, &name);
        RedisHolders::read(&self.shared, &name, &keys).await
    }
}

impl fmt::Debug for RedisLockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLockProvider")
            .field("server", &self.shared.node.address())
            .field("db", &self.shared.config.server.db)
            .field("key_prefix", &self.shared.config.lease.key_prefix)
            .field("ttl", &self.shared.config.lease.ttl)
            .field("strategy", &self.shared.config.strategy)
            .finish()
    }
}

impl LockProvider for RedisLockProvider {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let config = &self.shared.config;
        let (wait, fifo) = match config.strategy {
            RedisStrategy::Polling => (WaitKind::Poll, false),
            RedisStrategy::PubSub => (WaitKind::NotifyAll, false),
            _ => (WaitKind::NotifyOne, true),
        };
        Capabilities::new(wait)
            .with_fencing(Fencing::BestEffort)
            .with_lost_detection(true)
            .with_fifo(fifo)
            .with_leases(true)
            .with_elections(true)
            // Read-write locks and semaphores always queue, whatever the strategy.
            .with_reader_writer(true)
            .with_semaphore(true)
            // A crashed holder's key expires after the ttl; a waiter notices within one
            // refresh period.
            .with_crash_release_bound(Some(config.lease.ttl + refresh_period(config.lease.ttl)))
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let name = LockName::new(name)?;
        let lock = Arc::new(RedisLock::new(Arc::clone(&self.shared), name));
        Ok(observe_lock(
            lock,
            BACKEND,
            self.shared.config.strategy.as_str(),
        ))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// A read-write lock under `{prefix:name.rwlock}`; see [`RedisRwLock`].
    fn rw_lock(&self, name: &str) -> Result<Arc<dyn DistributedRwLock>, LockError> {
        let name = LockName::new(name)?;
        let lock = Arc::new(RedisRwLock::new(&self.shared, name));
        Ok(observe_rw_lock(lock, BACKEND, QUEUED))
    }

    /// A semaphore under `{prefix:name.semaphore}`; see [`RedisSemaphore`].
    fn semaphore(
        &self,
        name: &str,
        permits: u32,
    ) -> Result<Arc<dyn DistributedSemaphore>, LockError> {
        let name = LockName::new(name)?;
        check_permits(BACKEND, name.as_str(), permits, u32::MAX)?;
        let semaphore = Arc::new(RedisSemaphore::new(&self.shared, name, permits));
        Ok(observe_semaphore(semaphore, BACKEND, QUEUED))
    }

    /// An election on the queue strategy, `{prefix:name.election}:…`; see [`RedisElection`].
    fn election(&self, name: &str) -> Result<Arc<dyn Election>, LockError> {
        let name = LockName::new(name)?;
        let election = Arc::new(RedisElection::new(Arc::clone(&self.shared), name));
        Ok(observe_election(election, BACKEND, QUEUED))
    }
}
