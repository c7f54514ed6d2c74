//! The distlock contract.
//!
//! `lock-core` is the small, stable crate that every distlock backend and every
//! application depends on. It defines:
//!
//! - [`LockProvider`], which hands out named locks, and [`DistributedLock`], the lock itself
//!   (both object-safe: `Arc<dyn LockProvider>` is what the `distlock` facade returns);
//! - [`Guard`], the one concrete type for a held lock, built by backends over the
//!   [`GuardBackend`] SPI, with its [`FencingToken`] and [`LostSignal`];
//! - [`Election`], a leader election over the same machinery: [`Leadership`] wraps the
//!   guard of the won election, its term the guard's fencing token; [`LeaderWatch`] follows
//!   the leader;
//! - [`multi::MultiLock`], several locks of any providers taken all or none, in one order
//!   by name (deadlock-free), under one timeout;
//! - [`Capabilities`], what a provider promises; [`LockError`], everything that goes wrong;
//!   [`LockName`], the naming rules; [`MetricsSnapshot`], the herd counters;
//! - with the `memory` feature, [`memory`], the in-memory reference backend: the full
//!   contract inside one process, for applications' own tests.
//!
//! # Using a lock
//!
//! ```
//! use std::time::Duration;
//! use lock_core::{LockError, LockProvider};
//!
//! async fn nightly_report(locks: &dyn LockProvider) -> Result<(), LockError> {
//!     let lock = locks.lock("reports/nightly")?;
//!     let Some(mut guard) = lock.try_acquire().await? else {
//!         return Ok(()); // another instance is on it
//!     };
//!     // ... write the report, passing guard.fencing_token() to the store ...
//!     guard.release().await
//! }
//!
//! async fn with_patience(locks: &dyn LockProvider) -> Result<(), LockError> {
//!     let lock = locks.lock("migrations")?;
//!     let mut guard = lock.acquire(Some(Duration::from_secs(30))).await?;
//!     guard.release().await
//! }
//! ```
//!
//! # Not re-entrant
//!
//! Locks are not re-entrant: a second `acquire` of a name that the same provider (even the
//! same task) already holds queues behind the first guard like any other contender, and
//! `try_acquire` returns `Ok(None)`. A task that re-acquires what it holds deadlocks until
//! its timeout.
//!
//! # Writing a backend
//!
//! Implement [`LockProvider`]; for each kind of lock, one attempt that takes it or gives up
//! at a deadline ([`kit::MutexAttempt`], [`kit::RwAttempt`], [`kit::SemaphoreAttempt`],
//! [`kit::ElectionAttempt`] with an [`election::LeaderSource`]: the [`kit`] derives
//! [`DistributedLock`] and the others from it); and a [`GuardBackend`] per
//! grant. Make a [`LostNotifier`]/[`LostSignal`] pair per grant with [`lost_signal`], count
//! with [`Metrics`], and map names with [`LockName::escaped`] ([`LockName::escaped_within`]
//! where keys or file names are limited in length). The [`kit`] also ends the session with
//! the last provider handle, cleans up after dropped attempts and counts wake-ups. The
//! traits' async methods are written with [`async_trait`](macro@async_trait) (re-exported
//! here). Then run the `lock-conformance` suite against it.
//!
//! # Words
//!
//! One word per concept, in every crate of the workspace, its docs and its errors:
//!
//! - **provider**: a [`LockProvider`], standing for one process; it *is* the **session**
//!   (a ZooKeeper session, an etcd lease, a Redis connection's lifetime): when the session
//!   ends, every lock it held is lost and every wait it made fails.
//! - **contender**: one acquisition in progress or granted; a **waiter** until its grant,
//!   then the **holder**. A contender that gave up (a timeout, a dropped future) is
//!   **abandoned**: what it left is cleaned up in the background.
//! - **queue**: the contenders of one lock on the server, in arrival order (ZooKeeper's
//!   sequential nodes, etcd's keys by create revision, Redis's waiter list); a contender's
//!   **place** is its entry there, and a place is **gone** when someone else deletes it.
//!   [`DistributedLock::queue`] lists a lock's queue as a [`queue::LockQueue`].
//! - **blocker**: the one earlier contender whose departure can let a waiter in (its
//!   predecessor, or for a reader the nearest earlier writer). The herd-free strategies
//!   watch the blocker only; the herd strategies (`WholeQueue` on ZooKeeper and etcd,
//!   where every waiter watches the whole queue; their `SingleNode` and `Single`; Redis's
//!   `PubSub`) wake every waiter on every release, and polling waiters look on a timer.
//! - **grant**: the server's decision that a contender holds; the [`Guard`] stands for it.
//!   A **hand-off** is a release that grants the next waiter; a **wake-up** is a waiter
//!   woken to look, **futile** when it finds the lock still held.
//! - **entry**: what a held grant keeps on the server (a node, a key, an owner key), which
//!   release deletes if it is still the grant's ([`kit::HeldEntry`]).
//! - **lease**: a grant that lasts a time unless renewed ([`kit::Lease`]); its
//!   [`Guard::valid_until`] says until when.
//! - **fencing token**: a number that grows with every grant ([`FencingToken`]), to be
//!   checked by the store the holder writes to.
//! - **lost**: a grant the backend no longer vouches for ([`LostSignal`]), told apart by
//!   [`LossReason`].
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The attribute the traits are written with, re-exported so that a backend implements them
/// with `#[lock_core::async_trait]` and needs no dependency of its own on `async-trait`.
pub use async_trait::async_trait;

