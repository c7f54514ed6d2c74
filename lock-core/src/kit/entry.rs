//! Guards over entries that a session owns: a ZooKeeper node, an etcd key on a lease.
//!
//! A session-based backend holds a lock by an entry on the server that lives as long as the
//! backend's session; it writes one [`HeldEntry`] per grant: how to delete the entry if it
//! is still the grant's, and how to leave it to the background clean-up. [`entry_guard`]
//! turns it into a [`Guard`] that keeps the release's bookkeeping in one place:
//!
//! - a delete once sent may have been applied even if its answer never came, so until an
//!   answer says otherwise the entry's absence is the holder's own doing (as Curator's
//!   guaranteed delete assumes): a release that then finds it gone has released;
//! - a removal of the entry noticed while nobody releases it fires the lost signal
//!   ([`LossReason::EntryRemoved`]); one caused by the holder's own delete does not.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;

use crate::{
    FencingToken, Guard, GuardBackend, LockError, LockName, LossReason, LostNotifier, LostSignal,
};

/// One granted entry on the server, owned by a session: what a session-based backend writes
/// for [`entry_guard`].
#[async_trait]
pub trait HeldEntry: Send + Sync + fmt::Debug + 'static {
    /// The backend's name, as in [`LockError`] messages.
    fn backend(&self) -> &'static str;
    /// Deletes the entry if it is still this grant's. Sets `sent` just before it sends the
    /// delete: a delete once sent may have been applied, even if its answer never comes or
    /// this future is dropped.
    async fn remove(&mut self, sent: &AtomicBool) -> Result<Removal, RemovalError>;
    /// Stops the session from counting the guard among those it must signal when it is
    /// lost: the grant is over.
    fn forget(&self);
    /// Leaves the entry to a clean-up in the background, retried while the session lives
    /// (the guard was dropped without release).
    fn abandon(self: Box<Self>);
    /// Whether the session is in doubt (disconnected, not yet expired).
    fn is_suspect(&self) -> bool;
}

/// What a delete of a held entry found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Removal {
    /// The entry was the grant's, and is deleted.
    Removed,
    /// The entry was gone, or was not the grant's (another one of the same name).
    Gone,
}

/// Why a delete of a held entry failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RemovalError {
    /// The session is over: the server removes the entry with it.
    SessionOver,
    /// The delete's answer is lost: if it was sent, it may have been applied.
    Unknown(LockError),
    /// The delete was not applied (not sent, or refused).
    Failed(LockError),
}

/// The guard of a granted `entry`, whose lost signal is `lost` (its notifier registered
/// with the session by the backend) and whose `removed` future resolves to `true` once the
/// entry is removed by anyone (to `false` when the session ends first, whose end fires the
/// signal): a watch the backend sets on its entry.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
///
/// use lock_core::kit::{HeldEntry, Removal, RemovalError, entry_guard};
/// use lock_core::{async_trait, FencingToken, LockError, LockName, lost_signal};
///
/// /// An entry that a release always finds.
/// #[derive(Debug)]
/// struct Node;
///
/// #[async_trait]
/// impl HeldEntry for Node {
///     fn backend(&self) -> &'static str { "example" }
///     async fn remove(&mut self, sent: &AtomicBool) -> Result<Removal, RemovalError> {
///         sent.store(true, Ordering::Release);
///         Ok(Removal::Removed)
///     }
///     fn forget(&self) {}
///     fn abandon(self: Box<Self>) {}
///     fn is_suspect(&self) -> bool { false }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let name = LockName::new("jobs")?;
/// let (notifier, lost) = lost_signal();
/// let guard = entry_guard(&name, FencingToken(7), Node, (notifier, lost), std::future::pending());
/// assert_eq!(guard.fencing_token(), FencingToken(7));
/// let mut guard = guard;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn entry_guard(
    name: &LockName,
    token: FencingToken,
    entry: impl HeldEntry,
    lost: (LostNotifier, LostSignal),
    removed: impl Future<Output = bool> + Send + 'static,
) -> Guard {
    entry_guard_watching(name, token, entry, lost, |_| removed)
}

/// Whether a guard's own release is under way, or may have been applied: set as a release
/// or a drop begins, cleared when a release fails without a delete that may have landed.
#[derive(Debug, Clone)]
pub struct Releasing(LostSignal);

