//! The ZooKeeper lock provider: one session, shared by its locks.

use std::fmt;
use std::sync::Arc;

use lock_core::kit::{Closed, SessionOwner, SessionSlot, check_permits};
use lock_core::observe::{observe_election, observe_lock, observe_rw_lock, observe_semaphore};
use lock_core::{
    Capabilities, Deadline, DistributedLock, DistributedRwLock, DistributedSemaphore, Election,
    Fencing, LockError, LockName, LockProvider, Metrics, MetricsSnapshot, WaitKind,
};

use crate::config::{ZkConfig, ZkStrategy};
use crate::contenders::Contender;
use crate::election::ZkElection;
use crate::error::BACKEND;
use crate::lock::ZkLock;
use crate::node::lock_dir;
use crate::queue::Place;
use crate::rwlock::ZkRwLock;
use crate::semaphore::ZkSemaphore;
use crate::session::{Session, Shared};

/// A distlock provider on a ZooKeeper ensemble: one ZooKeeper session, shared by every
/// lock it hands out.
///
/// The provider is the session (see [`LockProvider`]): dropping its last handle closes the
/// session, which frees its locks at once. If the session expires, every guard of it is
/// lost and the provider opens a new session for later acquisitions; it never moves a held
/// guard to a new session.
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_zookeeper::{ZkConfig, ZkLockProvider};
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locks = ZkLockProvider::connect(ZkConfig::from_url("zk://127.0.0.1:2181")?).await?;
/// let mut guard = locks.lock("reports/nightly")?.acquire(None).await?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkLockProvider {
    shared: Arc<Shared>,
    _owner: SessionOwner,
}

impl ZkLockProvider {
    /// Connects to the ensemble and opens a session.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for an invalid configuration; [`LockError::Connection`]
    /// (retryable) when no server answers within the connect timeout.
    pub async fn connect(config: ZkConfig) -> Result<Self, LockError> {
        config.validate()?;
        let session = Session::open(&config, Deadline::after(None)).await?;
        let shared = Arc::new(Shared {
            config,
            metrics: Arc::new(Metrics::new()),
            sessions: SessionSlot::new(session),
            closed: Closed::new(),
        });
        let closing = Arc::clone(&shared);
        Ok(ZkLockProvider {
            _owner: SessionOwner::new(move || closing.sessions.close(&closing.closed)),
            shared,
        })
    }

    /// Connects with a `zk://` URL; see [`ZkConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`ZkConfig::from_url`] and [`ZkLockProvider::connect`].
    pub async fn connect_url(url: &str) -> Result<Self, LockError> {
        Self::connect(ZkConfig::from_url(url)?).await
    }

    /// The configuration this provider runs with.
    pub fn config(&self) -> &ZkConfig {
        &self.shared.config
    }

    /// The current session's id (`ephemeralOwner` of the nodes it creates), if one is open.
    pub fn session_id(&self) -> Option<i64> {
        self.shared.sessions.latest().map(|session| session.id)
    }

    /// The current session's client, for tests and tools that need to look at or act on
    /// the session (for example to make it expire from outside).
    pub fn client(&self) -> Option<zookeeper_client::Client> {
        self.shared.sessions.latest().map(|s| s.client.clone())
    }