pub mod capabilities;
pub mod deadline;
pub mod election;
pub mod error;
pub mod fencing;
pub mod guard;
pub mod kit;
pub mod lost;
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub mod memory;
pub mod metrics;
pub mod multi;
pub mod name;
pub mod observe;
pub mod queue;
pub mod url;

pub use capabilities::{Capabilities, Fencing, WaitKind};
pub use deadline::Deadline;
pub use election::{Election, LeaderInfo, LeaderWatch, Leadership, MAX_LEADER_VALUE_LEN};
pub use error::{BoxError, LockError};
pub use fencing::FencingToken;
pub use guard::{Guard, GuardBackend};
pub use lost::{LossReason, LostNotifier, LostSignal, lost_signal};
pub use metrics::{Metrics, MetricsSnapshot};
pub use name::{LockName, MAX_NAME_LEN, MIN_SHORTENED_LEN, NameError};

/// A source of named distributed locks: one client of one backend.
///
/// A provider stands for one client process: one ZooKeeper session, one set of Redis
/// connections, one in-memory client. Two providers are two independent contenders even
/// inside one process. Locks handed out by one provider share its session.
///
/// # Lifetime
///
/// The provider *is* the session. Dropping the last handle to it (the last clone of the
/// `Arc<dyn LockProvider>`) closes the session, even while lock handles and guards from it
/// still exist: its locks are freed (within the crash-release bound), its guards report
/// the loss on their [lost signal](Guard::lost), and calls on its lock handles fail with
/// [`LockError::SessionExpired`]. Lock handles and guards never keep the session alive —
/// that way a forgotten guard cannot hold a lock forever. Keep the provider for as long as
/// you use its locks.
///
/// Object-safe: use it as `Arc<dyn LockProvider>`.
pub trait LockProvider: Send + Sync + fmt::Debug {
    /// The backend's name, e.g. `"zookeeper"`, `"redis"`, `"memory"`.
    fn backend(&self) -> &'static str;

    /// What this provider promises; the conformance suite gates its cases on it.
    fn capabilities(&self) -> Capabilities;

    /// The lock called `name`. Cheap and local: nothing is sent to the server until the
    /// lock is acquired.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] if `name` breaks the [naming rules](LockName).
    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError>;

    /// This provider's herd counters (wake-ups, futile wake-ups, server round trips, grants)
    /// since it was created.
    fn metrics(&self) -> MetricsSnapshot;

    /// The read-write lock called `name`, if the backend offers them
    /// ([`Capabilities::reader_writer`]). Read-write locks live apart from mutexes: the
    /// mutex `"x"` and the read-write lock `"x"` are different locks.
    ///
    /// # Errors
    ///
    /// [`LockError::Unsupported`] when the backend has no read-write locks (the default);
    /// [`LockError::InvalidName`] for a bad name.
    fn rw_lock(&self, name: &str) -> Result<Arc<dyn DistributedRwLock>, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.backend(),
            what: "read-write locks".into(),
        })
    }

    /// The counting semaphore called `name` with `permits` permits, if the backend offers
    /// them ([`Capabilities::semaphore`]). Every client of one semaphore must use the same
    /// number of permits.
    ///
    /// # Errors
    ///
    /// [`LockError::Unsupported`] when the backend has no semaphores (the default);
    /// [`LockError::InvalidArgument`] for zero permits; [`LockError::InvalidName`] for a bad
    /// name.
    fn semaphore(
        &self,
        name: &str,
        permits: u32,
    ) -> Result<Arc<dyn DistributedSemaphore>, LockError> {
        let _ = (name, permits);
        Err(LockError::Unsupported {
            backend: self.backend(),
            what: "semaphores".into(),
        })
    }

    /// The leader election called `name`, if the backend offers them
    /// ([`Capabilities::elections`]). Elections live apart from locks: the election `"x"`
    /// and the mutex `"x"` are different.
    ///
    /// ```
    /// # async fn demo(provider: &dyn lock_core::LockProvider) -> Result<(), lock_core::LockError> {
    /// let election = provider.election("billing/worker")?;
    /// if let Some(leader) = election.leader().await? {
    ///     println!("{} leads in term {}", leader.value_lossy(), leader.term);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Unsupported`] when the backend has no elections (the default);
    /// [`LockError::InvalidName`] for a bad name.
    fn election(&self, name: &str) -> Result<Arc<dyn Election>, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.backend(),
            what: "leader elections".into(),
        })
    }
}