impl Releasing {
    /// Whether the guard's own release is under way (a removal of the entry now is no
    /// loss).
    pub fn is_set(&self) -> bool {
        self.0.releasing().load(Ordering::Acquire)
    }
}

/// [`entry_guard`], its `removed` future made from the guard's [`Releasing`]: for a backend
/// whose watch asks the server why the entry went (the end of a lease, say), which it need
/// not ask when the removal is the guard's own release.
///
/// ```
/// # use lock_core::kit::{HeldEntry, Removal, RemovalError, entry_guard_watching};
/// # use lock_core::{async_trait, FencingToken, LockError, LockName, lost_signal};
/// # #[derive(Debug)]
/// # struct Node;
/// # #[async_trait]
/// # impl HeldEntry for Node {
/// #     fn backend(&self) -> &'static str { "example" }
/// #     async fn remove(&mut self, _: &std::sync::atomic::AtomicBool) -> Result<Removal, RemovalError> {
/// #         Ok(Removal::Removed)
/// #     }
/// #     fn forget(&self) {}
/// #     fn abandon(self: Box<Self>) {}
/// #     fn is_suspect(&self) -> bool { false }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let name = LockName::new("jobs")?;
/// let mut guard = entry_guard_watching(&name, FencingToken(7), Node, lost_signal(), |releasing| {
///     async move {
///         // Wait for the entry's deletion here; then, unless it is our own release, ask why.
///         std::future::pending::<()>().await;
///         !releasing.is_set()
///     }
/// });
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn entry_guard_watching<F>(
    name: &LockName,
    token: FencingToken,
    entry: impl HeldEntry,
    (notifier, lost): (LostNotifier, LostSignal),
    removed: impl FnOnce(Releasing) -> F,
) -> Guard
where
    F: Future<Output = bool> + Send + 'static,
{
    let releasing = Releasing(lost.clone());
    let removed = removed(releasing.clone());
    // A combinator rather than an `async` block: the block would keep `removed` twice (as
    // what it captured and as what it awaits), doubling every held lock's task.
    let fire = move |removed: bool| {
        if removed && !releasing.is_set() {
            notifier.fire(LossReason::EntryRemoved);
        }
    };
    tokio::spawn(futures_util::FutureExt::map(removed, fire));
    guard_over(name, token, Box::new(entry), lost)
}

/// [`entry_guard`] for a backend that watches its entries per session rather than per
/// entry: it keeps the grant's [`LostNotifier`] where its session's one watch finds it, and
/// fires it itself (with the reason it found) when the entry or the session goes; no task
/// is spawned per grant.
///
/// ```
/// # use lock_core::kit::{HeldEntry, Removal, RemovalError, entry_guard_signalled};
/// # use lock_core::{async_trait, FencingToken, LockError, LockName, LossReason, lost_signal};
/// # #[derive(Debug)]
/// # struct Node;
/// # #[async_trait]
/// # impl HeldEntry for Node {
/// #     fn backend(&self) -> &'static str { "example" }
/// #     async fn remove(&mut self, _: &std::sync::atomic::AtomicBool) -> Result<Removal, RemovalError> {
/// #         Ok(Removal::Removed)
/// #     }
/// #     fn forget(&self) {}
/// #     fn abandon(self: Box<Self>) {}
/// #     fn is_suspect(&self) -> bool { false }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let name = LockName::new("jobs")?;
/// let (notifier, lost) = lost_signal();
/// let guard = entry_guard_signalled(&name, FencingToken(7), Node, lost);
/// // The session's watch, having seen the connection end:
/// notifier.fire(LossReason::SessionExpired);
/// assert!(guard.is_lost());
/// # Ok(()) }
/// ```
pub fn entry_guard_signalled(
    name: &LockName,
    token: FencingToken,
    entry: impl HeldEntry,
    lost: LostSignal,
) -> Guard {
    guard_over(name, token, Box::new(entry), lost)
}

