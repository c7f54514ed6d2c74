//! Several locks taken together, all or none: [`MultiLock`] and its [`MultiGuard`].
//!
//! The members are taken one at a time in one canonical order, by name, whatever order the
//! caller gave them in: two clients asking for `{a, b}` and `{b, a}` both take `a` first, so
//! neither can hold what the other waits for. A name may appear once per set. One timeout
//! covers the whole set. When a member cannot be taken (a timeout, an error), the members
//! already taken are released before the error is returned; when the acquiring future is
//! dropped, they are dropped with it, and each guard's drop releases its lock in the
//! background (see [`Guard`]'s release contract): nothing stays held, and every member's
//! own cancel safety leaves no waiter entry.
//!
//! ```
//! # #[cfg(feature = "memory")] {
//! use std::time::Duration;
//! use lock_core::memory::MemoryServer;
//! use lock_core::multi::MultiLock;
//! use lock_core::LockProvider;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let provider = MemoryServer::new().provider();
//! // Moving money: both accounts, or neither.
//! let accounts = MultiLock::locks(&provider, ["account/17", "account/4"])?;
//! let mut both = accounts.acquire(Some(Duration::from_secs(5))).await?;
//! // Their tokens, in the order given: for the writes to each account.
//! let tokens = both.fencing_tokens();
//! assert_eq!(Some(tokens[0]), both.guard(0).map(|g| g.fencing_token()));
//! both.release().await.map_err(|e| e.into_error())?;
//! # Ok(()) }
//! # main().unwrap(); }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::{
    Deadline, DistributedLock, DistributedRwLock, DistributedSemaphore, FencingToken, Guard,
    LockError, LockName, LockProvider, LostSignal, lost_signal,
};

/// The backend name in the errors about a set as a whole.
const MULTI: &str = "multi";

/// One member of a [`MultiLock`]: a mutex, a side of a read-write lock, or a permit.
#[derive(Clone)]
#[non_exhaustive]
pub enum Member {
    /// The mutex.
    Lock(Arc<dyn DistributedLock>),
    /// The read side of the read-write lock.
    Read(Arc<dyn DistributedRwLock>),
    /// The write side of the read-write lock.
    Write(Arc<dyn DistributedRwLock>),
    /// One permit of the semaphore.
    Permit(Arc<dyn DistributedSemaphore>),
}

impl Member {
    /// The name of the lock it takes.
    pub fn name(&self) -> &LockName {
        match self {
            Member::Lock(lock) => lock.name(),
            Member::Read(lock) | Member::Write(lock) => lock.name(),
            Member::Permit(semaphore) => semaphore.name(),
        }
    }

    async fn try_take(&self) -> Result<Option<Guard>, LockError> {
        match self {
            Member::Lock(lock) => lock.try_acquire().await,
            Member::Read(lock) => lock.try_read().await,
            Member::Write(lock) => lock.try_write().await,
            Member::Permit(semaphore) => semaphore.try_acquire().await,
        }
    }

    async fn take(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        match self {
            Member::Lock(lock) => lock.acquire(timeout).await,
            Member::Read(lock) => lock.read(timeout).await,
            Member::Write(lock) => lock.write(timeout).await,
            Member::Permit(semaphore) => semaphore.acquire(timeout).await,
        }
    }
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = match self {
            Member::Lock(_) => "Lock",
            Member::Read(_) => "Read",
            Member::Write(_) => "Write",
            Member::Permit(_) => "Permit",
        };
        f.debug_tuple(side).field(self.name()).finish()
    }
}

/// Several locks taken all or none, in a canonical order (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct MultiLock {
    /// The members by name: the order they are taken in.
    members: Vec<Member>,
    /// For each member in that order, its place in the order the caller gave.
    places: Vec<usize>,
}

impl MultiLock {
    /// The set of `members`; the guard lists them in this order.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidArgument`] for an empty set, or a name given twice (taking it
    /// twice would wait for itself).
    pub fn new(members: impl IntoIterator<Item = Member>) -> Result<Self, LockError> {
        let mut ordered: Vec<(usize, Member)> = members.into_iter().enumerate().collect();
        if ordered.is_empty() {
            return Err(invalid("a set of locks needs at least one"));
        }
        ordered.sort_by(|(_, a), (_, b)| a.name().cmp(b.name()));
        if let Some(pair) = ordered
            .windows(2)
            .find(|pair| pair[0].1.name() == pair[1].1.name())
        {
            let name = pair[0].1.name().as_str();
            return Err(invalid(&format!(
                "the lock {name:?} is named twice in one set"
            )));
        }
        let (places, members) = ordered.into_iter().unzip();
        Ok(MultiLock { members, places })
    }

