//! Held keys, and the clean-up of keys that nobody will use: after a cancel, a timeout, an
//! error, or a guard dropped without release.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::WatchResponse;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};
use lock_core::kit::{
    Abandon, HeldEntry, Releasing, Removal, RemovalError, Retry, entry_guard_releasing,
    notified_until, retry_in_background,
};
use lock_core::{
    Deadline, FencingToken, Guard, LockError, LockName, LossReason, LostNotifier, lost_signal,
};
use tokio::sync::Notify;

use crate::error::BACKEND;
use crate::session::{Session, Slot};
use crate::watches::{Held, Watch, deleted_after};

/// How a background clean-up backs off while the connection is down.
const CLEANUP_PAUSE: Duration = Duration::from_millis(200);

/// A key a contender may have written, and how to know it is ours.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) session: Weak<Session>,
    /// Shared with the held key's watch ([`OwnKey`]).
    pub(crate) key: Arc<str>,
    /// The single-key lock is shared: it is ours only while it holds this value.
    pub(crate) ours_if: Option<String>,
    /// The create of the key, as a clean-up must know it.
    pub(crate) creation: Arc<Creation>,
    /// Held, for its drop, until the key is surely gone (shared by a contender's keys, as
    /// a semaphore's contender has two).
    pub(crate) _slot: Arc<Slot>,
}

impl Entry {
    /// Deletes the key if it is still ours.
    pub(crate) async fn remove(&self, session: &Session) -> Result<(), LockError> {
        // A create still on its way could land after the delete and leave the key behind:
        // wait for its answer first (its request is bounded by the timeout).
        let settled = self.creation.answered();
        let _ = tokio::time::timeout(session.timeout * 2, settled).await;
        let key = &*self.key;
        let delete = TxnOp::delete(key, None);
        let created = self.creation.revision.load(Ordering::Acquire);
        let txn = match &self.ours_if {
            _ if created != 0 => Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, created)])
                .and_then([delete]),
            Some(value) => Txn::new()
                .when([Compare::value(key, CompareOp::Equal, value.as_str())])
                .and_then([delete]),
            None => Txn::new().and_then([delete]),
        };
        let mut kv = session.client.kv_client();
        session.ask(&self.key, kv.txn(txn)).await.map(drop)
    }
}

impl Entry {
    /// A new entry for `key`, nothing sent yet.
    pub(crate) fn new(
        session: &Arc<Session>,
        key: String,
        ours_if: Option<String>,
        slot: Arc<Slot>,
    ) -> Entry {
        Entry {
            session: Arc::downgrade(session),
            key: key.into(),
            ours_if,
            creation: Arc::default(),
            _slot: slot,
        }
    }

    /// Sends `txn`, a create of this entry's key, from a task of its own: dropping the
    /// attempt does not cut it off mid-way, and a clean-up waits for its answer before it
    /// deletes, so that the create cannot land after the delete. `created` reads the
    /// key's create revision from the answer, when the key is ours.
    pub(crate) async fn send_create(
        &self,
        session: &Arc<Session>,
        name: &str,
        txn: Txn,
        created: fn(&TxnResponse) -> Option<i64>,
    ) -> Result<TxnResponse, LockError> {
        let creation = Arc::clone(&self.creation);
        let (session, name) = (Arc::clone(session), name.to_owned());
        creation.busy.store(true, Ordering::Release);
        let sending = tokio::spawn(async move {
            let mut kv = session.client.kv_client();
            let answer = session.ask(&name, kv.txn(txn)).await;
            if let Some(known) = answer.as_ref().ok().and_then(created) {
                creation.revision.store(known, Ordering::Release);
            }
            creation.busy.store(false, Ordering::Release);
            creation.settled.notify_waiters();
            answer
        });
        sending.await.unwrap_or_else(|failed| {
            let message = format!("the create's task failed: {failed}");
            Err(LockError::other(BACKEND, message).retryable(true))
        })
    }
}

/// The create of an entry's key: one per contender's key, so kept small.
#[derive(Debug, Default)]
pub(crate) struct Creation {
    /// The key's create revision once known (0 before): a delete then takes that key
    /// only, not a later one of the same name (a slot's key is named again once free).
    pub(crate) revision: AtomicI64,
    /// Whether a create of the key is on its way: a clean-up waits for its answer.
    busy: AtomicBool,
    /// Woken when a create's answer came.
    settled: Notify,
}

impl Creation {
    /// Returns once no create of the key is on its way.
    async fn answered(&self) {
        let idle = || (!self.busy.load(Ordering::Acquire)).then_some(());
        notified_until(&self.settled, idle).await;
    }
}

