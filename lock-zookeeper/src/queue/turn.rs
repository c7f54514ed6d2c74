//! Waiting for one's turn in the queue: the decision (who blocks whom), the wait (a watch on
//! the blocker, or on the whole directory for the herd variant), and the loop that keeps
//! them apart, after Curator's `internalLockLoop`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use lock_core::kit::Wakeups;
use lock_core::{Deadline, Guard, LockError};
use uuid::Uuid;
use zookeeper_client::{Error as ZkError, EventType, WatchedEvent};

use super::{Listing, Place};
use crate::config::ZkStrategy;
use crate::guard::{Granted, Leftover, Pending, grant};
use crate::node::{NodeKind, contenders, is_reader};
use crate::session::{OwnNodeWatch, Session};

/// How a waiter learns that it may have become the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waiting {
    /// A watch on the whole directory (herd).
    Children,
    /// A data watch on the one node whose departure can let this waiter in (herd-free).
    Predecessor,
}

impl Waiting {
    /// How a contender of `kind` waits under `strategy`: an election's candidate always
    /// watches its predecessor alone; the naive strategy has no sequential form of its own
    /// and waits as the herd recipe does.
    fn of(strategy: ZkStrategy, kind: NodeKind) -> Self {
        match (strategy, kind) {
            (_, NodeKind::Candidate) => Waiting::Predecessor,
            (ZkStrategy::SingleNode | ZkStrategy::WholeQueue, _) => Waiting::Children,
            _ => Waiting::Predecessor,
        }
    }
}

/// Which earlier contenders keep a contender out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Every earlier contender (a mutex contender, a writer).
    Exclusive,
    /// Only earlier writers (a reader).
    Shared,
}

impl Role {
    /// The role of a contender of `kind`: a reader shares, every other contender excludes.
    fn of(kind: NodeKind) -> Self {
        match kind {
            NodeKind::Read => Role::Shared,
            _ => Role::Exclusive,
        }
    }

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

/// How many times a try goes again after losing to contenders that were all gone once it
/// withdrew (see [`Place::take_turn`]).
const TRY_AGAIN: u32 = 3;

/// How a contender's time in the queue ended.
enum TurnEnd {
    Granted(Granted),
    /// The deadline passed, or a try found the lock busy; its node is withdrawn.
    NotGranted,
    /// A try lost, and once its node was withdrawn nobody was left in its way.
    FreeOnceWithdrawn,
}

/// How a wait for the blocker ended.
#[derive(Debug)]
enum Wake {
    /// The deadline passed (or a try that must not wait found the lock busy).
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

impl Place {
    /// A contender of `kind` on the provider's session, queued and granted as
    /// [`wait_turn`](Self::wait_turn) says: its guard, or `Ok(None)` at the deadline. A try
    /// that lost to contenders who were all gone once it withdrew goes again, up to
    /// [`TRY_AGAIN`] times.
    pub(crate) async fn take_turn(
        &self,
        kind: NodeKind,
        deadline: Deadline,
    ) -> Result<Option<Guard>, LockError> {
        let session = self.shared.session(&self.name, deadline).await?;
        let mut again = TRY_AGAIN;
        loop {
            let uuid = Uuid::new_v4();
            match self.queue_and_wait(&session, kind, uuid, deadline).await? {
                TurnEnd::Granted(granted) => {
                    return Ok(Some(grant(&self.shared, &session, &self.name, granted)));
                }
                TurnEnd::FreeOnceWithdrawn if again > 0 => again -= 1,
                TurnEnd::FreeOnceWithdrawn | TurnEnd::NotGranted => return Ok(None),
            }
        }
    }

    /// Whether a contender of `role` queued now would find another in its way.
    async fn busy_now(&self, session: &Session, role: Role) -> Result<bool, LockError> {
        let listed = self
            .resend(session, |client| client.list_children(&self.dir))
            .await;
        let queue = match listed {
            Ok(children) => contenders(children),
            Err(ZkError::NoNode) => return Ok(false),
            Err(error) => return Err(self.error(error)),
        };
        Ok(role.blocker(&queue, queue.len()).is_some())
    }

    /// Queues a contender of `kind` and waits until its [`Role`] lets it hold, waiting as
    /// [`Waiting::of`] says, or until the deadline (`Ok(None)`, nothing left behind).
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
        uuid: Uuid,
        deadline: Deadline,
    ) -> Result<Option<Granted>, LockError> {
        let ended = self.queue_and_wait(session, kind, uuid, deadline).await?;
        Ok(match ended {
            TurnEnd::Granted(granted) => Some(granted),
            TurnEnd::NotGranted | TurnEnd::FreeOnceWithdrawn => None,
        })
    }

