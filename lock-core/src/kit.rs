//! The backend kit: everything a backend needs besides its own algorithm.
//!
//! A backend writes, for each kind of lock it offers, *one attempt*: take the lock, or give
//! up at a [`Deadline`] with `Ok(None)`, leaving nothing behind. The kit turns that into the
//! public traits ([`MutexAttempt`] into [`DistributedLock`], [`RwAttempt`] into
//! [`DistributedRwLock`], [`SemaphoreAttempt`] into [`DistributedSemaphore`],
//! [`ElectionAttempt`] into [`Election`]): `try_*` is one attempt with a zero deadline, and a wait that comes back empty becomes
//! [`LockError::Timeout`]. Around the attempt the kit gives:
//!
//! - [`SessionOwner`] and [`Closed`]: the provider *is* the session; the session ends when
//!   the last provider handle goes, and lock handles then fail with
//!   [`LockError::SessionExpired`]; [`SessionSlot`] replaces a server-side session that
//!   expired;
//! - [`Cleanup`]: removes a waiter's server-side entry unless the attempt disarms it, so that
//!   a dropped `acquire` leaves nothing behind (the cancel-safety contract);
//! - [`retry_in_background`]: the best-effort clean-up that outlives a dropped future,
//!   retried until it succeeds or its deadline passes;
//! - [`LostSignals`]: the lost signals of a session's guards, fired together when the
//!   session is lost;
//! - [`Wakeups`]: the wake-up and futile wake-up counts of a wait loop, for the herd
//!   measurements;
//! - [`lease_guard`]: for a backend whose grants are leases (a key with an expiry), the
//!   guard, renewed by one timer per session; the backend writes the [`Lease`] (renew,
//!   release);
//! - [`entry_guard`]: for a backend whose grants are entries its session owns (a node, a
//!   key on a session's lease), the guard; the backend writes the [`HeldEntry`] (delete if
//!   still the grant's, clean up in the background) and a watch on the entry
//!   ([`entry_guard_watching`] tells the watch when the guard's own release is under way;
//!   [`entry_guard_signalled`] has no watch per entry, the session's fires the signal, and
//!   [`entry_guard_releasing`] gives that watch the guard's [`Releasing`]);
//! - [`notified_until`]: a wait on a [`Notify`](tokio::sync::Notify) for a condition that
//!   may already hold, without missing a change made between the look and the wait.
//!
//! ```
//! use std::time::Duration;
//! use lock_core::kit::{Closed, MutexAttempt, Wakeups};
//! use lock_core::{async_trait, Deadline, DistributedLock, Guard, LockError, LockName, Metrics};
//!
//! /// A lock whose every attempt finds it busy, polling until the deadline.
//! #[derive(Debug)]
//! struct AlwaysBusy {
//!     name: LockName,
//!     closed: Closed,
//!     metrics: Metrics,
//! }
//!
//! #[async_trait]
//! impl MutexAttempt for AlwaysBusy {
//!     fn name(&self) -> &LockName {
//!         &self.name
//!     }
//!
//!     fn backend(&self) -> &'static str {
//!         "always-busy"
//!     }
//!
//!     async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
//!         self.closed.check(self.backend(), &self.name)?;
//!         let mut wakeups = Wakeups::new(&self.metrics);
//!         loop {
//!             wakeups.busy(); // the try after each wake-up found the lock held
//!             if deadline.is_immediate() || deadline.has_passed() {
//!                 return Ok(None);
//!             }
//!             tokio::time::sleep(deadline.cap(Duration::from_millis(10))).await;
//!             wakeups.woke();
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), LockError> {
//! let lock = AlwaysBusy { name: LockName::new("jobs")?, closed: Closed::new(), metrics: Metrics::new() };
//! assert!(lock.try_acquire().await?.is_none());
//! let waited = lock.acquire(Some(Duration::from_millis(30))).await;
//! assert!(matches!(waited, Err(LockError::Timeout { .. })));
//! assert!(lock.metrics.snapshot().futile_wakeups >= 2);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

mod entry;
mod lease;
mod session_slot;

pub use entry::{
    HeldEntry, Releasing, Removal, RemovalError, entry_guard, entry_guard_releasing,
    entry_guard_signalled, entry_guard_watching,
};
pub use lease::{Lease, Renewal, lease_guard, release_in_background};
/// The earlier name of [`ServerSession`], too close to [`SessionSlot`].
#[deprecated(note = "renamed ServerSession")]
pub use session_slot::ServerSession as SlotSession;
pub use session_slot::{ServerSession, SessionSlot};

/// Checks a semaphore's permit count: at least one, and at most `max` (what the backend's
/// store can count; `u32::MAX` where any count will do). The error names the semaphore.
///
/// ```
/// use lock_core::kit::check_permits;
///
/// assert!(check_permits("example", "jobs", 3, u32::MAX).is_ok());
/// let zero = check_permits("example", "jobs", 0, u32::MAX).unwrap_err();
/// assert_eq!(
///     zero.to_string(),
///     "example: invalid argument: semaphore \"jobs\" needs at least one permit"
/// );
/// let many = check_permits("example", "jobs", 9, 8).unwrap_err();
/// assert!(many.to_string().contains("needs 1 to 8 permits, not 9"));
/// ```
pub fn check_permits(
    backend: &'static str,
    name: &str,
    permits: u32,
    max: u32,
) -> Result<(), LockError> {
    let message = match permits {
        0 if max == u32::MAX => format!("semaphore {name:?} needs at least one permit"),
        0 => format!("semaphore {name:?} needs 1 to {max} permits, not 0"),
        permits if permits > max => {
            format!("semaphore {name:?} needs 1 to {max} permits, not {permits}")
        }
        _ => return Ok(()),
    };
    Err(LockError::InvalidArgument { backend, message })
}

/// Locks `mutex` whether or not a panic poisoned it: for mutexes over values that every
/// holder leaves whole (no await, no half-made update while held), as a backend's bookkeeping
/// is.
///
/// ```
/// use std::sync::Mutex;
/// use lock_core::kit::unpoisoned;
///
/// let count = Mutex::new(0);
/// *unpoisoned(&count) += 1;
/// assert_eq!(*unpoisoned(&count), 1);
/// ```
pub fn unpoisoned<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits until `ready` gives a value, woken by `notify`, which whoever changes what `ready`
/// looks at must call `notify_waiters` on after the change. The waiter registers before
/// it looks, so that a change made after the look still wakes it.
///
/// Cancel safety: cancel-safe, it only waits.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use lock_core::kit::notified_until;
/// use tokio::sync::Notify;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (done, changed) = (AtomicBool::new(false), Notify::new());
/// let waiting = notified_until(&changed, || done.load(Ordering::Acquire).then_some(()));
/// let setting = async {
///     done.store(true, Ordering::Release);
///     changed.notify_waiters();
/// };
/// tokio::join!(waiting, setting);
/// # }
/// ```
pub async fn notified_until<T>(notify: &tokio::sync::Notify, ready: impl Fn() -> Option<T>) -> T {
    loop {
        let changed = notify.notified();
        let mut changed = std::pin::pin!(changed);
        changed.as_mut().enable();
        if let Some(value) = ready() {
            return value;
        }
        changed.await;
    }
}

use crate::election::{LeaderSource, check_value, follow};
use crate::queue::LockQueue;
use crate::{
    Deadline, DistributedLock, DistributedRwLock, DistributedSemaphore, Election, Guard,
    LeaderInfo, LeaderWatch, Leadership, LockError, LockName, LossReason, LostNotifier, Metrics,
};

/// One attempt at a mutex: what a backend writes; the kit derives [`DistributedLock`].
///
/// The attempt takes the lock, or gives up at `deadline` with `Ok(None)` and leaves nothing
/// behind. A `deadline` that [`is_immediate`](Deadline::is_immediate) asks for a single try
/// that never waits for a holder. The attempt must be cancel-safe as
/// [`DistributedLock::acquire`] describes ([`Cleanup`] helps).
#[async_trait]
pub trait MutexAttempt: Send + Sync + fmt::Debug {
    /// The lock's name.
    fn name(&self) -> &LockName;

    /// The backend's name, as in [`LockError`] messages.
    fn backend(&self) -> &'static str;

    /// Takes the lock, or gives up at `deadline` with `Ok(None)`.
    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError>;

    /// Who holds the lock and who waits: [`DistributedLock::queue`]. Unsupported unless
    /// the backend lists its contenders.
    async fn queue(&self) -> Result<LockQueue, LockError> {
        Err(LockError::Unsupported {
            backend: self.backend(),
            what: "listing a lock's contenders".into(),
        })
    }
}

#[async_trait]
impl<T: MutexAttempt> DistributedLock for T {
    fn name(&self) -> &LockName {
        MutexAttempt::name(self)
    }

    async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
        self.attempt(Deadline::after(Some(Duration::ZERO))).await
    }

    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        let granted = self.attempt(Deadline::after(timeout)).await?;
        granted_or_timed_out(self, timeout)(granted)
    }

    async fn queue(&self) -> Result<LockQueue, LockError> {
        MutexAttempt::queue(self).await
    }
}