/// A named mutual-exclusion lock shared by every client of the same backend.
///
/// Object-safe: use it as `Arc<dyn DistributedLock>`. At most one [`Guard`] for a name is
/// live across all clients at any time, as far as the backend can vouch (see
/// [`Guard::lost`]).
///
/// Not re-entrant: see the [crate docs](crate#not-re-entrant).
#[async_trait]
pub trait DistributedLock: Send + Sync + fmt::Debug {
    /// The lock's name.
    fn name(&self) -> &LockName;

    /// Makes exactly one attempt to take the lock and never waits for a holder.
    ///
    /// Returns `Ok(Some(guard))` when the lock was free, `Ok(None)` when another holder has
    /// it (busy is not an error). It may still wait for the server's reply.
    ///
    /// # Cancel safety
    ///
    /// As for [`acquire`](DistributedLock::acquire).
    ///
    /// # Errors
    ///
    /// Connection, authentication and backend errors; never [`LockError::Timeout`].
    async fn try_acquire(&self) -> Result<Option<Guard>, LockError>;

    /// Waits until this caller holds the lock, or until `timeout` has passed.
    ///
    /// `None` waits without limit. `Some(Duration::ZERO)` makes one attempt like
    /// [`try_acquire`](DistributedLock::try_acquire) and fails with
    /// [`LockError::Timeout`] at once when the lock is busy. Timeouts too large for the clock
    /// (up to `Duration::MAX`) wait without limit. On timeout, the error comes no earlier
    /// than `timeout` after the call and not much later, and no waiter entry is left behind.
    ///
    /// Backends that declare [`Capabilities::fifo`] grant waiters in the order their
    /// `acquire` calls reached the server.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel-safe in the following sense. If the returned future is dropped
    /// before it completes, at any await point:
    ///
    /// 1. nothing is held on the caller's behalf: if the server granted the lock before it
    ///    learned of the cancellation, the grant is released (passed to the next waiter) as
    ///    if its guard had been dropped;
    /// 2. no waiter entry remains (no ZooKeeper node, no Redis queue entry, no in-memory
    ///    queue slot): it is removed at once where the backend can do so synchronously, and
    ///    otherwise by a background task that retries until it succeeds or the client's
    ///    session ends;
    /// 3. the next contender is not delayed: a cancelled waiter ahead of it in the queue is
    ///    skipped as soon as the server removes its entry.
    ///
    /// Dropping the future therefore has the same observable outcome as a timeout, except
    /// that clean-up may finish after the drop returns. A backend that cannot give these
    /// guarantees fails the conformance suite.
    ///
    /// # Errors
    ///
    /// [`LockError::Timeout`] when the timeout passes; [`LockError::SessionExpired`] when the
    /// client's session ends while waiting (the waiter never wins later); connection,
    /// authentication and backend errors.
    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError>;

    /// Who holds this lock and who waits for it, as the server shows it now (one look, no
    /// entry made): what `distlock holders` prints, the same for every backend.
    ///
    /// ```
    /// # async fn demo(lock: &dyn lock_core::DistributedLock) -> Result<(), lock_core::LockError> {
    /// let queue = lock.queue().await?;
    /// if let Some(holder) = queue.holder() {
    ///     println!("held ({:?}), {} waiting", holder.fencing_token, queue.waiters().count());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Unsupported`] where the backend cannot list its contenders (the
    /// default); connection and backend errors.
    async fn queue(&self) -> Result<queue::LockQueue, LockError> {
        Err(LockError::Unsupported {
            backend: "this backend",
            what: "listing a lock's contenders".into(),
        })
    }
}

