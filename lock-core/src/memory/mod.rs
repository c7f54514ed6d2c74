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
//! A session ends when its provider (and every lock handle from it) is dropped, or on
//! [`expire_session`](MemoryLockProvider::expire_session): its locks are freed at once, its
//! guards report [`LossReason::SessionExpired`], and its waiters fail with
//! [`LockError::SessionExpired`]. The crash-release bound is therefore zero.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;

use crate::{
    Capabilities, Deadline, DistributedLock, Fencing, FencingToken, Guard, GuardBackend, LockError,
    LockName, LockProvider, LossReason, LostNotifier, LostSignal, Metrics, MetricsSnapshot,
    WaitKind, lost_signal,
};

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
        let mut registry = lock(&NAMED_SERVERS);
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
        let session = Session::open(&self.inner);
        MemoryLockProvider {
            shared: Arc::new(ProviderShared {
                server: Arc::clone(&self.inner),
                namespace: namespace.to_owned(),
                session: Mutex::new(Arc::new(session)),
                metrics: Arc::new(Metrics::new()),
            }),
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
/// Cheap to clone; clones share the session. Dropping the last clone (and every lock
/// handle and pending `acquire` of it) ends the session: see the [module docs](self).
#[derive(Clone)]
pub struct MemoryLockProvider {
    shared: Arc<ProviderShared>,
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

    /// Takes the lock `name` away from its current holder, as an operator or a fault would:
    /// the holder's lost signal fires with [`LossReason::Revoked`], and the next waiter gets
    /// the lock. Returns the revoked holder's token, or `None` if nobody held it.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] if `name` is not a valid lock name.
    pub fn revoke(&self, name: &str) -> Result<Option<FencingToken>, LockError> {
        let key = self.shared.key(LockName::new(name)?);
        Ok(self.shared.server.revoke(&key))
    }

    /// Ends this provider's session now, as a session expiry would: its guards are lost
    /// ([`LossReason::SessionExpired`]), its locks freed, its waiters fail with
    /// [`LockError::SessionExpired`]. Later acquisitions run in a new session.
    pub fn expire_session(&self) {
        let fresh = Arc::new(Session::open(&self.shared.server));
        let old = std::mem::replace(&mut *lock(&self.shared.session), fresh);
        old.end();
    }

    /// How many callers wait for `name` (not counting the holder).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] if `name` is not a valid lock name.
    pub fn waiters(&self, name: &str) -> Result<usize, LockError> {
        let key = self.shared.key(LockName::new(name)?);
        Ok(self
            .shared
            .server
            .state()
            .locks
            .get(&key)
            .map_or(0, |entry| entry.waiters.len()))
    }

    /// The fencing token of the current holder of `name`, if anyone holds it.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] if `name` is not a valid lock name.
    pub fn holder(&self, name: &str) -> Result<Option<FencingToken>, LockError> {
        let key = self.shared.key(LockName::new(name)?);
        Ok(self
            .shared
            .server
            .state()
            .locks
            .get(&key)
            .and_then(|entry| entry.holder.as_ref().map(|holder| holder.token)))
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
            .field("session", &lock(&self.shared.session).id)
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
            .with_crash_release_bound(Some(Duration::ZERO))
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let name = LockName::new(name)?;
        Ok(Arc::new(MemoryLock {
            key: self.shared.key(name.clone()),
            name,
            provider: Arc::clone(&self.shared),
        }))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }
}

/// A lock handle from a [`MemoryLockProvider`].
pub struct MemoryLock {
    name: LockName,
    key: LockKey,
    provider: Arc<ProviderShared>,
}

impl fmt::Debug for MemoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLock")
            .field("name", &self.name)
            .field("namespace", &self.provider.namespace)
            .finish()
    }
}

#[async_trait]
impl DistributedLock for MemoryLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
        match self.enter(false)? {
            Entry::Granted(grant) => Ok(Some(self.guard(grant))),
            Entry::Busy => Ok(None),
            Entry::Queued(..) => Err(internal("a try was queued")),
        }
    }

    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        let deadline = Deadline::after(timeout);
        let (mut ticket, mut receiver) = match self.enter(!deadline.is_immediate())? {
            Entry::Granted(grant) => return Ok(self.guard(grant)),
            Entry::Busy => return Err(self.timeout_error(timeout)),
            Entry::Queued(ticket, receiver) => (ticket, receiver),
        };
        let woken = tokio::select! {
            biased;
            grant = &mut receiver => Some(grant),
            () = deadline.sleep() => None,
        };
        let grant = match woken {
            Some(grant) => grant.ok(),
            None => {
                self.provider.metrics.record_server_requests(1);
                match self.provider.server.withdraw(&ticket.key, ticket.id) {
                    Withdrawal::Removed => {
                        ticket.disarm();
                        return Err(self.timeout_error(timeout));
                    }
                    // The grant raced the deadline: it is ours, take it.
                    Withdrawal::Granted | Withdrawal::Gone => receiver.try_recv().ok(),
                }
            }
        };
        ticket.disarm();
        match grant {
            Some(grant) => {
                self.provider.metrics.record_wakeup();
                Ok(self.guard(grant))
            }
            // The sender went without a grant: our session ended while we waited.
            None => Err(LockError::SessionExpired {
                backend: BACKEND,
                name: Some(self.name.to_string()),
            }),
        }
    }
}