    /// [`wait_turn`](Self::wait_turn), telling apart a try that lost to contenders who were
    /// all gone once it withdrew.
    async fn queue_and_wait(
        &self,
        session: &Arc<Session>,
        kind: NodeKind,
        uuid: Uuid,
        deadline: Deadline,
    ) -> Result<TurnEnd, LockError> {
        let role = Role::of(kind);
        let waiting = Waiting::of(self.shared.config.strategy, kind);
        // Armed from before the create is sent: dropping this future at any point removes
        // whatever the server made of it.
        let mut pending = Pending::new(
            session,
            &self.dir,
            Leftover::Sequential { uuid, node: None },
        );
        let (node, czxid, mut first) = self.create_and_list(session, uuid, kind, waiting).await?;
        pending.set_node(node.clone());
        let path = format!("{}/{node}", self.dir);
        let mut own_watch = None;
        let mut wakeups = Wakeups::new(&self.shared.metrics);
        loop {
            // 1. The decision: fail, hold, or find the blocker.
            let listing = match first.take() {
                Some(listing) => listing,
                None => self.list(session, waiting).await?,
            };
            let queue = contenders(listing.children);
            let Some(position) = queue.iter().position(|(_, child)| *child == node) else {
                pending.disarm();
                return Err(self.place_gone(&node));
            };
            let Some(blocker) = role.blocker(&queue, position) else {
                pending.disarm();
                let granted = Granted::new(path, czxid, listing.asked, own_watch);
                return Ok(TurnEnd::Granted(granted));
            };
            wakeups.busy();
            let alone = role.blocks_alone(&queue, position);
            // 2. The wait, unless the deadline leaves no time for one.
            let wake = if deadline.is_immediate() || deadline.has_passed() {
                Wake::TimedOut
            } else if let Some(children_changed) = listing.watcher {
                match self.wait_for(children_changed, &deadline).await? {
                    true => Wake::Changed,
                    false => Wake::TimedOut,
                }
            } else {
                let blocker = format!("{}/{}", self.dir, queue[blocker].1);
                self.await_blocker(session, &blocker, &path, &mut own_watch, &deadline)
                    .await?
            };
            // 3. Hold on the blocker's deletion if it alone kept us out; 4. else look again.
            match wake {
                Wake::TimedOut if deadline.is_immediate() => {
                    // A try that lost withdraws its node and looks again in the same flight
                    // (a session's requests are served in order). The nodes of tries that
                    // lose stand in each other's way while they live, so that tries which
                    // overlap could all lose on a lock that nobody holds: finding nobody
                    // left, the try may go again.
                    let metrics = &self.shared.metrics;
                    let (_, busy) =
                        tokio::join!(pending.remove_now(metrics), self.busy_now(session, role));
                    // The try lost either way: a look that failed is no error of the try's.
                    return Ok(match busy {
                        Ok(false) => TurnEnd::FreeOnceWithdrawn,
                        Ok(true) | Err(_) => TurnEnd::NotGranted,
                    });
                }
                Wake::TimedOut => {
                    pending.remove_now(&self.shared.metrics).await;
                    return Ok(TurnEnd::NotGranted);
                }
                Wake::OwnNodeDeleted => {
                    pending.disarm();
                    return Err(self.place_gone(&node));
                }
                Wake::BlockerDeleted { asked } if alone => {
                    wakeups.woke();
                    pending.disarm();
                    let granted = Granted::new(path, czxid, asked, own_watch);
                    return Ok(TurnEnd::Granted(granted));
                }
                Wake::BlockerDeleted { .. } | Wake::Changed => wakeups.woke(),
                Wake::BlockerGoneAlready => {}
            }
        }
    }

    /// Lists the directory, with a watch on its children for herd waiting.
    async fn list(&self, session: &Session, waiting: Waiting) -> Result<Listing, LockError> {
        let asked = tokio::time::Instant::now();
        let (children, watcher) = match waiting {
            Waiting::Children => self
                .resend(session, |client| client.list_and_watch_children(&self.dir))
                .await
                .map(|(children, watcher)| (children, Some(watcher))),
            Waiting::Predecessor => self
                .resend(session, |client| client.list_children(&self.dir))
                .await
                .map(|children| (children, None)),
        }
        .map_err(|e| self.error(e))?;
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
        let watching_blocker = self.resend(session, |client| client.get_and_watch_data(blocker));
        let watching_own = own_watch
            .is_none()
            .then(|| self.resend(session, |client| client.get_and_watch_data(own)));
        let (blocker_watch, own_watched) =
            tokio::join!(watching_blocker, async { Some(watching_own?.await) });
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordered(children: &[&str]) -> Vec<(i64, String)> {
        contenders(children.iter().map(|child| (*child).to_owned()).collect())
    }

    #[test]
    fn each_role_waits_for_the_one_contender_that_can_let_it_in() {
        let mixed = ordered(&[
            "a__READ__0000000001",
            "b__WRIT__0000000002",
            "c__READ__0000000003",
            "d__WRIT__0000000004",
            "e__READ__0000000005",
            "f__READ__0000000006",
        ]);
        let readers = ordered(&["a__READ__0000000001", "b__rlock__0000000002"]);
        let foreign = ordered(&["x-lock-0000000001", "b__READ__0000000002"]);
        // (role, queue, position, blocker, whether the blocker alone keeps it out)
        for case in [
            (Role::Exclusive, &mixed, 0, None, false), // the first holds
            (Role::Exclusive, &mixed, 1, Some(0), true), // behind a reader
            (Role::Exclusive, &mixed, 3, Some(2), false),
            (Role::Shared, &mixed, 0, None, false), // the first reader holds
            (Role::Shared, &mixed, 2, Some(1), true),
            (Role::Shared, &mixed, 5, Some(3), false), // the nearest writer, not the first
            (Role::Shared, &readers, 1, None, false),  // readers share
            (Role::Shared, &foreign, 1, Some(0), true), // an unknown contender excludes readers
        ] {
            let (role, queue, position, blocker, alone) = case;
            assert_eq!(role.blocker(queue, position), blocker, "{case:?}");
            assert_eq!(role.blocks_alone(queue, position), alone, "{case:?}");
        }
    }
}
