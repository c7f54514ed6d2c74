//! Leader election in the layout of etcd's own `concurrency.Election`: the mutex queue with
//! the candidate's value in its key, and observers that watch the leader's key.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{GetOptions, SortOrder, SortTarget, WatchFilterType, WatchOptions};
use lock_core::election::LeaderSource;
use lock_core::kit::ElectionAttempt;
use lock_core::{Deadline, FencingToken, Guard, LeaderInfo, LockError, LockName};

use crate::config::EtcdStrategy;
use crate::error::BACKEND;
use crate::queue::{Blockers, Place};
use crate::session::Shared;
use crate::watches::Watch;

/// A leader election from an [`EtcdLockProvider`](crate::EtcdLockProvider).
///
/// Candidates are keys `{prefix}/{name}.election/{lease in hex}` on their session's lease,
/// holding their value: the layout of etcd's `concurrency.Election`, so that
/// `etcdctl elect {prefix}/{name}.election` and distlock campaign in one election and see
/// each other's leaders. The key with the smallest create revision leads, and that revision
/// is its term; each other candidate watches only the deletion of the key just before its
/// own, whatever the provider's strategy. Observers read the first key and watch it (or,
/// with no candidate, the directory).
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_etcd::EtcdLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let etcd = EtcdLockProvider::connect_url("etcd://127.0.0.1:2379").await?;
/// let election = etcd.election("billing/worker")?;
/// let mut leadership = election.campaign(b"host-a:8080", None).await?;
/// // ... lead, passing leadership.term() with every write ...
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
pub struct EtcdElection {
    /// `{prefix}/{name escaped}.election/`, always herd-free.
    place: Place,
}

impl fmt::Debug for EtcdElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdElection")
            .field("name", &self.place.name)
            .field("dir", &self.place.dir)
            .finish()
    }
}

impl EtcdElection {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        let mut place = Place::new(shared, name, ".election");
        place.strategy = EtcdStrategy::Predecessor;
        EtcdElection { place }
    }

    /// The leader's key and what it holds, and the revision of the read.
    async fn head(&self) -> Result<(Option<(String, LeaderInfo)>, i64), LockError> {
        let place = &self.place;
        let session = place.shared.session(&place.name).await?;
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let answer = session
            .read(place.name.as_str(), &Deadline::after(None), || {
                let mut kv = session.client.kv_client();
                let first = first.clone();
                async move { kv.get(&*place.dir, Some(first)).await }
            })
            .await?;
        let revision = answer.header().map_or(0, |header| header.revision());
        let leader = answer.kvs().first().map(|kv| {
            let term = FencingToken(u64::try_from(kv.create_revision()).unwrap_or_default());
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                LeaderInfo::new(kv.value().to_vec(), term),
            )
        });
        Ok((leader, revision))
    }
}

#[async_trait]
impl ElectionAttempt for EtcdElection {
    fn name(&self) -> &LockName {
        &self.place.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Queues a candidate key holding `value` and waits to be first, herd-free.
    async fn attempt(&self, value: &[u8], deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let place = self.place.with_value(value);
        let session = place.shared.session(&place.name).await?;
        let slot = place.slot(&session);
        // Armed before the first request: a dropped campaign leaves no key behind.
        let pending = place.entry(&session, &slot, "");
        place
            .attempt(&session, pending, Blockers::any(&place.dir), &deadline)
            .await
    }
}

#[async_trait]
impl LeaderSource for EtcdElection {
    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        Ok(self.head().await?.0.map(|(_, leader)| leader))
    }

    /// Waits until the leader is no longer `seen`: watches the leader's key (any change: a
    /// deletion, or a new value proclaimed by `etcdctl`) or, with no leader, the directory
    /// for a new candidate; wakes also when the provider closes or the session ends. A
    /// watch sees only after the revision it began at (see the `watches` module), so one that
    /// began after the read that found `seen` is followed by another read.
    async fn changed(&self, seen: &Option<LeaderInfo>) -> Result<(), LockError> {
        let place = &self.place;
        let session = place.shared.session(&place.name).await?;
        let name = place.name.as_str();
        // The watch, and the key or directory it watches: kept while that stays the same.
        let mut watching: Option<(String, Watch)> = None;
        loop {
            let (head, revision) = self.head().await?;
            if head.as_ref().map(|(_, leader)| leader) != seen.as_ref() {
                return Ok(());
            }
            let (key, options) = match &head {
                Some((key, _)) => (key.as_str(), WatchOptions::new()),
                None => (
                    &*place.dir,
                    WatchOptions::new()
                        .with_prefix()
                        .with_filters([WatchFilterType::NoDelete]),
                ),
            };
            if watching.as_ref().is_none_or(|(on, _)| on != key) {
                // Cancelled before the next is made.
                drop(watching.take());
                let watch = session
                    .again(name, &Deadline::after(None), || {
                        session.watches.add(name, key, options.clone())
                    })
                    .await?;
                let from = watch.from;
                watching = Some((key.to_owned(), watch));
                if from > revision {
                    continue;
                }
            }
            let Some((_, watch)) = watching.as_mut() else {
                continue;
            };
            loop {
                tokio::select! {
                    answer = watch.next() => match answer {
                        Some(answer) if answer.events().is_empty() && !answer.canceled() => {}
                        // An event, a cancelled or broken watch: look again.
                        _ => return Ok(()),
                    },
                    () = session.over.wait() => return Ok(()),
                    () = place.shared.closed.wait() => return Ok(()),
                }
            }
        }
    }
}