    /// The mutexes `names` of `provider`, as a set.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), and [`LockProvider::lock`]'s for each name.
    pub fn locks<'a>(
        provider: &dyn LockProvider,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, LockError> {
        let members = names
            .into_iter()
            .map(|name| provider.lock(name).map(Member::Lock))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(members)
    }

    /// The members, in the order they are taken.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// One attempt at every member, in order: `Ok(None)` as soon as one is busy, with the
    /// members already taken released.
    ///
    /// # Errors
    ///
    /// The first member's error, once the members already taken are released.
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>, LockError> {
        let mut taken = Vec::with_capacity(self.members.len());
        for member in &self.members {
            match member.try_take().await {
                Ok(Some(guard)) => taken.push(guard),
                Ok(None) => {
                    give_back(taken).await;
                    return Ok(None);
                }
                Err(error) => {
                    give_back(taken).await;
                    return Err(error);
                }
            }
        }
        Ok(Some(self.guard(taken)))
    }

    /// Takes every member, waiting at most `timeout` for the whole set (`None`: as long as
    /// it takes).
    ///
    /// # Errors
    ///
    /// [`LockError::Timeout`] naming the set and the whole timeout when it passes, or the
    /// first member's error; either way once the members already taken are released.
    ///
    /// # Cancel safety
    ///
    /// Dropped while waiting, it drops the guards of the members already taken, which
    /// release their locks in the background; the member being waited for is cancelled as
    /// its own `acquire` is. Nothing stays held and no waiter entry stays behind.
    pub async fn acquire(&self, timeout: Option<Duration>) -> Result<MultiGuard, LockError> {
        let deadline = Deadline::after(timeout);
        let mut taken = Vec::with_capacity(self.members.len());
        for member in &self.members {
            match member.take(deadline.remaining()).await {
                Ok(guard) => taken.push(guard),
                Err(error) => {
                    give_back(taken).await;
                    return Err(match (error, timeout) {
                        (LockError::Timeout { .. }, Some(waited)) => LockError::Timeout {
                            backend: MULTI,
                            name: self.describe(),
                            waited,
                        },
                        (error, _) => error,
                    });
                }
            }
        }
        Ok(self.guard(taken))
    }

    /// The guard of `taken` (every member, in the order taken).
    fn guard(&self, taken: Vec<Guard>) -> MultiGuard {
        let mut placed: Vec<(usize, Guard)> = self.places.iter().copied().zip(taken).collect();
        placed.sort_by_key(|(place, _)| *place);
        let guards: Vec<Guard> = placed.into_iter().map(|(_, guard)| guard).collect();
        let lost = any_lost(&guards);
        MultiGuard { guards, lost }
    }

    /// The names, joined: `a+b+c`.
    fn describe(&self) -> String {
        let names: Vec<&str> = self.members.iter().map(|m| m.name().as_str()).collect();
        names.join("+")
    }
}

/// A held set of locks: every member's guard, in the order the set was given.
///
/// Dropping it drops every member's guard: each releases in the background.
#[must_use = "the locks are released as soon as the guard is dropped"]
pub struct MultiGuard {
    guards: Vec<Guard>,
    /// Fires when any member's does.
    lost: LostSignal,
}

impl MultiGuard {
    /// Member `index`'s guard, in the order the set was given.
    pub fn guard(&self, index: usize) -> Option<&Guard> {
        self.guards.get(index)
    }

    /// Every member's guard, in the order the set was given.
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }

    /// Every member's fencing token, in the order the set was given.
    pub fn fencing_tokens(&self) -> Vec<FencingToken> {
        self.guards.iter().map(Guard::fencing_token).collect()
    }

    /// Fires, with that member's reason, when any member's lock is lost; ends when the set
    /// is released or dropped. Which member it was: [`Guard::is_lost`] on each.
    pub fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Whether any member's lock is lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(Guard::is_lost)
    }

    /// Releases every member, all at once (a release never waits for another lock, so the
    /// order does not matter), each whatever became of the others.
    ///
    /// # Errors
    ///
    /// [`ReleaseErrors`] listing every member whose release failed (a lost lock, a
    /// connection error: see [`Guard::release`]); the others are released.
    pub async fn release(&mut self) -> Result<(), ReleaseErrors> {
        let releases = self.guards.iter_mut().map(|guard| async move {
            let released = guard.release().await;
            released.map_err(|error| (guard.name().clone(), error))
        });
        let failures: Vec<_> = futures_util::future::join_all(releases)
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect();
        self.lost.end();
        match failures.is_empty() {
            true => Ok(()),
            false => Err(ReleaseErrors { failures }),
        }
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        // The members' guards release themselves as they drop, after this.
        self.lost.end();
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("guards", &self.guards)
            .finish_non_exhaustive()
    }
}

