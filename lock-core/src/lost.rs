//! The lost signal: how a guard learns that the backend no longer vouches for its lock.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::Notify;

/// Why a backend stopped vouching for a held lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The lock was taken away on purpose (an operator, or a test's fault injection).
    Revoked,
    /// The client's session ended (ZooKeeper session expiry, in-memory client closed).
    SessionExpired,
    /// The connection was down for longer than the session or lease allows.
    Disconnected,
    /// The lease ran out without a confirmed renewal.
    LeaseExpired,
    /// The holder's entry (node or key) was deleted or taken over by someone else.
    EntryRemoved,
    /// Anything else, described.
    Other(String),
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Revoked => f.write_str("the lock was revoked"),
            LossReason::SessionExpired => f.write_str("the session expired"),
            LossReason::Disconnected => {
                f.write_str("the connection was down longer than the session allows")
            }
            LossReason::LeaseExpired => f.write_str("the lease expired without renewal"),
            LossReason::EntryRemoved => {
                f.write_str("the lock entry was deleted or taken over by another client")
            }
            LossReason::Other(text) => f.write_str(text),
        }
    }
}

/// How a held lock's signal ended: lost for a reason, or (`None`) released or dropped
/// without a loss.
type Ending = Option<LossReason>;

/// A clonable view of whether a guard's lock has been lost.
///
/// Obtained from [`Guard::lost`](crate::Guard::lost). It fires at most once, when the
/// backend can no longer vouch for the lock (session expired, lease expired without renewal,
/// own entry deleted, connection down longer than the session allows). A normal release or
/// drop of the guard never fires it; it *ends* the signal instead, so that
/// [`wait`](LostSignal::wait) returns `None` rather than waiting forever.
///
/// Subscribing after the loss still sees it: the state is kept, not broadcast.
///
/// ```
/// # async fn demo(guard: lock_core::Guard) {
/// let lost = guard.lost();
/// tokio::select! {
///     reason = lost.wait() => {
///         if let Some(reason) = reason {
///             // Stop touching the protected resource: someone else may hold the lock.
///             tracing::warn!(%reason, "lock lost");
///         }
///     }
///     _ = do_protected_work() => {}
/// }
/// # }
/// # async fn do_protected_work() {}
/// ```
#[derive(Clone)]
pub struct LostSignal {
    shared: Arc<Shared>,
}

/// The backend's side of a [`LostSignal`]: fires the loss.
///
/// Part of the backend SPI. Clonable, so that session watchers, lease watchdogs and node
/// watches can all hold one.
#[derive(Clone)]
pub struct LostNotifier {
    shared: Arc<Shared>,
}

/// What a notifier and its signals share. Every held lock has one, so it is kept small
/// (a process may hold many thousands of locks): the ending, set once, and the waiters.
#[derive(Default)]
struct Shared {
    /// Unset while the lock is held; set once, when the signal fires or ends.
    ending: OnceLock<Ending>,
    /// Woken when `ending` is set.
    ended: Notify,
    /// Where a loss is counted in the metrics, once the guard is observed (see
    /// [`observe`](crate::observe)): the loss may fire before or after the guard learns
    /// where to count it, and is counted once either way.
    recording: crate::observe::LossRecording,
    counted: AtomicBool,
    /// The guard's own release is under way (see [`kit::Releasing`](crate::kit::Releasing)):
    /// kept here, where the guard and the backend's watch both reach it, rather than in an
    /// allocation of its own per held lock.
    releasing: AtomicBool,
}

/// Creates a connected notifier and signal for one grant.
///
/// ```
/// use lock_core::{lost_signal, LossReason};
/// let (notifier, signal) = lost_signal();
/// assert!(!signal.is_lost());
/// notifier.fire(LossReason::SessionExpired);
/// assert_eq!(signal.reason(), Some(LossReason::SessionExpired));
/// ```
pub fn lost_signal() -> (LostNotifier, LostSignal) {
    let shared = Arc::new(Shared::default());
    (
        LostNotifier {
            shared: Arc::clone(&shared),
        },
        LostSignal { shared },
    )
}

impl Shared {
    /// The signal leaves the held state once, to lost or ended. Returns whether it did now.
    fn leave_held(&self, ending: Ending) -> bool {
        if self.ending.set(ending).is_err() {
            return false;
        }
        self.ended.notify_waiters();
        if let Some(Some(reason)) = self.ending.get() {
            self.count(reason);
        }
        true
    }

    /// Counts the loss for `reason`, unless it has been counted or there is nowhere yet.
    fn count(&self, reason: &LossReason) {
        if let Some(recording) = self.recording.get()
            && !self.counted.swap(true, Ordering::AcqRel)
        {
            recording.loss(reason);
        }
    }

    fn reason(&self) -> Option<LossReason> {
        self.ending.get().cloned().flatten()
    }

    fn is_lost(&self) -> bool {
        matches!(self.ending.get(), Some(Some(_)))
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ending.get() {
            None => f.write_str("Held"),
            Some(Some(reason)) => f.debug_tuple("Lost").field(reason).finish(),
            Some(None) => f.write_str("Ended"),
        }
    }
}

