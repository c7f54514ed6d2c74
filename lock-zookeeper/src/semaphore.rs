//! The counting semaphore: Curator's lease recipe (`InterProcessSemaphoreV2`).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::kit::{SemaphoreAttempt, Wakeups};
use lock_core::{Deadline, Guard, LockError};
use uuid::Uuid;

use crate::guard::{Granted, Leftover, Pending, grant};
use crate::node::{NodeKind, contenders};
use crate::queue::{Place, name_and_backend};
use crate::session::Session;

/// A semaphore handle from a [`ZkLockProvider`](crate::ZkLockProvider).
///
/// The layout and protocol are Curator's `InterProcessSemaphoreV2` under
/// `{root}/{name}.semaphore`: a contender first takes the mutex in `locks`, then creates its
/// ephemeral sequential lease node in `leases`; it holds a permit as soon as `leases` has
/// no more than `permits` children, and it gives the mutex up then. So only the contender
/// that holds the mutex watches the lease directory; the others wait for the mutex, each
/// watching its predecessor (or, under the herd strategies, the `locks` directory), in
/// arrival order.
///
/// Every client of one semaphore must use the same number of permits.
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_zookeeper::ZkLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locks = ZkLockProvider::connect_url("zk://127.0.0.1:2181").await?;
/// let crawlers = locks.semaphore("crawlers", 4)?;
/// let mut permit = crawlers.acquire(None).await?;
/// // ... at most four of these run at once ...
/// permit.release().await?;
/// # Ok(()) }
/// ```
pub struct ZkSemaphore {
    permits: u32,
    /// `{dir}/locks`: the mutex that lets one contender at a time watch the leases.
    locks: Place,
    /// `{dir}/leases`: one node per permit held, and the mutex holder's.
    leases: Place,
}

impl fmt::Debug for ZkSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSemaphore")
            .field("name", &self.leases.name)
            .field("permits", &self.permits)
            .field("leases", &self.leases.dir)
            .field("strategy", &self.leases.shared.config.strategy)
            .finish()
    }
}

#[async_trait]
impl SemaphoreAttempt for ZkSemaphore {
    name_and_backend!(leases);

    fn permits(&self) -> u32 {
        self.permits
    }

    /// Takes a permit, or gives up at the deadline with `Ok(None)`, leaving nothing behind.
    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let place = &self.leases;
        let session = place.shared.session(&place.name, deadline).await?;
        // One uuid for both nodes of this contender: an inspection can tell the mutex
        // holder's lease (still waiting) from the leases held.
        let uuid = Uuid::new_v4();
        let Some(mutex) = self
            .locks
            .wait_turn(&session, NodeKind::Lock, uuid, deadline)
            .await?
        else {
            return Ok(None);
        };
        // Given up on every way out of here: at once, or in the background after a cancel.
        let leftover = Leftover::Granted {
            path: mutex.path,
            czxid: mutex.czxid,
        };
        let mut mutex = Pending::new(&session, &self.locks.dir, leftover);
        let lease = self.wait_for_lease(&session, uuid, deadline).await;
        mutex.remove_now(&place.shared.metrics).await;
        // The lease stays armed for removal until here: a cancel while the mutex was being
        // given up must not leave a permit taken on nobody's behalf.
        Ok(lease?.map(|(granted, mut lease)| {
            lease.disarm();
            grant(&place.shared, &session, &place.name, granted)
        }))
    }
}

impl ZkSemaphore {
    /// The semaphore whose directory is `place.dir`.
    pub(crate) fn new(place: Place, permits: u32) -> Self {
        let at = |child: &str| Place {
            dir: format!("{}/{child}", place.dir),
            ..place.clone()
        };
        ZkSemaphore {
            permits,
            locks: at("locks"),
            leases: at("leases"),
        }
    }

    /// With the mutex held: creates this contender's lease and waits until it is among the
    /// first `permits`, watching the lease directory. The granted lease comes with its
    /// clean-up still armed.
    async fn wait_for_lease(
        &self,
        session: &Arc<Session>,
        uuid: Uuid,
        deadline: Deadline,
    ) -> Result<Option<(Granted, Pending)>, LockError> {
        let place = &self.leases;
        let mut pending = Pending::new(
            session,
            &place.dir,
            Leftover::Sequential { uuid, node: None },
        );
        let (node, czxid) = place
            .create_sequential(session, uuid, NodeKind::Lease)
            .await?;
        pending.set_node(node.clone());
        let mut wakeups = Wakeups::new(&place.shared.metrics);
        loop {
            let asked = tokio::time::Instant::now();
            let (children, watcher) = place
                .resend(session, |client| client.list_and_watch_children(&place.dir))
                .await
                .map_err(|e| place.error(e))?;
            let leases = contenders(children);
            if !leases.iter().any(|(_, child)| *child == node) {
                pending.disarm();
                return Err(place.place_gone(&node));
            }
            if leases.len() <= self.permits as usize {
                let granted = Granted::new(format!("{}/{node}", place.dir), czxid, asked, None);
                return Ok(Some((granted, pending)));
            }
            wakeups.busy();
            if deadline.is_immediate()
                || deadline.has_passed()
                || !place.wait_for(watcher, &deadline).await?
            {
                pending.remove_now(&place.shared.metrics).await;
                return Ok(None);
            }
            wakeups.woke();
        }
    }
}