impl MemoryLock {
    /// One visit to the server: take the lock if free, else queue (when `queue`) or report busy.
    fn enter(&self, queue: bool) -> Result<Entry, LockError> {
        let session = lock(&self.provider.session).id;
        let server = &self.provider.server;
        self.provider.metrics.record_server_requests(1);
        let mut state = server.state();
        if !state.live_sessions.contains(&session) {
            return Err(LockError::SessionExpired {
                backend: BACKEND,
                name: Some(self.name.to_string()),
            });
        }
        let id = state.next_id();
        let ServerState {
            locks, next_token, ..
        } = &mut *state;
        let entry = locks.entry(self.key.clone()).or_default();
        if entry.holder.is_none() {
            let token = bump(next_token);
            let (notifier, lost) = lost_signal();
            entry.holder = Some(Holder {
                id,
                session,
                token,
                notifier,
            });
            return Ok(Entry::Granted(Grant { id, token, lost }));
        }
        if !queue {
            return Ok(Entry::Busy);
        }
        let (sender, receiver) = oneshot::channel();
        entry.waiters.push_back(Waiter {
            id,
            session,
            grant: sender,
        });
        let ticket = WaitTicket {
            server: Arc::clone(server),
            key: self.key.clone(),
            id,
            armed: true,
        };
        Ok(Entry::Queued(ticket, receiver))
    }

    fn guard(&self, grant: Grant) -> Guard {
        self.provider.metrics.record_grant();
        let backend = MemoryGuard {
            server: Arc::clone(&self.provider.server),
            metrics: Arc::clone(&self.provider.metrics),
            key: self.key.clone(),
            id: grant.id,
            lost: grant.lost.clone(),
        };
        Guard::new(
            self.name.clone(),
            grant.token,
            grant.lost,
            Box::new(backend),
        )
    }

    fn timeout_error(&self, timeout: Option<Duration>) -> LockError {
        LockError::Timeout {
            backend: BACKEND,
            name: self.name.to_string(),
            waited: timeout.unwrap_or_default(),
        }
    }
}

/// The backend side of a guard from a [`MemoryLockProvider`].
struct MemoryGuard {
    server: Arc<ServerInner>,
    metrics: Arc<Metrics>,
    key: LockKey,
    id: u64,
    lost: LostSignal,
}

impl fmt::Debug for MemoryGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryGuard")
            .field("name", &self.key.1)
            .field("id", &self.id)
            .finish()
    }
}

#[async_trait]
impl GuardBackend for MemoryGuard {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn release(&mut self) -> Result<(), LockError> {
        self.metrics.record_server_requests(1);
        if self.server.release(&self.key, self.id) {
            Ok(())
        } else {
            Err(LockError::Lost {
                backend: BACKEND,
                name: self.key.1.to_string(),
                reason: self.lost.reason().unwrap_or(LossReason::EntryRemoved),
            })
        }
    }

    fn release_on_drop(self: Box<Self>) {
        self.metrics.record_server_requests(1);
        self.server.release(&self.key, self.id);
    }
}

/// A lock's identity on the server: namespace and name.
type LockKey = (String, LockName);

struct ProviderShared {
    server: Arc<ServerInner>,
    namespace: String,
    session: Mutex<Arc<Session>>,
    metrics: Arc<Metrics>,
}

impl ProviderShared {
    fn key(&self, name: LockName) -> LockKey {
        (self.namespace.clone(), name)
    }
}

/// A live session; ends when dropped.
struct Session {
    id: u64,
    server: Arc<ServerInner>,
}

impl Session {
    fn open(server: &Arc<ServerInner>) -> Session {
        let mut state = server.state();
        let id = state.next_id();
        state.live_sessions.insert(id);
        Session {
            id,
            server: Arc::clone(server),
        }
    }

    fn end(&self) {
        self.server.end_session(self.id);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.end();
    }
}

struct ServerInner {
    name: Option<String>,
    state: Mutex<ServerState>,
}

#[derive(Default)]
struct ServerState {
    locks: HashMap<LockKey, LockState>,
    live_sessions: HashSet<u64>,
    /// Source of session, waiter and holder ids.
    ids: u64,
    /// Server-wide, like ZooKeeper's zxid: strictly increasing for every name at once.
    next_token: u64,
}

#[derive(Default)]
struct LockState {
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
}

struct Holder {
    id: u64,
    session: u64,
    token: FencingToken,
    notifier: LostNotifier,
}

