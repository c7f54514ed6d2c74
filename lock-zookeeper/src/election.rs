//! Leader election: the mutex queue with the candidate's value in its node, and observers
//! that watch the head of the queue.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::election::LeaderSource;
use lock_core::kit::ElectionAttempt;
use lock_core::{Deadline, Guard, LeaderInfo, LockError};
use zookeeper_client::Error as ZkError;

use crate::node::{NodeKind, contenders, sequence, token};
use crate::queue::{Place, name_and_backend};

/// A leader election from a [`ZkLockProvider`](crate::ZkLockProvider).
///
/// Candidates queue as ephemeral sequential nodes in `{root}/{name}.election`, each holding
/// its value, named as Curator's `LeaderLatch` names them (`_c_<uuid>-latch-<sequence>`;
/// kazoo's `Election`, `<hex>__lock__<sequence>`, with the kazoo node format), so that
/// either sees distlock's candidates and distlock sees theirs. The first in sequence leads;
/// each other candidate watches only the node just before its own, whatever the provider's
/// strategy, so that a resignation wakes the next candidate alone. The term is the leader's
/// node's creation zxid. Observers read the first node and watch it (or, with no candidate,
/// the directory).
///
/// ```no_run
/// use std::sync::Arc;
/// use lock_core::LockProvider;
/// use lock_zookeeper::ZkLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let zk = ZkLockProvider::connect_url("zk://127.0.0.1:2181").await?;
/// let election = zk.election("billing/worker")?;
/// let mut leadership = election.campaign(b"host-a:8080", None).await?;
/// // ... lead, passing leadership.term() with every write ...
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
pub struct ZkElection {
    pub(crate) place: Place,
}

impl fmt::Debug for ZkElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkElection")
            .field("name", &self.place.name)
            .field("dir", &self.place.dir)
            .finish()
    }
}

impl ZkElection {
    /// The path of the first candidate and, when there is one, its node's content: the
    /// leader. `None` when nobody campaigns (or the directory is gone).
    async fn head(&self) -> Result<Option<(String, LeaderInfo)>, LockError> {
        let place = &self.place;
        let session = place
            .shared
            .session(&place.name, Deadline::after(None))
            .await?;
        loop {
            let children = place.children(&session).await?;
            let Some((_, first)) = contenders(children).into_iter().next() else {
                return Ok(None);
            };
            let path = format!("{}/{first}", place.dir);
            match place
                .resend(&session, |client| client.get_data(&path))
                .await
            {
                Ok((value, stat)) => {
                    return Ok(Some((path, LeaderInfo::new(value, token(stat.czxid)))));
                }
                // Resigned since the listing: look again.
                Err(ZkError::NoNode) => continue,
                Err(error) => return Err(place.error(error)),
            }
        }
    }
}

#[async_trait]
impl ElectionAttempt for ZkElection {
    name_and_backend!(place);

    /// Queues a candidate node holding `value` and waits to be first, herd-free.
    async fn attempt(&self, value: &[u8], deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let place = Place {
            data: Arc::from(value),
            ..self.place.clone()
        };
        place.take_turn(NodeKind::Candidate, deadline).await
    }
}

#[async_trait]
impl LeaderSource for ZkElection {
    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        Ok(self.head().await?.map(|(_, leader)| leader))
    }

    /// Watches the leader's node for its deletion (or, with no leader, the directory for a
    /// candidate), set only if the leader is still `seen`; wakes also when the provider
    /// closes or the session ends (the client ends a session it cannot reach within the
    /// session timeout, so a cut-off observer learns it then).
    async fn changed(&self, seen: &Option<LeaderInfo>) -> Result<(), LockError> {
        let place = &self.place;
        let session = place
            .shared
            .session(&place.name, Deadline::after(None))
            .await?;
        let head = self.head().await?;
        if head.as_ref().map(|(_, leader)| leader) != seen.as_ref() {
            return Ok(());
        }
        let watched = match &head {
            // A data watch, not an exists watch: on a node already gone, an exists watch
            // would stay on the server, waiting for a creation that never comes.
            Some((path, _)) => match place
                .resend(&session, |client| client.get_and_watch_data(path))
                .await
            {
                Ok((_, _, watcher)) => Ok(Some(watcher)),
                Err(ZkError::NoNode) => Ok(None),
                Err(error) => Err(error),
            },
            // Whatever the look missed since makes the watch moot: a candidate already in
            // the listing, or a directory made since it was found missing.
            None => match place
                .resend(&session, |client| {
                    client.list_and_watch_children(&place.dir)
                })
                .await
            {
                Ok((children, watcher))
                    if !children.iter().any(|child| sequence(child).is_some()) =>
                {
                    Ok(Some(watcher))
                }
                Ok(_) => Ok(None),
                // No directory yet: watch for its creation.
                Err(ZkError::NoNode) => place
                    .resend(&session, |client| client.check_and_watch_stat(&place.dir))
                    .await
                    .map(|(made, watcher)| made.is_none().then_some(watcher)),
                Err(error) => Err(error),
            },
        };
        // None: the leader left, or a candidate came, between the look and the watch.
        let Some(watcher) = watched.map_err(|e| place.error(e))? else {
            return Ok(());
        };
        tokio::select! {
            _ = watcher.changed() => {}
            () = place.shared.closed.wait() => {}
        }
        Ok(())
    }
}
