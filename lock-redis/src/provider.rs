//! The Redis lock provider: one server, one shared connection.

use std::fmt;
use std::sync::Arc;

use lock_core::{
    Capabilities, DistributedLock, Fencing, LockError, LockName, LockProvider, Metrics,
    MetricsSnapshot, WaitKind,
};
use tokio::sync::watch;

use crate::config::{RedisConfig, RedisStrategy};
use crate::error::BACKEND;
use crate::lock::{RedisLock, refresh_period};
use crate::node::Node;

/// A distlock provider on one Redis server.
///
/// **Efficiency-grade**: see the [crate docs](crate) for what a failover or a paused
/// process does to a Redis lock. Each lock is an owner key with the lease as its expiry,
/// renewed by a watchdog at ttl/3 while its guard lives; tokens come from a counter bumped
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
    shared: Arc<Shared>,
    _owner: Arc<Owner>,
}

/// What the provider's lock handles and guards share.
pub(crate) struct Shared {
    pub(crate) config: RedisConfig,
    pub(crate) node: Node,
    pub(crate) metrics: Arc<Metrics>,
    closed: Closed,
}

impl Shared {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_closed()
    }

    /// Resolves once the provider's last handle is gone.
    pub(crate) async fn closed(&self) {
        self.closed.wait().await;
    }
}

/// Whether a provider's last handle is gone: the end of its "session".
#[derive(Debug)]
pub(crate) struct Closed(watch::Sender<bool>);

impl Closed {
    pub(crate) fn new() -> Self {
        Closed(watch::channel(false).0)
    }

    pub(crate) fn close(&self) {
        self.0.send_replace(true);
    }

    pub(crate) fn is_closed(&self) -> bool {
        *self.0.borrow()
    }

    pub(crate) async fn wait(&self) {
        let mut closed = self.0.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("server", &self.node.address())
            .finish()
    }
}

/// Held only by the provider's handles.
struct Owner {
    shared: Arc<Shared>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.shared.closed.close();
    }
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
        let node = Node::connect(
            &config.server,
            config.timeout,
            BACKEND,
            Arc::clone(&metrics),
        )
        .await?;
        let shared = Arc::new(Shared {
            config,
            node,
            metrics,
            closed: Closed::new(),
        });
        Ok(RedisLockProvider {
            _owner: Arc::new(Owner {
                shared: Arc::clone(&shared),
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
}

impl fmt::Debug for RedisLockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLockProvider")
            .field("server", &self.shared.node.address())
            .field("db", &self.shared.config.server.db)
            .field("key_prefix", &self.shared.config.key_prefix)
            .field("ttl", &self.shared.config.ttl)
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
            // A crashed holder's key expires after the ttl; a waiter notices within one
            // refresh period.
            .with_crash_release_bound(Some(config.ttl + refresh_period(config.ttl)))
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let name = LockName::new(name)?;
        Ok(Arc::new(RedisLock::new(Arc::clone(&self.shared), name)))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }
}
