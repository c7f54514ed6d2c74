//! The ZooKeeper mutex: the three strategies, connection-safe creation, cancel-safe waiting.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Deadline, DistributedLock, FencingToken, Guard, LockError, LockName};
use uuid::Uuid;
use zookeeper_client::{CreateMode, Error as ZkError, EventType, OneshotWatcher};

use crate::config::ZkStrategy;
use crate::error::{BACKEND, lock_error, outcome_unknown};
use crate::guard::{Claim, Granted, Pending, grant};
use crate::node::{contenders, has_uuid, node_prefix};
use crate::provider::Shared;
use crate::session::Session;

/// How many times a create is retried when the directory vanished or the reply was lost.
const CREATE_ATTEMPTS: usize = 10;
/// Pause before retrying a request whose outcome was unknown (the client reconnects).
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A lock handle from a [`ZkLockProvider`](crate::ZkLockProvider).
pub struct ZkLock {
    shared: Arc<Shared>,
    name: LockName,
    dir: String,
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLock")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("strategy", &self.shared.config.strategy)
            .finish()
    }
}

#[async_trait]
impl DistributedLock for ZkLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
        self.run(Deadline::after(Some(Duration::ZERO))).await
    }

    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        match self.run(Deadline::after(timeout)).await? {
            Some(guard) => Ok(guard),
            None => Err(LockError::Timeout {
                backend: BACKEND,
                name: self.name.to_string(),
                waited: timeout.unwrap_or_default(),
            }),
        }
    }
}

/// How a waiter learns that it may have become the holder.
enum Waiting {
    /// A watch on the whole directory (herd).
    Children,
    /// A data watch on the immediate predecessor (herd-free).
    Predecessor,
}

