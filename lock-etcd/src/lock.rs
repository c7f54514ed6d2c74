//! The mutex: a key per contender ordered by create revision (herd-free or herd), or one
//! shared key (naive).
//!
//! The queue is etcd's own `concurrency.Mutex`: a contender writes `{dir}{lease in hex}`
//! on its session's lease (a transaction that creates the key only if it is absent, so
//! that a create sent twice makes one key), and holds the lock when no key of the
//! directory has a smaller create revision. Revisions only grow, so a contender that
//! finds no key before its own holds the lock until it deletes its key or its lease ends;
//! and one that finds some waits for a deletion, then looks again.
//!
//! - `predecessor` watches only the deletion of the key just before its own (the one with
//!   the greatest create revision below its own): a release wakes one waiter.
//! - `prefix` watches the whole directory: every deletion wakes every waiter (a herd).
//! - `single` creates `{dir}lock` if absent, and every waiter watches that key.
//!
//! The holder's fencing token is its key's create revision: revisions are the cluster's
//! one logical clock, and survive a leader's failover.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use lock_core::kit::{Cleanup, MutexAttempt, Wakeups};
use lock_core::{Deadline, Guard, LockError, LockName};

use crate::config::EtcdStrategy;
use crate::error::BACKEND;
use crate::guard::{Entry, grant};
use crate::session::{Session, Shared, Slot};

/// The single-key lock's key in a lock's directory (not a hex lease id, so it never names
/// a contender of the queue strategies).
pub(crate) const SINGLE_KEY: &str = "lock";

/// A lock handle from an [`EtcdLockProvider`](crate::EtcdLockProvider).
pub struct EtcdLock {
    shared: Arc<Shared>,
    name: LockName,
    /// `{prefix}/{name escaped}/`.
    dir: String,
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLock")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("strategy", &self.shared.config.strategy)
            .finish()
    }
}

impl EtcdLock {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        let dir = lock_dir(&shared.config.prefix, &name);
        EtcdLock { shared, name, dir }
    }
}

/// The directory of the lock `name` under `prefix`.
pub(crate) fn lock_dir(prefix: &str, name: &LockName) -> String {
    format!("{prefix}/{}/", name.escaped())
}

/// What one look at the queue found.
enum Turn {
    /// No key before ours: the lock is ours.
    Held,
    /// Ours is not first: wait for a deletion of `blocker` (or, watching the prefix, of
    /// any key), from `revision` on.
    Blocked { blocker: String, revision: i64 },
}

#[async_trait]
impl MutexAttempt for EtcdLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let session = self.shared.session(&self.name).await?;
        let slot = Slot::take(&session, &self.dir);
        let single = self.shared.config.strategy == EtcdStrategy::Single;
        let key = match single {
            true => format!("{}{SINGLE_KEY}", self.dir),
            false => slot.key.clone(),
        };
        let ours_if = single.then(|| slot.key.clone());
        let entry = Entry::new(&session, key, ours_if, slot);
        // Armed before the first request: a dropped attempt leaves no key behind.
        let mut pending = Cleanup::new(entry);
        let granted = match pending.entry() {
            Some(entry) if single => self.single(&session, entry, &deadline).await,
            Some(entry) => self.queue(&session, entry, &deadline).await,
            None => Ok(None),
        };
        match granted {
            Ok(Some(revision)) => match pending.disarm() {
                Some(entry) => grant(&session, &self.name, entry, revision).map(Some),
                None => Ok(None),
            },
            Ok(None) => {
                // Disarmed only once the key is surely gone: dropped during the delete,
                // the attempt still leaves its clean-up to the background.
                if let Some(entry) = pending.entry()
                    && entry.remove(&session).await.is_ok()
                {
                    pending.disarm();
                }
                Ok(None)
            }
            // Dropping `pending` hands the key to the background clean-up.
            Err(error) => Err(error),
        }
    }
}

impl EtcdLock {
    /// Queues `entry`'s key, then waits for its turn: the key's create revision once held,
    /// `None` at the deadline.
    async fn queue(
        &self,
        session: &Arc<Session>,
        entry: &Entry,
        deadline: &Deadline,
    ) -> Result<Option<i64>, LockError> {
        let mine = self.create(session, entry).await?;
        let mut wakeups = Wakeups::new(&self.shared.metrics);
        loop {
            let (blocker, revision) = match self.look(session, &entry.key, mine).await? {
                Turn::Held => return Ok(Some(mine)),
                Turn::Blocked { blocker, revision } => (blocker, revision),
            };
            wakeups.busy();
            if deadline.is_immediate() || deadline.has_passed() {
                return Ok(None);
            }
            let watched = match self.shared.config.strategy {
                EtcdStrategy::Prefix => Watched::Prefix(&self.dir),
                _ => Watched::Key(&blocker),
            };
            if !self
                .wait_for_delete(session, watched, revision, deadline)
                .await?
            {
                return Ok(None);
            }
            wakeups.woke();
        }
    }