struct Waiter {
    id: u64,
    session: u64,
    grant: oneshot::Sender<Grant>,
}

struct Grant {
    id: u64,
    token: FencingToken,
    lost: LostSignal,
}

enum Entry {
    Granted(Grant),
    Busy,
    Queued(WaitTicket, oneshot::Receiver<Grant>),
}

enum Withdrawal {
    /// Still queued; now removed.
    Removed,
    /// The lock was handed to this waiter.
    Granted,
    /// Neither queued nor holding (the session ended).
    Gone,
}

/// A queued waiter's claim; dropping it while armed withdraws the waiter, and passes the
/// lock on if a grant raced the cancellation.
struct WaitTicket {
    server: Arc<ServerInner>,
    key: LockKey,
    id: u64,
    armed: bool,
}

impl WaitTicket {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Withdrawal::Granted = self.server.withdraw(&self.key, self.id) {
            self.server.release(&self.key, self.id);
        }
    }
}

impl ServerInner {
    fn new(name: Option<String>) -> Self {
        ServerInner {
            name,
            state: Mutex::new(ServerState::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, ServerState> {
        lock(&self.state)
    }

    /// Frees `key` if holder `id` holds it, handing it to the next live waiter.
    fn release(&self, key: &LockKey, id: u64) -> bool {
        let mut state = self.state();
        let ServerState {
            locks, next_token, ..
        } = &mut *state;
        let Some(entry) = locks.get_mut(key) else {
            return false;
        };
        if entry.holder.as_ref().is_none_or(|holder| holder.id != id) {
            return false;
        }
        hand_off(entry, next_token);
        forget_if_idle(locks, key);
        true
    }

    fn withdraw(&self, key: &LockKey, id: u64) -> Withdrawal {
        let mut state = self.state();
        let Some(entry) = state.locks.get_mut(key) else {
            return Withdrawal::Gone;
        };
        if let Some(at) = entry.waiters.iter().position(|waiter| waiter.id == id) {
            entry.waiters.remove(at);
            forget_if_idle(&mut state.locks, key);
            return Withdrawal::Removed;
        }
        match &entry.holder {
            Some(holder) if holder.id == id => Withdrawal::Granted,
            _ => Withdrawal::Gone,
        }
    }

    fn revoke(&self, key: &LockKey) -> Option<FencingToken> {
        let mut state = self.state();
        let ServerState {
            locks, next_token, ..
        } = &mut *state;
        let entry = locks.get_mut(key)?;
        let holder = entry.holder.as_ref()?;
        let token = holder.token;
        holder.notifier.fire(LossReason::Revoked);
        tracing::debug!(lock = %key.1, %token, "memory: holder revoked");
        hand_off(entry, next_token);
        forget_if_idle(locks, key);
        Some(token)
    }

    fn end_session(&self, session: u64) {
        let mut state = self.state();
        if !state.live_sessions.remove(&session) {
            return;
        }
        let ServerState {
            locks, next_token, ..
        } = &mut *state;
        // Waiters first, so that a freed lock is never handed to the dying session.
        for entry in locks.values_mut() {
            entry.waiters.retain(|waiter| waiter.session != session);
            if let Some(holder) = &entry.holder
                && holder.session == session
            {
                holder.notifier.fire(LossReason::SessionExpired);
                hand_off(entry, next_token);
            }
        }
        locks.retain(|_, entry| !entry.is_idle());
        tracing::debug!(session, "memory: session ended");
    }
}

impl ServerState {
    fn next_id(&mut self) -> u64 {
        self.ids += 1;
        self.ids
    }
}

impl LockState {
    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.waiters.is_empty()
    }
}

/// Frees the lock and grants it to the first waiter still listening; waiters whose
/// `acquire` was dropped are skipped.
fn hand_off(entry: &mut LockState, next_token: &mut u64) {
    entry.holder = None;
    while let Some(waiter) = entry.waiters.pop_front() {
        let token = bump(next_token);
        let (notifier, lost) = lost_signal();
        let grant = Grant {
            id: waiter.id,
            token,
            lost,
        };
        if waiter.grant.send(grant).is_ok() {
            entry.holder = Some(Holder {
                id: waiter.id,
                session: waiter.session,
                token,
                notifier,
            });
            return;
        }
    }
}

fn forget_if_idle(locks: &mut HashMap<LockKey, LockState>, key: &LockKey) {
    if locks.get(key).is_some_and(LockState::is_idle) {
        locks.remove(key);
    }
}

fn bump(counter: &mut u64) -> FencingToken {
    *counter += 1;
    FencingToken(*counter)
}

fn internal(what: &str) -> LockError {
    LockError::Backend {
        backend: BACKEND,
        name: None,
        message: format!("internal error: {what}"),
        retryable: false,
        source: None,
    }
}

/// The server's state stays consistent at every await-free step, so a panic elsewhere
/// while the mutex was held leaves nothing half-done: recover from poisoning.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