impl ZkLock {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName, dir: String) -> Self {
        ZkLock { shared, name, dir }
    }

    /// Takes the lock, or gives up at the deadline with `Ok(None)`, leaving nothing behind.
    async fn run(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let session = self.shared.session(&self.name).await?;
        let granted = match self.shared.config.strategy {
            ZkStrategy::SingleNode => self.single_node(&session, deadline).await,
            ZkStrategy::SequentialChildren => {
                self.sequential(&session, deadline, Waiting::Children).await
            }
            _ => {
                self.sequential(&session, deadline, Waiting::Predecessor)
                    .await
            }
        }?;
        Ok(granted.map(|granted| grant(&self.shared, &session, &self.name, granted)))
    }

    fn error(&self, error: ZkError) -> LockError {
        lock_error(error, Some(self.name.as_str()))
    }

    fn count(&self) {
        self.shared.metrics.record_server_requests(1);
    }

    /// Creates the lock directory, a container that the server removes once it is empty,
    /// and if need be the root and its parents, as persistent nodes.
    ///
    /// The root must not be a container: the server would remove it (and then its parents)
    /// along with its last lock directory, and its creator-only ACL with it, so that any
    /// client could create the root again as its own and lock under it.
    async fn ensure_dir(&self, session: &Session) -> Result<(), LockError> {
        let client = &session.client;
        let container = CreateMode::Container.with_acls(session.acls);
        self.count();
        match client.create(&self.dir, &[], &container).await {
            Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
            Err(ZkError::NoNode) => {}
            Err(error) => return Err(self.error(error)),
        }
        self.count();
        let persistent = CreateMode::Persistent.with_acls(session.acls);
        client
            .mkdir(&self.shared.config.root, &persistent)
            .await
            .map_err(|e| self.error(e))?;
        self.count();
        match client.create(&self.dir, &[], &container).await {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(error) => Err(self.error(error)),
        }
    }

    /// The sequential recipes: queue with an ephemeral sequential node, hold when first.
    async fn sequential(
        &self,
        session: &Arc<Session>,
        deadline: Deadline,
        waiting: Waiting,
    ) -> Result<Option<Granted>, LockError> {
        let uuid = Uuid::new_v4();
        // Armed from before the create is sent: dropping this future at any point removes
        // whatever the server made of it.
        let mut pending = Pending::new(session, &self.dir, Claim::Sequential { uuid, node: None });
        let (node, czxid) = self.create_sequential(session, uuid).await?;
        pending.set_node(node.clone());
        let mut woken = false;
        loop {
            self.count();
            // The server answered a request sent no earlier than this: it has heard from the
            // session at this moment or later (see `Session::register`).
            let asked = tokio::time::Instant::now();
            let (children, children_watch) = match waiting {
                Waiting::Children => {
                    let (children, watcher) = session
                        .client
                        .list_and_watch_children(&self.dir)
                        .await
                        .map_err(|e| self.error(e))?;
                    (children, Some(watcher))
                }
                Waiting::Predecessor => (
                    session
                        .client
                        .list_children(&self.dir)
                        .await
                        .map_err(|e| self.error(e))?,
                    None,
                ),
            };
            let queue = contenders(children);
            let Some(position) = queue.iter().position(|(_, child)| *child == node) else {
                pending.disarm();
                return Err(LockError::Backend {
                    backend: BACKEND,
                    name: Some(self.name.to_string()),
                    message: format!("this waiter's node {node} was deleted by another client"),
                    retryable: true,
                    source: None,
                });
            };
            if position == 0 {
                if woken {
                    tracing::trace!(lock = %self.name, "zookeeper: woken and granted");
                }
                pending.disarm();
                return Ok(Some(Granted {
                    path: format!("{}/{node}", self.dir),
                    czxid,
                    checked: false,
                    asked,
                }));
            }
            if woken {
                self.shared.metrics.record_futile_wakeup();
                woken = false;
            }
            if deadline.is_immediate() || deadline.has_passed() {
                pending.remove_now(&self.shared.metrics).await;
                return Ok(None);
            }
            let watcher = match children_watch {
                Some(watcher) => watcher,
                None => {
                    let predecessor = format!("{}/{}", self.dir, queue[position - 1].1);
                    self.count();
                    match session.client.get_and_watch_data(&predecessor).await {
                        Ok((_, _, watcher)) => watcher,
                        // Gone already: look again (no watch was left behind).
                        Err(ZkError::NoNode) => continue,
                        Err(error) => return Err(self.error(error)),
                    }
                }
            };
            if !self.wait_for(watcher, &deadline).await? {
                pending.remove_now(&self.shared.metrics).await;
                return Ok(None);
            }
            self.shared.metrics.record_wakeup();
            woken = true;
        }
    }

    /// Waits for the watch to fire (`true`) or the deadline (`false`).
    async fn wait_for(
        &self,
        watcher: OneshotWatcher,
        deadline: &Deadline,
    ) -> Result<bool, LockError> {
        tokio::select! {
            event = watcher.changed() => {
                if event.event_type == EventType::Session && event.session_state.is_terminated() {
                    return Err(LockError::SessionExpired {
                        backend: BACKEND,
                        name: Some(self.name.to_string()),
                    });
                }
                Ok(true)
            }
            () = deadline.sleep() => Ok(false),
        }
    }

    /// Creates this contender's node, protected against lost replies: after a connection
    /// loss the node is looked up by its uuid and adopted only if this session owns it.
    async fn create_sequential(
        &self,
        session: &Session,
        uuid: Uuid,
    ) -> Result<(String, i64), LockError> {
        let prefix = node_prefix(self.shared.config.node_format, uuid);
        let path = format!("{}/{prefix}", self.dir);
        let options = CreateMode::EphemeralSequential.with_acls(session.acls);
        let mut last = None;
        for _ in 0..CREATE_ATTEMPTS {
            self.count();
            match session.client.create(&path, &[], &options).await {
                Ok((stat, sequence)) => return Ok((format!("{prefix}{sequence}"), stat.czxid)),
                Err(ZkError::NoNode) => self.ensure_dir(session).await?,
                Err(error) if outcome_unknown(&error) => {
                    tracing::debug!(lock = %self.name, %error, "zookeeper: create reply lost; looking for the node");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    if let Some(found) = self.find_own(session, uuid).await? {
                        return Ok(found);
                    }
                    last = Some(error);
                }
                Err(error) => return Err(self.error(error)),
            }
        }
        Err(self.error(last.unwrap_or(ZkError::ConnectionLoss)))
    }

    /// This session's node with `uuid`, if the server created it.
    async fn find_own(
        &self,
        session: &Session,
        uuid: Uuid,
    ) -> Result<Option<(String, i64)>, LockError> {
        for _ in 0..CREATE_ATTEMPTS {
            self.count();
            let children = match session.client.list_children(&self.dir).await {
                Ok(children) => children,
                Err(ZkError::NoNode) => return Ok(None),
                Err(error) if outcome_unknown(&error) => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
                Err(error) => return Err(self.error(error)),
            };
            let Some(child) = children.into_iter().find(|child| has_uuid(child, uuid)) else {
                return Ok(None);
            };
            self.count();
            match session
                .client
                .check_stat(&format!("{}/{child}", self.dir))
                .await
            {
                Ok(Some(stat)) if stat.ephemeral_owner == session.id => {
                    return Ok(Some((child, stat.czxid)));
                }
                // Not ours (cannot normally happen: the uuid is fresh) or already gone.
                Ok(_) => return Ok(None),
                Err(error) if outcome_unknown(&error) => tokio::time::sleep(RETRY_PAUSE).await,
                Err(error) => return Err(self.error(error)),
            }
        }
        Err(self.error(ZkError::ConnectionLoss))
    }

    /// The naive lock: whoever creates `{dir}/lock` holds it; every waiter watches it.
    async fn single_node(
        &self,
        session: &Arc<Session>,
        deadline: Deadline,
    ) -> Result<Option<Granted>, LockError> {
        let uuid = Uuid::new_v4();
        let path = format!("{}/lock", self.dir);
        let options = CreateMode::Ephemeral.with_acls(session.acls);
        let mut pending = Pending::new(session, &self.dir, Claim::Single { uuid });
        let mut woken = false;
        let mut unknown = 0;
        loop {
            self.count();
            let mut asked = tokio::time::Instant::now();
            let ours = match session
                .client
                .create(&path, uuid.as_bytes(), &options)
                .await
            {
                Ok((stat, _)) => Some(stat.czxid),
                Err(ZkError::NoNode) => {
                    self.ensure_dir(session).await?;
                    continue;
                }
                Err(ZkError::NodeExists) => None,
                Err(error) if outcome_unknown(&error) && unknown < CREATE_ATTEMPTS => {
                    unknown += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                    // Decided by the node's owner and content, never by assumption.
                    self.count();
                    asked = tokio::time::Instant::now();
                    match session.client.get_data(&path).await {
                        Ok((data, stat))
                            if stat.ephemeral_owner == session.id && data == uuid.as_bytes() =>
                        {
                            Some(stat.czxid)
                        }
                        Ok(_) | Err(ZkError::NoNode) => None,
                        Err(error) if outcome_unknown(&error) => continue,
                        Err(error) => return Err(self.error(error)),
                    }
                }
                Err(error) => return Err(self.error(error)),
            };
            if let Some(czxid) = ours {
                pending.disarm();
                return Ok(Some(Granted {
                    path,
                    czxid,
                    checked: true,
                    asked,
                }));
            }
            if woken {
                self.shared.metrics.record_futile_wakeup();
                woken = false;
            }
            if deadline.is_immediate() || deadline.has_passed() {
                pending.disarm();
                return Ok(None);
            }
            self.count();
            let watcher = match session.client.check_and_watch_stat(&path).await {
                Ok((Some(_), watcher)) => watcher,
                // Freed in between: try again at once.
                Ok((None, _)) => continue,
                Err(error) => return Err(self.error(error)),
            };
            if !self.wait_for(watcher, &deadline).await? {
                pending.disarm();
                return Ok(None);
            }
            self.shared.metrics.record_wakeup();
            woken = true;
        }
    }
}

/// The fencing token of a grant: the lock node's creation zxid.
pub(crate) fn token(czxid: i64) -> FencingToken {
    FencingToken(u64::try_from(czxid).unwrap_or_default())
}
