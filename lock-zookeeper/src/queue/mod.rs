//! The sequential-node queue that the mutex, the read-write lock and the semaphore share: a
//! directory on the server ([`Place`]), connection-safe creation of a contender's node, and
//! the requests, each counted through [`Place::ask`]. How a contender waits for its turn, the
//! herd-free algorithm, is in [`turn`].

mod turn;

use std::future::Future;
use std::sync::Arc;

use lock_core::{Deadline, LockError, LockName};
use uuid::Uuid;
use zookeeper_client::{
    CreateMode, CreateOptions, Error as ZkError, EventType, OneshotWatcher, WatchedEvent,
};

use crate::error::{BACKEND, lock_error, outcome_unknown};
use crate::node::{NodeKind, has_uuid, node_prefix};
use crate::session::{RETRY_PAUSE, SEND_ATTEMPTS, Session, Shared};

use turn::Waiting;

/// A listing of the lock directory, with the watch on its children that herd waiting sets,
/// and when it was asked for.
struct Listing {
    children: Vec<String>,
    watcher: Option<OneshotWatcher>,
    asked: tokio::time::Instant,
}

/// The `name` and `backend` of a lock-core attempt trait (`MutexAttempt` and the others),
/// for a lock handle whose [`Place`] is its field `$place`.
macro_rules! name_and_backend {
    ($place:ident) => {
        fn name(&self) -> &lock_core::LockName {
            &self.$place.name
        }

        fn backend(&self) -> &'static str {
            $crate::error::BACKEND
        }
    };
}
pub(crate) use name_and_backend;

/// One directory on the server where contenders queue, on behalf of one named lock.
#[derive(Clone)]
pub(crate) struct Place {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: LockName,
    pub(crate) dir: String,
    /// What a contender's node holds: nothing for locks, an election candidate's value.
    pub(crate) data: Arc<[u8]>,
}

impl Place {
    pub(crate) fn error(&self, error: ZkError) -> LockError {
        lock_error(error, Some(self.name.as_str()))
    }

