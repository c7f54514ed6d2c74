//! The semaphore: `permits` advisory locks, `hashtextextended('{schema}/{name}/{i}', 3)`,
//! behind a queue, the advisory lock `hashtextextended('{schema}/{name}', 2)`.
//!
//! A contender queues for the queue lock on the server (first come, first served; a
//! release wakes one). The queue's head takes the first free permit in one statement that
//! also raises the name's counter row and leaves the queue; the permit is its guard's. While
//! no permit is free only the head waits for one: it listens on the semaphore's channel,
//! which every permit's release notifies, and looks again after the keepalive anyway (a
//! holder that died notified nobody). So a release wakes one contender, whatever the
//! provider's strategy.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::kit::SemaphoreAttempt;
use lock_core::{Deadline, Guard, LockError, LockName};
use tokio_postgres::types::{ToSql, Type};

use crate::error::BACKEND;
use crate::lock::{Kind, Target, Waiting, grant, token_of};
use crate::shared::{Mode, Shared};

/// A semaphore from a [`PostgresLockProvider`](crate::PostgresLockProvider).
pub struct PostgresSemaphore {
    shared: Arc<Shared>,
    /// The queue's advisory lock; its channel is the one permits' releases notify.
    queue: Target,
    permits: u32,
}

impl PostgresSemaphore {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName, permits: u32) -> Self {
        let queue = Target::new(&shared.config.schema, name, Kind::SemaphoreQueue);
        PostgresSemaphore {
            shared,
            queue,
            permits,
        }
    }

    /// The permit `index`: its advisory lock, released with a notification of the queue's
    /// channel.
    fn permit(&self, index: i32) -> Arc<Target> {
        Arc::new(Target::with_key(
            self.queue.name.clone(),
            format!("{}/{index}", self.queue.key),
            Kind::Permit,
            self.queue.channel.clone(),
        ))
    }

    /// The statement that takes the first free permit (trying them in order, stopping at
    /// the first taken), raises the name's counter row and leaves the queue: the token and
    /// the permit's index, or no row (still queued) when every permit is taken.
    fn take_permit(&self) -> String {
        format!(
            "WITH permit AS MATERIALIZED (SELECT i FROM generate_series(0, $3 - 1) AS i \
             WHERE pg_try_advisory_lock(hashtextextended($1 || '/' || i, {permit})) LIMIT 1) \
             INSERT INTO {table} AS f (name, token) SELECT $2, 1 FROM permit \
             ON CONFLICT (name) DO UPDATE SET token = f.token + 1 \
             RETURNING token, (SELECT i FROM permit), \
             pg_advisory_unlock(hashtextextended($1, {queue}))",
            permit = Kind::Permit as i64,
            queue = Kind::SemaphoreQueue as i64,
            table = self.shared.table,
        )
    }
}

impl fmt::Debug for PostgresSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSemaphore")
            .field("name", &self.queue.name)
            .field("key", &self.queue.key)
            .field("permits", &self.permits)
            .finish()
    }
}

#[async_trait]
impl SemaphoreAttempt for PostgresSemaphore {
    fn name(&self) -> &LockName {
        &self.queue.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn permits(&self) -> u32 {
        self.permits
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        self.take(deadline)
            .await
            .map_err(|error| error.for_lock(&self.queue.name))
    }
}

impl PostgresSemaphore {
    async fn take(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let shared = &self.shared;
        shared.closed.check(BACKEND, &self.queue.name)?;
        // A connection of its own: the queue's wait blocks it, and its head listens.
        let waiting = Waiting::new(shared.pool.for_wait().await?);
        let conn = Arc::clone(&waiting.conn);
        let key: &str = &self.queue.key;
        let kind = self.queue.kind as i64;
        let queue_params = [
            (&key as &(dyn ToSql + Sync), Type::TEXT),
            (&kind, Type::INT8),
        ];
        // 1. The head of the queue.
        if deadline.is_immediate() {
            let rows = conn
                .ask(
                    "SELECT pg_try_advisory_lock(hashtextextended($1, $2))",
                    &queue_params,
                )
                .await?;
            let headed = rows.first().and_then(|row| row.try_get::<_, bool>(0).ok());
            if headed != Some(true) {
                shared.pool.share(waiting.settle());
                return Ok(None);
            }
        } else {
            let queued = conn.wait(
                "SELECT pg_advisory_lock(hashtextextended($1, $2))",
                &queue_params,
            );
            match deadline.remaining() {
                None => drop(queued.await?),
                Some(left) => match tokio::time::timeout(left, queued).await {
                    Ok(rows) => drop(rows?),
                    // Cancelled and closed as `waiting` drops.
                    Err(_) => return Ok(None),
                },
            }
        }
        // 2. A permit, waiting for a release while none is free.
        let listening = !deadline.is_immediate();
        if listening {
            conn.run(&format!("LISTEN {}", self.queue.channel)).await?;
        }
        let row: &str = self.queue.name.as_str();
        let permits = i32::try_from(self.permits).unwrap_or(i32::MAX);
        let take_params = [
            (&key as &(dyn ToSql + Sync), Type::TEXT),
            (&row, Type::TEXT),
            (&permits, Type::INT4),
        ];
        let take = self.take_permit();
        let (token, index) = loop {
            let rows = conn.ask(&take, &take_params).await?;
            if let Some(token) = token_of(&rows) {
                let index = rows.first().and_then(|row| row.try_get::<_, i32>(1).ok());
                break (token, index.unwrap_or_default());
            }
            if deadline.is_immediate() || deadline.has_passed() {
                // Closing the connection leaves the queue and stops the listening.
                waiting.discard();
                return Ok(None);
            }
            conn.notification(deadline.cap(shared.config.keepalive))
                .await;
        };
        // Out of the queue (the statement left it), the permit held.
        let permit = self.permit(index);
        let conn = waiting.settle();
        let guard = grant(
            shared,
            &permit,
            Mode::Exclusive,
            Arc::clone(&conn),
            token,
            (listening, true),
        );
        if !listening {
            shared.pool.share(conn);
        }
        Ok(Some(guard))
    }
}
