//! The queue under every etcd lock: contenders' keys ordered by create revision, and the
//! wait for one's turn.
//!
//! A contender writes its key on its session's lease in a transaction that creates the key
//! only if it is absent (so that a create sent twice makes one key), and learns the key's
//! create revision: its place. Its turn comes when few enough of the keys that can block it
//! have a smaller create revision — none for a mutex or a writer (any key blocks them), no
//! earlier writer for a reader, fewer than `permits` for a semaphore's lease. Revisions only
//! grow, so no key created later can get ahead of it: once its turn has come, it lasts until
//! it deletes its key or its lease ends.
//!
//! While its turn has not come, a contender watches for a deletion and looks again:
//!
//! - herd-free ([`Predecessor`](crate::EtcdStrategy::Predecessor)): the deletion of the
//!   nearest blocking key only — a release wakes the one waiter (or the readers) it lets in;
//! - herd (the other strategies): any deletion in the queue's directory — every release
//!   wakes every waiter.
//!
//! Each look reads its own key and the blocking keys in one transaction, at one revision R.
//! The watch is then one on the session's shared stream, opened without a start revision,
//! and the server says the revision W it sees after (see [`crate::watches`]): with W ≤ R
//! no deletion between the look and the watch can be missed; with W > R the contender
//! looks again, at a revision of at least W, and keeps the watch while it still watches
//! the right key. A deletion the watch reports wakes the contender, which looks again. A
//! look is serializable, answered from the member's applied state, whenever that state has
//! reached what the contender knows (see [`Queue::look`]).

use std::sync::Arc;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use lock_core::kit::{Cleanup, Wakeups};
use lock_core::{Deadline, Guard, LockError, LockName};

use crate::config::EtcdStrategy;
use crate::error::BACKEND;
use crate::guard::{Entry, grant};
use crate::session::{Session, Shared, Slot};
use crate::watches::Watch;

/// One lock's directory on the server, `{prefix}/{name escaped}{suffix}/`, and what its
/// waits need.
#[derive(Clone)]
pub(crate) struct Queue {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: LockName,
    /// Ends in `/`.
    pub(crate) dir: String,
    /// How waiters wait: the provider's strategy, or always herd-free (elections).
    pub(crate) strategy: EtcdStrategy,
    /// What a contender's key holds: nothing for locks, an election candidate's value.
    pub(crate) value: Arc<[u8]>,
}

/// Which keys can keep a contender out, and how many of them it tolerates before its own.
#[derive(Clone, Copy)]
pub(crate) struct Blockers<'a> {
    /// The directory whose keys block (a prefix of the queue's keys).
    pub(crate) dir: &'a str,
    /// The contender's turn has come while fewer keys than this precede it.
    pub(crate) admits: u32,
}

impl<'a> Blockers<'a> {
    /// Any earlier key of `dir` blocks: a mutex, a writer.
    pub(crate) fn any(dir: &'a str) -> Self {
        Blockers { dir, admits: 1 }
    }
}

/// What one look at the queue found.
enum Turn {
    /// Few enough blocking keys before ours, at `revision`: the lock is ours.
    Held { revision: i64 },
    /// Ours is not in yet: wait for a deletion of `nearest` (the latest blocking key before
    /// ours) or, watching the directory, of any key, after `revision`.
    Blocked { nearest: String, revision: i64 },
}

impl Queue {
    /// The queue of `name`'s lock kind whose directory ends in `suffix` (`""` for a mutex).
    pub(crate) fn new(shared: Arc<Shared>, name: LockName, suffix: &str) -> Self {
        let dir = format!("{}/{}{suffix}/", shared.config.prefix, name.escaped());
        Queue {
            strategy: shared.config.strategy,
            shared,
            name,
            dir,
            value: Arc::from(&[][..]),
        }
    }

    /// The same queue for contenders whose keys hold `value`.
    pub(crate) fn with_value(&self, value: &[u8]) -> Self {
        Queue {
            value: Arc::from(value),
            ..self.clone()
        }
    }

    /// A contender's key in the sub-directory `within` (`""`, or e.g. `"write/"`), named by
    /// `slot`; nothing sent yet. Armed: dropped, it deletes the key if it was written.
    pub(crate) fn entry(
        &self,
        session: &Arc<Session>,
        slot: &Arc<Slot>,
        within: &str,
    ) -> Cleanup<Entry> {
        let key = format!("{}{within}{}", self.dir, slot.id);
        Cleanup::new(Entry::new(session, key, None, Arc::clone(slot)))
    }

