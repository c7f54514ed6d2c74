//! The contenders of a ZooKeeper mutex as its directory shows them: for
//! [`ZkLockProvider::contenders`](crate::ZkLockProvider::contenders) and, in lock-core's
//! terms, [`DistributedLock::queue`](lock_core::DistributedLock::queue).

use lock_core::queue::{LockQueue, QueuedContender};
use lock_core::{Deadline, FencingToken, LockError};
use zookeeper_client::Error as ZkError;

use crate::config::ZkStrategy;
use crate::node::{SINGLE_NODE, contenders, token};
use crate::queue::Place;

/// One contender for a ZooKeeper mutex, from [`ZkLockProvider::contenders`](crate::ZkLockProvider::contenders): a node in the
/// lock's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Contender {
    /// The node's name in the lock directory, such as `_c_<uuid>-lock-0000000007`
    /// (distlock and Curator), `<hex>__lock__0000000007` (kazoo), or `lock` (the holder
    /// under the `SingleNode` strategy).
    pub node: String,
    /// The sequence number the node's name ends with, which orders the contenders; `None`
    /// for the `SingleNode` strategy's `lock` node.
    pub sequence: Option<i64>,
    /// The session that owns the node (its `ephemeralOwner`); 0 for a node that is not
    /// ephemeral.
    pub session_id: i64,
    /// The zxid of the node's creation.
    pub czxid: i64,
}

impl Contender {
    /// The fencing token of the grant this node stands for, as the lock hands it out to
    /// its holder: the node's creation zxid.
    pub fn fencing_token(&self) -> FencingToken {
        token(self.czxid)
    }
}

impl Place {
    /// The directory's contenders: the `lock` node of the single-node strategy first, then
    /// the sequential nodes in sequence order, each with its owner and czxid.
    pub(crate) async fn contenders(&self) -> Result<Vec<Contender>, LockError> {
        let session = self
            .shared
            .session(&self.name, Deadline::after(None))
            .await?;
        let listed = session.resend(|client| client.list_children(&self.dir));
        let children = match listed.await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(other) => return Err(self.error(other)),
        };
        let single = children
            .iter()
            .any(|child| child == SINGLE_NODE)
            .then(|| (None, SINGLE_NODE.to_owned()));
        let ordered = single.into_iter().chain(
            contenders(children)
                .into_iter()
                .map(|(sequence, node)| (Some(sequence), node)),
        );
        // Every request is sent before the first reply is awaited: one round trip in all.
        let requests: Vec<_> = ordered
            .map(|(sequence, node)| {
                let stat = session.client.check_stat(&format!("{}/{node}", self.dir));
                (sequence, node, stat)
            })
            .collect();
        let mut found = Vec::with_capacity(requests.len());
        for (sequence, node, stat) in requests {
            match stat.await {
                Ok(Some(stat)) => found.push(Contender {
                    node,
                    sequence,
                    session_id: stat.ephemeral_owner,
                    czxid: stat.czxid,
                }),
                // Left since the listing.
                Ok(None) | Err(ZkError::NoNode) => {}
                Err(other) => return Err(self.error(other)),
            }
        }
        Ok(found)
    }

    /// The contenders as lock-core's [`LockQueue`]: the first holds.
    pub(crate) async fn queue(&self) -> Result<LockQueue, LockError> {
        let contenders = self.contenders().await?;
        let listed = contenders.iter().enumerate().map(|(index, contender)| {
            let mut listed = QueuedContender::new(index == 0, Some(contender.node.clone()))
                .with_session(format!("{:#x}", contender.session_id))
                .with_fencing_token(contender.fencing_token());
            if let Some(sequence) = contender.sequence {
                listed = listed.with_detail("sequence", sequence);
            }
            listed.with_detail("czxid", contender.czxid)
        });
        let queue = LockQueue::new(listed.collect()).at(self.dir.clone());
        Ok(match self.shared.config.strategy {
            ZkStrategy::SingleNode => queue
                .without_recorded_waiters()
                .with_note("the single-node strategy leaves no node for its waiters"),
            _ => queue,
        })
    }
}
