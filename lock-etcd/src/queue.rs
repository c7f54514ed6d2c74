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
//! A try (a deadline that does not wait) of a mutex, a writer or a reader does not queue:
//! it writes its key only if no blocking key exists, in one transaction (see
//! [`Place::attempt`]).
//!
//! While its turn has not come, a contender watches for a deletion and looks again:
//!
//! - herd-free ([`Predecessor`](crate::EtcdStrategy::Predecessor)): the deletion of the
//!   nearest blocking key only — a release wakes the one waiter (or the readers) it lets in;
//! - herd (the other strategies): any deletion in the queue's directory — every release
//!   wakes every waiter.
//!
//! Each look reads its own key and the blocking keys in one transaction, at one revision R
//! (the first is part of the create's transaction, where the new key is the newest).
//! The watch is then one on the session's shared stream, opened without a start revision,
//! and the server says the revision W it sees after (see [`crate::watches`]): with W ≤ R
//! no deletion between the look and the watch can be missed; with W > R the contender
//! looks again, at a revision of at least W, and keeps the watch while it still watches
//! the right key. A look is serializable, answered from the member's applied state,
//! whenever that state has reached what the contender knows (see [`Queue::look`]).
//!
//! A deletion the watch reports wakes the contender, which looks again — unless the look
//! at R found the deleted key alone in its way. Then the turn has come without a look, as
//! a key created after R has a later revision than ours and cannot get in the way: the
//! look would only confirm that our own key still stands. That the waiter knows from a
//! second watch, on its own key, made beside the first during its first wait (and looked
//! past in the same way): a deletion of our key ends the wait with an error, and once the
//! turn has come the guard keeps that watch for its lost signal. A handoff is then the
//! release, its event, and nothing more. (Only a deletion of our key in the very revision
//! of the last key's can reach us after the turn: one transaction of someone else's that
//! deletes both — the end of a lease both keys share would too, so a key on our own lease
//! is never the last. The guard's watch then fires the lost signal at once, as for any
//! deletion after a grant.)

use std::sync::Arc;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchResponse,
};
use lock_core::kit::{Cleanup, Wakeups};
use lock_core::{Deadline, Guard, LockError, LockName};

use crate::config::EtcdStrategy;
use crate::error::BACKEND;
use crate::guard::{Entry, Granted, grant};
use crate::session::{Session, Shared, Slot};
use crate::watches::{Watch, deleted_after};

/// One lock's directory on the server, `{prefix}/{name escaped}{suffix}/`, and what its
/// waits need.
#[derive(Clone)]
pub(crate) struct Place {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: LockName,
    /// Ends in `/`. Shared with the slots that contenders take in it.
    pub(crate) dir: Arc<str>,
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
    /// ours) or, watching the directory, of any key, after `revision`. `last`: one
    /// deletion among the blocking keys is enough for our turn.
    Blocked {
        nearest: String,
        revision: i64,
        last: bool,
    },
}

impl Turn {
    /// The turn that `before`, the blocking keys before ours at `revision` (at most
    /// `admits + 1`, nearest first, each with its lease), makes for a contender on
    /// `own_lease`.
    fn of(before: Vec<(String, i64)>, admits: u32, revision: i64, own_lease: i64) -> Turn {
        // `admits` of them is too many; `admits` exactly, and one deletion lets ours in —
        // unless that key is on our own lease, whose end would take our key in the same
        // revision (the wait would see the nearest key's deletion, perhaps before ours).
        let admits = admits as usize;
        if before.len() < admits {
            return Turn::Held { revision };
        }
        let last =
            before.len() == admits && before.first().is_some_and(|(_, lease)| *lease != own_lease);
        match before.into_iter().next() {
            Some((nearest, _)) => Turn::Blocked {
                nearest,
                revision,
                last,
            },
            None => Turn::Held { revision },
        }
    }
}

impl Place {
    /// The queue of `name`'s lock kind whose directory ends in `suffix` (`""` for a mutex).
    pub(crate) fn new(shared: Arc<Shared>, name: LockName, suffix: &str) -> Self {
        let dir = format!("{}/{}{suffix}/", shared.config.prefix, name.escaped());
        Place {
            strategy: shared.config.strategy,
            shared,
            name,
            dir: dir.into(),
            value: Arc::from(&[][..]),
        }
    }