    /// A new contender's slot in this queue's directory.
    pub(crate) fn slot(&self, session: &Arc<Session>) -> Arc<Slot> {
        Arc::new(Slot::take(session, &self.dir))
    }

    /// Queues `pending`'s key and waits for its turn, then turns it into a guard; `None` at
    /// the deadline. Nothing is left behind on any way out: the key is deleted at once, or
    /// in the background when the attempt is dropped or fails.
    pub(crate) async fn attempt(
        &self,
        session: &Arc<Session>,
        pending: Cleanup<Entry>,
        blockers: Blockers<'_>,
        deadline: &Deadline,
    ) -> Result<Option<Guard>, LockError> {
        let turn = match pending.entry() {
            Some(entry) => self.wait_turn(session, entry, blockers, deadline).await,
            None => Ok(None),
        };
        self.settle(session, pending, turn).await
    }

    /// The end of an attempt: a guard for `pending`'s key if `turn` granted it; otherwise
    /// the key deleted (in the background, should the delete fail or be dropped).
    pub(crate) async fn settle(
        &self,
        session: &Arc<Session>,
        mut pending: Cleanup<Entry>,
        turn: Result<Option<Granted>, LockError>,
    ) -> Result<Option<Guard>, LockError> {
        match turn {
            Ok(Some(granted)) => match pending.disarm() {
                Some(entry) => grant(session, &self.name, entry, granted).map(Some),
                None => Ok(None),
            },
            Ok(None) => {
                self.give_up(session, pending).await;
                Ok(None)
            }
            // Dropping `pending` hands the key to the background clean-up.
            Err(error) => Err(error),
        }
    }

    /// Deletes `pending`'s key now. Disarmed only once the key is surely gone: should the
    /// delete fail, or this future be dropped during it, the background finishes the job.
    pub(crate) async fn give_up(&self, session: &Session, mut pending: Cleanup<Entry>) {
        if let Some(entry) = pending.entry()
            && entry.remove(session).await.is_ok()
        {
            pending.disarm();
        }
    }

    /// Writes `entry`'s key, then waits until its turn comes (`None` at the deadline).
    pub(crate) async fn wait_turn(
        &self,
        session: &Arc<Session>,
        entry: &Entry,
        blockers: Blockers<'_>,
        deadline: &Deadline,
    ) -> Result<Option<Granted>, LockError> {
        let mine = self.create(session, entry, deadline).await?;
        let mut wakeups = Wakeups::new(&self.shared.metrics);
        // The newest revision this contender knows of: a look must see at least that far.
        let mut known = mine;
        let mut watching = None;
        loop {
            // 1. Look: is it our turn, and if not, which key to wait for.
            let looked = self.look(session, &entry.key, mine, known, blockers, deadline);
            let (nearest, revision) = match looked.await? {
                Turn::Held { revision } => return Ok(Some(Granted::new(mine, revision))),
                Turn::Blocked { nearest, revision } => (nearest, revision),
            };
            wakeups.busy();
            if deadline.is_immediate() || deadline.has_passed() {
                return Ok(None);
            }
            // 2. Wait for a deletion of it. A semaphore's lease waits for any holder to
            // leave: only the contender that holds the semaphore's mutex waits here, so that
            // is no herd.
            let watched = match self.strategy {
                EtcdStrategy::Predecessor if blockers.admits == 1 => Watched::Key(&nearest),
                EtcdStrategy::Predecessor => Watched::Prefix(blockers.dir),
                _ => Watched::Prefix(&self.dir),
            };
            let woke = self.wait_for_delete(session, &mut watching, watched, revision, deadline);
            // 3. Deleted, or to be looked at again: know at least as far as that.
            match woke.await? {
                Woke::Deleted(at) => {
                    known = known.max(at);
                    wakeups.woke();
                }
                Woke::LookAgain(at) => known = known.max(at),
                Woke::TimedOut => return Ok(None),
            }
        }
    }