    /// Creates `key` on the session's lease unless it exists (a create sent again after a
    /// lost reply): its create revision either way.
    async fn create(&self, session: &Arc<Session>, entry: &Entry) -> Result<i64, LockError> {
        let key = entry.key.as_str();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                "",
                Some(PutOptions::new().with_lease(session.lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let answer = entry
            .send_create(session, self.name.as_str(), txn, created_or_found)
            .await?;
        created_or_found(&answer).ok_or_else(|| self.place_gone())
    }

    /// One look at the queue, at one revision: whether our key still stands, and the key
    /// just before it.
    async fn look(&self, session: &Session, key: &str, mine: i64) -> Result<Turn, LockError> {
        let before = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(mine - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new().and_then([
            TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
            TxnOp::get(self.dir.as_str(), Some(before)),
        ]);
        let mut kv = session.client.kv_client();
        let answer = session.ask(self.name.as_str(), kv.txn(txn)).await?;
        let revision = answer.header().map_or(0, |header| header.revision());
        let answers = answer.op_responses();
        let own = answers
            .first()
            .and_then(|own| first_kv(std::slice::from_ref(own)));
        if own.is_none_or(|(_, create_revision, _)| create_revision != mine) {
            return Err(self.place_gone());
        }
        Ok(
            match answers
                .get(1)
                .and_then(|before| first_kv(std::slice::from_ref(before)))
            {
                None => Turn::Held,
                Some((blocker, _, _)) => Turn::Blocked { blocker, revision },
            },
        )
    }

    /// The single-key lock: create `{dir}lock` holding our slot's key if absent, else wait
    /// for its deletion and try again.
    async fn single(
        &self,
        session: &Arc<Session>,
        entry: &Entry,
        deadline: &Deadline,
    ) -> Result<Option<i64>, LockError> {
        let (key, value) = (
            entry.key.as_str(),
            entry.ours_if.as_deref().unwrap_or_default(),
        );
        let mut wakeups = Wakeups::new(&self.shared.metrics);
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    value,
                    Some(PutOptions::new().with_lease(session.lease)),
                )])
                .or_else([TxnOp::get(key, None)]);
            let answer = entry
                .send_create(session, self.name.as_str(), txn, created)
                .await?;
            let revision = answer.header().map_or(0, |header| header.revision());
            if answer.succeeded() {
                return Ok(Some(revision));
            }
            match first_kv(&answer.op_responses()) {
                // Ours: a create sent again after a lost reply.
                Some((_, create_revision, held_by)) if held_by == value.as_bytes() => {
                    return Ok(Some(create_revision));
                }
                // Deleted in between: try again at once.
                None => continue,
                Some(_) => {}
            }
            wakeups.busy();
            if deadline.is_immediate() || deadline.has_passed() {
                return Ok(None);
            }
            if !self
                .wait_for_delete(session, Watched::Key(key), revision, deadline)
                .await?
            {
                return Ok(None);
            }
            wakeups.woke();
        }
    }

    /// Waits for a deletion after `revision` of what `watched` names: `true` once one
    /// happened (or the watch broke: look again), `false` at the deadline.
    async fn wait_for_delete(
        &self,
        session: &Session,
        watched: Watched<'_>,
        revision: i64,
        deadline: &Deadline,
    ) -> Result<bool, LockError> {
        let mut options = WatchOptions::new()
            .with_start_revision(revision + 1)
            .with_filters([WatchFilterType::NoPut]);
        let key = match watched {
            Watched::Key(key) => key,
            Watched::Prefix(dir) => {
                options = options.with_prefix();
                dir
            }
        };
        let mut watches = session.client.watch_client();
        let (_watcher, mut stream) = session
            .ask(self.name.as_str(), watches.watch(key, Some(options)))
            .await?;
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = deadline.sleep() => return Ok(false),
                () = session.over.wait() => return Err(LockError::SessionExpired {
                    backend: BACKEND,
                    name: Some(self.name.to_string()),
                }),
            };
            match message {
                Ok(Some(answer)) if answer.canceled() => return Ok(true),
                Ok(Some(answer)) => {
                    if answer
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(true);
                    }
                }
                Ok(None) | Err(_) => return Ok(true),
            }
        }
    }

    fn place_gone(&self) -> LockError {
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

/// What a waiter watches.
#[derive(Clone, Copy)]
enum Watched<'a> {
    /// One key.
    Key(&'a str),
    /// Every key of a directory.
    Prefix(&'a str),
}

/// The create revision of the key a create transaction made or found.
fn created_or_found(answer: &TxnResponse) -> Option<i64> {
    if answer.succeeded() {
        return answer.header().map(|header| header.revision());
    }
    first_kv(&answer.op_responses()).map(|(_, create_revision, _)| create_revision)
}

/// The create revision of the single key, when this create made it.
fn created(answer: &TxnResponse) -> Option<i64> {
    answer
        .succeeded()
        .then(|| answer.header().map(|header| header.revision()))
        .flatten()
}

/// The first key of a get's answer in a transaction: its name, create revision and value.
fn first_kv(answers: &[TxnOpResponse]) -> Option<(String, i64, Vec<u8>)> {
    answers.iter().find_map(|answer| match answer {
        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            (key, kv.create_revision(), kv.value().to_vec())
        }),
        _ => None,
    })
}