impl LostNotifier {
    /// Marks the lock lost for `reason`. Only the first call while the lock is held has an
    /// effect; after a normal release (the signal ended) it does nothing. Returns whether
    /// this call fired the signal.
    pub fn fire(&self, reason: LossReason) -> bool {
        self.shared.leave_held(Some(reason))
    }

    /// Whether the signal has already fired.
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Whether `signal` belongs to this notifier.
    pub fn is_for(&self, signal: &LostSignal) -> bool {
        Arc::ptr_eq(&self.shared, &signal.shared)
    }
}

impl LostSignal {
    /// Set while the guard's own release is under way (see
    /// [`kit::Releasing`](crate::kit::Releasing)).
    pub(crate) fn releasing(&self) -> &AtomicBool {
        &self.shared.releasing
    }

    /// The [`LockError::Lost`](crate::LockError::Lost) of the lock `name`: with the reason
    /// signalled, if the signal fired, otherwise `otherwise` (what the caller just found).
    ///
    /// ```
    /// use lock_core::{lost_signal, LockError, LossReason};
    ///
    /// let (notifier, lost) = lost_signal();
    /// let error = lost.error("demo", "jobs", LossReason::EntryRemoved);
    /// assert!(matches!(error, LockError::Lost { reason: LossReason::EntryRemoved, .. }));
    /// notifier.fire(LossReason::SessionExpired);
    /// let error = lost.error("demo", "jobs", LossReason::EntryRemoved);
    /// assert!(matches!(error, LockError::Lost { reason: LossReason::SessionExpired, .. }));
    /// ```
    pub fn error(
        &self,
        backend: &'static str,
        name: &str,
        otherwise: LossReason,
    ) -> crate::LockError {
        crate::LockError::Lost {
            backend,
            name: name.to_owned(),
            reason: self.reason().unwrap_or(otherwise),
        }
    }

    /// Whether the lock has been lost.
    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Why the lock was lost, or `None` while it is held or after it ended normally.
    pub fn reason(&self) -> Option<LossReason> {
        self.shared.reason()
    }

    /// Waits until the lock is lost (`Some(reason)`) or the guard ends normally by release
    /// or drop (`None`). Returns at once if either has already happened.
    ///
    /// Cancel safety: dropping the future has no effect on the signal or the guard.
    pub async fn wait(&self) -> Option<LossReason> {
        let shared = &self.shared;
        crate::kit::notified_until(&shared.ended, || shared.ending.get().cloned()).await
    }

    /// Marks the lock lost when a release discovers the loss before the backend fired.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        self.shared.leave_held(Some(reason));
    }

    /// Ends the signal after a normal release: it can no longer fire, and waiters get `None`.
    pub(crate) fn end(&self) {
        self.shared.leave_held(None);
    }

    /// Counts a loss, when it comes, in the metrics with `labels`.
    pub(crate) fn count_loss_with(&self, recording: crate::observe::Recording) {
        self.shared.recording.set(recording);
        if let Some(reason) = self.reason() {
            self.shared.count(&reason);
        }
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LostSignal").field(&self.shared).finish()
    }
}

impl fmt::Debug for LostNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LostNotifier").field(&self.shared).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn late_subscribers_see_the_loss() {
        let (notifier, signal) = lost_signal();
        assert!(notifier.fire(LossReason::Revoked));
        assert!(!notifier.fire(LossReason::SessionExpired), "fires once");
        let late = signal.clone();
        assert!(late.is_lost());
        assert_eq!(late.wait().await, Some(LossReason::Revoked));
    }

    #[tokio::test]
    async fn waiters_are_woken_by_a_loss() {
        let (notifier, signal) = lost_signal();
        let waiter = tokio::spawn(async move { signal.wait().await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        notifier.fire(LossReason::LeaseExpired);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert_eq!(got.unwrap().unwrap(), Some(LossReason::LeaseExpired));
    }

    #[tokio::test]
    async fn ending_never_fires_and_releases_waiters() {
        let (notifier, signal) = lost_signal();
        let waiter = {
            let signal = signal.clone();
            tokio::spawn(async move { signal.wait().await })
        };
        signal.end();
        assert!(!notifier.fire(LossReason::Revoked), "no loss after the end");
        assert!(!signal.is_lost());
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert_eq!(got.unwrap().unwrap(), None);
    }

    #[test]
    fn a_signal_stays_small() {
        // Every held lock has one: at many locks per process, its size counts.
        let size = std::mem::size_of::<Shared>();
        assert!(size <= 128, "the shared state takes {size} bytes");
    }

    #[tokio::test]
    async fn a_wait_begun_before_the_loss_sees_it_and_later_ones_too() {
        let (notifier, signal) = lost_signal();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let signal = signal.clone();
                tokio::spawn(async move { signal.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        notifier.fire(LossReason::EntryRemoved);
        for waiter in waiters {
            let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
            assert_eq!(got.unwrap().unwrap(), Some(LossReason::EntryRemoved));
        }
        assert_eq!(signal.wait().await, Some(LossReason::EntryRemoved));
    }
}
