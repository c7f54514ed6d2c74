//! The in-memory reference backend: the whole contract inside one process.
//!
//! A [`MemoryServer`] plays the part of a lock server; each [`MemoryLockProvider`] is one
//! client of it with its own session, so two providers of one server contend like two
//! processes. It offers FIFO, herd-free handoff, monotonic fencing tokens, cancel-safe
//! waiters, conditional release and the lost signal, plus test hooks that real servers
//! lack: [`revoke`](MemoryLockProvider::revoke) a holder, [`expire_session`](MemoryLockProvider::expire_session),
//! and count [`waiters`](MemoryLockProvider::waiters).
//!
//! Use it in your application's unit tests in place of ZooKeeper or Redis:
//!
//! ```
//! use lock_core::{memory::MemoryServer, LockProvider};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let server = MemoryServer::new();
//! let (a, b) = (server.provider(), server.provider());
//!
//! let mut held = a.lock("jobs")?.acquire(None).await?;
//! assert!(b.lock("jobs")?.try_acquire().await?.is_none());
//!
//! held.release().await?;
//! let next = b.lock("jobs")?.try_acquire().await?.expect("free after release");
//! assert!(next.fencing_token() > held.fencing_token());
//! # Ok(()) }
//! ```
//!
//! A session ends when the last handle to its provider is dropped (lock handles and guards
//! do not keep it alive), or on [`expire_session`](MemoryLockProvider::expire_session): its
//! locks are freed at once, its guards report [`LossReason::SessionExpired`](crate::LossReason::SessionExpired), and its
//! waiters and later calls on its lock handles fail with [`LockError::SessionExpired`]. The
//! crash-release bound is therefore zero.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use crate::{
    Capabilities, DistributedLock, DistributedRwLock, DistributedSemaphore, Election, Fencing,
    FencingToken, LockError, LockName, LockProvider, Metrics, MetricsSnapshot, WaitKind,
};

mod locks;
mod server;

use crate::kit::{SessionOwner, unpoisoned};
use locks::Handle;
pub use locks::{MemoryElection, MemoryLock, MemoryRwLock, MemorySemaphore};
use server::{Family, LockKey, ServerInner};

const BACKEND: &str = "memory";

/// An in-process lock server shared by any number of [`MemoryLockProvider`] clients.
///
/// Cheap to clone; clones are the same server. The server lives while any handle, provider
/// or guard of it lives.
#[derive(Clone)]
pub struct MemoryServer {
    inner: Arc<ServerInner>,
}

static NAMED_SERVERS: LazyLock<Mutex<HashMap<String, Weak<ServerInner>>>> =
    LazyLock::new(Default::default);

impl MemoryServer {
    /// A new, private server.
    pub fn new() -> Self {
        MemoryServer {
            inner: Arc::new(ServerInner::new(None)),
        }
    }

    /// The process-wide server called `name`, created on first use and kept while any
    /// handle to it lives. This is what `distlock::connect("memory://NAME")` uses.
    ///
    /// ```
    /// use lock_core::memory::MemoryServer;
    /// assert!(MemoryServer::named("jobs").same_server(&MemoryServer::named("jobs")));
    /// assert!(!MemoryServer::named("jobs").same_server(&MemoryServer::named("other")));
    /// ```
    pub fn named(name: &str) -> Self {
        let mut registry = unpoisoned(&NAMED_SERVERS);
        if let Some(inner) = registry.get(name).and_then(Weak::upgrade) {
            return MemoryServer { inner };
        }
        registry.retain(|_, server| server.strong_count() > 0);
        let inner = Arc::new(ServerInner::new(Some(name.to_owned())));
        registry.insert(name.to_owned(), Arc::downgrade(&inner));
        MemoryServer { inner }
    }

    /// Whether two handles refer to the same server.
    pub fn same_server(&self, other: &MemoryServer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A new client with its own session, in the default (empty) namespace.
    pub fn provider(&self) -> MemoryLockProvider {
        self.provider_in("")
    }

    /// A new client with its own session whose lock names live in `namespace`; providers in
    /// different namespaces never see each other's locks (like different ZooKeeper roots or
    /// Redis key prefixes).
    pub fn provider_in(&self, namespace: &str) -> MemoryLockProvider {
        let shared = Arc::new(ProviderShared {
            server: Arc::clone(&self.inner),
            namespace: namespace.to_owned(),
            session: Mutex::new(self.inner.open_session()),
            metrics: Arc::new(Metrics::new()),
        });
        let ending = Arc::clone(&shared);
        let owner = SessionOwner::new(move || {
            let session = *unpoisoned(&ending.session);
            ending.server.end_session(session);
        });
        MemoryLockProvider {
            _owner: owner,
            shared,
        }
    }

    /// How many locks the server keeps state for: held, or with waiters. Zero once every
    /// lock is free and no one waits; anything else after clean-up is residue.
    pub fn active_locks(&self) -> usize {
        self.inner.state().locks.len()
    }
}

impl Default for MemoryServer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.state();
        f.debug_struct("MemoryServer")
            .field("name", &self.inner.name)
            .field("active_locks", &state.locks.len())
            .field("live_sessions", &state.live_sessions.len())
            .finish()
    }
}

/// A client of a [`MemoryServer`]: one session, implementing [`LockProvider`].
///
/// Cheap to clone; clones share the session. Dropping the last clone ends the session,
/// whatever lock handles or guards of it still exist: see the [module docs](self).
#[derive(Clone)]
pub struct MemoryLockProvider {
    shared: Arc<ProviderShared>,
    _owner: SessionOwner,
}

