//! The sequential-node queue that the mutex, the read-write lock and the semaphore share:
//! a place on the server, connection-safe creation, and waiting for one's turn.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use lock_core::kit::Wakeups;
use lock_core::{Deadline, LockError, LockName};
use uuid::Uuid;
use zookeeper_client::{CreateMode, Error as ZkError, EventType, OneshotWatcher, WatchedEvent};

use crate::config::ZkStrategy;
use crate::error::{BACKEND, lock_error, outcome_unknown};
use crate::guard::{Claim, Granted, Pending};
use crate::node::{NodeKind, contenders, has_uuid, is_reader, node_prefix};
use crate::provider::Shared;
use crate::session::Session;

/// How many times a create is retried when the directory vanished or the reply was lost.
const CREATE_ATTEMPTS: usize = 10;
/// Pause before retrying a request whose outcome was unknown (the client reconnects).
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// How a waiter learns that it may have become the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// A watch on the whole directory (herd).
    Children,
    /// A data watch on the one node whose departure can let this waiter in (herd-free).
    Predecessor,
}

impl Waiting {
    /// The waiting of the sequential recipes under `strategy`: the naive strategy has no
    /// sequential form of its own and waits as the herd recipe does.
    pub(crate) fn of(strategy: ZkStrategy) -> Self {
        match strategy {
            ZkStrategy::SingleNode | ZkStrategy::SequentialChildren => Waiting::Children,
            _ => Waiting::Predecessor,
        }
    }
}

/// Which earlier contenders keep a contender out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Every earlier contender (a mutex contender, a writer).
    Exclusive,
    /// Only earlier writers (a reader).
    Shared,
}

impl Role {
    /// `None` when the contender at `position` holds; otherwise the index of the contender
    /// it waits for: the immediate predecessor (exclusive), or the nearest earlier writer
    /// (shared), whose departure is the only one that can let it in.
    fn blocker(self, queue: &[(i64, String)], position: usize) -> Option<usize> {
        match self {
            Role::Exclusive => position.checked_sub(1),
            Role::Shared => queue[..position]
                .iter()
                .rposition(|(_, child)| !is_reader(child)),
        }
    }

    /// Whether the contender at `position` is kept out by its blocker alone: the only
    /// earlier contender that excludes it (every earlier one, exclusive; the writers and
    /// unknown contenders, shared).
    fn blocks_alone(self, queue: &[(i64, String)], position: usize) -> bool {
        let excluding = match self {
            Role::Exclusive => position,
            Role::Shared => queue[..position]
                .iter()
                .filter(|(_, child)| !is_reader(child))
                .count(),
        };
        excluding == 1
    }
}

/// A watch on a waiter's own node, set while it queues and handed on to its guard.
pub(crate) type OwnNodeWatch = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// How a wait for the blocker ended.
#[derive(Debug)]
enum Wake {
    /// The deadline passed.
    TimedOut,
    /// Our own node was deleted, by another client.
    OwnNodeDeleted,
    /// The blocker was deleted while our node stood and the session stayed connected
    /// (see [`Place::await_blocker`]); `asked` is when the watches were asked for.
    BlockerDeleted { asked: tokio::time::Instant },
    /// The blocker was gone before its watch was set: look again (no event came).
    BlockerGoneAlready,
    /// Anything else: look again.
    Changed,
}

