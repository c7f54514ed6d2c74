//! The read-write lock: readers and writers in one queue ordered by create revision.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::kit::{RwAttempt, RwSide};
use lock_core::{Deadline, Guard, LockError, LockName};

use crate::error::BACKEND;
use crate::queue::{Blockers, Place};
use crate::session::Shared;

/// A read-write lock handle from an [`EtcdLockProvider`](crate::EtcdLockProvider).
///
/// Readers write `{dir}read/{lease in hex}` and writers `{dir}write/{lease in hex}` in the
/// directory `{prefix}/{name}.rwlock/` (the layout of etcd's `recipes.RWMutex`), all in
/// one order: create revisions. A reader holds when no writer's key precedes its own, a
/// writer when no key at all does; so a waiting writer keeps out the readers that come
/// after it, and the readers queued behind one writer all enter when it leaves.
///
/// Under [`Predecessor`](crate::EtcdStrategy::Predecessor) a waiting reader watches the
/// nearest earlier writer and a waiting writer the key just before its own, so that a
/// departure wakes only those it can let in; under the other strategies every waiter
/// watches the directory (the herd variant). Fencing tokens are create revisions, as for
/// the mutex.
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_etcd::EtcdLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locks = EtcdLockProvider::connect_url("etcd://127.0.0.1:2379").await?;
/// let catalogue = locks.rw_lock("catalogue")?;
/// let mut reading = catalogue.read(None).await?;
/// // ... read, alongside other readers ...
/// reading.release().await?;
/// # Ok(()) }
/// ```
pub struct EtcdRwLock {
    place: Place,
    /// `{dir}write/`: the keys that keep a reader out.
    writers: String,
}

impl fmt::Debug for EtcdRwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdRwLock")
            .field("name", &self.place.name)
            .field("dir", &self.place.dir)
            .field("strategy", &self.place.shared.config.strategy)
            .finish()
    }
}

impl EtcdRwLock {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        let place = Place::new(shared, name, ".rwlock");
        let writers = format!("{}write/", place.dir);
        EtcdRwLock { place, writers }
    }
}

#[async_trait]
impl RwAttempt for EtcdRwLock {
    fn name(&self) -> &LockName {
        &self.place.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Takes a read or write hold, or gives up at the deadline with `Ok(None)`, leaving
    /// nothing behind.
    async fn attempt(&self, side: RwSide, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let place = &self.place;
        let session = place.shared.session(&place.name).await?;
        let slot = place.slot(&session);
        let (within, blockers) = match side {
            RwSide::Read => ("read/", Blockers::any(&self.writers)),
            RwSide::Write => ("write/", Blockers::any(&place.dir)),
        };
        let pending = place.entry(&session, &slot, within);
        place.attempt(&session, pending, blockers, &deadline).await
    }
}
