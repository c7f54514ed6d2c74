//! Leader election on the queue strategy: the lock's queue and lease, with each candidate's
//! value kept beside its place; observers poll the leader.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::LeaderSource;
use lock_core::kit::ElectionAttempt;
use lock_core::{Deadline, FencingToken, Guard, LeaderInfo, LockError, LockName};

use crate::error::BACKEND;
use crate::lock::RedisLock;
use crate::scripts;
use crate::session::Session;

/// How often an observer asks who leads: Redis tells nobody when a lease runs out.
const OBSERVE_EVERY: Duration = Duration::from_millis(100);

/// A leader election from a [`RedisLockProvider`](crate::RedisLockProvider).
///
/// The election `N` is a lock of its own, `{prefix:N.election}:…`, always on the
/// [`Queue`](crate::RedisStrategy::Queue) strategy whatever the provider's: candidates wait
/// in its queue, a resignation hands over to the first live one (herd-free), and the leader
/// holds the owner key on a lease its watchdog renews. Each candidate's value is kept in
/// `{prefix:N.election}:v:<owner id>` for as long as its place or its lease, and removed
/// when it resigns or gives up. The term is the lock's fencing token. Observers ask who
/// leads every 100 ms: a lease that runs out is announced to nobody.
///
/// Efficiency-grade, like the Redis lock: a failover or a restart without persistence can
/// make two leaders at once and roll the term back. Use ZooKeeper or etcd where two leaders
/// must never act at once.
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_redis::RedisLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let redis = RedisLockProvider::connect_url("redis://127.0.0.1:6379").await?;
/// let election = redis.election("cache-warmer")?;
/// let mut leadership = election.campaign(b"host-a", None).await?;
/// // ... lead while leadership.lost() has not fired ...
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
pub struct RedisElection {
    lock: RedisLock,
}

impl fmt::Debug for RedisElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisElection")
            .field("name", &self.lock.name)
            .field("owner_key", &self.lock.keys.owner)
            .finish()
    }
}

impl RedisElection {
    pub(crate) fn new(shared: Arc<Session>, name: LockName) -> Self {
        RedisElection {
            lock: RedisLock::election(shared, name),
        }
    }
}

#[async_trait]
impl ElectionAttempt for RedisElection {
    fn name(&self) -> &LockName {
        &self.lock.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, value: &[u8], deadline: Deadline) -> Result<Option<Guard>, LockError> {
        self.lock.attempt_with(Some(value), deadline).await
    }
}

#[async_trait]
impl LeaderSource for RedisElection {
    /// Asks again, every 100 ms, while Redis cannot be reached (a restart, a
    /// dropped connection), for at most one lease: an observation ends at its first error.
    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        let (shared, name) = (&self.lock.shared, &self.lock.name);
        let give_up = Deadline::after(Some(shared.config.lease.ttl));
        loop {
            shared.closed.check(BACKEND, name)?;
            let asked: Result<Option<(String, Vec<u8>, u64)>, LockError> = shared
                .node
                .run(scripts::leader(&self.lock.keys), name.as_str())
                .await;
            match asked {
                Ok(leader) => {
                    return Ok(
                        leader.map(|(_, value, term)| LeaderInfo::new(value, FencingToken(term)))
                    );
                }
                Err(error) if error.is_retryable() && !give_up.has_passed() => {
                    tracing::debug!(election = %name, %error, "redis: who leads? asking again");
                    tokio::select! {
                        () = tokio::time::sleep(OBSERVE_EVERY) => {}
                        () = shared.closed.wait() => {}
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn changed(&self, _seen: &Option<LeaderInfo>) -> Result<(), LockError> {
        tokio::select! {
            () = tokio::time::sleep(OBSERVE_EVERY) => {}
            () = self.lock.shared.closed.wait() => {}
        }
        Ok(())
    }
}