/// What an `acquire` of `lock` with `timeout` answers for its attempt's result: the guard,
/// or, when the attempt gave up at the deadline, the timeout error.
pub(crate) fn granted_or_timed_out<T: MutexAttempt + ?Sized>(
    lock: &T,
    timeout: Option<Duration>,
) -> impl FnOnce(Option<Guard>) -> Result<Guard, LockError> + Send + Unpin + '_ {
    move |granted| {
        granted
            .ok_or_else(|| LockError::timed_out(lock.backend(), MutexAttempt::name(lock), timeout))
    }
}

/// Which side of a read-write lock an attempt is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwSide {
    /// A read hold, shared with other readers.
    Read,
    /// The write hold, exclusive.
    Write,
}

/// One attempt at either side of a read-write lock; the kit derives [`DistributedRwLock`].
///
/// As [`MutexAttempt::attempt`], for a read or a write hold.
#[async_trait]
pub trait RwAttempt: Send + Sync + fmt::Debug {
    /// The lock's name.
    fn name(&self) -> &LockName;

    /// The backend's name, as in [`LockError`] messages.
    fn backend(&self) -> &'static str;

    /// Takes a hold on `side`, or gives up at `deadline` with `Ok(None)`.
    async fn attempt(&self, side: RwSide, deadline: Deadline) -> Result<Option<Guard>, LockError>;
}

