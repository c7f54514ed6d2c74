//! Who holds a Redis lock and who waits: for
//! [`RedisLockProvider::holders`](crate::RedisLockProvider::holders) and, in lock-core's
//! terms, [`DistributedLock::queue`](lock_core::DistributedLock::queue).

use std::time::Duration;

use lock_core::queue::{LockQueue, QueuedContender};
use lock_core::{FencingToken, LockError, LockName};

use crate::config::RedisStrategy;
use crate::keys::LockKeys;
use crate::session::Session;

/// Who holds a Redis lock and who waits for it: [`RedisLockProvider::holders`](crate::RedisLockProvider::holders).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisHolders {
    /// The holder's owner id, or `None` when the lock is free.
    pub owner: Option<String>,
    /// The lease left on the holder's key, when the server reports one.
    pub owner_ttl: Option<Duration>,
    /// The waiters' owner ids, first in line first (queue strategy only). Waiters whose
    /// deadline has passed stay listed until a grant or a release drops them.
    pub queue: Vec<String>,
    /// The last fencing token handed out for this name (the holder's, while it is held);
    /// 0 when none ever was.
    pub fence: u64,
}

impl RedisHolders {
    /// The holder, its lease, the queue and the fence of the lock on `keys`, read in one
    /// transaction.
    pub(crate) async fn read(
        session: &Session,
        name: &LockName,
        keys: &LockKeys,
    ) -> Result<Self, LockError> {
        let mut pipeline = redis::pipe();
        pipeline
            .atomic()
            .get(&keys.owner)
            .pttl(&keys.owner)
            .lrange(&keys.queue, 0, -1)
            .get(&keys.fence);
        let (owner, pttl, queue, fence): (Option<String>, i64, Vec<String>, Option<u64>) =
            session.node.query(&pipeline, name.as_str()).await?;
        Ok(RedisHolders {
            owner_ttl: owner
                .as_ref()
                .and_then(|_| u64::try_from(pttl).ok())
                .map(Duration::from_millis),
            owner,
            queue,
            fence: fence.unwrap_or_default(),
        })
    }

    /// The same as lock-core's [`LockQueue`], for a lock on `strategy` whose owner key is
    /// `owner_key`.
    pub(crate) fn queue(&self, strategy: RedisStrategy, owner_key: &str) -> LockQueue {
        let holder = self.owner.as_ref().map(|owner| {
            let holder =
                QueuedContender::holder(owner.clone()).with_fencing_token(FencingToken(self.fence));
            match self.owner_ttl {
                Some(left) => holder.with_lease_left(left),
                None => holder,
            }
        });
        let waiters = self
            .queue
            .iter()
            .map(|owner| QueuedContender::waiter(owner.clone()));
        let queue = LockQueue::new(holder.into_iter().chain(waiters).collect()).at(owner_key);
        match strategy {
            RedisStrategy::Queue => queue,
            other => queue.without_recorded_waiters().with_note(format!(
                "the {other} strategy keeps no queue on the server: waiters are not listed"
            )),
        }
    }
}