/// [`entry_guard_signalled`], with the guard's [`Releasing`]: for a backend whose session
/// watches its entries for all of them and must tell the guard's own release from a loss
/// when an entry goes (it asks the server why only when it was not the release).
///
/// ```
/// # use lock_core::kit::{HeldEntry, Removal, RemovalError, entry_guard_releasing};
/// # use lock_core::{async_trait, FencingToken, LockError, LockName, LossReason, lost_signal};
/// # #[derive(Debug)]
/// # struct Node;
/// # #[async_trait]
/// # impl HeldEntry for Node {
/// #     fn backend(&self) -> &'static str { "example" }
/// #     async fn remove(&mut self, _: &std::sync::atomic::AtomicBool) -> Result<Removal, RemovalError> {
/// #         Ok(Removal::Removed)
/// #     }
/// #     fn forget(&self) {}
/// #     fn abandon(self: Box<Self>) {}
/// #     fn is_suspect(&self) -> bool { false }
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let name = LockName::new("jobs")?;
/// let (notifier, lost) = lost_signal();
/// let (guard, releasing) = entry_guard_releasing(&name, FencingToken(7), Node, lost);
/// // The session's watch, having seen the entry deleted while no release was under way:
/// if !releasing.is_set() {
///     notifier.fire(LossReason::EntryRemoved);
/// }
/// assert!(guard.is_lost());
/// # Ok(()) }
/// ```
pub fn entry_guard_releasing(
    name: &LockName,
    token: FencingToken,
    entry: impl HeldEntry,
    lost: LostSignal,
) -> (Guard, Releasing) {
    let releasing = Releasing(lost.clone());
    (guard_over(name, token, Box::new(entry), lost), releasing)
}

/// The guard over `entry`, whose release sets the signal's [`Releasing`] while it is under
/// way.
fn guard_over(
    name: &LockName,
    token: FencingToken,
    entry: Box<dyn HeldEntry>,
    lost: LostSignal,
) -> Guard {
    let backend = EntryGuard {
        backend: entry.backend(),
        entry: Some(entry),
        name: name.clone(),
        in_doubt: AtomicBool::new(false),
        lost: lost.clone(),
    };
    Guard::new(name.clone(), token, lost, Box::new(backend))
}

/// Ends a release that did not end the grant — failed, or dropped on the way: unless a
/// delete of ours may have been applied, a removal of the entry is a loss again.
struct Settle<'a> {
    releasing: &'a AtomicBool,
    in_doubt: &'a AtomicBool,
    armed: bool,
}

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        if self.armed && !self.in_doubt.load(Ordering::Acquire) {
            self.releasing.store(false, Ordering::Release);
        }
    }
}

/// The backend side of a guard over a held entry.
#[derive(Debug)]
struct EntryGuard {
    backend: &'static str,
    /// Taken by a release that ended the grant, or by a drop.
    entry: Option<Box<dyn HeldEntry>>,
    name: LockName,
    /// A delete of ours was sent and its outcome never learned (set by the entry as it
    /// sends, so that a release dropped meanwhile leaves it set).
    in_doubt: AtomicBool,
    lost: LostSignal,
}

impl EntryGuard {
    fn lost(&self, reason: LossReason) -> LockError {
        self.lost.error(self.backend, self.name.as_str(), reason)
    }
}

