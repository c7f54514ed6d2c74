//! Tools the cases use, public so that a backend's own tests can use them too.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_core::{DistributedLock, Fencing, FencingToken, Guard, LockProvider, LossReason};

use crate::harness::{Client, Entries, FaultError, Harness, LockKind};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};

/// How strongly the harness's provider fences (its declared capability).
///
/// # Errors
///
/// A [`CaseFailure`] when no client connects.
pub(crate) async fn fencing_of(harness: &dyn Harness) -> Result<Fencing, CaseFailure> {
    Ok(harness.client().await?.provider.capabilities().fencing)
}

/// A lock name no other case or run uses: `{case}-{process}-{time}-{counter}`.
///
/// ```
/// let a = lock_conformance::unique_name("a1");
/// let b = lock_conformance::unique_name("a1");
/// assert!(a.starts_with("a1-") && a != b);
/// ```
pub fn unique_name(case: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{case}-{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Counts how many holders are inside the critical section at once.
#[derive(Debug, Default, Clone)]
pub struct Occupancy {
    inner: Arc<(AtomicUsize, AtomicUsize)>,
}

/// Inside the critical section until dropped.
#[derive(Debug)]
pub struct Occupant {
    inner: Arc<(AtomicUsize, AtomicUsize)>,
}

impl Occupancy {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Enters the critical section.
    pub fn enter(&self) -> Occupant {
        let now = self.inner.0.fetch_add(1, Ordering::SeqCst) + 1;
        self.inner.1.fetch_max(now, Ordering::SeqCst);
        Occupant {
            inner: Arc::clone(&self.inner),
        }
    }

    /// The most holders ever seen inside at once.
    pub fn peak(&self) -> usize {
        self.inner.1.load(Ordering::SeqCst)
    }

    /// Holders inside now.
    pub fn current(&self) -> usize {
        self.inner.0.load(Ordering::SeqCst)
    }
}

impl Drop for Occupant {
    fn drop(&mut self) {
        self.inner.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A store that rejects writes with a fencing token lower than the highest it has seen,
/// as a resource protected by a lock should.
#[derive(Debug, Default, Clone)]
pub struct FencedStore {
    inner: Arc<Mutex<StoreLog>>,
}

#[derive(Debug, Default)]
struct StoreLog {
    highest: Option<FencingToken>,
    writes: Vec<(FencingToken, String)>,
}

/// A write carrying a token older than one already seen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {offered}; the store has seen {highest}")]
pub struct StaleToken {
    /// The rejected token.
    pub offered: FencingToken,
    /// The highest token the store has accepted.
    pub highest: FencingToken,
}

impl FencedStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts `value` if `token` is at least the highest seen.
    ///
    /// # Errors
    ///
    /// [`StaleToken`] when a newer holder has already written.
    pub fn write(&self, token: FencingToken, value: impl Into<String>) -> Result<(), StaleToken> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(highest) = inner.highest
            && token < highest
        {
            return Err(StaleToken {
                offered: token,
                highest,
            });
        }
        inner.highest = Some(token);
        inner.writes.push((token, value.into()));
        Ok(())
    }

    /// The accepted writes, in order.
    pub fn writes(&self) -> Vec<(FencingToken, String)> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .writes
            .clone()
    }
}

/// Runs `future` for at most `bound`.
///
/// # Errors
///
/// A [`CaseFailure`] naming `what` and the bound when it takes longer.
pub async fn within<F: Future>(
    bound: Duration,
    what: &str,
    future: F,
) -> Result<F::Output, CaseFailure> {
    tokio::time::timeout(bound, future)
        .await
        .map_err(|_| CaseFailure::new(format!("{what} did not finish within {bound:?}")))
}

/// Waits at most `bound` for `guard`'s lost signal. Where the guard has a validity, the
/// signal must also fire no later than its last [`valid_until`](Guard::valid_until) (as
/// sampled while the guard was not lost) plus `slack`: a lease whose renewal holds the
/// watchdog past the validity fails here.
///
/// # Errors
///
/// A [`CaseFailure`] naming `what` when the signal is late.
pub(crate) async fn lost_by_validity(
    guard: &Guard,
    bound: Duration,
    slack: Duration,
    what: &str,
) -> Result<Option<LossReason>, CaseFailure> {
    let lost = guard.lost();
    let waiting = lost.wait();
    tokio::pin!(waiting);
    let began = tokio::time::Instant::now();
    let step = (slack / 20).max(Duration::from_millis(5));
    let mut valid_until = guard.valid_until();
    loop {
        tokio::select! {
            reason = &mut waiting => {
                if let Some(valid_until) = valid_until {
                    let late = std::time::Instant::now().saturating_duration_since(valid_until);
                    if late > slack {
                        return Err(CaseFailure::new(format!(
                            "{what}: the lost signal fired {late:?} after the guard's \
                             valid_until (allowed: {slack:?}); a renewal that blocks keeps the \
                             lease's watchdog from giving the lock up in time"
                        )));
                    }
                }
                return Ok(reason);
            }
            () = tokio::time::sleep(step) => {
                if began.elapsed() > bound {
                    return Err(CaseFailure::new(format!(
                        "{what}: the lost signal did not fire within {bound:?}"
                    )));
                }
                if !lost.is_lost() && let Some(now_valid) = guard.valid_until() {
                    valid_until = Some(now_valid);
                }
            }
        }
    }
}

/// Polls `condition` until it holds or `bound` passes.
///
/// # Errors
///
/// A [`CaseFailure`] naming `what` when it never held.
pub async fn eventually<F, Fut>(
    bound: Duration,
    what: &str,
    condition: F,
) -> Result<(), CaseFailure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    observe_until(bound, what, condition, |held| *held)
        .await
        .map(drop)
}

