//! The ZooKeeper mutex: the three strategies, connection-safe creation, cancel-safe waiting.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::kit::{MutexAttempt, Wakeups};
use lock_core::queue::LockQueue;
use lock_core::{Deadline, Guard, LockError};
use uuid::Uuid;
use zookeeper_client::{CreateMode, Error as ZkError};

use crate::config::ZkStrategy;
use crate::error::outcome_unknown;
use crate::guard::{Granted, Leftover, Pending, grant};
use crate::node::{NodeKind, SINGLE_NODE};
use crate::queue::{Place, name_and_backend};
use crate::session::{RETRY_PAUSE, SEND_ATTEMPTS, Session};

/// A lock handle from a [`ZkLockProvider`](crate::ZkLockProvider).
pub struct ZkLock {
    pub(crate) place: Place,
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLock")
            .field("name", &self.place.name)
            .field("dir", &self.place.dir)
            .field("strategy", &self.place.shared.config.strategy)
            .finish()
    }
}

#[async_trait]
impl MutexAttempt for ZkLock {
    name_and_backend!(place);

    /// Takes the lock, or gives up at the deadline with `Ok(None)`, leaving nothing behind.
    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let place = &self.place;
        if place.shared.config.strategy != ZkStrategy::SingleNode {
            return place.take_turn(NodeKind::Lock, deadline).await;
        }
        let session = place.shared.session(&place.name, deadline).await?;
        let granted = self.single_node(&session, deadline).await?;
        Ok(granted.map(|granted| grant(&place.shared, &session, &place.name, granted)))
    }

    async fn queue(&self) -> Result<LockQueue, LockError> {
        self.place.queue().await
    }
}

impl ZkLock {
    /// The naive lock: whoever creates `{dir}/lock` holds it; every waiter watches it.
    async fn single_node(
        &self,
        session: &Arc<Session>,
        deadline: Deadline,
    ) -> Result<Option<Granted>, LockError> {
        let place = &self.place;
        let uuid = Uuid::new_v4();
        let path = format!("{}/{SINGLE_NODE}", place.dir);
        let options = CreateMode::Ephemeral.with_acls(session.acls);
        let mut pending = Pending::new(session, &place.dir, Leftover::Single { uuid });
        let mut wakeups = Wakeups::new(&place.shared.metrics);
        let mut unknown = 0;
        loop {
            let mut asked = tokio::time::Instant::now();
            let ours = match place
                .ask(session)
                .create(&path, uuid.as_bytes(), &options)
                .await
            {
                Ok((stat, _)) => Some(stat.czxid),
                Err(ZkError::NoNode) => {
                    place.ensure_dir(session).await?;
                    continue;
                }
                Err(ZkError::NodeExists) => None,
                Err(error) if outcome_unknown(&error) && unknown < SEND_ATTEMPTS => {
                    unknown += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                    // Decided by the node's owner and content, never by assumption.
                    asked = tokio::time::Instant::now();
                    match place.ask(session).get_data(&path).await {
                        Ok((data, stat))
                            if stat.ephemeral_owner == session.id && data == uuid.as_bytes() =>
                        {
                            Some(stat.czxid)
                        }
                        Ok(_) | Err(ZkError::NoNode) => None,
                        Err(error) if outcome_unknown(&error) => continue,
                        Err(error) => return Err(place.error(error)),
                    }
                }
                Err(error) => return Err(place.error(error)),
            };
            if let Some(czxid) = ours {
                pending.disarm();
                return Ok(Some(Granted {
                    checked: true,
                    ..Granted::new(path, czxid, asked, None)
                }));
            }
            wakeups.busy();
            if deadline.is_immediate() || deadline.has_passed() {
                pending.disarm();
                return Ok(None);
            }
            let watcher = match place
                .resend(session, |client| client.check_and_watch_stat(&path))
                .await
            {
                Ok((Some(_), watcher)) => watcher,
                // Freed in between: try again at once.
                Ok((None, _)) => continue,
                Err(error) => return Err(place.error(error)),
            };
            if !place.wait_for(watcher, &deadline).await? {
                pending.disarm();
                return Ok(None);
            }
            wakeups.woke();
        }
    }
}
