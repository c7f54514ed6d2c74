//! Leader elections: the advisory lock `hashtextextended('{schema}/{name}', 4)`, queued on
//! the server; its holder leads.
//!
//! The statement that grants the lock also raises the name's counter row (the term) and
//! writes the leader's row in `{schema}.distlock_leaders`: its term, its value and the
//! server process holding the lock. Observers count that row only while that process
//! holds the lock (`pg_locks`), so a leader that resigned or died is not reported, and
//! read it again every [`OBSERVE_INTERVAL`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::LeaderSource;
use lock_core::kit::ElectionAttempt;
use lock_core::{Deadline, FencingToken, Guard, LeaderInfo, LockError, LockName};
use tokio_postgres::types::{ToSql, Type};

use crate::error::BACKEND;
use crate::lock::{Kind, Target, contend};
use crate::shared::{HELD_KEY, LEADERS_TABLE, Mode, Shared};

/// How often an observer reads the leader again.
pub const OBSERVE_INTERVAL: Duration = Duration::from_millis(100);

/// An election from a [`PostgresLockProvider`](crate::PostgresLockProvider).
pub struct PostgresElection {
    shared: Arc<Shared>,
    target: Arc<Target>,
    /// The statement that reads the leader.
    read_leader: String,
}

impl PostgresElection {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        let target = Arc::new(Target::new(&shared.config.schema, name, Kind::Election));
        let read_leader = format!(
            "SELECT l.term, l.value FROM {schema}.{LEADERS_TABLE} l WHERE l.name = $3 \
             AND EXISTS (SELECT 1 FROM pg_locks k WHERE k.pid = l.pid AND k.granted AND \
             {HELD_KEY})",
            schema = shared.config.schema
        );
        PostgresElection {
            shared,
            target,
            read_leader,
        }
    }
}

impl fmt::Debug for PostgresElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresElection")
            .field("name", &self.target.name)
            .field("key", &self.target.key)
            .finish()
    }
}

#[async_trait]
impl ElectionAttempt for PostgresElection {
    fn name(&self) -> &LockName {
        &self.target.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Queues for the election's lock on the server; the grant writes `value` as the
    /// leader's.
    async fn attempt(&self, value: &[u8], deadline: Deadline) -> Result<Option<Guard>, LockError> {
        contend(
            &self.shared,
            &self.target,
            Mode::Exclusive,
            Some(value),
            deadline,
        )
        .await
        .map_err(|error| error.for_lock(&self.target.name))
    }
}

#[async_trait]
impl LeaderSource for PostgresElection {
    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        let shared = &self.shared;
        shared.closed.check(BACKEND, &self.target.name)?;
        let look = shared.pool.look().await?;
        let key: &str = &self.target.key;
        let row: &str = self.target.name.as_str();
        let params = [
            (&key as &(dyn ToSql + Sync), Type::TEXT),
            (&self.target.seed, Type::INT8),
            (&row, Type::TEXT),
        ];
        let rows = look
            .conn
            .ask(&self.read_leader, &params)
            .await
            .map_err(|error| error.for_lock(&self.target.name))?;
        drop(look);
        Ok(rows.first().map(|row| {
            let term: i64 = row.get(0);
            let value: Vec<u8> = row.get(1);
            LeaderInfo::new(value, FencingToken(u64::try_from(term).unwrap_or_default()))
        }))
    }

    /// Reads the leader every [`OBSERVE_INTERVAL`] until it is no longer `seen`; ends with
    /// the provider.
    async fn changed(&self, seen: &Option<LeaderInfo>) -> Result<(), LockError> {
        loop {
            tokio::select! {
                () = tokio::time::sleep(OBSERVE_INTERVAL) => {}
                () = self.shared.closed.wait() => {
                    return Err(LockError::SessionExpired {
                        backend: BACKEND,
                        name: Some(self.target.name.to_string()),
                    });
                }
            }
            if self.leader().await? != *seen {
                return Ok(());
            }
        }
    }
}
