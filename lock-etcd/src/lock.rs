//! The mutex: a key per contender ordered by create revision (herd-free or herd), or one
//! shared key (naive).
//!
//! - `predecessor` and `prefix` queue (see `queue`) in the layout of etcd's own
//!   `concurrency.Mutex`: a key `{dir}{lease in hex}`, held when no key of the directory
//!   has a smaller create revision. `predecessor` watches only the key just before its own:
//!   a release wakes one waiter; `prefix` watches the whole directory: every deletion wakes
//!   every waiter (a herd).
//! - `single` creates `{dir}lock` if absent, and every waiter watches that key.
//!
//! The holder's fencing token is its key's create revision: revisions are the cluster's
//! one logical clock, and survive a leader's failover.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnResponse};
use lock_core::kit::{Cleanup, MutexAttempt, Wakeups};
use lock_core::queue::LockQueue;
use lock_core::{Deadline, Guard, LockError, LockName};

use crate::config::EtcdStrategy;
use crate::error::BACKEND;
use crate::guard::Entry;
use crate::guard::Granted;
use crate::queue::{Blockers, Place, Wait, Watched, Watching, Woke, kvs};
use crate::session::{Session, Shared};

/// The single-key lock's key in a lock's directory (not a hex lease id, so it never names
/// a contender of the queue strategies).
pub(crate) const SINGLE_KEY: &str = "lock";

/// A lock handle from an [`EtcdLockProvider`](crate::EtcdLockProvider).
pub struct EtcdLock {
    /// `{prefix}/{name escaped}/`.
    place: Place,
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLock")
            .field("name", &self.place.name)
            .field("dir", &self.place.dir)
            .field("strategy", &self.place.shared.config.strategy)
            .finish()
    }
}

impl EtcdLock {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        EtcdLock {
            place: Place::new(shared, name, ""),
        }
    }
}

#[async_trait]
impl MutexAttempt for EtcdLock {
    fn name(&self) -> &LockName {
        &self.place.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let place = &self.place;
        let session = place.shared.session(&place.name).await?;
        let slot = place.slot(&session);
        if place.shared.config.strategy != EtcdStrategy::Single {
            // Armed before the first request: a dropped attempt leaves no key behind.
            let pending = place.entry(&session, &slot, "");
            return place
                .attempt(&session, pending, Blockers::any(&place.dir), &deadline)
                .await;
        }
        let key = format!("{}{SINGLE_KEY}", place.dir);
        let ours_if = Some(slot.key());
        let pending = Cleanup::new(Entry::new(&session, key, ours_if, slot));
        let turn = match pending.entry() {
            Some(entry) => self.single(&session, entry, &deadline).await,
            None => Ok(None),
        };
        place.settle(&session, pending, turn).await
    }

    async fn queue(&self) -> Result<LockQueue, LockError> {
        self.place.queue().await
    }
}

impl EtcdLock {
    /// The single-key lock: create `{dir}lock` holding our slot's key if absent, else wait
    /// for its deletion and try again.
    async fn single(
        &self,
        session: &Arc<Session>,
        entry: &Entry,
        deadline: &Deadline,
    ) -> Result<Option<Granted>, LockError> {
        let place = &self.place;
        let (key, value) = (&*entry.key, entry.ours_if.as_deref().unwrap_or_default());
        let mut wakeups = Wakeups::new(&place.shared.metrics);
        let mut watching = Watching::default();
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    value,
                    Some(PutOptions::new().with_lease(session.lease)),
                )])
                .or_else([TxnOp::get(key, None)]);
            let answer = entry
                .send_create(session, place.name.as_str(), txn, created)
                .await?;
            let revision = answer.header().map_or(0, |header| header.revision());
            if answer.succeeded() {
                return Ok(Some(Granted::new(revision, revision)));
            }
            let found = answer
                .op_responses()
                .into_iter()
                .find_map(|found| kvs(found).into_iter().next());
            match found {
                // Ours: a create sent again after a lost reply.
                Some((_, create_revision, held_by)) if held_by == value.as_bytes() => {
                    return Ok(Some(Granted::new(create_revision, revision)));
                }
                // Deleted in between: try again at once.
                None => continue,
                Some(_) => {}
            }
            wakeups.busy();
            if deadline.is_immediate() || deadline.has_passed() {
                return Ok(None);
            }
            let wait = Wait {
                watched: Watched::Key(key),
                own: None,
                last: false,
                revision,
            };
            let woke = place.wait_for_delete(session, &mut watching, wait, deadline);
            match woke.await? {
                Woke::Ours | Woke::Deleted(_) => wakeups.woke(),
                Woke::LookAgain(_) => {}
                Woke::TimedOut => return Ok(None),
            }
        }
    }
}

/// The create revision of the single key, when this create made it.
fn created(answer: &TxnResponse) -> Option<i64> {
    answer
        .succeeded()
        .then(|| answer.header().map(|header| header.revision()))
        .flatten()
}