impl Abandon for Entry {
    /// Retries the removal until it succeeds or the session is over (its keys go with the
    /// lease).
    fn abandon(self) {
        // Asked here too, not only in the task: every guard of a closed provider lands here
        // as it drops, and a task each would be a burst of thousands for nothing.
        if self
            .session
            .upgrade()
            .is_none_or(|session| session.is_over())
        {
            return;
        }
        let what = format!("clean-up of {}", self.key);
        let entry = Arc::new(self);
        retry_in_background(
            BACKEND,
            what,
            CLEANUP_PAUSE,
            Deadline::after(None),
            move || {
                let entry = Arc::clone(&entry);
                async move {
                    let Some(session) = entry.session.upgrade().filter(|s| !s.is_over()) else {
                        return Retry::Done;
                    };
                    match entry.remove(&session).await {
                        Ok(()) => Retry::Done,
                        Err(error) if error.is_retryable() => Retry::Again(error.to_string()),
                        Err(error) => Retry::GiveUp(error.to_string()),
                    }
                }
            },
        );
    }
}

/// Turns a granted key into a guard: its lost signal registered with the session, and a
/// watch on the key, which the session's watch stream looks after, so that a deletion by
/// someone else is noticed.
pub(crate) fn grant(
    session: &Arc<Session>,
    name: &LockName,
    entry: Entry,
    granted: Granted,
) -> Result<Guard, LockError> {
    let revision = granted.created;
    let (notifier, lost) = lost_signal();
    let Some(registration) = session.register(notifier.clone()) else {
        entry.abandon();
        return Err(LockError::SessionExpired {
            backend: BACKEND,
            name: Some(name.to_string()),
        });
    };
    session.metrics.record_grant();
    let key = entry.key.clone();
    let held = HeldKey {
        entry,
        name: name.clone(),
        revision,
        registration,
    };
    let token = FencingToken(u64::try_from(revision).unwrap_or_default());
    let (guard, releasing) = entry_guard_releasing(name, token, held, lost);
    let own = Arc::new(OwnKey {
        session: Arc::downgrade(session),
        key,
        created: granted.created,
        seen: AtomicI64::new(granted.seen),
        releasing,
        notifier,
    });
    match granted.watch {
        // The watch made while it waited sees every deletion after `seen`.
        Some(watch) if watch.from <= granted.seen => watch.hold(own),
        waited_with => drop(tokio::spawn(own.watch(waited_with))),
    }
    Ok(guard)
}

/// A held key as the session's watch stream looks after it (see [`Held`]): a task runs for
/// it only to make its watch, and to ask why the key went.
struct OwnKey {
    session: Weak<Session>,
    key: Arc<str>,
    /// The key's create revision.
    created: i64,
    /// A revision at which the key stood as the holder's: a deletion after it is this
    /// key's. A watch made on a member behind the one that granted can still report the
    /// deletion of an earlier key of the same name (this session's previous hold of the
    /// lock).
    seen: AtomicI64,
    releasing: Releasing,
    notifier: LostNotifier,
}

impl Held for OwnKey {
    fn is_deleted(&self, answer: &WatchResponse) -> bool {
        deleted_after(answer, self.seen.load(Ordering::Acquire)).is_some()
    }

    fn deleted(self: Arc<Self>, watch: Watch) {
        // The guard's own release asks nothing: its watch is cancelled at once.
        if !self.releasing.is_set() {
            drop(tokio::spawn(self.removed(watch)));
        }
    }

    fn ended(self: Arc<Self>) {
        drop(tokio::spawn(self.watch(None)));
    }
}

impl OwnKey {
    /// Makes the key's watch (or takes `waited_with`, made while the holder waited) and
    /// hands it to the session's stream; until the session is over.
    ///
    /// The key was the holder's at `seen`, and a watch sees only after the revision it
    /// began at (see [`crate::watches`]): a watch that begins later is followed by one more
    /// read of the key, so that a deletion in between is not missed.
    async fn watch(self: Arc<Self>, mut waited_with: Option<Watch>) {
        // Its requests and pauses are boxed: each grant runs this task, many side by side,
        // and what the allocator keeps of them grows with their size.
        loop {
            let Some(live) = self.session.upgrade().filter(|s| !s.is_over()) else {
                return;
            };
            let made = match waited_with.take() {
                Some(watch) => Ok(watch),
                None => {
                    let forever = Deadline::after(None);
                    Box::pin(live.watch_deletions(&self.key, &self.key, false, &forever)).await
                }
            };
            let Ok(watch) = made else {
                drop(live);
                Box::pin(tokio::time::sleep(CLEANUP_PAUSE)).await;
                continue;
            };
            if watch.from > self.seen.load(Ordering::Acquire) {
                let read = live.key_reads.changed(&self.key, self.created, watch.from);
                match Box::pin(read).await {
                    Some((true, _)) => {
                        drop(live);
                        if !self.releasing.is_set() {
                            Box::pin(self.removed(watch)).await;
                        }
                        return;
                    }
                    Some((false, at)) => {
                        self.seen.fetch_max(at, Ordering::AcqRel);
                    }
                    None => {
                        drop((live, watch));
                        Box::pin(tokio::time::sleep(CLEANUP_PAUSE)).await;
                        continue;
                    }
                }
            }
            watch.hold(self);
            return;
        }
    }