#[async_trait]
impl GuardBackend for EntryGuard {
    fn backend(&self) -> &'static str {
        self.backend
    }

    async fn release(&mut self) -> Result<(), LockError> {
        let Some(entry) = self.entry.as_mut() else {
            return Ok(());
        };
        // Set while a release is under way (or may have been applied): the entry's removal
        // is then no loss.
        self.lost.releasing().store(true, Ordering::Release);
        let was_in_doubt = self.in_doubt.load(Ordering::Acquire);
        let mut settle = Settle {
            releasing: self.lost.releasing(),
            in_doubt: &self.in_doubt,
            armed: true,
        };
        let removal = entry.remove(&self.in_doubt).await;
        // Removed or gone: the grant is over either way.
        if removal.is_ok()
            && let Some(entry) = self.entry.take()
        {
            entry.forget();
        }
        settle.armed = removal.is_err();
        match removal {
            Ok(Removal::Removed) => Ok(()),
            // Gone after a delete of ours whose outcome we never learned: that delete
            // removed it. A loss signalled before still turns this into `Lost` in
            // `Guard::release`.
            Ok(Removal::Gone) if was_in_doubt => Ok(()),
            Ok(Removal::Gone) => Err(self.lost(LossReason::EntryRemoved)),
            Err(RemovalError::SessionOver) => Err(self.lost(LossReason::SessionExpired)),
            Err(RemovalError::Unknown(error)) => Err(error),
            Err(RemovalError::Failed(error)) => {
                self.in_doubt.store(was_in_doubt, Ordering::Release);
                Err(error)
            }
        }
    }

    fn release_on_drop(mut self: Box<Self>) {
        self.lost.releasing().store(true, Ordering::Release);
        if let Some(entry) = self.entry.take() {
            entry.forget();
            entry.abandon();
        }
    }

    fn is_suspect(&self) -> bool {
        self.entry.as_ref().is_some_and(|entry| entry.is_suspect())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::AtomicU32;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;
    use crate::lost_signal;

    /// What the scripted entry's deletes do, in turn.
    #[derive(Debug)]
    enum Answer {
        /// The entry is removed (its watch fires) while the delete is on its way.
        RemovedWatched,
        Gone,
        SessionOver,
        /// Sent, and its answer lost.
        Unknown,
        /// Lost before it was sent.
        UnknownUnsent,
        /// Not sent.
        Failed,
        /// Sent, and refused.
        RefusedAfterSend,
        /// Sent, and never answered.
        Hang,
        /// Never answered, and not sent.
        HangUnsent,
    }

    /// What the guard asked of the scripted entry.
    #[derive(Debug, Default)]
    struct Counts {
        removes: AtomicU32,
        forgotten: AtomicU32,
        abandoned: AtomicU32,
    }

    /// An entry whose deletes answer from a script; `removal` reports the entry removed.
    #[derive(Debug)]
    struct Scripted {
        answers: Mutex<VecDeque<Answer>>,
        counts: Arc<Counts>,
        removal: Mutex<Option<oneshot::Sender<()>>>,
    }

    fn failure() -> LockError {
        LockError::Connection {
            backend: "scripted",
            name: None,
            message: "no answer".into(),
            source: None,
        }
    }

    #[async_trait]
    impl HeldEntry for Scripted {
        fn backend(&self) -> &'static str {
            "scripted"
        }
        async fn remove(&mut self, sent: &AtomicBool) -> Result<Removal, RemovalError> {
            self.counts.removes.fetch_add(1, Ordering::SeqCst);
            let answer = self.answers.lock().unwrap().pop_front();
            if !matches!(
                answer,
                Some(
                    Answer::SessionOver
                        | Answer::Failed
                        | Answer::UnknownUnsent
                        | Answer::HangUnsent
                )
            ) {
                sent.store(true, Ordering::SeqCst);
            }
            match answer {
                None => Ok(Removal::Removed),
                Some(Answer::RemovedWatched) => {
                    let removal = self.removal.lock().unwrap().take();
                    removal.unwrap().send(()).unwrap();
                    settle().await;
                    Ok(Removal::Removed)
                }
                Some(Answer::Gone) => Ok(Removal::Gone),
                Some(Answer::SessionOver) => Err(RemovalError::SessionOver),
                Some(Answer::Unknown | Answer::UnknownUnsent) => {
                    Err(RemovalError::Unknown(failure()))
                }
                Some(Answer::Failed | Answer::RefusedAfterSend) => {
                    Err(RemovalError::Failed(failure()))
                }
                Some(Answer::Hang | Answer::HangUnsent) => std::future::pending().await,
            }
        }
        fn forget(&self) {
            self.counts.forgotten.fetch_add(1, Ordering::SeqCst);
        }
        fn abandon(self: Box<Self>) {
            self.counts.abandoned.fetch_add(1, Ordering::SeqCst);
        }
        fn is_suspect(&self) -> bool {
            false
        }
    }

    /// A guard over a scripted entry whose removal the entry reports during its own delete.
    fn held(answers: impl IntoIterator<Item = Answer>) -> (Guard, Arc<Counts>) {
        let (guard, counts, _) = scripted(answers, true);
        (guard, counts)
    }

    /// A guard over a scripted entry whose removal the test reports through the switch.
    fn watched(answers: impl IntoIterator<Item = Answer>) -> (Guard, oneshot::Sender<()>) {
        let (guard, _, switch) = scripted(answers, false);
        (guard, switch.unwrap())
    }

    fn scripted(
        answers: impl IntoIterator<Item = Answer>,
        switch_in_entry: bool,
    ) -> (Guard, Arc<Counts>, Option<oneshot::Sender<()>>) {
        let counts = Arc::new(Counts::default());
        let (removal, removed) = oneshot::channel::<()>();
        let (in_entry, in_test) = if switch_in_entry {
            (Some(removal), None)
        } else {
            (None, Some(removal))
        };
        let entry = Scripted {
            answers: Mutex::new(answers.into_iter().collect()),
            counts: Arc::clone(&counts),
            removal: Mutex::new(in_entry),
        };
        let name = LockName::new("entry").unwrap();
        let guard = entry_guard(&name, FencingToken(1), entry, lost_signal(), async move {
            removed.await.is_ok()
        });
        (guard, counts, in_test)
    }

    /// Reports the entry removed, and expects the guard's lost signal to fire for it.
    async fn expect_lost_on_removal(guard: &Guard, remove: oneshot::Sender<()>) {
        let lost = guard.lost();
        remove.send(()).unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(5), lost.wait()).await;
        assert_eq!(reason.unwrap(), Some(LossReason::EntryRemoved));
    }

    /// Lets the spawned watch task run.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn count(counter: &AtomicU32) -> u32 {
        counter.load(Ordering::SeqCst)
    }

    fn is_lost(error: &LockError, expected: LossReason) -> bool {
        matches!(error, LockError::Lost { reason, .. } if *reason == expected)
    }

    #[tokio::test]
    async fn a_release_removes_the_entry_and_its_own_removal_is_no_loss() {
        let (mut guard, counts) = held([Answer::RemovedWatched]);
        guard.release().await.unwrap();
        assert_eq!((count(&counts.removes), count(&counts.forgotten)), (1, 1));
        assert_eq!(count(&counts.abandoned), 0);
    }

    #[tokio::test]
    async fn an_entry_found_gone_is_lost_unless_a_delete_of_ours_was_in_doubt() {
        let (mut guard, _) = held([Answer::Gone]);
        let error = guard.release().await.unwrap_err();
        assert!(is_lost(&error, LossReason::EntryRemoved), "{error:?}");

        let (mut guard, counts) = held([Answer::Unknown, Answer::Gone]);
        assert!(guard.release().await.is_err());
        guard.release().await.unwrap();
        assert_eq!((count(&counts.removes), count(&counts.forgotten)), (2, 1));
    }

    #[tokio::test]
    async fn a_release_dropped_after_its_delete_was_sent_leaves_it_in_doubt() {
        let (mut guard, _) = held([Answer::Hang, Answer::Gone]);
        let dropped = tokio::time::timeout(Duration::from_millis(20), guard.release()).await;
        assert!(dropped.is_err(), "the first release never ends");
        guard.release().await.unwrap();
    }

    #[tokio::test]
    async fn a_release_that_did_not_send_its_delete_leaves_the_guard_watching() {
        for first in [Answer::UnknownUnsent, Answer::HangUnsent] {
            let (mut guard, remove) = watched([first]);
            let release = tokio::time::timeout(Duration::from_millis(20), guard.release()).await;
            assert!(!matches!(release, Ok(Ok(()))));
            expect_lost_on_removal(&guard, remove).await;
        }
    }

    #[tokio::test]
    async fn a_delete_refused_after_it_was_sent_leaves_nothing_in_doubt() {
        let (mut guard, _) = held([Answer::RefusedAfterSend, Answer::Gone]);
        assert!(guard.release().await.is_err());
        let error = guard.release().await.unwrap_err();
        assert!(is_lost(&error, LossReason::EntryRemoved), "{error:?}");
    }

    #[tokio::test]
    async fn a_refused_delete_leaves_the_guard_held_and_watching() {
        let (mut guard, remove) = watched([Answer::Failed]);
        assert!(guard.release().await.is_err());
        expect_lost_on_removal(&guard, remove).await;
    }

    #[tokio::test]
    async fn a_delete_in_doubt_keeps_the_removal_from_counting_as_a_loss() {
        let (mut guard, remove) = watched([Answer::Unknown, Answer::Failed]);
        let lost = guard.lost();
        assert!(guard.release().await.is_err());
        // A later refusal does not undo the doubt the first delete left.
        assert!(guard.release().await.is_err());
        remove.send(()).unwrap();
        settle().await;
        assert!(!lost.is_lost());
    }

    #[tokio::test]
    async fn a_session_over_is_a_lost_session_and_a_drop_abandons_the_entry() {
        let (mut guard, _) = held([Answer::SessionOver]);
        let error = guard.release().await.unwrap_err();
        assert!(is_lost(&error, LossReason::SessionExpired), "{error:?}");

        let (guard, counts) = held([]);
        drop(guard);
        assert_eq!((count(&counts.forgotten), count(&counts.abandoned)), (1, 1));
        assert_eq!(count(&counts.removes), 0);
    }
}