    /// The session's client, for one request. Every request of an acquisition goes through
    /// here, so that the metrics count each one.
    pub(crate) fn ask<'s>(&self, session: &'s Session) -> &'s zookeeper_client::Client {
        self.shared.metrics.record_server_requests(1);
        &session.client
    }

    /// A request that may safely arrive twice, sent again while its outcome is unknown, as
    /// [`Session::resend`] sends it; each attempt is counted.
    pub(crate) async fn resend<'s, T, F, Fut>(
        &self,
        session: &'s Session,
        mut request: F,
    ) -> Result<T, ZkError>
    where
        F: FnMut(&'s zookeeper_client::Client) -> Fut,
        Fut: Future<Output = Result<T, ZkError>>,
    {
        session
            .resend(|client| {
                self.shared.metrics.record_server_requests(1);
                request(client)
            })
            .await
    }

    /// Creates the directory, a container that the server removes once it is empty, and if
    /// need be its container parents below the root, and the root and its parents as
    /// persistent nodes.
    ///
    /// The root must not be a container: the server would remove it (and then its parents)
    /// along with its last lock directory, and its creator-only ACL with it, so that any
    /// client could create the root again as its own and lock under it.
    pub(crate) async fn ensure_dir(&self, session: &Session) -> Result<(), LockError> {
        let directory = CreateMode::Container.with_acls(session.acls);
        match self.create_if_missing(session, &self.dir, &directory).await {
            Ok(()) => return Ok(()),
            Err(ZkError::NoNode) => {}
            Err(error) => return Err(self.error(error)),
        }
        let root = &self.shared.config.root;
        let persistent = CreateMode::Persistent.with_acls(session.namespace_acls);
        self.resend(session, |client| client.mkdir(root, &persistent))
            .await
            .map_err(|e| self.error(e))?;
        // The containers between the root and the directory, outermost first.
        let between = CreateMode::Container.with_acls(session.namespace_acls);
        let below_root = self.dir.strip_prefix(root.as_str()).unwrap_or(&self.dir);
        let mut path = root.clone();
        for part in below_root.split('/').filter(|part| !part.is_empty()) {
            path.push('/');
            path.push_str(part);
            let container = if path == self.dir {
                &directory
            } else {
                &between
            };
            self.create_if_missing(session, &path, container)
                .await
                .map_err(|e| self.error(e))?;
        }
        Ok(())
    }

    /// Creates an empty node at `path` unless it stands: `NodeExists` is success, so that a
    /// create sent again after a lost answer does no harm.
    async fn create_if_missing(
        &self,
        session: &Session,
        path: &str,
        mode: &CreateOptions<'_>,
    ) -> Result<(), ZkError> {
        let created = self.resend(session, |client| client.create(path, &[], mode));
        match created.await {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// `SessionExpired` for a watch event that reports the session's end.
    fn check_session(&self, event: &WatchedEvent) -> Result<(), LockError> {
        if event.event_type == EventType::Session && event.session_state.is_terminated() {
            return Err(LockError::SessionExpired {
                backend: BACKEND,
                name: Some(self.name.to_string()),
            });
        }
        Ok(())
    }

    /// The error of a waiter or holder whose node another client deleted.
    pub(crate) fn place_gone(&self, node: &str) -> LockError {
        let message = format!("this waiter's node {node} was deleted by another client");
        LockError::other(BACKEND, message)
            .retryable(true)
            .for_lock(&self.name)
    }

    /// Waits for the watch to fire (`true`) or the deadline (`false`).
    pub(crate) async fn wait_for(
        &self,
        watcher: OneshotWatcher,
        deadline: &Deadline,
    ) -> Result<bool, LockError> {
        tokio::select! {
            event = watcher.changed() => {
                self.check_session(&event)?;
                Ok(true)
            }
            () = deadline.sleep() => Ok(false),
        }
    }

    /// Creates a sequential node of `kind` and lists the directory in one round trip: the
    /// list is sent right behind the create on the same session, and the server answers a
    /// session's requests in order, so the list already holds the new node. A missing
    /// directory is made and both sent again; other failures fall back to
    /// [`create_sequential`](Self::create_sequential) (and no listing).
    async fn create_and_list(
        &self,
        session: &Session,
        uuid: Uuid,
        kind: NodeKind,
        waiting: Waiting,
    ) -> Result<(String, i64, Option<Listing>), LockError> {
        let prefix = node_prefix(self.shared.config.node_format, uuid, kind);
        let path = format!("{}/{prefix}", self.dir);
        let options = CreateMode::EphemeralSequential.with_acls(session.acls);
        // An idle lock's directory (a container) may be gone: make it once, then try again.
        let mut made_dir = false;
        loop {
            let asked = tokio::time::Instant::now();
            // Both requests are sent here, in this order, before either is awaited.
            let creating = self.ask(session).create(&path, &self.data, &options);
            let (created, listed) = match waiting {
                Waiting::Children => {
                    let listing = self.ask(session).list_and_watch_children(&self.dir);
                    let (created, listed) = tokio::join!(creating, listing);
                    (
                        created,
                        listed.map(|(children, watcher)| (children, Some(watcher))),
                    )
                }
                Waiting::Predecessor => {
                    let listing = self.ask(session).list_children(&self.dir);
                    let (created, listed) = tokio::join!(creating, listing);
                    (created, listed.map(|children| (children, None)))
                }
            };
            let found = match created {
                Ok((stat, sequence)) => {
                    let node = format!("{prefix}{sequence}");
                    let listing = match listed {
                        Ok((children, watcher)) if children.contains(&node) => Some(Listing {
                            children,
                            watcher,
                            asked,
                        }),
                        _ => None,
                    };
                    return Ok((node, stat.czxid, listing));
                }
                Err(ZkError::NoNode) if !made_dir => {
                    self.ensure_dir(session).await?;
                    made_dir = true;
                    continue;
                }
                Err(ZkError::NoNode) => None,
                Err(error) if outcome_unknown(&error) => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                    self.find_own(session, uuid).await?
                }
                Err(error) => return Err(self.error(error)),
            };
            let (node, czxid) = match found {
                Some(found) => found,
                None => self.create_sequential(session, uuid, kind).await?,
            };
            return Ok((node, czxid, None));
        }
    }

    /// Creates a sequential node of `kind`, protected against lost replies: after a
    /// connection loss the node is looked up by its uuid and adopted only if this session
    /// owns it. Returns the node's name and creation zxid.
    pub(crate) async fn create_sequential(
        &self,
        session: &Session,
        uuid: Uuid,
        kind: NodeKind,
    ) -> Result<(String, i64), LockError> {
        let prefix = node_prefix(self.shared.config.node_format, uuid, kind);
        let path = format!("{}/{prefix}", self.dir);
        let options = CreateMode::EphemeralSequential.with_acls(session.acls);
        let mut last = None;
        for _ in 0..SEND_ATTEMPTS {
            match self.ask(session).create(&path, &self.data, &options).await {
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

    /// The directory's children (none once it is gone), asked as [`resend`](Self::resend) asks.
    pub(crate) async fn children(&self, session: &Session) -> Result<Vec<String>, LockError> {
        let listed = self.resend(session, |client| client.list_children(&self.dir));
        match listed.await {
            Err(ZkError::NoNode) => Ok(Vec::new()),
            other => other.map_err(|error| self.error(error)),
        }
    }

    /// This session's node with `uuid`, if the server created it.
    async fn find_own(
        &self,
        session: &Session,
        uuid: Uuid,
    ) -> Result<Option<(String, i64)>, LockError> {
        let children = self.children(session).await?;
        let Some(child) = children.into_iter().find(|child| has_uuid(child, uuid)) else {
            return Ok(None);
        };
        let path = format!("{}/{child}", self.dir);
        match self
            .resend(session, |client| client.check_stat(&path))
            .await
        {
            Ok(Some(stat)) if stat.ephemeral_owner == session.id => Ok(Some((child, stat.czxid))),
            // Not ours (cannot normally happen: the uuid is fresh) or already gone.
            Ok(_) => Ok(None),
            Err(error) => Err(self.error(error)),
        }
    }
}