    /// The same queue for contenders whose keys hold `value`.
    pub(crate) fn with_value(&self, value: &[u8]) -> Self {
        Place {
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
        let key = format!("{}{within}{}", self.dir, slot.id());
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
        mut pending: Cleanup<Entry>,
        blockers: Blockers<'_>,
        deadline: &Deadline,
    ) -> Result<Option<Guard>, LockError> {
        if deadline.is_immediate() && blockers.admits == 1 {
            let turn = match pending.entry() {
                Some(entry) => self.try_once(session, entry, blockers, deadline).await,
                None => Ok(None),
            };
            if let Ok(None) = turn {
                // Busy, and nothing was written: no key to delete.
                pending.disarm();
                return Ok(None);
            }
            return self.settle(session, pending, turn).await;
        }
        let turn = match pending.entry() {
            Some(entry) => self.wait_turn(session, entry, blockers, deadline).await,
            None => Ok(None),
        };
        self.settle(session, pending, turn).await
    }

    /// One try that does not queue: `entry`'s key is written only if no blocking key exists,
    /// in one transaction (`create_revision = 0` over a range holds only when the range is
    /// empty). A try that queued and then gave up would stand, for as long as its key lived,
    /// in the way of every other try: tries that overlap could all fail on a lock nobody
    /// holds. Sent again after a lost answer, the transaction finds the key it wrote.
    async fn try_once(
        &self,
        session: &Arc<Session>,
        entry: &Entry,
        blockers: Blockers<'_>,
        deadline: &Deadline,
    ) -> Result<Option<Granted>, LockError> {
        let key = &*entry.key;
        let txn = Txn::new()
            .when([Compare::create_revision(blockers.dir, CompareOp::Equal, 0).with_prefix()])
            .and_then([self.put(session, key)])
            .or_else([TxnOp::get(key, None)]);
        let answer = self.send_create(session, entry, txn, deadline).await?;
        let revision = answer.header().map_or(0, |header| header.revision());
        Ok(created_or_found(&answer).map(|mine| Granted::new(mine, revision)))
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
        let (mine, mut first_look) = self.create(session, entry, blockers, deadline).await?;
        let mut wakeups = Wakeups::new(&self.shared.metrics);
        // The newest revision this contender knows of: a look must see at least that far.
        let mut known = mine;
        let mut watching = Watching::default();
        loop {
            // 1. Look (the create looked first): is it our turn, and if not, which key to
            // wait for.
            let looked = match first_look.take() {
                Some(turn) => turn,
                None => {
                    let look = self.look(session, &entry.key, mine, known, blockers, deadline);
                    look.await?
                }
            };
            let (nearest, revision, last) = match looked {
                Turn::Held { revision } => {
                    return Ok(Some(Granted::new(mine, revision).watched(watching.own)));
                }
                Turn::Blocked {
                    nearest,
                    revision,
                    last,
                } => (nearest, revision, last),
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
            let wait = Wait {
                watched,
                own: Some(&entry.key),
                last,
                revision,
            };
            let woke = self.wait_for_delete(session, &mut watching, wait, deadline);
            // 3. Deleted, or to be looked at again: know at least as far as that.
            match woke.await? {
                Woke::Ours => {
                    wakeups.woke();
                    return Ok(Some(Granted::new(mine, revision).watched(watching.own)));
                }
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
    /// either way and, when this create made it, the queue's first look, made in the same
    /// transaction (the newest key then is ours: the keys before it are the newest others).
    /// A create whose answer is lost is sent again while the session lives (see
    /// [`Session::again`]): made already, it finds the key, which the lease names, and the
    /// contender looks as it would after a wait.
    async fn create(
        &self,
        session: &Arc<Session>,
        entry: &Entry,
        blockers: Blockers<'_>,
        deadline: &Deadline,
    ) -> Result<(i64, Option<Turn>), LockError> {
        let key = &*entry.key;
        // Ours and the `admits + 1` nearest before it, should ours be in `blockers.dir`.
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(i64::from(blockers.admits) + 2)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                self.put(session, key),
                TxnOp::get(blockers.dir, Some(newest)),
            ])
            .or_else([TxnOp::get(key, None)]);
        let answer = self.send_create(session, entry, txn, deadline).await?;
        let mine = created_or_found(&answer).ok_or_else(|| self.place_gone())?;
        if !answer.succeeded() {
            return Ok((mine, None));
        }
        let mut before = answer
            .op_responses()
            .into_iter()
            .nth(1)
            .map(leased_keys)
            .unwrap_or_default();
        before.retain(|(other, _)| other != key);
        before.truncate(blockers.admits as usize + 1);
        let turn = Turn::of(before, blockers.admits, mine, session.lease);
        Ok((mine, Some(turn)))
    }

    /// The put of a contender's `key` on the session's lease.
    fn put(&self, session: &Session, key: &str) -> TxnOp {
        let on_lease = PutOptions::new().with_lease(session.lease);
        TxnOp::put(key, self.value.to_vec(), Some(on_lease))
    }

    /// Sends `txn`, a create of `entry`'s key that reads the key when it stands already;
    /// sent again after a lost answer while the session lives (see [`Session::again`]).
    async fn send_create(
        &self,
        session: &Arc<Session>,
        entry: &Entry,
        txn: Txn,
        deadline: &Deadline,
    ) -> Result<TxnResponse, LockError> {
        let name = self.name.as_str();
        let send = || entry.send_create(session, name, txn.clone(), created_or_found);
        session.again(name, deadline, send).await
    }

    /// One look at the queue, at one revision no older than `known`: whether our key still
    /// stands, and the blocking keys before it (at most `admits + 1` of them, nearest
    /// first: enough to tell whether one deletion would let ours in).
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
        let before = answers.next().map(leased_keys).unwrap_or_default();
        Ok(Turn::of(before, blockers.admits, revision, session.lease))
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
            .with_limit(i64::from(blockers.admits) + 1)
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

    /// Waits for a deletion of what `wait.watched` names after `wait.revision`, the
    /// revision of the look that found it in the way, on `watching`'s watch (kept while it
    /// watches the same thing and the watch lives; otherwise replaced), and watches
    /// `wait.own`, the contender's own key, beside it. What the contender must know before
    /// it looks again: the deletion's revision, or a revision it must look at least as far
    /// as, when a watch began after the look or ended. Or no look at all: the deleted key
    /// was the last in the way.
    pub(crate) async fn wait_for_delete(
        &self,
        session: &Session,
        watching: &mut Watching,
        wait: Wait<'_>,
        deadline: &Deadline,
    ) -> Result<Woke, LockError> {
        let Wait {
            watched, revision, ..
        } = wait;
        let name = self.name.as_str();
        let kept = watching
            .blocker
            .as_ref()
            .is_some_and(|(current, _)| *current == watched);
        let own = wait.own.filter(|_| watching.own.is_none());
        if !kept || own.is_some() {
            // Both watches asked for together: their creates share a round trip.
            let (key, prefix) = match watched {
                Watched::Key(key) => (key, false),
                Watched::Prefix(dir) => (dir, true),
            };
            let blocker = async {
                match kept {
                    true => None,
                    false => Some(session.watch_deletions(name, key, prefix, deadline).await),
                }
            };
            let own = async {
                match own {
                    Some(own) => Some(session.watch_deletions(name, own, false, deadline).await),
                    None => None,
                }
            };
            let (blocker, own) = tokio::join!(blocker, own);
            let mut from = 0;
            if let Some(made) = own {
                let made = made?;
                from = made.from;
                watching.own = Some(made);
            }
            if let Some(made) = blocker {
                let made = made?;
                from = from.max(made.from);
                watching.blocker = Some((watched.to_owned(), made));
            }
            // Begun after the look: a deletion in between would be missed.
            if from > revision {
                return Ok(Woke::LookAgain(from));
            }
        }
        let Watching {
            blocker: Some((_, blocker)),
            own,
        } = watching
        else {
            return Ok(Woke::LookAgain(revision));
        };
        loop {
            let (answer, about_own) = tokio::select! {
                answer = blocker.next() => (answer, false),
                answer = next_of(own) => (answer, true),
                () = deadline.sleep() => return Ok(Woke::TimedOut),
                () = session.over.wait() => return Err(LockError::SessionExpired {
                    backend: BACKEND,
                    name: Some(name.to_owned()),
                }),
            };
            let Some(answer) = answer else {
                // The stream broke: look again, then watch anew.
                *watching = Watching::default();
                return Ok(Woke::LookAgain(revision));
            };
            if answer.canceled() {
                // Compacted: the next look must see past the compaction (a member behind
                // it could answer from before it, and the waiter spin until it caught up).
                *watching = Watching::default();
                return Ok(Woke::LookAgain(revision.max(answer.compact_revision())));
            }
            // Deletions the look saw already are no news.
            let Some(deleted) = deleted_after(&answer, revision) else {
                continue;
            };
            if about_own {
                return Err(self.place_gone());
            }
            // A deleted key is watched no longer; a directory is, from here on.
            if let Watched::Key(_) = watched {
                watching.blocker = None;
                if wait.last {
                    match watching.own.as_mut().map(|own| pending_end(own, revision)) {
                        Some(OwnKey::Stands) => return Ok(Woke::Ours),
                        Some(OwnKey::Deleted) => return Err(self.place_gone()),
                        Some(OwnKey::Unwatched) => watching.own = None,
                        None => {}
                    }
                }
            }
            return Ok(Woke::Deleted(deleted));
        }
    }

    /// The error of a contender whose key vanished while it waited.
    pub(crate) fn place_gone(&self) -> LockError {
        let message = "this waiter's key is gone (deleted by another client, or its lease ended)";
        LockError::other(BACKEND, message)
            .retryable(true)
            .for_lock(&self.name)
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

/// What a waiter keeps from one look to the next: its watch on what is in its way, and
/// what that watch watches; in a queue, the watch on its own key, which its guard keeps.
#[derive(Default)]
pub(crate) struct Watching {
    blocker: Option<(WatchedOwned, Watch)>,
    own: Option<Watch>,
}

/// One wait for a deletion, after a look at `revision`.
#[derive(Clone, Copy)]
pub(crate) struct Wait<'a> {
    /// What to wait for a deletion of.
    pub(crate) watched: Watched<'a>,
    /// The contender's own key, watched beside it (a queue's contender).
    pub(crate) own: Option<&'a str>,
    /// The watched key is the last in the way: its deletion is the turn.
    pub(crate) last: bool,
    /// The revision of the look that found it in the way.
    pub(crate) revision: i64,
}

/// How a wait for a deletion ended.
pub(crate) enum Woke {
    /// The last key in the way was deleted, and the contender's own key stands: its turn.
    Ours,
    /// A deletion at this revision.
    Deleted(i64),
    /// Look again, at this revision at least: the watch began after the look, or ended.
    LookAgain(i64),
    /// The deadline passed.
    TimedOut,
}

/// What the answers a contender's own-key watch has received so far say.
enum OwnKey {
    /// No deletion: the key stands.
    Stands,
    /// Deleted.
    Deleted,
    /// The watch ended (a compaction, a broken stream): the key is not known to stand.
    Unwatched,
}

/// Reads the answers already received on `own`, the watch on a contender's own key, after
/// the look at `revision`.
fn pending_end(own: &mut Watch, revision: i64) -> OwnKey {
    while let Some(answer) = own.received() {
        match answer {
            None => return OwnKey::Unwatched,
            Some(answer) if answer.canceled() => return OwnKey::Unwatched,
            Some(answer) if deleted_after(&answer, revision).is_some() => return OwnKey::Deleted,
            Some(_) => {}
        }
    }
    OwnKey::Stands
}

/// `watch`'s next answer; never, without a watch.
async fn next_of(watch: &mut Option<Watch>) -> Option<WatchResponse> {
    match watch {
        Some(watch) => watch.next().await,
        None => std::future::pending().await,
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

/// The keys of a get's answer in a transaction, each with its lease.
fn leased_keys(answer: TxnOpResponse) -> Vec<(String, i64)> {
    each_kv(answer, |kv| (key_of(kv), kv.lease()))
}

/// The keys of a get's answer in a transaction: name, create revision and value of each.
pub(crate) fn kvs(answer: TxnOpResponse) -> Vec<(String, i64, Vec<u8>)> {
    each_kv(answer, |kv| {
        (key_of(kv), kv.create_revision(), kv.value().to_vec())
    })
}

/// `read` of each key of a get's answer in a transaction.
fn each_kv<T>(answer: TxnOpResponse, read: impl Fn(&KeyValue) -> T) -> Vec<T> {
    match answer {
        TxnOpResponse::Get(get) => get.kvs().iter().map(read).collect(),
        _ => Vec::new(),
    }
}

fn key_of(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.key()).into_owned()
}