/// The output of `future` if it is ready without waiting.
fn ready_now<F: Future + ?Sized>(future: Pin<&mut F>) -> Option<F::Output> {
    match future.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// A listing of the lock directory, with the watch on its children that herd waiting sets,
/// and when it was asked for.
struct Listing {
    children: Vec<String>,
    watcher: Option<OneshotWatcher>,
    asked: tokio::time::Instant,
}

/// One directory on the server where contenders queue, on behalf of one named lock.
#[derive(Clone)]
pub(crate) struct Place {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: LockName,
    pub(crate) dir: String,
}

impl Place {
    pub(crate) fn error(&self, error: ZkError) -> LockError {
        lock_error(error, Some(self.name.as_str()))
    }

    pub(crate) fn count(&self) {
        self.shared.metrics.record_server_requests(1);
    }

    /// Creates the directory, a container that the server removes once it is empty, and if
    /// need be its container parents below the root, and the root and its parents as
    /// persistent nodes.
    ///
    /// The root must not be a container: the server would remove it (and then its parents)
    /// along with its last lock directory, and its creator-only ACL with it, so that any
    /// client could create the root again as its own and lock under it.
    pub(crate) async fn ensure_dir(&self, session: &Session) -> Result<(), LockError> {
        let client = &session.client;
        let container = CreateMode::Container.with_acls(session.acls);
        self.count();
        match client.create(&self.dir, &[], &container).await {
            Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
            Err(ZkError::NoNode) => {}
            Err(error) => return Err(self.error(error)),
        }
        let root = &self.shared.config.root;
        self.count();
        let persistent = CreateMode::Persistent.with_acls(session.acls);
        client
            .mkdir(root, &persistent)
            .await
            .map_err(|e| self.error(e))?;
        // The containers between the root and the directory, outermost first.
        let below_root = self.dir.strip_prefix(root.as_str()).unwrap_or(&self.dir);
        let mut path = root.clone();
        for part in below_root.split('/').filter(|part| !part.is_empty()) {
            path.push('/');
            path.push_str(part);
            self.count();
            match client.create(&path, &[], &container).await {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(error) => return Err(self.error(error)),
            }
        }
        Ok(())
    }

    /// Queues a contender of `kind` and waits until `role` lets it hold, or until the
    /// deadline (`Ok(None)`, nothing left behind).
    ///
    /// The loop, in the manner of Curator's `internalLockLoop`:
    ///
    /// 1. List the directory (the first listing rides along with the create). If our node is
    ///    not in it, another client deleted it: fail. If nothing ahead excludes us, we hold.
    /// 2. Otherwise wait for the blocker, the one contender whose departure can let us in:
    ///    herd waiting watches the whole directory and lists again on any change; herd-free
    ///    waiting watches the blocker, and our own node, in one round trip
    ///    ([`await_blocker`](Self::await_blocker)).
    /// 3. When the blocker was the only contender ahead that excludes us (the holder, for a
    ///    mutex or a writer; the only earlier writer, for a reader), its deletion lets us
    ///    hold without listing again: sequence numbers only grow, so nobody who queued since
    ///    sorts ahead of us, and those ahead that do not exclude us (readers, for a reader)
    ///    never will. `await_blocker` vouches that our node still stands and that the
    ///    session stayed connected, the two things the deletion event alone cannot tell.
    /// 4. Any other wake-up (a blocker that was itself waiting and gave up, a data change, a
    ///    reconnection) starts again at 1.
    pub(crate) async fn wait_turn(
        &self,
        session: &Arc<Session>,
        kind: NodeKind,
        role: Role,
        uuid: Uuid,
        deadline: Deadline,
        waiting: Waiting,
    ) -> Result<Option<Granted>, LockError> {
        // Armed from before the create is sent: dropping this future at any point removes
        // whatever the server made of it.
        let mut pending = Pending::new(session, &self.dir, Claim::Sequential { uuid, node: None });
        let (node, czxid, mut listing) = self.create_and_list(session, uuid, kind, waiting).await?;
        pending.set_node(node.clone());
        let path = format!("{}/{node}", self.dir);
        let mut own_watch = None;
        let mut wakeups = Wakeups::new(&self.shared.metrics);
        loop {
            let Listing {
                children,
                watcher,
                asked,
            } = match listing.take() {
                Some(listing) => listing,
                None => self.list(session, waiting).await?,
            };
            let queue = contenders(children);
            let Some(position) = queue.iter().position(|(_, child)| *child == node) else {
                pending.disarm();
                return Err(self.node_deleted(&node));
            };
            let Some(blocker) = role.blocker(&queue, position) else {
                pending.disarm();
                return Ok(Some(self.granted(path, czxid, asked, own_watch)));
            };
            wakeups.busy();
            if deadline.is_immediate() || deadline.has_passed() {
                pending.remove_now(&self.shared.metrics).await;
                return Ok(None);
            }
            let alone = role.blocks_alone(&queue, position);
            let wake = match watcher {
                Some(children_changed) => match self.wait_for(children_changed, &deadline).await? {
                    true => Wake::Changed,
                    false => Wake::TimedOut,
                },
                None => {
                    let blocker = format!("{}/{}", self.dir, queue[blocker].1);
                    self.await_blocker(session, &blocker, &path, &mut own_watch, &deadline)
                        .await?
                }
            };
            match wake {
                Wake::TimedOut => {
                    pending.remove_now(&self.shared.metrics).await;
                    return Ok(None);
                }
                Wake::OwnNodeDeleted => {
                    pending.disarm();
                    return Err(self.node_deleted(&node));
                }
                Wake::BlockerDeleted { asked } if alone => {
                    wakeups.woke();
                    pending.disarm();
                    return Ok(Some(self.granted(path, czxid, asked, own_watch)));
                }
                Wake::BlockerDeleted { .. } | Wake::Changed => wakeups.woke(),
                Wake::BlockerGoneAlready => {}
            }
        }
    }

    /// The grant of the node at `path`.
    fn granted(
        &self,
        path: String,
        czxid: i64,
        asked: tokio::time::Instant,
        own_watch: Option<OwnNodeWatch>,
    ) -> Granted {
        Granted {
            path,
            czxid,
            checked: false,
            asked,
            own_watch,
        }
    }

    /// Lists the directory, with a watch on its children for herd waiting.
    async fn list(&self, session: &Session, waiting: Waiting) -> Result<Listing, LockError> {
        self.count();
        let asked = tokio::time::Instant::now();
        let (children, watcher) = match waiting {
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
        Ok(Listing {
            children,
            watcher,
            asked,
        })
    }

    /// Watches `blocker` and, unless `own_watch` already does, our own node at `own`, in one
    /// round trip; then waits for the first of: our node changing, the blocker changing, the
    /// deadline.
    ///
    /// [`Wake::BlockerDeleted`] means more than the blocker's deletion event: our own node
    /// still stood when it arrived (the server notifies a session in the order it applied
    /// the changes, so a deletion of our node before the blocker's would have been seen
    /// first), and the session was not disconnected since the watches were set (on
    /// reconnection the server replays missed events in no particular order).
    async fn await_blocker(
        &self,
        session: &Session,
        blocker: &str,
        own: &str,
        own_watch: &mut Option<OwnNodeWatch>,
        deadline: &Deadline,
    ) -> Result<Wake, LockError> {
        // Taken before the requests: any state change from here on is seen below.
        let mut states = session.client.state_watcher();
        let asked = tokio::time::Instant::now();
        self.count();
        let watching_blocker = session.client.get_and_watch_data(blocker);
        let watching_own = own_watch.is_none().then(|| {
            self.count();
            session.client.get_and_watch_data(own)
        });
        let (blocker_watch, own_watched) = tokio::join!(watching_blocker, async {
            match watching_own {
                Some(watching) => Some(watching.await),
                None => None,
            }
        });
        match own_watched {
            Some(Ok((_, _, watcher))) => *own_watch = Some(Box::pin(watcher.changed())),
            Some(Err(ZkError::NoNode)) => return Ok(Wake::OwnNodeDeleted),
            Some(Err(error)) => return Err(self.error(error)),
            None => {}
        }
        let blocker_watch = match blocker_watch {
            Ok((_, _, watcher)) => watcher,
            // No watch was left behind.
            Err(ZkError::NoNode) => return Ok(Wake::BlockerGoneAlready),
            Err(error) => return Err(self.error(error)),
        };
        // Set above if it was not before.
        let Some(own_changed) = own_watch.as_mut() else {
            return Ok(Wake::Changed);
        };
        let blocker_changed = tokio::select! {
            biased;
            event = own_changed => {
                *own_watch = None;
                return self.own_node_changed(&event);
            }
            event = blocker_watch.changed() => event,
            () = deadline.sleep() => return Ok(Wake::TimedOut),
        };
        self.check_session(&blocker_changed)?;
        if blocker_changed.event_type != EventType::NodeDeleted {
            return Ok(Wake::Changed);
        }
        // Our node's event, had it come first, was handed over before the blocker's: it is
        // ready now if it ever came.
        if let Some(event) = own_watch
            .as_mut()
            .and_then(|changed| ready_now(changed.as_mut()))
        {
            *own_watch = None;
            return self.own_node_changed(&event);
        }
        if ready_now(std::pin::pin!(states.changed())).is_some() {
            return Ok(Wake::Changed);
        }
        Ok(Wake::BlockerDeleted { asked })
    }

    /// What an event on our own node means: a deletion by another client ends the wait,
    /// anything else is looked at again.
    fn own_node_changed(&self, event: &WatchedEvent) -> Result<Wake, LockError> {
        self.check_session(event)?;
        Ok(match event.event_type {
            EventType::NodeDeleted => Wake::OwnNodeDeleted,
            _ => Wake::Changed,
        })
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
    pub(crate) fn node_deleted(&self, node: &str) -> LockError {
        LockError::Backend {
            backend: BACKEND,
            name: Some(self.name.to_string()),
            message: format!("this waiter's node {node} was deleted by another client"),
            retryable: true,
            source: None,
        }
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
            self.shared.metrics.record_server_requests(2);
            let asked = tokio::time::Instant::now();
            // Both requests are sent here, in this order, before either is awaited.
            let creating = session.client.create(&path, &[], &options);
            let (created, listed) = match waiting {
                Waiting::Children => {
                    let listing = session.client.list_and_watch_children(&self.dir);
                    let (created, listed) = tokio::join!(creating, listing);
                    (
                        created,
                        listed.map(|(children, watcher)| (children, Some(watcher))),
                    )
                }
                Waiting::Predecessor => {
                    let listing = session.client.list_children(&self.dir);
                    let (created, listed) = tokio::join!(creating, listing);
                    (created, listed.map(|children| (children, None)))
                }
            };
            return match created {
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
                    Ok((node, stat.czxid, listing))
                }
                Err(ZkError::NoNode) if !made_dir => {
                    self.ensure_dir(session).await?;
                    made_dir = true;
                    continue;
                }
                Err(ZkError::NoNode) => {
                    let (node, czxid) = self.create_sequential(session, uuid, kind).await?;
                    Ok((node, czxid, None))
                }
                Err(error) if outcome_unknown(&error) => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                    let found = match self.find_own(session, uuid).await? {
                        Some(found) => found,
                        None => self.create_sequential(session, uuid, kind).await?,
                    };
                    Ok((found.0, found.1, None))
                }
                Err(error) => Err(self.error(error)),
            };
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered(children: &[&str]) -> Vec<(i64, String)> {
        contenders(children.iter().map(|child| (*child).to_owned()).collect())
    }

    #[test]
    fn exclusive_contenders_wait_for_their_predecessor() {
        let queue = ordered(&["r__READ__0000000001", "w__WRIT__0000000002"]);
        assert_eq!(Role::Exclusive.blocker(&queue, 0), None);
        assert_eq!(Role::Exclusive.blocker(&queue, 1), Some(0));
    }

    #[test]
    fn readers_wait_for_the_nearest_earlier_writer_only() {
        let queue = ordered(&[
            "a__READ__0000000001",
            "b__WRIT__0000000002",
            "c__READ__0000000003",
            "d__WRIT__0000000004",
            "e__READ__0000000005",
            "f__READ__0000000006",
        ]);
        assert_eq!(Role::Shared.blocker(&queue, 0), None, "first reader holds");
        assert_eq!(Role::Shared.blocker(&queue, 2), Some(1));
        assert_eq!(
            Role::Shared.blocker(&queue, 5),
            Some(3),
            "the nearest writer, not the first"
        );
        let readers = ordered(&["a__READ__0000000001", "b__rlock__0000000002"]);
        assert_eq!(Role::Shared.blocker(&readers, 1), None, "readers share");
        let foreign = ordered(&["x-lock-0000000001", "b__READ__0000000002"]);
        assert_eq!(
            Role::Shared.blocker(&foreign, 1),
            Some(0),
            "an unknown contender excludes readers"
        );
    }
}