    /// The key was seen deleted, not by the guard's release when it was seen: a loss,
    /// unless the session's lease ended (then the session's end fires every signal), or
    /// the release began meanwhile. The watch that saw it is kept until the question is
    /// answered: when the lease ended, the session's end stops the stream, and none of its
    /// held keys' watches is cancelled one by one.
    async fn removed(self: Arc<Self>, watch: Watch) {
        let lease_ended = match self.session.upgrade() {
            Some(live) => live.lease_ended(&self.key).await,
            None => true,
        };
        if !lease_ended && !self.releasing.is_set() {
            self.notifier.fire(LossReason::EntryRemoved);
        }
        drop(watch);
    }
}

/// A granted key, as its guard releases it.
struct HeldKey {
    entry: Entry,
    name: LockName,
    revision: i64,
    registration: u64,
}

impl fmt::Debug for HeldKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldKey")
            .field("key", &self.entry.key)
            .field("revision", &self.revision)
            .finish()
    }
}

impl HeldKey {
    fn session(&self) -> Option<Arc<Session>> {
        self.entry.session.upgrade()
    }
}

#[async_trait]
impl HeldEntry for HeldKey {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn remove(&mut self, sent: &AtomicBool) -> Result<Removal, RemovalError> {
        let Some(session) = self.session().filter(|session| !session.is_over()) else {
            return Err(RemovalError::SessionOver);
        };
        let key = &*self.entry.key;
        let txn = Txn::new()
            .when([Compare::create_revision(
                key,
                CompareOp::Equal,
                self.revision,
            )])
            .and_then([TxnOp::delete(key, None)]);
        // The conditional delete is safe to send twice: asked again while its error may
        // pass (a member that was killed, an election) for at most the lease's ttl, so a
        // release does not fail on the member it happened to reach. A key found gone
        // after a try whose answer was lost was most likely deleted by that try.
        let tries = AtomicU32::new(0);
        sent.store(true, Ordering::Release);
        let (session, name) = (&session, self.name.as_str());
        let answer = session
            .again(name, &Deadline::after(None), || {
                tries.fetch_add(1, Ordering::Relaxed);
                let mut kv = session.client.kv_client();
                let txn = txn.clone();
                async move { session.ask(name, kv.txn(txn)).await }
            })
            .await;
        match answer {
            Ok(answer) if answer.succeeded() || tries.load(Ordering::Relaxed) > 1 => {
                Ok(Removal::Removed)
            }
            Ok(_) => Ok(Removal::Gone),
            Err(error @ LockError::Connection { .. }) => Err(RemovalError::Unknown(error)),
            Err(error) => Err(RemovalError::Failed(error)),
        }
    }

    fn forget(&self) {
        if let Some(session) = self.session() {
            session.unregister(self.registration);
        }
    }

    fn abandon(self: Box<Self>) {
        self.entry.abandon();
    }

    fn is_suspect(&self) -> bool {
        self.session().is_some_and(|session| session.is_suspect())
    }
}

/// A granted contender: its key's create revision (its fencing token), a revision at
/// which the key was seen still standing as the holder's, and the watch on it made while
/// it waited, if any (it sees every deletion after `seen`).
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) created: i64,
    pub(crate) seen: i64,
    pub(crate) watch: Option<Watch>,
}

impl Granted {
    pub(crate) fn new(created: i64, seen: i64) -> Self {
        Granted {
            created,
            seen: seen.max(created),
            watch: None,
        }
    }

    /// The same, with the watch on the key made while it waited.
    pub(crate) fn watched(self, watch: Option<Watch>) -> Self {
        Granted { watch, ..self }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI64};

    use lock_core::kit::{HeldEntry, Removal, RemovalError, entry_guard_releasing};
    use lock_core::{FencingToken, LockName, lost_signal};

    #[derive(Debug)]
    struct Nothing;

    #[async_trait::async_trait]
    impl HeldEntry for Nothing {
        fn backend(&self) -> &'static str {
            "test"
        }
        async fn remove(&mut self, _: &AtomicBool) -> Result<Removal, RemovalError> {
            Ok(Removal::Removed)
        }
        fn forget(&self) {}
        fn abandon(self: Box<Self>) {}
        fn is_suspect(&self) -> bool {
            false
        }
    }

    /// A held lock keeps its key's state on the session's watch stream as long as it is
    /// held, and each grant runs the task that makes its key's watch: at many locks per
    /// process, both are much of a lock's client memory.
    #[test]
    fn a_held_keys_state_and_watch_task_stay_small() {
        let size = std::mem::size_of::<super::OwnKey>();
        assert!(size <= 64, "a held key's state takes {size} bytes");
        let (notifier, lost) = lost_signal();
        let name = LockName::new("small").unwrap_or_else(|error| panic!("{error}"));
        let (_guard, releasing) = entry_guard_releasing(&name, FencingToken(1), Nothing, lost);
        let own = Arc::new(super::OwnKey {
            session: std::sync::Weak::new(),
            key: Arc::from(""),
            created: 1,
            seen: AtomicI64::new(1),
            releasing,
            notifier,
        });
        let watching = own.watch(None);
        let size = std::mem::size_of_val(&watching);
        assert!(
            size <= 320,
            "the task making a held key's watch takes {size} bytes"
        );
    }
}
