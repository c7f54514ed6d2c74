//! Who holds a lock and who waits for it, as the server shows it: [`LockQueue`], which
//! every backend fills the same way ([`DistributedLock::queue`](crate::DistributedLock::queue)),
//! so that a tool reads any backend alike.

use std::time::Duration;

use crate::FencingToken;

/// The contenders of one mutex as the server records them at one moment: the holder first
/// (if anyone holds it), then the waiters, first in line first.
///
/// ```
/// use lock_core::queue::{LockQueue, QueuedContender};
/// use lock_core::FencingToken;
///
/// let queue = LockQueue::new(vec![
///     QueuedContender::holder("node-7").with_fencing_token(FencingToken(7)),
///     QueuedContender::waiter("node-9"),
/// ]);
/// assert_eq!(queue.holder().map(|h| h.place.as_deref()), Some(Some("node-7")));
/// assert_eq!(queue.waiters().count(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockQueue {
    /// The holder, if any, then the waiters in queue order.
    pub contenders: Vec<QueuedContender>,
    /// Where the queue lives on the server (a ZooKeeper directory, an etcd key prefix, a
    /// Redis key), where it has one place.
    pub location: Option<String>,
    /// Whether the server records waiters: `false` where the strategy keeps no queue there
    /// (a single node or key, polling, pub/sub), so that only the holder can be listed.
    pub waiters_recorded: bool,
    /// Anything else a reader of the listing should know (what the server cannot show).
    pub note: Option<String>,
}

impl Default for LockQueue {
    /// A free lock: nobody holds it, nobody waits.
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl LockQueue {
    /// A queue of `contenders` (holder first) whose waiters the server records.
    pub fn new(contenders: Vec<QueuedContender>) -> Self {
        LockQueue {
            contenders,
            location: None,
            waiters_recorded: true,
            note: None,
        }
    }

    /// The same, at `location` on the server.
    #[must_use]
    pub fn at(mut self, location: impl Into<String>) -> Self {
        self.location = Some(location.into());
        self
    }

    /// The same, for a strategy that keeps no waiters on the server.
    #[must_use]
    pub fn without_recorded_waiters(mut self) -> Self {
        self.waiters_recorded = false;
        self
    }

    /// The same, with a note for its reader.
    #[must_use]
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    /// The holder, if anyone holds the lock.
    pub fn holder(&self) -> Option<&QueuedContender> {
        self.contenders.first().filter(|contender| contender.holds)
    }

    /// The waiters, first in line first.
    pub fn waiters(&self) -> impl Iterator<Item = &QueuedContender> {
        self.contenders.iter().filter(|contender| !contender.holds)
    }
}

/// One contender of a [`LockQueue`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuedContender {
    /// Whether it holds the lock (otherwise it waits).
    pub holds: bool,
    /// Its place on the server, as the backend names it: a node's name, a key, an owner id;
    /// `None` where the server keeps no name for it.
    pub place: Option<String>,
    /// The session it belongs to, as the backend writes it (a ZooKeeper session id or an
    /// etcd lease id, in hex), where the server says.
    pub session: Option<String>,
    /// The fencing token of its grant (for a waiter, the one it will get), where the
    /// server knows it already.
    pub fencing_token: Option<FencingToken>,
    /// How long its lease has left, where the backend grants by lease.
    pub lease_left: Option<Duration>,
    /// What else the backend records for it, as (name, value) pairs: a ZooKeeper node's
    /// sequence number and czxid, an etcd key's create revision.
    pub details: Vec<(&'static str, String)>,
}

impl QueuedContender {
    /// The holder, at `place`.
    pub fn holder(place: impl Into<String>) -> Self {
        Self::new(true, Some(place.into()))
    }

    /// A waiter, at `place`.
    pub fn waiter(place: impl Into<String>) -> Self {
        Self::new(false, Some(place.into()))
    }

    /// A contender that holds (`holds`) or waits, at `place` if the server names one.
    pub fn new(holds: bool, place: Option<String>) -> Self {
        QueuedContender {
            holds,
            place,
            session: None,
            fencing_token: None,
            lease_left: None,
            details: Vec::new(),
        }
    }

    /// The same, of `session`.
    #[must_use]
    pub fn with_session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// The same, with the fencing token of its grant.
    #[must_use]
    pub fn with_fencing_token(mut self, token: FencingToken) -> Self {
        self.fencing_token = Some(token);
        self
    }

    /// The same, with `left` on its lease.
    #[must_use]
    pub fn with_lease_left(mut self, left: Duration) -> Self {
        self.lease_left = Some(left);
        self
    }

    /// The same, with one more detail.
    #[must_use]
    pub fn with_detail(mut self, name: &'static str, value: impl ToString) -> Self {
        self.details.push((name, value.to_string()));
        self
    }
}
