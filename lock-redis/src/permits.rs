//! The read-write lock and the semaphore: one queue of permits (`scripts/permits.lua`),
//! waited on as the mutex's queue strategy waits (a release pushes a token onto the list of
//! each waiter it admits, and wakes no one else), with the mutex's lease and watchdog.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::kit::{RwAttempt, RwSide, SemaphoreAttempt};
use lock_core::{Deadline, Guard, LockError, LockName};

use crate::claim::Shape;
use crate::error::BACKEND;
use crate::lock::RedisLock;
use crate::session::Session;

/// The permits of a read-write lock: more than any count of readers reaches. A reader
/// takes one, a writer all of them.
const READ_WRITE_CAPACITY: u64 = 1 << 32;

/// A read-write lock from [`RedisLockProvider::rw_lock`](lock_core::LockProvider::rw_lock):
/// readers share it, a writer holds it alone, first come first served (a waiting writer
/// holds back the readers that come after it). Its keys are `{prefix:name.rwlock}:…`, apart
/// from the mutex of the same name; every hold has a fencing token of its own and the
/// lease and watchdog of the mutex.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::LockProvider;
/// use lock_redis::RedisLockProvider;
///
/// let provider = RedisLockProvider::connect_url("redis://127.0.0.1:6379").await?;
/// let prices = provider.rw_lock("prices")?;
/// let mut reading = prices.read(Some(Duration::from_secs(5))).await?;
/// // … read, while other readers may too …
/// reading.release().await?;
/// # Ok(()) }
/// ```
pub struct RedisRwLock {
    read: RedisLock,
    write: RedisLock,
}

impl RedisRwLock {
    pub(crate) fn new(shared: &Arc<Session>, name: LockName) -> Self {
        let side = |weight| {
            let shape = Shape::Permits {
                weight,
                capacity: READ_WRITE_CAPACITY,
            };
            RedisLock::permits(Arc::clone(shared), name.clone(), "rwlock", shape)
        };
        RedisRwLock {
            read: side(1),
            write: side(READ_WRITE_CAPACITY),
        }
    }
}

impl fmt::Debug for RedisRwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRwLock")
            .field("name", &self.read.name)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl RwAttempt for RedisRwLock {
    fn name(&self) -> &LockName {
        &self.read.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, side: RwSide, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        match side {
            RwSide::Read => self.read.attempt_with(None, deadline).await,
            RwSide::Write => self.write.attempt_with(None, deadline).await,
        }
    }
}

/// A counting semaphore from
/// [`RedisLockProvider::semaphore`](lock_core::LockProvider::semaphore): at most `permits`
/// holders at once, first come first served, a release waking only the waiter it admits.
/// Its keys are `{prefix:name.semaphore}:…`; every permit is a full guard (fencing token,
/// lease, watchdog). Every client of one semaphore must give the same number of permits.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
/// use lock_core::LockProvider;
/// use lock_redis::RedisLockProvider;
///
/// let provider = RedisLockProvider::connect_url("redis://127.0.0.1:6379").await?;
/// let uploads = provider.semaphore("uploads", 4)?;
/// let mut permit = uploads.acquire(Some(Duration::from_secs(5))).await?;
/// // … one of at most four uploads …
/// permit.release().await?;
/// # Ok(()) }
/// ```
pub struct RedisSemaphore {
    lock: RedisLock,
    permits: u32,
}

impl RedisSemaphore {
    pub(crate) fn new(shared: &Arc<Session>, name: LockName, permits: u32) -> Self {
        let shape = Shape::Permits {
            weight: 1,
            capacity: u64::from(permits),
        };
        RedisSemaphore {
            lock: RedisLock::permits(Arc::clone(shared), name, "semaphore", shape),
            permits,
        }
    }
}

impl fmt::Debug for RedisSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSemaphore")
            .field("name", &self.lock.name)
            .field("permits", &self.permits)
            .finish()
    }
}

#[async_trait]
impl SemaphoreAttempt for RedisSemaphore {
    fn name(&self) -> &LockName {
        &self.lock.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn permits(&self) -> u32 {
        self.permits
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        self.lock.attempt_with(None, deadline).await
    }
}