/// The members of a [`MultiGuard`] whose release failed, and why.
#[derive(Debug, thiserror::Error)]
#[error("{} of the set's locks failed to release: {}", .failures.len(), list(.failures))]
#[non_exhaustive]
pub struct ReleaseErrors {
    /// Each failed member's name and error.
    pub failures: Vec<(LockName, LockError)>,
}

impl ReleaseErrors {
    /// One [`LockError`] for a caller that wants one: a lost member's (the one that says
    /// the set was not held to the end), else the first failure's.
    pub fn into_error(self) -> LockError {
        let lost = |(_, error): &(LockName, LockError)| matches!(error, LockError::Lost { .. });
        let at = self.failures.iter().position(lost).unwrap_or(0);
        match self.failures.into_iter().nth(at) {
            Some((_, error)) => error,
            None => invalid("no release failed"),
        }
    }
}

fn list(failures: &[(LockName, LockError)]) -> String {
    let each: Vec<String> = failures
        .iter()
        .map(|(name, error)| format!("{:?}: {error}", name.as_str()))
        .collect();
    each.join("; ")
}

fn invalid(message: &str) -> LockError {
    LockError::InvalidArgument {
        backend: MULTI,
        message: message.to_owned(),
    }
}

/// Releases what an unfinished acquisition took, reporting nothing but logs: the caller
/// returns the error that stopped it.
async fn give_back(taken: Vec<Guard>) {
    for mut guard in taken {
        if let Err(error) = guard.release().await {
            tracing::debug!(name = guard.name().as_str(), %error, "multi: a member's release failed");
        }
    }
}

/// A signal that fires with the first member's loss, watched by one task per member; the
/// tasks end as the members' signals do.
fn any_lost(guards: &[Guard]) -> LostSignal {
    let (notifier, signal) = lost_signal();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return signal;
    };
    for guard in guards {
        let (member, notifier) = (guard.lost(), notifier.clone());
        runtime.spawn(async move {
            if let Some(reason) = member.wait().await {
                notifier.fire(reason);
            }
        });
    }
    signal
}