#[async_trait]
impl<T: RwAttempt> DistributedRwLock for T {
    fn name(&self) -> &LockName {
        RwAttempt::name(self)
    }

    async fn try_read(&self) -> Result<Option<Guard>, LockError> {
        self.attempt(RwSide::Read, Deadline::after(Some(Duration::ZERO)))
            .await
    }

    async fn read(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        self.attempt(RwSide::Read, Deadline::after(timeout))
            .await?
            .ok_or_else(|| LockError::timed_out(self.backend(), RwAttempt::name(self), timeout))
    }

    async fn try_write(&self) -> Result<Option<Guard>, LockError> {
        self.attempt(RwSide::Write, Deadline::after(Some(Duration::ZERO)))
            .await
    }

    async fn write(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        self.attempt(RwSide::Write, Deadline::after(timeout))
            .await?
            .ok_or_else(|| LockError::timed_out(self.backend(), RwAttempt::name(self), timeout))
    }
}

/// One attempt at a semaphore's permit; the kit derives [`DistributedSemaphore`].
///
/// As [`MutexAttempt::attempt`], for one permit.
#[async_trait]
pub trait SemaphoreAttempt: Send + Sync + fmt::Debug {
    /// The semaphore's name.
    fn name(&self) -> &LockName;

    /// The backend's name, as in [`LockError`] messages.
    fn backend(&self) -> &'static str;

    /// How many permits the semaphore has.
    fn permits(&self) -> u32;

    /// Takes a permit, or gives up at `deadline` with `Ok(None)`.
    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError>;
}

/// One campaign of a leader election: what a backend writes, with a [`LeaderSource`] to
/// read and follow the leader; the kit derives [`Election`].
///
/// As [`MutexAttempt::attempt`]: the candidate's entry carries `value`, and the guard's
/// fencing token is the leader's term. The kit checks the value's length
/// ([`MAX_LEADER_VALUE_LEN`](crate::MAX_LEADER_VALUE_LEN)) before the attempt.
#[async_trait]
pub trait ElectionAttempt: LeaderSource + fmt::Debug {
    /// The election's name.
    fn name(&self) -> &LockName;

    /// The backend's name, as in [`LockError`] messages.
    fn backend(&self) -> &'static str;

    /// Becomes leader with `value`, or gives up at `deadline` with `Ok(None)`.
    async fn attempt(&self, value: &[u8], deadline: Deadline) -> Result<Option<Guard>, LockError>;
}

#[async_trait]
impl<T: ElectionAttempt> Election for T {
    fn name(&self) -> &LockName {
        ElectionAttempt::name(self)
    }

