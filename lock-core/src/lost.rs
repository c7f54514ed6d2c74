//! The lost signal: how a guard learns that the backend no longer vouches for its lock.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

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

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Held,
    Lost(LossReason),
    /// Released or dropped without a loss; the signal can no longer fire.
    Ended,
}

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
    state: Arc<watch::Sender<State>>,
    counted: Counted,
}

/// The backend's side of a [`LostSignal`]: fires the loss.
///
/// Part of the backend SPI. Clonable, so that session watchers, lease watchdogs and node
/// watches can all hold one.
#[derive(Clone)]
pub struct LostNotifier {
    state: Arc<watch::Sender<State>>,
    counted: Counted,
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
    let state = Arc::new(watch::Sender::new(State::Held));
    let counted = Counted::default();
    (
        LostNotifier {
            state: Arc::clone(&state),
            counted: Arc::clone(&counted),
        },
        LostSignal { state, counted },
    )
}

/// Where a loss is counted in the metrics, once the guard is observed (see
/// [`observe`](crate::observe)), and whether it has been: the loss may fire before or after
/// the guard learns where to count it, and is counted once either way.
type Counted = Arc<Counting>;

#[derive(Default)]
struct Counting {
    recording: OnceLock<Arc<crate::observe::Recording>>,
    done: AtomicBool,
}

impl Counting {
    /// Counts the loss for `reason`, unless it has been counted or there is nowhere yet.
    fn count(&self, reason: &LossReason) {
        if let Some(recording) = self.recording.get()
            && !self.done.swap(true, Ordering::AcqRel)
        {
            recording.loss(reason);
        }
    }
}

impl LostNotifier {
    /// Marks the lock lost for `reason`. Only the first call while the lock is held has an
    /// effect; after a normal release (the signal ended) it does nothing. Returns whether
    /// this call fired the signal.
    pub fn fire(&self, reason: LossReason) -> bool {
        leave_held(&self.state, &self.counted, State::Lost(reason))
    }

    /// Whether the signal has already fired.
    pub fn is_lost(&self) -> bool {
        matches!(*self.state.borrow(), State::Lost(_))
    }

    /// Whether `signal` belongs to this notifier.
    pub fn is_for(&self, signal: &LostSignal) -> bool {
        Arc::ptr_eq(&self.state, &signal.state)
    }
}

impl LostSignal {
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
        matches!(*self.state.borrow(), State::Lost(_))
    }

    /// Why the lock was lost, or `None` while it is held or after it ended normally.
    pub fn reason(&self) -> Option<LossReason> {
        match &*self.state.borrow() {
            State::Lost(reason) => Some(reason.clone()),
            State::Held | State::Ended => None,
        }
    }

    /// Waits until the lock is lost (`Some(reason)`) or the guard ends normally by release
    /// or drop (`None`). Returns at once if either has already happened.
    ///
    /// Cancel safety: dropping the future has no effect on the signal or the guard.
    pub async fn wait(&self) -> Option<LossReason> {
        let mut receiver = self.state.subscribe();
        // The sender lives inside `self`, so the channel cannot close while we wait.
        match receiver.wait_for(|state| *state != State::Held).await {
            Ok(state) => match &*state {
                State::Lost(reason) => Some(reason.clone()),
                State::Held | State::Ended => None,
            },
            Err(_) => None,
        }
    }

    /// Marks the lock lost when a release discovers the loss before the backend fired.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        leave_held(&self.state, &self.counted, State::Lost(reason));
    }

    /// Ends the signal after a normal release: it can no longer fire, and waiters get `None`.
    pub(crate) fn end(&self) {
        leave_held(&self.state, &self.counted, State::Ended);
    }

    /// Counts a loss, when it comes, in the metrics with `labels`.
    pub(crate) fn count_loss_with(&self, recording: Arc<crate::observe::Recording>) {
        let _ = self.counted.recording.set(recording);
        if let Some(reason) = self.reason() {
            self.counted.count(&reason);
        }
    }
}

/// The signal changes state once: from held to lost or ended. Returns whether it changed.
fn leave_held(state: &watch::Sender<State>, counted: &Counted, next: State) -> bool {
    let left = state.send_if_modified(|current| {
        if *current == State::Held {
            *current = next;
            true
        } else {
            false
        }
    });
    if let (true, State::Lost(reason)) = (left, &*state.borrow()) {
        counted.count(reason);
    }
    left
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LostSignal")
            .field(&*self.state.borrow())
            .finish()
    }
}

impl fmt::Debug for LostNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LostNotifier")
            .field(&*self.state.borrow())
            .finish()
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
}