#[cfg(all(test, feature = "memory"))]
#[allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test code: a failed set-up or check must fail the test"
)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::LossReason;
    use crate::memory::{MemoryLockProvider, MemoryServer};

    const NAMES: [&str; 4] = ["w", "x", "y", "z"];

    fn set(provider: &MemoryLockProvider, names: &[&str]) -> MultiLock {
        MultiLock::locks(provider, names.iter().copied()).unwrap()
    }

    /// Whether every name of the server is free, holders and waiters alike.
    fn all_free(provider: &MemoryLockProvider) -> bool {
        NAMES
            .iter()
            .all(|name| provider.entries(name).unwrap() == (0, 0))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn random_sets_in_random_orders_never_deadlock_nor_overlap() {
        let server = MemoryServer::new();
        let holders: Arc<Mutex<HashMap<&str, usize>>> = Arc::default();
        let mut clients = Vec::new();
        for client in 0..5 {
            let (provider, holders) = (server.provider(), Arc::clone(&holders));
            clients.push(tokio::spawn(async move {
                for round in 0..200 {
                    let mut names = NAMES.to_vec();
                    fastrand::shuffle(&mut names);
                    names.truncate(2 + round % 2);
                    let lock = set(&provider, &names);
                    let mut held = lock.acquire(Some(Duration::from_secs(10))).await.unwrap();
                    for name in &names {
                        let mut holders = holders.lock().unwrap();
                        let count = holders.entry(name).or_default();
                        assert_eq!(
                            *count, 0,
                            "client {client} round {round}: {name} held twice"
                        );
                        *count += 1;
                    }
                    tokio::task::yield_now().await;
                    for name in &names {
                        *holders.lock().unwrap().get_mut(name).unwrap() -= 1;
                    }
                    held.release().await.unwrap();
                }
            }));
        }
        for client in clients {
            // Every round completed within its timeout: no deadlock.
            client.await.unwrap();
        }
        assert!(all_free(&server.provider()));
    }

    #[tokio::test]
    async fn the_guard_lists_the_members_as_given_and_takes_them_by_name() {
        let provider = MemoryServer::new().provider();
        let lock = set(&provider, &["z", "x", "y"]);
        let names: Vec<&str> = lock.members().iter().map(|m| m.name().as_str()).collect();
        assert_eq!(names, ["x", "y", "z"]);
        let mut held = lock.try_acquire().await.unwrap().unwrap();
        let given: Vec<&str> = held.guards().iter().map(|g| g.name().as_str()).collect();
        assert_eq!(given, ["z", "x", "y"]);
        let tokens = held.fencing_tokens();
        assert_eq!(Some(tokens[0]), held.guard(0).map(Guard::fencing_token));
        held.release().await.unwrap();
        let again = lock.try_acquire().await.unwrap().unwrap();
        assert!(
            again
                .fencing_tokens()
                .iter()
                .zip(&tokens)
                .all(|(new, old)| new > old)
        );
    }

    #[tokio::test]
    async fn an_empty_set_and_a_name_given_twice_are_refused() {
        let provider = MemoryServer::new().provider();
        let refused = |result: Result<MultiLock, LockError>| match result {
            Err(LockError::InvalidArgument { message, .. }) => message,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(refused(MultiLock::new([])).contains("at least one"));
        let twice = MultiLock::locks(&provider, ["x", "y", "x"]);
        assert!(refused(twice).contains("\"x\" is named twice"));
        let rw = provider.rw_lock("x").unwrap();
        let sides = MultiLock::new([Member::Read(Arc::clone(&rw)), Member::Write(rw)]);
        assert!(refused(sides).contains("named twice"));
    }

    #[tokio::test]
    async fn a_busy_member_leaves_none_held() {
        let provider = MemoryServer::new().provider();
        let other = provider.server().provider();
        let mut busy = other.lock("y").unwrap().acquire(None).await.unwrap();
        let lock = set(&provider, &["x", "y", "z"]);
        assert!(lock.try_acquire().await.unwrap().is_none());
        assert_eq!(provider.entries("x").unwrap(), (0, 0));
        let timed_out = lock.acquire(Some(Duration::from_millis(200))).await;
        match timed_out {
            Err(LockError::Timeout { name, waited, .. }) => {
                assert_eq!(
                    (name.as_str(), waited),
                    ("x+y+z", Duration::from_millis(200))
                );
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert_eq!(provider.entries("x").unwrap(), (0, 0));
        assert_eq!(provider.entries("y").unwrap(), (1, 0));
        busy.release().await.unwrap();
        assert!(all_free(&provider));
    }

    #[tokio::test]
    async fn a_dropped_acquisition_leaves_nothing() {
        let provider = MemoryServer::new().provider();
        let other = provider.server().provider();
        let mut busy = other.lock("y").unwrap().acquire(None).await.unwrap();
        let lock = set(&provider, &["x", "y"]);
        // At each await point: before anything is taken, and waiting for y with x held.
        for wait in [Duration::ZERO, Duration::from_millis(50)] {
            let waiting = tokio::time::timeout(wait, lock.acquire(None)).await;
            assert!(waiting.is_err(), "it must still wait for y");
            let freed = tokio::time::timeout(Duration::from_secs(5), async {
                while provider.entries("x").unwrap() != (0, 0)
                    || provider.entries("y").unwrap() != (1, 0)
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            freed.await.expect("x freed and no waiter for y left");
        }
        busy.release().await.unwrap();
        assert!(all_free(&provider));
    }

    #[tokio::test]
    async fn a_member_lost_fires_the_sets_signal_and_its_release_says_which() {
        let provider = MemoryServer::new().provider();
        let mut held = set(&provider, &["x", "y"]).acquire(None).await.unwrap();
        let lost = held.lost();
        assert!(!held.is_lost());
        provider.revoke("y").unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(5), lost.wait()).await;
        assert_eq!(reason.unwrap(), Some(LossReason::Revoked));
        let lost: Vec<bool> = held.guards().iter().map(Guard::is_lost).collect();
        assert!(held.is_lost() && lost == [false, true]);
        let failed = held.release().await.unwrap_err();
        assert_eq!(failed.failures.len(), 1);
        assert_eq!(failed.failures[0].0.as_str(), "y");
        assert!(matches!(failed.failures[0].1, LockError::Lost { .. }));
        assert!(
            failed
                .to_string()
                .contains("1 of the set's locks failed to release")
        );
        assert!(matches!(failed.into_error(), LockError::Lost { .. }));
        // x was released all the same.
        assert!(all_free(&provider));
    }

    #[tokio::test]
    async fn sides_of_read_write_locks_and_permits_are_members_too() {
        let provider = MemoryServer::new().provider();
        let (rw, semaphore) = (
            provider.rw_lock("x").unwrap(),
            provider.semaphore("y", 2).unwrap(),
        );
        let reader = MultiLock::new([
            Member::Read(Arc::clone(&rw)),
            Member::Permit(Arc::clone(&semaphore)),
        ])
        .unwrap();
        let mut first = reader.acquire(None).await.unwrap();
        let mut second = reader
            .try_acquire()
            .await
            .unwrap()
            .expect("readers share, two permits");
        let writer =
            MultiLock::new([Member::Write(rw), Member::Lock(provider.lock("z").unwrap())]).unwrap();
        assert!(writer.try_acquire().await.unwrap().is_none());
        assert_eq!(provider.entries("z").unwrap(), (0, 0));
        first.release().await.unwrap();
        second.release().await.unwrap();
        let _free = writer.try_acquire().await.unwrap().expect("free now");
    }
}