    async fn campaign(
        &self,
        value: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Leadership, LockError> {
        let name = ElectionAttempt::name(self);
        check_value(self.backend(), name, value)?;
        let guard = self
            .attempt(value, Deadline::after(timeout))
            .await?
            .ok_or_else(|| LockError::timed_out(self.backend(), name, timeout))?;
        Ok(Leadership::new(guard, value))
    }

    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        LeaderSource::leader(self).await
    }

    async fn observe(self: Arc<Self>) -> Result<LeaderWatch, LockError> {
        let (backend, name) = (self.backend(), ElectionAttempt::name(&*self).clone());
        follow(self, backend, &name).await
    }
}

#[async_trait]
impl<T: SemaphoreAttempt> DistributedSemaphore for T {
    fn name(&self) -> &LockName {
        SemaphoreAttempt::name(self)
    }

    fn permits(&self) -> u32 {
        SemaphoreAttempt::permits(self)
    }

    async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
        self.attempt(Deadline::after(Some(Duration::ZERO))).await
    }

    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        self.attempt(Deadline::after(timeout))
            .await?
            .ok_or_else(|| {
                LockError::timed_out(self.backend(), SemaphoreAttempt::name(self), timeout)
            })
    }
}

/// Whether a provider's session is over: set once, never cleared, awaitable.
///
/// ```
/// use lock_core::{kit::Closed, LockError, LockName};
///
/// let closed = Closed::new();
/// let name = LockName::new("jobs")?;
/// assert!(closed.check("demo", &name).is_ok());
/// closed.close();
/// assert!(matches!(closed.check("demo", &name), Err(LockError::SessionExpired { .. })));
/// # Ok::<(), LockError>(())
/// ```
#[derive(Debug)]
pub struct Closed {
    ended: watch::Sender<bool>,
    /// The renewals of the session's leases, made with the first lease.
    renewals: OnceLock<Arc<lease::Renewals>>,
}

impl Closed {
    /// Open.
    pub fn new() -> Self {
        Closed {
            ended: watch::channel(false).0,
            renewals: OnceLock::new(),
        }
    }

    /// Marks the session over and wakes every [`wait`](Closed::wait). Returns whether this
    /// call closed it (false if it was closed already).
    pub fn close(&self) -> bool {
        !self.ended.send_replace(true)
    }

    /// Whether the session is over.
    pub fn is_closed(&self) -> bool {
        *self.ended.borrow()
    }

    /// Completes once the session is over.
    ///
    /// Cancel safety: cancel-safe, it only waits.
    pub async fn wait(&self) {
        let mut closed = self.ended.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
    }

    fn subscribe(&self) -> watch::Receiver<bool> {
        self.ended.subscribe()
    }

    fn renewals(&self) -> &Arc<lease::Renewals> {
        self.renewals.get_or_init(Arc::default)
    }

    /// [`LockError::SessionExpired`] for the lock `name` once the session is over: the
    /// answer of a lock handle that outlived its provider.
    ///
    /// # Errors
    ///
    /// As above.
    pub fn check(&self, backend: &'static str, name: &LockName) -> Result<(), LockError> {
        if self.is_closed() {
            return Err(LockError::SessionExpired {
                backend,
                name: Some(name.as_str().to_owned()),
            });
        }
        Ok(())
    }
}

impl Default for Closed {
    fn default() -> Self {
        Self::new()
    }
}

/// Ends a provider's session when the last provider handle goes.
///
/// A provider keeps one clone in each of its handles, and lock handles and guards keep
/// none: so that a forgotten guard cannot keep a session (and its locks) alive. Dropping the
/// last clone runs the backend's `end` (close the connection, mark [`Closed`], fire the
/// guards' lost signals) once.
///
/// ```
/// use std::sync::Arc;
/// use lock_core::kit::{Closed, SessionOwner};
///
/// let closed = Arc::new(Closed::new());
/// let owner = SessionOwner::new({
///     let closed = Arc::clone(&closed);
///     move || {
///         closed.close();
///     }
/// });
/// let clone = owner.clone();
/// drop(owner);
/// assert!(!closed.is_closed());
/// drop(clone);
/// assert!(closed.is_closed());
/// ```
#[derive(Clone)]
pub struct SessionOwner(Arc<EndOnDrop>);

struct EndOnDrop(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Some(end) = self.0.take() {
            end();
        }
    }
}

impl SessionOwner {
    /// An owner that runs `end` when its last clone is dropped.
    pub fn new(end: impl FnOnce() + Send + Sync + 'static) -> Self {
        SessionOwner(Arc::new(EndOnDrop(Some(Box::new(end)))))
    }
}

