//! The etcd lock provider: one session (one lease), shared by its locks.

use std::fmt;
use std::sync::Arc;

use lock_core::kit::{SessionOwner, check_permits};
use lock_core::observe::{observe_election, observe_lock, observe_rw_lock, observe_semaphore};
use lock_core::{
    Capabilities, DistributedLock, DistributedRwLock, DistributedSemaphore, Election, Fencing,
    LockError, LockName, LockProvider, MetricsSnapshot, WaitKind,
};

use crate::config::{EtcdConfig, EtcdStrategy};
use crate::contenders::EtcdContender;
use crate::election::EtcdElection;
use crate::error::BACKEND;
use crate::lock::EtcdLock;
use crate::queue::Place;
use crate::rwlock::EtcdRwLock;
use crate::semaphore::EtcdSemaphore;
use crate::session::Shared;

/// A distlock provider over an etcd cluster. The provider *is* the session: one lease, kept
/// alive at a third of its ttl, that every key of its locks hangs on. Dropping the last
/// handle revokes the lease, which frees every lock it held.
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_etcd::EtcdLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locks = EtcdLockProvider::connect_url("etcd://127.0.0.1:2379/apps?lease_ttl=10s").await?;
/// let mut guard = locks.lock("billing")?.acquire(None).await?;
/// // ... pass guard.fencing_token() with every write; watch guard.lost() ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdLockProvider {
    shared: Arc<Shared>,
    _owner: SessionOwner,
}

impl EtcdLockProvider {
    /// Connects and grants the session's lease, each within the configured timeout.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for an invalid configuration; [`LockError::Connection`]
    /// (retryable) when no server answers in time; [`LockError::Auth`] for wrong
    /// credentials.
    pub async fn connect(config: EtcdConfig) -> Result<Self, LockError> {
        config.validate()?;
        let shared = Arc::new(Shared::open(config).await?);
        let closing = Arc::clone(&shared);
        Ok(EtcdLockProvider {
            _owner: SessionOwner::new(move || closing.sessions.close(&closing.closed)),
            shared,
        })
    }

    /// Parses an `etcd://` URL (see [`EtcdConfig::from_url`]) and connects.
    ///
    /// # Errors
    ///
    /// As for [`EtcdConfig::from_url`] and [`connect`](Self::connect).
    pub async fn connect_url(url: &str) -> Result<Self, LockError> {
        Self::connect(EtcdConfig::from_url(url)?).await
    }

    /// The configuration the provider was made with.
    pub fn config(&self) -> &EtcdConfig {
        &self.shared.config
    }

    /// The id of the current session's lease, while the session lasts: the keys of this
    /// provider's contenders are named by it in hex.
    pub fn lease_id(&self) -> Option<i64> {
        self.shared.current().map(|session| session.lease)
    }

    /// The strategy's name, as the metrics label what this provider hands out.
    fn strategy(&self) -> &'static str {
        self.shared.config.strategy.as_str()
    }
}

impl EtcdLockProvider {
    /// The keys of the lock `name`, in create-revision order: the holder first, then the
    /// waiters in the order they will be served (the single-key strategy records no
    /// waiters). One request, at one revision.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`], connection errors, and [`LockError::SessionExpired`]
    /// once the provider's session is over and no new one can be opened.
    pub async fn contenders(&self, name: &str) -> Result<Vec<EtcdContender>, LockError> {
        let name = LockName::new(name)?;
        Place::new(Arc::clone(&self.shared), name, "")
            .contenders()
            .await
    }
}

impl fmt::Debug for EtcdLockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLockProvider")
            .field("endpoints", &self.shared.config.endpoints)
            .field("prefix", &self.shared.config.prefix)
            .field("strategy", &self.shared.config.strategy)
            .field("lease", &self.lease_id().map(|id| format!("{id:x}")))
            .finish()
    }
}

impl LockProvider for EtcdLockProvider {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let (wait, fifo) = match self.shared.config.strategy {
            EtcdStrategy::Single => (WaitKind::NotifyAll, false),
            EtcdStrategy::WholeQueue => (WaitKind::NotifyAll, true),
            _ => (WaitKind::NotifyOne, true),
        };
        let ttl = self
            .shared
            .current()
            .map_or(self.shared.config.lease_ttl, |session| session.ttl());
        Capabilities::new(wait)
            .with_fencing(Fencing::Monotonic)
            .with_lost_detection(true)
            .with_fifo(fifo)
            .with_reader_writer(true)
            .with_semaphore(true)
            .with_elections(true)
            .with_crash_release_bound(Some(ttl))
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let name = LockName::new(name)?;
        let lock = Arc::new(EtcdLock::new(Arc::clone(&self.shared), name));
        Ok(observe_lock(lock, BACKEND, self.strategy()))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// An election in `{prefix}/{name}.election/`; see [`EtcdElection`].
    fn election(&self, name: &str) -> Result<Arc<dyn Election>, LockError> {
        let name = LockName::new(name)?;
        let election = Arc::new(EtcdElection::new(Arc::clone(&self.shared), name));
        Ok(observe_election(election, BACKEND, self.strategy()))
    }

    /// A read-write lock in `{prefix}/{name}.rwlock/`; see [`EtcdRwLock`].
    fn rw_lock(&self, name: &str) -> Result<Arc<dyn DistributedRwLock>, LockError> {
        let name = LockName::new(name)?;
        let lock = Arc::new(EtcdRwLock::new(Arc::clone(&self.shared), name));
        Ok(observe_rw_lock(lock, BACKEND, self.strategy()))
    }

    /// A semaphore in `{prefix}/{name}.semaphore/`; see [`EtcdSemaphore`].
    fn semaphore(
        &self,
        name: &str,
        permits: u32,
    ) -> Result<Arc<dyn DistributedSemaphore>, LockError> {
        let name = LockName::new(name)?;
        check_permits(BACKEND, name.as_str(), permits, u32::MAX)?;
        let semaphore = Arc::new(EtcdSemaphore::new(Arc::clone(&self.shared), name, permits));
        Ok(observe_semaphore(semaphore, BACKEND, self.strategy()))
    }
}
