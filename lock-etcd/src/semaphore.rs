//! The counting semaphore: a mutex in front of the leases, as Curator's
//! `InterProcessSemaphoreV2`.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::kit::SemaphoreAttempt;
use lock_core::{Deadline, Guard, LockError, LockName};

use crate::error::BACKEND;
use crate::queue::{Blockers, Place};
use crate::session::Shared;

/// A semaphore handle from an [`EtcdLockProvider`](crate::EtcdLockProvider).
///
/// Under `{prefix}/{name}.semaphore/`, a contender first takes the mutex `locks/` (a queue
/// like the mutex's, herd-free under [`Predecessor`](crate::EtcdStrategy::Predecessor)),
/// then writes its lease `leases/{lease in hex}` and holds a permit as soon as fewer than
/// `permits` leases precede its own; it gives the mutex up then. So only the contender
/// that holds the mutex watches the leases, and a release wakes that one contender; the
/// others wait for the mutex, in arrival order. A permit's fencing token is its lease's
/// create revision.
///
/// Every client of one semaphore must use the same number of permits.
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_etcd::EtcdLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locks = EtcdLockProvider::connect_url("etcd://127.0.0.1:2379").await?;
/// let crawlers = locks.semaphore("crawlers", 4)?;
/// let mut permit = crawlers.acquire(None).await?;
/// // ... at most four of these run at once ...
/// permit.release().await?;
/// # Ok(()) }
/// ```
pub struct EtcdSemaphore {
    place: Place,
    permits: u32,
    /// `{dir}locks/`.
    locks: String,
    /// `{dir}leases/`.
    leases: String,
}

impl fmt::Debug for EtcdSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSemaphore")
            .field("name", &self.place.name)
            .field("permits", &self.permits)
            .field("dir", &self.place.dir)
            .field("strategy", &self.place.shared.config.strategy)
            .finish()
    }
}

impl EtcdSemaphore {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName, permits: u32) -> Self {
        let place = Place::new(shared, name, ".semaphore");
        let locks = format!("{}locks/", place.dir);
        let leases = format!("{}leases/", place.dir);
        EtcdSemaphore {
            place,
            permits,
            locks,
            leases,
        }
    }
}

#[async_trait]
impl SemaphoreAttempt for EtcdSemaphore {
    fn name(&self) -> &LockName {
        &self.place.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn permits(&self) -> u32 {
        self.permits
    }

    /// Takes a permit, or gives up at the deadline with `Ok(None)`, leaving nothing behind.
    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let place = &self.place;
        let session = place.shared.session(&place.name).await?;
        // One slot for both keys of this contender: an inspection can tell the mutex
        // holder's lease (still waiting) from the leases held.
        let slot = place.slot(&session);
        let mutex = place.entry(&session, &slot, "locks/");
        let turn = match mutex.entry() {
            Some(entry) => {
                let blockers = Blockers::any(&self.locks);
                place.wait_turn(&session, entry, blockers, &deadline).await
            }
            None => Ok(None),
        };
        if !matches!(turn, Ok(Some(_))) {
            return place.settle(&session, mutex, turn).await;
        }
        let lease = place.entry(&session, &slot, "leases/");
        let turn = match lease.entry() {
            Some(entry) => {
                let blockers = Blockers {
                    dir: &self.leases,
                    admits: self.permits,
                };
                place.wait_turn(&session, entry, blockers, &deadline).await
            }
            None => Ok(None),
        };
        // The lease stays armed for removal until it is granted: a cancel while the mutex
        // is given up must not leave a permit taken on nobody's behalf.
        place.give_up(&session, mutex).await;
        place.settle(&session, lease, turn).await
    }
}