impl fmt::Debug for SessionOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionOwner")
            .field("handles", &Arc::strong_count(&self.0))
            .finish()
    }
}

/// What a [`Cleanup`] does with an entry that nobody will use: start its removal, without
/// blocking (typically [`retry_in_background`]).
pub trait Abandon: Send + 'static {
    /// Starts removing the entry. Must not block, panic or print.
    fn abandon(self);
}

/// A server-side entry that is removed unless the attempt disarms it.
///
/// Arm it before the first request that may create the entry (a queued node, a queue slot,
/// a vote); disarm it once the entry became a grant or was removed. Dropped while armed (the
/// attempt's future was dropped, or it returned an error) it hands the entry to
/// [`Abandon::abandon`].
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use lock_core::kit::{Abandon, Cleanup};
///
/// struct Slot(Arc<Mutex<Vec<&'static str>>>);
/// impl Abandon for Slot {
///     fn abandon(self) {
///         self.0.lock().unwrap().push("removed");
///     }
/// }
///
/// let log = Arc::new(Mutex::new(Vec::new()));
/// drop(Cleanup::new(Slot(Arc::clone(&log))));
/// let mut granted = Cleanup::new(Slot(Arc::clone(&log)));
/// granted.disarm();
/// drop(granted);
/// assert_eq!(*log.lock().unwrap(), ["removed"]);
/// ```
pub struct Cleanup<E: Abandon>(Option<E>);

impl<E: Abandon> Cleanup<E> {
    /// Armed over `entry`.
    pub fn new(entry: E) -> Self {
        Cleanup(Some(entry))
    }

    /// The entry, while armed.
    pub fn entry(&self) -> Option<&E> {
        self.0.as_ref()
    }

    /// The entry, while armed, to update (a node's name once its create is confirmed).
    pub fn entry_mut(&mut self) -> Option<&mut E> {
        self.0.as_mut()
    }

    /// Leaves the entry alone from now on, and hands it back.
    pub fn disarm(&mut self) -> Option<E> {
        self.0.take()
    }
}

impl<E: Abandon> Drop for Cleanup<E> {
    fn drop(&mut self) {
        if let Some(entry) = self.0.take() {
            entry.abandon();
        }
    }
}

impl<E: Abandon + fmt::Debug> fmt::Debug for Cleanup<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Cleanup").field(&self.0).finish()
    }
}

/// What one try of a background job came to.
#[derive(Debug)]
pub enum Retry {
    /// Done, or nothing left to do (the session is over, the entry is gone).
    Done,
    /// Failed in a way that may pass (a connection error): try again after the pause.
    Again(String),
    /// Failed for good: give up, and say why.
    GiveUp(String),
}

/// Runs `job` on the current Tokio runtime, again every `pause` while it answers
/// [`Retry::Again`] and `give_up` has not passed. Failures are logged at debug level; without
/// a runtime (a guard dropped outside one) nothing runs, and the session or lease is the
/// backstop. Never blocks, panics or prints: fit for `Drop`.
///
/// `what` names the job in the logs ("clean-up of lock jobs").
pub fn retry_in_background<F, Fut>(
    backend: &'static str,
    what: String,
    pause: Duration,
    give_up: Deadline,
    mut job: F,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Retry> + Send + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(
            backend,
            what,
            "no runtime to run it on; the session or lease will see to it"
        );
        return;
    };
    runtime.spawn(async move {
        loop {
            match job().await {
                Retry::Done => return,
                Retry::Again(error) if !give_up.has_passed() => {
                    tracing::debug!(backend, what, error, "failed; retrying");
                    tokio::time::sleep(pause).await;
                }
                Retry::Again(error) | Retry::GiveUp(error) => {
                    tracing::debug!(
                        backend,
                        what,
                        error,
                        "abandoned; the session or lease will see to it"
                    );
                    return;
                }
            }
        }
    });
}

