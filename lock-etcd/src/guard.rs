//! Held keys, and the clean-up of keys that nobody will use: after a cancel, a timeout, an
//! error, or a guard dropped without release.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};
use lock_core::kit::{
    Abandon, HeldEntry, Releasing, Removal, RemovalError, Retry, entry_guard_watching,
    notified_until, retry_in_background,
};
use lock_core::{Deadline, FencingToken, Guard, LockError, LockName, lost_signal};
use tokio::sync::Notify;

use crate::error::BACKEND;
use crate::session::{Session, Slot};
use crate::watches::{Watch, deleted_after};

/// How a background clean-up backs off while the connection is down.
const CLEANUP_PAUSE: Duration = Duration::from_millis(200);

/// A key a contender may have written, and how to know it is ours.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) session: Weak<Session>,
    pub(crate) key: String,
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
        let key = self.key.as_str();
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
            key,
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
/// watch on the key so that a deletion by someone else is noticed.
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
    let (session, key) = (Arc::downgrade(session), entry.key.clone());
    let deleted = |releasing| own_key_removed(session, key, granted, releasing);
    let held = HeldKey {
        entry,
        name: name.to_string(),
        revision,
        registration,
    };
    let token = FencingToken(u64::try_from(revision).unwrap_or_default());
    Ok(entry_guard_watching(
        name,
        token,
        held,
        (notifier, lost),
        deleted,
    ))
}

/// Whether the granted key was removed by someone else; `false` when the session ended
/// first, or ends because the key went with its lease (the session's end fires the signal).
/// A deletion once the holder's own release began is not asked about: it is the release's.
async fn own_key_removed(
    session: Weak<Session>,
    key: String,
    granted: Granted,
    releasing: Releasing,
) -> bool {
    // The watch that saw the deletion is kept until the question below is answered: when
    // the lease ended, the session's end stops the stream, and none of its held keys'
    // watches is cancelled one by one.
    let Some(_seen_by) = watch_own_key(&session, &key, granted).await else {
        return false;
    };
    if releasing.is_set() {
        return true;
    }
    match session.upgrade() {
        Some(live) => !Box::pin(live.lease_ended(&key)).await,
        None => false,
    }
}

/// The watch that saw the granted key deleted (or replaced); `None` when the session ended
/// first (its end fires the signal).
///
/// The key was the holder's at `granted.seen`, and a watch sees only after the revision it
/// began at (see [`crate::watches`]): the watch made while the holder waited began no
/// later than that; when a watch made now begins later, the key is read once more, so that
/// a deletion in between is not missed. So again whenever the watch is made anew (its
/// stream broke, or a compaction cancelled it).
async fn watch_own_key(session: &Weak<Session>, key: &str, granted: Granted) -> Option<Watch> {
    let Granted {
        created,
        mut seen,
        watch: mut waited_with,
    } = granted;
    // The requests and pauses below are boxed: this task lives as long as the guard, and
    // its state should be the small watch it waits on, not their larger futures. The
    // session's end needs no wait of its own here: it closes the watch stream after it
    // marks the session over, which ends the watch (`None`), and the next turn finds the
    // session over.
    loop {
        let live = session.upgrade().filter(|s| !s.is_over())?;
        let made = match waited_with.take() {
            Some(watch) => Ok(watch),
            None => Box::pin(live.watch_deletions(key, key, false, &Deadline::after(None))).await,
        };
        let mut watch = match made {
            Ok(watch) => watch,
            Err(_) => {
                drop(live);
                Box::pin(tokio::time::sleep(CLEANUP_PAUSE)).await;
                continue;
            }
        };
        if watch.from > seen {
            match Box::pin(live.key_reads.changed(key, created, watch.from)).await {
                Some((true, _)) => return Some(watch),
                Some((false, at)) => seen = seen.max(at),
                None => {
                    drop((live, watch));
                    Box::pin(tokio::time::sleep(CLEANUP_PAUSE)).await;
                    continue;
                }
            }
        }
        loop {
            match watch.next().await {
                // Compacted, or the stream broke: watch anew (and look).
                Some(answer) if answer.canceled() => break,
                None => break,
                // A watch made on a member behind the one that granted can still report
                // the deletion of an earlier key of the same name (this session's previous
                // hold of the lock): only a deletion after `seen` is of this key.
                Some(answer) => {
                    if deleted_after(&answer, seen).is_some() {
                        return Some(watch);
                    }
                }
            }
        }
    }
}

/// A granted key, as its guard releases it.
struct HeldKey {
    entry: Entry,
    name: String,
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
        let key = self.entry.key.as_str();
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
    /// A held lock keeps this task as long as it is held: at many locks per process, its
    /// size is most of a lock's client memory.
    #[test]
    fn a_held_keys_watch_task_stays_small() {
        let session = std::sync::Weak::new();
        let watching = super::watch_own_key(&session, "", super::Granted::new(1, 1));
        let size = std::mem::size_of_val(&watching);
        assert!(size <= 768, "the task's state takes {size} bytes");
    }
}