    /// Creates `entry`'s key on the session's lease unless it exists: its create revision
    /// either way. A create whose answer is lost is sent again while the session lives
    /// (see [`Session::again`]): made already, it finds the key, which the lease names.
    async fn create(
        &self,
        session: &Arc<Session>,
        entry: &Entry,
        deadline: &Deadline,
    ) -> Result<i64, LockError> {
        let key = entry.key.as_str();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                self.value.to_vec(),
                Some(PutOptions::new().with_lease(session.lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let name = self.name.as_str();
        let answer = session
            .again(name, deadline, || {
                entry.send_create(session, name, txn.clone(), created_or_found)
            })
            .await?;
        created_or_found(&answer).ok_or_else(|| self.place_gone())
    }

    /// One look at the queue, at one revision no older than `known`: whether our key still
    /// stands, and the blocking keys before it (at most `admits` of them, nearest first).
    ///
    /// The look is first made serializable: the member answers from the state it has
    /// applied, without the leader's confirmation that a linearizable read waits for (behind
    /// the disk writes queued before it, such as the releaser's next create). That is sound:
    /// a member applies only committed revisions, and a turn seen at any committed revision
    /// lasts while our key stands, as no key created later can get ahead of ours. A member
    /// behind `known` — before our create, or before the deletion that woke us — would only
    /// report our key missing or the deleted blocker present, so then the look is made again,
    /// linearizable.
    async fn look(
        &self,
        session: &Session,
        key: &str,
        mine: i64,
        known: i64,
        blockers: Blockers<'_>,
        deadline: &Deadline,
    ) -> Result<Turn, LockError> {
        let answer = self.look_at(session, key, mine, blockers, Read::Serializable, deadline);
        let mut answer = answer.await?;
        if answer
            .header()
            .is_none_or(|header| header.revision() < known)
        {
            answer = self
                .look_at(session, key, mine, blockers, Read::Linearizable, deadline)
                .await?;
        }
        let revision = answer.header().map_or(0, |header| header.revision());
        let mut answers = answer.op_responses().into_iter();
        let own = answers.next().and_then(|own| kvs(own).into_iter().next());
        if own.is_none_or(|(_, create_revision, _)| create_revision != mine) {
            return Err(self.place_gone());
        }
        // At most `admits` keys come back, nearest first: all of them means too many.
        let before = answers.next().map(kvs).unwrap_or_default();
        if before.len() < blockers.admits as usize {
            return Ok(Turn::Held { revision });
        }
        Ok(match before.into_iter().next() {
            Some((nearest, _, _)) => Turn::Blocked { nearest, revision },
            None => Turn::Held { revision },
        })
    }

    /// The transaction behind [`look`](Self::look), read as `read` says.
    async fn look_at(
        &self,
        session: &Session,
        key: &str,
        mine: i64,
        blockers: Blockers<'_>,
        read: Read,
        deadline: &Deadline,
    ) -> Result<TxnResponse, LockError> {
        let options = || match read {
            Read::Serializable => GetOptions::new().with_serializable(),
            Read::Linearizable => GetOptions::new(),
        };
        let before = options()
            .with_prefix()
            .with_max_create_revision(mine - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(i64::from(blockers.admits))
            .with_keys_only();
        let txn = Txn::new().and_then([
            TxnOp::get(key, Some(options().with_keys_only())),
            TxnOp::get(blockers.dir, Some(before)),
        ]);
        session
            .read(self.name.as_str(), deadline, || {
                let mut kv = session.client.kv_client();
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await
    }

    /// Waits for a deletion of what `watched` names after `revision`, the revision of the
    /// look that found it in the way, on `watching` (kept while it watches the same thing
    /// and the watch lives; otherwise replaced). What the contender must know before it
    /// looks again: the deletion's revision, or a revision it must look at least as far
    /// as, when the watch began after the look or ended.
    pub(crate) async fn wait_for_delete(
        &self,
        session: &Session,
        watching: &mut Option<Watching>,
        watched: Watched<'_>,
        revision: i64,
        deadline: &Deadline,
    ) -> Result<Woke, LockError> {
        let name = self.name.as_str();
        if watching
            .as_ref()
            .is_none_or(|current| current.watched != watched)
        {
            *watching = None;
            let (key, prefix) = match watched {
                Watched::Key(key) => (key, false),
                Watched::Prefix(dir) => (dir, true),
            };
            let watch = session.watch_deletions(name, key, prefix, deadline).await?;
            let from = watch.from;
            *watching = Some(Watching {
                watched: watched.to_owned(),
                watch,
            });
            // Begun after the look: a deletion in between would be missed.
            if from > revision {
                return Ok(Woke::LookAgain(from));
            }
        }
        let Some(Watching { watch, .. }) = watching.as_mut() else {
            return Ok(Woke::LookAgain(revision));
        };
        loop {
            let answer = tokio::select! {
                answer = watch.next() => answer,
                () = deadline.sleep() => return Ok(Woke::TimedOut),
                () = session.over.wait() => return Err(LockError::SessionExpired {
                    backend: BACKEND,
                    name: Some(name.to_owned()),
                }),
            };
            let Some(answer) = answer else {
                // The stream broke: look again, then watch anew.
                *watching = None;
                return Ok(Woke::LookAgain(revision));
            };
            if answer.canceled() {
                // Compacted: the next look must see past the compaction (a member behind
                // it could answer from before it, and the waiter spin until it caught up).
                *watching = None;
                return Ok(Woke::LookAgain(revision.max(answer.compact_revision())));
            }
            // Deletions the look saw already are no news.
            let deleted = answer
                .events()
                .iter()
                .filter(|event| event.event_type() == EventType::Delete)
                .filter_map(|event| event.kv().map(|kv| kv.mod_revision()))
                .filter(|&at| at > revision)
                .max();
            if let Some(deleted) = deleted {
                // A deleted key is watched no longer; a directory is, from here on.
                if matches!(watched, Watched::Key(_)) {
                    *watching = None;
                }
                return Ok(Woke::Deleted(deleted));
            }
        }
    }

    /// The error of a contender whose key vanished while it waited.
    pub(crate) fn place_gone(&self) -> LockError {
        LockError::Backend {
            backend: BACKEND,
            name: Some(self.name.to_string()),
            message: "this waiter's key is gone (deleted by another client, or its lease ended)"
                .to_owned(),
            retryable: true,
            source: None,
        }
    }
}

/// How a look reads the queue.
#[derive(Clone, Copy)]
enum Read {
    /// From the member's applied state, whatever its revision.
    Serializable,
    /// At the cluster's latest revision, confirmed by the leader.
    Linearizable,
}

/// What a waiter watches.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched<'a> {
    /// One key.
    Key(&'a str),
    /// Every key of a directory.
    Prefix(&'a str),
}

impl Watched<'_> {
    fn to_owned(self) -> WatchedOwned {
        match self {
            Watched::Key(key) => WatchedOwned::Key(key.to_owned()),
            Watched::Prefix(dir) => WatchedOwned::Prefix(dir.to_owned()),
        }
    }
}

/// [`Watched`], kept beside its watch.
#[derive(PartialEq, Eq)]
enum WatchedOwned {
    Key(String),
    Prefix(String),
}

impl PartialEq<Watched<'_>> for WatchedOwned {
    fn eq(&self, other: &Watched<'_>) -> bool {
        match (self, other) {
            (WatchedOwned::Key(mine), Watched::Key(other)) => mine == other,
            (WatchedOwned::Prefix(mine), Watched::Prefix(other)) => mine == other,
            _ => false,
        }
    }
}

/// A waiter's watch, and what it watches: kept from one look to the next.
pub(crate) struct Watching {
    watched: WatchedOwned,
    watch: Watch,
}

/// How a wait for a deletion ended.
pub(crate) enum Woke {
    /// A deletion at this revision.
    Deleted(i64),
    /// Look again, at this revision at least: the watch began after the look, or ended.
    LookAgain(i64),
    /// The deadline passed.
    TimedOut,
}

/// A granted contender: its key's create revision (its fencing token), and a revision at
/// which the key was seen still standing as the holder's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Granted {
    pub(crate) created: i64,
    pub(crate) seen: i64,
}

impl Granted {
    pub(crate) fn new(created: i64, seen: i64) -> Self {
        Granted {
            created,
            seen: seen.max(created),
        }
    }
}

/// The create revision of the key a create transaction made or found.
fn created_or_found(answer: &TxnResponse) -> Option<i64> {
    if answer.succeeded() {
        return answer.header().map(|header| header.revision());
    }
    answer
        .op_responses()
        .into_iter()
        .find_map(|found| kvs(found).into_iter().next())
        .map(|(_, create_revision, _)| create_revision)
}

/// The keys of a get's answer in a transaction: name, create revision and value of each.
pub(crate) fn kvs(answer: TxnOpResponse) -> Vec<(String, i64, Vec<u8>)> {
    match answer {
        TxnOpResponse::Get(get) => get
            .kvs()
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                (key, kv.create_revision(), kv.value().to_vec())
            })
            .collect(),
        _ => Vec::new(),
    }
}