/// The lost signals of the guards that hang on one session: when the session is lost, each
/// fires once.
///
/// A guard registers its [`LostNotifier`] when it is granted and unregisters it when it is
/// released. To have no guard miss its loss, mark the session over before
/// [`fire_all`](LostSignals::fire_all), and check it after
/// [`register`](LostSignals::register): a guard registered after the firing finds the
/// session over.
///
/// ```
/// use lock_core::kit::LostSignals;
/// use lock_core::{lost_signal, LossReason};
///
/// let guards = LostSignals::new();
/// let (notifier, lost) = lost_signal();
/// let (released, kept) = lost_signal();
/// guards.register(notifier);
/// let id = guards.register(released);
/// guards.unregister(id);
/// assert_eq!(guards.fire_all(&LossReason::SessionExpired), 1);
/// assert!(lost.is_lost() && !kept.is_lost());
/// ```
#[derive(Debug, Default)]
pub struct LostSignals(Mutex<Registered>);

#[derive(Debug, Default)]
struct Registered {
    notifiers: HashMap<u64, LostNotifier>,
    next: u64,
}

impl LostSignals {
    /// None registered.
    pub fn new() -> Self {
        Self::default()
    }

    fn registered(&self) -> std::sync::MutexGuard<'_, Registered> {
        unpoisoned(&self.0)
    }

    /// Registers a granted guard's notifier; the id unregisters it.
    pub fn register(&self, notifier: LostNotifier) -> u64 {
        let mut registered = self.registered();
        let id = registered.next;
        registered.next += 1;
        registered.notifiers.insert(id, notifier);
        id
    }

    /// Forgets a released guard's notifier.
    pub fn unregister(&self, id: u64) {
        self.registered().notifiers.remove(&id);
    }

    /// Whether no guard is registered.
    pub fn is_empty(&self) -> bool {
        self.registered().notifiers.is_empty()
    }

    /// Fires every registered notifier with `reason` and forgets them; how many there were.
    pub fn fire_all(&self, reason: &LossReason) -> usize {
        let fired: Vec<_> = self.registered().notifiers.drain().collect();
        for (_, notifier) in &fired {
            notifier.fire(reason.clone());
        }
        fired.len()
    }
}

/// The wake-up bookkeeping of one wait loop: every wake-up is counted, and a wake-up after
/// which the lock was still busy is counted as futile (the herd measurements compare the
/// two).
///
/// Call [`woke`](Wakeups::woke) when the waiter wakes (a watch event, a message, a poll
/// timer), and [`busy`](Wakeups::busy) when an attempt finds the lock held.
#[derive(Debug)]
pub struct Wakeups<'m> {
    metrics: &'m Metrics,
    woken: bool,
}

impl<'m> Wakeups<'m> {
    /// Counting into `metrics`; nothing counted yet.
    pub fn new(metrics: &'m Metrics) -> Self {
        Wakeups {
            metrics,
            woken: false,
        }
    }

    /// The waiter woke up.
    pub fn woke(&mut self) {
        self.metrics.record_wakeup();
        self.woken = true;
    }

    /// The attempt found the lock held: the last wake-up, if any, was futile.
    pub fn busy(&mut self) {
        if std::mem::take(&mut self.woken) {
            self.metrics.record_futile_wakeup();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn background_retries_stop_at_the_deadline() {
        let tries = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::clone(&tries);
        retry_in_background(
            "test",
            "job".into(),
            Duration::from_millis(100),
            Deadline::after(Some(Duration::from_millis(450))),
            move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Retry::Again("down".into()) }
            },
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        // At 0, 100, 200, 300, 400 and 500 ms; the one at 500 finds the deadline passed.
        assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn done_stops_at_once_and_no_runtime_runs_nothing() {
        let tries = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::clone(&tries);
        retry_in_background(
            "test",
            "job".into(),
            Duration::ZERO,
            Deadline::after(None),
            move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Retry::Done }
            },
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 1);
        std::thread::spawn(|| {
            retry_in_background(
                "test",
                "job".into(),
                Duration::ZERO,
                Deadline::after(None),
                || async { Retry::Done },
            );
        })
        .join()
        .expect("no panic without a runtime");
    }

    #[test]
    fn futile_only_after_a_wakeup() {
        let metrics = Metrics::new();
        let mut wakeups = Wakeups::new(&metrics);
        wakeups.busy();
        wakeups.woke();
        wakeups.busy();
        wakeups.busy();
        wakeups.woke();
        let counted = metrics.snapshot();
        assert_eq!((counted.wakeups, counted.futile_wakeups), (2, 1));
    }

    #[test]
    fn the_session_ends_once_with_the_last_owner() {
        let ends = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let owner = SessionOwner::new({
            let ends = Arc::clone(&ends);
            move || {
                ends.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let clones = vec![owner.clone(), owner.clone()];
        drop(owner);
        drop(clones);
        assert_eq!(ends.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