    /// The contenders for the mutex called `name`, as the server records them now: the
    /// holder first, then the waiters in the order they will get the lock.
    ///
    /// These are the children of the lock directory `{root}/{name}` whose names end in a
    /// sequence number, ordered by that number, whoever created them (distlock, Curator,
    /// kazoo), each with the session that owns it and its creation zxid (the fencing token
    /// of the grant it stands for). Under the [`SingleNode`](ZkStrategy::SingleNode)
    /// strategy the holder is the directory's `lock` node, listed first with no sequence
    /// number; its waiters leave no node behind and are not listed.
    ///
    /// An empty list means that nobody holds or waits for the lock. The view is a snapshot:
    /// the directory is listed, then each child is looked at, so a contender that leaves in
    /// between is left out. It is read with this provider's session and is not counted in
    /// its [metrics](LockProvider::metrics).
    ///
    /// ```no_run
    /// use lock_zookeeper::ZkLockProvider;
    ///
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locks = ZkLockProvider::connect_url("zk://127.0.0.1:2181").await?;
    /// let contenders = locks.contenders("reports/nightly").await?;
    /// if let Some((holder, waiters)) = contenders.split_first() {
    ///     println!(
    ///         "held by session {:#x} (token {}), {} waiting",
    ///         holder.session_id,
    ///         holder.fencing_token(),
    ///         waiters.len()
    ///     );
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] for a bad name; [`LockError::Connection`] and the
    /// provider's other errors when the server cannot be asked;
    /// [`LockError::PermissionDenied`] when the directory's ACL does not let this client
    /// read it.
    pub async fn contenders(&self, name: &str) -> Result<Vec<Contender>, LockError> {
        self.place(name, "")?.contenders().await
    }

    /// Where the lock kind whose directories end in `suffix` keeps `name`.
    fn place(&self, name: &str, suffix: &str) -> Result<Place, LockError> {
        let name = LockName::new(name)?;
        Ok(Place {
            dir: lock_dir(&self.shared.config.root, &name, suffix),
            shared: Arc::clone(&self.shared),
            name,
            data: Arc::from(&[][..]),
        })
    }
}

impl fmt::Debug for ZkLockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLockProvider")
            .field("hosts", &self.shared.config.hosts)
            .field("root", &self.shared.config.root)
            .field("strategy", &self.shared.config.strategy)
            .field("session", &self.session_id().map(|id| format!("{id:#x}")))
            .finish()
    }
}

impl LockProvider for ZkLockProvider {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let config = &self.shared.config;
        let (wait, fifo) = match config.strategy {
            ZkStrategy::SingleNode => (WaitKind::NotifyAll, false),
            ZkStrategy::WholeQueue => (WaitKind::NotifyAll, true),
            _ => (WaitKind::NotifyOne, true),
        };
        let latest = self.shared.sessions.latest();
        let session_timeout = latest.map_or(config.session_timeout, |session| session.timeout());
        Capabilities::new(wait)
            .with_fencing(Fencing::Monotonic)
            .with_lost_detection(true)
            .with_fifo(fifo)
            .with_crash_release_bound(Some(session_timeout))
            .with_reader_writer(true)
            .with_semaphore(true)
            .with_elections(true)
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let place = self.place(name, "")?;
        let strategy = self.shared.config.strategy.as_str();
        Ok(observe_lock(Arc::new(ZkLock { place }), BACKEND, strategy))
    }

    /// A read-write lock in `{root}/{name}.rwlock`; see [`ZkRwLock`].
    fn rw_lock(&self, name: &str) -> Result<Arc<dyn DistributedRwLock>, LockError> {
        let place = self.place(name, ".rwlock")?;
        let strategy = self.shared.config.strategy.as_str();
        Ok(observe_rw_lock(
            Arc::new(ZkRwLock { place }),
            BACKEND,
            strategy,
        ))
    }

    /// A semaphore in `{root}/{name}.semaphore`; see [`ZkSemaphore`].
    fn semaphore(
        &self,
        name: &str,
        permits: u32,
    ) -> Result<Arc<dyn DistributedSemaphore>, LockError> {
        let place = self.place(name, ".semaphore")?;
        check_permits(BACKEND, name, permits, u32::MAX)?;
        let strategy = self.shared.config.strategy.as_str();
        let semaphore = Arc::new(ZkSemaphore::new(place, permits));
        Ok(observe_semaphore(semaphore, BACKEND, strategy))
    }

    /// An election in `{root}/{name}.election`; see [`ZkElection`].
    fn election(&self, name: &str) -> Result<Arc<dyn Election>, LockError> {
        let place = self.place(name, ".election")?;
        let election = Arc::new(ZkElection { place });
        Ok(observe_election(
            election,
            BACKEND,
            ZkStrategy::SequentialPredecessor.as_str(),
        ))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }
}