/// A named read-write lock: readers share it, a writer excludes everyone.
///
/// Fair: a waiting writer blocks readers that arrive after it (writers do not starve), and
/// the readers queued behind one writer all enter together when it leaves. Guards are the
/// same [`Guard`] type as for mutexes, with fencing tokens and lost signals; the timeout,
/// cancel-safety and release contracts of [`DistributedLock::acquire`] and [`Guard`] apply
/// to both sides unchanged. Not re-entrant, and no upgrade from read to write.
#[async_trait]
pub trait DistributedRwLock: Send + Sync + fmt::Debug {
    /// The lock's name.
    fn name(&self) -> &LockName;

    /// One attempt at a read hold; `Ok(None)` when a writer holds or waits.
    async fn try_read(&self) -> Result<Option<Guard>, LockError>;

    /// Waits for a read hold, as [`DistributedLock::acquire`] waits for the lock.
    async fn read(&self, timeout: Option<Duration>) -> Result<Guard, LockError>;

    /// One attempt at the write hold; `Ok(None)` when anyone holds or waits.
    async fn try_write(&self) -> Result<Option<Guard>, LockError>;

    /// Waits for the write hold, as [`DistributedLock::acquire`] waits for the lock.
    async fn write(&self, timeout: Option<Duration>) -> Result<Guard, LockError>;

    /// The write side as a plain [`DistributedLock`], like Curator's `writeLock()`.
    fn write_lock(self: Arc<Self>) -> Arc<dyn DistributedLock>
    where
        Self: 'static,
    {
        Arc::new(adapters::WriteSide(self))
    }
}

/// A named counting semaphore: at most `permits` holders at once.
///
/// Each permit is a [`Guard`] with its own fencing token and lost signal; the timeout,
/// cancel-safety and release contracts of [`DistributedLock::acquire`] and [`Guard`] apply
/// unchanged.
#[async_trait]
pub trait DistributedSemaphore: Send + Sync + fmt::Debug {
    /// The semaphore's name.
    fn name(&self) -> &LockName;

    /// How many permits the semaphore has.
    fn permits(&self) -> u32;

    /// One attempt at a permit; `Ok(None)` when all are taken or others wait.
    async fn try_acquire(&self) -> Result<Option<Guard>, LockError>;

    /// Waits for a permit, as [`DistributedLock::acquire`] waits for the lock.
    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError>;

    /// A one-permit semaphore as a plain [`DistributedLock`].
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidArgument`] when the semaphore has more than one permit.
    fn as_lock(self: Arc<Self>) -> Result<Arc<dyn DistributedLock>, LockError>
    where
        Self: 'static,
    {
        if self.permits() != 1 {
            return Err(LockError::InvalidArgument {
                backend: "semaphore",
                message: format!(
                    "semaphore {:?} has {} permits; only a one-permit semaphore is a lock",
                    self.name().as_str(),
                    self.permits()
                ),
            });
        }
        Ok(Arc::new(adapters::OnePermit(self)))
    }
}

/// Plain-lock views of the other lock kinds.
mod adapters {
    use super::*;

    /// The write side of a read-write lock.
    pub(super) struct WriteSide<L: ?Sized>(pub(super) Arc<L>);

    /// A one-permit semaphore.
    pub(super) struct OnePermit<S: ?Sized>(pub(super) Arc<S>);

    impl<L: DistributedRwLock + ?Sized> fmt::Debug for WriteSide<L> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_tuple("WriteSide").field(&self.0).finish()
        }
    }

    impl<S: DistributedSemaphore + ?Sized> fmt::Debug for OnePermit<S> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_tuple("OnePermit").field(&self.0).finish()
        }
    }

    #[async_trait]
    impl<L: DistributedRwLock + ?Sized> DistributedLock for WriteSide<L> {
        fn name(&self) -> &LockName {
            self.0.name()
        }
        async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
            self.0.try_write().await
        }
        async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
            self.0.write(timeout).await
        }
    }

    #[async_trait]
    impl<S: DistributedSemaphore + ?Sized> DistributedLock for OnePermit<S> {
        fn name(&self) -> &LockName {
            self.0.name()
        }
        async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
            self.0.try_acquire().await
        }
        async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
            self.0.acquire(timeout).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_static<T: Send + Sync + 'static>() {}

    #[test]
    fn contract_types_are_object_safe_and_thread_safe() {
        assert_send_static::<Guard>();
        assert_send_static::<LockError>();
        assert_send_static::<Arc<dyn LockProvider>>();
        assert_send_static::<Arc<dyn DistributedLock>>();
        assert_send_static::<Arc<dyn DistributedRwLock>>();
        assert_send_static::<Arc<dyn DistributedSemaphore>>();
        assert_send_static::<LostSignal>();
    }
}