/// Polls `observe` until `done` accepts what it returns, for at most `bound`, and returns
/// that observation: a wait for the condition a fixed sleep would stand for, as long as it
/// takes and no longer.
///
/// # Errors
///
/// A [`CaseFailure`] naming `what` and the last observation when `bound` runs out.
pub async fn observe_until<T, F, Fut>(
    bound: Duration,
    what: &str,
    mut observe: F,
    done: impl Fn(&T) -> bool,
) -> Result<T, CaseFailure>
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + bound;
    let mut pause = Duration::from_millis(2);
    loop {
        let observed = observe().await;
        if done(&observed) {
            return Ok(observed);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CaseFailure::new(format!(
                "{what}: not so within {bound:?}; last seen: {observed:?}"
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// How long the cases wait for a dead client's lock to be freed: the harness's
/// [`Timing::crash_release_bound`](crate::Timing::crash_release_bound). It must cover what
/// the provider declares
/// ([`Capabilities::crash_release_bound`](lock_core::Capabilities::crash_release_bound)),
/// or a case would give up before the backend's promise runs out: such a harness fails
/// here, naming both bounds.
///
/// ```
/// # lock_conformance::runner::block_on(async {
/// use lock_conformance::{Harness, crash_release_bound, memory::MemoryHarness};
///
/// let h = MemoryHarness::new();
/// let client = h.client().await.unwrap();
/// let bound = crash_release_bound(&h, client.provider.as_ref()).unwrap();
/// assert_eq!(bound, h.timing().crash_release_bound);
/// # });
/// ```
///
/// # Errors
///
/// The harness's bound is shorter than the declared one.
pub fn crash_release_bound(
    harness: &dyn Harness,
    provider: &dyn LockProvider,
) -> Result<Duration, CaseFailure> {
    let waited = harness.timing().crash_release_bound;
    match provider.capabilities().crash_release_bound {
        Some(declared) if declared > waited => Err(CaseFailure::new(format!(
            "the harness's Timing::crash_release_bound ({waited:?}) is shorter than the \
             crash-release bound the provider declares ({declared:?}): the cases would give \
             up before the backend's promise runs out; make the harness's the declared one \
             plus slack"
        ))),
        _ => Ok(waited),
    }
}

/// Ends `client`'s session through its [`SessionExpiry`](crate::SessionExpiry), the hook
/// every harness must offer.
///
/// # Errors
///
/// A [`CaseFailure`] when the hook fails, or answers that it is unsupported.
pub async fn expire_session(client: &Client) -> Result<(), CaseFailure> {
    match client.session.expire_session().await {
        Ok(()) => Ok(()),
        Err(FaultError::Unsupported) => Err(CaseFailure::new(
            "the harness cannot end a client's session: every harness must, through the \
             client's SessionExpiry (the cases make stale holders with it)",
        )),
        Err(other) => Err(other.into()),
    }
}

/// Takes the lock with one try, failing the case if it is busy.
///
/// # Errors
///
/// A [`CaseFailure`] when the lock is busy or the backend errs.
pub async fn take(lock: &dyn DistributedLock, what: &str) -> Result<Guard, CaseFailure> {
    match lock.try_acquire().await {
        Ok(Some(guard)) => Ok(guard),
        Ok(None) => Err(CaseFailure::new(format!(
            "{what}: the lock {} was busy",
            lock.name()
        ))),
        Err(error) => Err(CaseFailure::new(format!("{what}: {error}"))),
    }
}

/// Waits until the server records nothing for `name` (no holder, no waiter), when the
/// harness can look; passes at once otherwise.
///
/// # Errors
///
/// A [`CaseFailure`] naming the residue.
pub async fn no_residue(harness: &dyn Harness, name: &str, what: &str) -> Result<(), CaseFailure> {
    expect_entries(harness, name, Entries::new(0, 0), what).await
}

/// Waits until the server records exactly `expected` for the mutex `name`, when the
/// harness can look.
///
/// # Errors
///
/// A [`CaseFailure`] naming what the server still records.
pub async fn expect_entries(
    harness: &dyn Harness,
    name: &str,
    expected: Entries,
    what: &str,
) -> Result<(), CaseFailure> {
    expect_entries_of(harness, LockKind::Mutex, name, expected, what).await
}

/// Waits until the server records exactly `expected` for the lock of `kind` called `name`,
/// when the harness can look. Where it cannot see waiters (no inspector, or waiters that
/// leave no entry), it gives expected waiters half the operation slack to start waiting.
///
/// # Errors
///
/// A [`CaseFailure`] naming what the server still records.
pub async fn expect_entries_of(
    harness: &dyn Harness,
    kind: LockKind,
    name: &str,
    expected: Entries,
    what: &str,
) -> Result<(), CaseFailure> {
    let inspector = harness.inspector();
    let sees_waiters = inspector.is_some_and(|inspector| inspector.records_waiters(kind));
    if expected.waiters > 0 && !sees_waiters {
        // Nothing to see on the server: give the waiters time to start waiting.
        tokio::time::sleep(harness.timing().operation_slack / 2).await;
    }
    let Some(inspector) = inspector else {
        crate::runner::not_checked("what the server records (the harness has no inspector)");
        return Ok(());
    };
    let expected = if sees_waiters {
        expected
    } else {
        Entries::new(expected.holders, 0)
    };
    let deadline = tokio::time::Instant::now() + harness.timing().operation_slack * 2;
    loop {
        let entries = inspector.entries(name).await;
        if matches!(entries, Ok(ref e) if *e == expected) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CaseFailure::new(format!(
                "{what}: the server records {entries:?} for {name:?}; expected {expected:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls a future at most `polls` times, then completes with `None` at its next wake:
/// dropping it there cancels the inner future at exactly that await point.
///
/// ```
/// # lock_conformance::runner::block_on(async {
/// use lock_conformance::PollBudget;
/// let never = PollBudget::new(std::future::pending::<()>(), 0);
/// assert_eq!(never.await, None);
/// let ready = PollBudget::new(async { 7 }, 1);
/// assert_eq!(ready.await, Some(7));
/// # });
/// ```
pub struct PollBudget<F> {
    inner: Pin<Box<F>>,
    polls: usize,
}

impl<F: Future> PollBudget<F> {
    /// Wraps `future`, allowing it `polls` polls.
    pub fn new(future: F, polls: usize) -> Self {
        PollBudget {
            inner: Box::pin(future),
            polls,
        }
    }
}

impl<F: Future> Future for PollBudget<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.polls == 0 {
            return Poll::Ready(None);
        }
        self.polls -= 1;
        self.inner.as_mut().poll(cx).map(Some)
    }
}

/// How a case takes a lock away from its holder, to make a stale holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakeAway {
    /// The holder's session ends, through the client's
    /// [`SessionExpiry`](crate::SessionExpiry): every harness offers it.
    SessionExpiry,
    /// [`Faults::revoke`](crate::Faults::revoke), as an operator deleting the holder's
    /// entry would, where the harness offers it.
    Revoke,
}

impl fmt::Display for TakeAway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TakeAway::SessionExpiry => "session expiry",
            TakeAway::Revoke => "revoke",
        })
    }
}

/// Runs `case` once for every way of taking a lock away: through the holder's session's
/// end, which every harness must offer (so a harness cannot pass the stale-holder cases
/// with a revoke alone), then through a revoke where the harness offers one. A case skipped
/// through the session's end is skipped; one skipped through a revoke (none offered) is not.
pub(crate) async fn by_every_take_away<F, Fut>(case: F) -> CaseResult
where
    F: Fn(TakeAway) -> Fut,
    Fut: Future<Output = CaseResult>,
{
    for how in [TakeAway::SessionExpiry, TakeAway::Revoke] {
        let outcome = case(how)
            .await
            .map_err(|failure| CaseFailure::new(format!("through a {how}: {failure}")))?;
        if let (TakeAway::SessionExpiry, Outcome::Skipped(_)) = (how, &outcome) {
            return Ok(outcome);
        }
    }
    Ok(Outcome::Passed)
}

/// A case that could not take the lock away `how` says: the harness offers no revoke.
pub(crate) fn not_offered(how: TakeAway) -> Outcome {
    Outcome::Skipped(Skip::missing_hook(&how.to_string(), None))
}

/// Takes the lock `name` away from `holder` as `how` says; `false` when the harness offers
/// no revoke.
pub(crate) async fn take_away(
    h: &dyn Harness,
    holder: &Client,
    name: &str,
    how: TakeAway,
) -> Result<bool, CaseFailure> {
    match how {
        TakeAway::SessionExpiry => {
            expire_session(holder).await?;
            Ok(true)
        }
        TakeAway::Revoke => {
            let Some(faults) = h.faults() else {
                return Ok(false);
            };
            match faults.revoke(name).await {
                Ok(true) => Ok(true),
                Ok(false) => Err(CaseFailure::new(
                    "the harness's revoke found no holder while one held the lock",
                )),
                Err(FaultError::Unsupported) => Ok(false),
                Err(other) => Err(other.into()),
            }
        }
    }
}

/// Takes the lock away from `holder` (see [`take_away`]) and returns `next`'s grant once
/// the lock is free again; `None` when the harness offers no revoke.
pub(crate) async fn take_over(
    h: &dyn Harness,
    holder: &Client,
    next: &Client,
    name: &str,
    how: TakeAway,
) -> Result<Option<Guard>, CaseFailure> {
    if !take_away(h, holder, name, how).await? {
        return Ok(None);
    }
    let bound = crash_release_bound(h, next.provider.as_ref())? + h.timing().handoff_bound;
    within(
        bound,
        &format!("another client's acquire after a {how}"),
        next.provider.lock(name)?.acquire(None),
    )
    .await?
    .map(Some)
    .map_err(CaseFailure::from)
}
