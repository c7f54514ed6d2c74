//! The read-write lock: ZooKeeper's shared-lock recipe, with Curator's node names.

use std::fmt;

use async_trait::async_trait;
use lock_core::kit::{RwAttempt, RwSide};
use lock_core::{Deadline, Guard, LockError};

use crate::node::NodeKind;
use crate::queue::{Place, name_and_backend};

/// A read-write lock handle from a [`ZkLockProvider`](crate::ZkLockProvider).
///
/// Readers create `__READ__` nodes and writers `__WRIT__` nodes (Curator's
/// `InterProcessReadWriteLock`; kazoo's `__rlock__` / `__lock__` with the kazoo node format)
/// in the directory `{root}/{name}.rwlock`, all in one sequence. A reader holds when no
/// writer precedes it, a writer when it is first; so a waiting writer keeps out the readers
/// that come after it, and the readers queued behind one writer all enter when it leaves.
///
/// Under [`SequentialPredecessor`](crate::ZkStrategy::SequentialPredecessor) a waiting
/// reader watches the nearest earlier writer and a waiting writer its immediate
/// predecessor, so that a departure wakes only those it can let in; under the other
/// strategies every waiter watches the directory (the herd variant).
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_zookeeper::ZkLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locks = ZkLockProvider::connect_url("zk://127.0.0.1:2181").await?;
/// let catalogue = locks.rw_lock("catalogue")?;
/// let mut reading = catalogue.read(None).await?;
/// // ... read, alongside other readers ...
/// reading.release().await?;
/// # Ok(()) }
/// ```
pub struct ZkRwLock {
    pub(crate) place: Place,
}

impl fmt::Debug for ZkRwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkRwLock")
            .field("name", &self.place.name)
            .field("dir", &self.place.dir)
            .field("strategy", &self.place.shared.config.strategy)
            .finish()
    }
}

#[async_trait]
impl RwAttempt for ZkRwLock {
    name_and_backend!(place);

    /// Takes a read (shared) or write hold, or gives up at the deadline with `Ok(None)`,
    /// leaving nothing behind.
    async fn attempt(&self, side: RwSide, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let kind = match side {
            RwSide::Read => NodeKind::Read,
            RwSide::Write => NodeKind::Write,
        };
        self.place.take_turn(kind, deadline).await
    }
}