impl MemoryLockProvider {
    /// A client of a new private server; for a second client of the same server use
    /// [`MemoryServer::provider`].
    pub fn new() -> Self {
        MemoryServer::new().provider()
    }

    /// The server this provider is a client of.
    pub fn server(&self) -> MemoryServer {
        MemoryServer {
            inner: Arc::clone(&self.shared.server),
        }
    }

    /// Takes the mutex `name` away from its current holder, as an operator or a fault
    /// would: the holder's lost signal fires with [`LossReason::Revoked`](crate::LossReason::Revoked), and the next
    /// waiter gets the lock. Returns the revoked holder's token, or `None` if nobody held it.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] if `name` is not a valid lock name.
    pub fn revoke(&self, name: &str) -> Result<Option<FencingToken>, LockError> {
        let key = self.shared.key(Family::Mutex, LockName::new(name)?);
        Ok(self.shared.server.revoke(&key).first().copied())
    }

    /// Ends this provider's session now, as a session expiry would: its guards are lost
    /// ([`LossReason::SessionExpired`](crate::LossReason::SessionExpired)), its locks freed, its waiters fail with
    /// [`LockError::SessionExpired`]. Later acquisitions run in a new session.
    pub fn expire_session(&self) {
        let fresh = self.shared.server.open_session();
        let old = std::mem::replace(&mut *unpoisoned(&self.shared.session), fresh);
        self.shared.server.end_session(old);
    }

    /// How many callers wait for the mutex `name` (not counting the holder).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] if `name` is not a valid lock name.
    pub fn waiters(&self, name: &str) -> Result<usize, LockError> {
        let key = self.shared.key(Family::Mutex, LockName::new(name)?);
        Ok(self
            .shared
            .server
            .state()
            .locks
            .get(&key)
            .map_or(0, |entry| entry.waiters.len()))
    }

    /// The fencing token of the current holder of the mutex `name`, if anyone holds it.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] if `name` is not a valid lock name.
    pub fn holder(&self, name: &str) -> Result<Option<FencingToken>, LockError> {
        let key = self.shared.key(Family::Mutex, LockName::new(name)?);
        Ok(self
            .shared
            .server
            .state()
            .locks
            .get(&key)
            .and_then(|entry| entry.holders.first().map(|holder| holder.token)))
    }

    /// Holders and waiters recorded for `name` in this namespace, over the mutex, the
    /// read-write lock and the semaphore of that name together: zero and zero once nothing
    /// of it is left on the server.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] if `name` is not a valid lock name.
    pub fn entries(&self, name: &str) -> Result<(usize, usize), LockError> {
        let name = LockName::new(name)?;
        let state = self.shared.server.state();
        Ok([
            Family::Mutex,
            Family::ReadWrite,
            Family::Semaphore,
            Family::Election,
        ]
        .into_iter()
        .filter_map(|family| state.locks.get(&self.shared.key(family, name.clone())))
        .fold((0, 0), |(holders, waiters), entry| {
            (holders + entry.holders.len(), waiters + entry.waiters.len())
        }))
    }
}

impl Default for MemoryLockProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryLockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLockProvider")
            .field("server", &self.shared.server.name)
            .field("namespace", &self.shared.namespace)
            .field("session", &*unpoisoned(&self.shared.session))
            .finish()
    }
}

impl LockProvider for MemoryLockProvider {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(WaitKind::NotifyOne)
            .with_fencing(Fencing::Monotonic)
            .with_lost_detection(true)
            .with_fifo(true)
            .with_reader_writer(true)
            .with_semaphore(true)
            .with_elections(true)
            .with_crash_release_bound(Some(Duration::ZERO))
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let lock = Arc::new(MemoryLock(self.shared.handle(Family::Mutex, name, 1)?));
        Ok(crate::observe::observe_lock(lock, BACKEND, "fifo"))
    }

    fn rw_lock(&self, name: &str) -> Result<Arc<dyn DistributedRwLock>, LockError> {
        let lock = Arc::new(MemoryRwLock(self.shared.handle(
            Family::ReadWrite,
            name,
            1,
        )?));
        Ok(crate::observe::observe_rw_lock(lock, BACKEND, "fifo"))
    }

    fn semaphore(
        &self,
        name: &str,
        permits: u32,
    ) -> Result<Arc<dyn DistributedSemaphore>, LockError> {
        crate::kit::check_permits(BACKEND, name, permits, u32::MAX)?;
        let semaphore = Arc::new(MemorySemaphore(self.shared.handle(
            Family::Semaphore,
            name,
            permits,
        )?));
        Ok(crate::observe::observe_semaphore(
            semaphore, BACKEND, "fifo",
        ))
    }

    fn election(&self, name: &str) -> Result<Arc<dyn Election>, LockError> {
        let election = Arc::new(MemoryElection(self.shared.handle(
            Family::Election,
            name,
            1,
        )?));
        Ok(crate::observe::observe_election(election, BACKEND, "fifo"))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }
}

struct ProviderShared {
    server: Arc<ServerInner>,
    namespace: String,
    /// The current session's id; replaced by [`MemoryLockProvider::expire_session`].
    session: Mutex<u64>,
    metrics: Arc<Metrics>,
}

impl ProviderShared {
    fn key(&self, family: Family, name: LockName) -> LockKey {
        LockKey {
            namespace: self.namespace.clone(),
            family,
            name,
        }
    }

    fn handle(
        self: &Arc<Self>,
        family: Family,
        name: &str,
        permits: u32,
    ) -> Result<Handle, LockError> {
        let name = LockName::new(name)?;
        Ok(Handle {
            key: self.key(family, name.clone()),
            name,
            provider: Arc::clone(self),
            permits,
        })
    }
}

#[cfg(test)]
mod tests;
