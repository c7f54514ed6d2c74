//! Tests of the tests: deliberately broken backends, each of which must fail at least one
//! named case of the suite.
#![allow(
    clippy::panic,
    clippy::print_stderr,
    reason = "test helpers outside #[test] functions report and fail like tests"
)]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_conformance::memory::{MemoryHarness, MemorySession};
use lock_conformance::{
    Client, FaultResult, Faults, Harness, Inspector, Outcome, SessionExpiry, Timing, Unproven,
    async_trait, cases,
};
use lock_core::election::{LeaderSource, follow};
use lock_core::memory::MemoryLockProvider;
use lock_core::{
    Capabilities, DistributedLock, Election, FencingToken, Guard, GuardBackend, LeaderInfo,
    LeaderWatch, Leadership, LockError, LockName, LockProvider, LostNotifier, MetricsSnapshot,
    WaitKind, lost_signal,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutation {
    /// Grants a busy lock anyway.
    NotExclusive,
    /// A stale guard's release frees whoever holds the lock now.
    UnconditionalRelease,
    /// Tokens decrease.
    NonMonotonicToken,
    /// A dropped acquire leaves its waiter queued.
    NotCancelSafe,
    /// The lost signal never fires.
    LostNeverFires,
    /// Declares no lost detection, and its signal never fires: honest, not a mutant.
    NoLostDetection,
    /// Declares no lost detection, yet its signal fires when someone else revokes the lock.
    LostUndeclared,
    /// Declares a crash-release bound longer than the harness waits.
    CrashBoundOverHarness,
    /// Waiters poll, later arrivals faster: not FIFO, while declaring FIFO.
    FifoViolated,
    /// A campaign on a led election wins anyway.
    TwoLeaders,
    /// Terms decrease from one leader to the next.
    DecreasingTerms,
    /// Resigning reports success and keeps leading.
    ResignDoesNothing,
    /// An observer never sees a change after its first read.
    StuckObserver,
    /// Its session expiry reports success and leaves the session, and its locks, alive
    /// (its revoke works).
    ExpiryKeepsLocks,
    /// Polls, each try in a task of its own that keeps what it wins when the caller is gone.
    PollNotCancelSafe,
    /// No mutation: the wrapper as it is.
    None,
}

struct MutantHarness {
    inner: MemoryHarness,
    mutation: Mutation,
    /// Counts acquire calls across all clients (FifoViolated).
    arrivals: Arc<AtomicU64>,
    /// Only what every harness must offer: clients and their session expiry; no server
    /// faults, no inspector.
    required_only: bool,
}

impl MutantHarness {
    fn new(mutation: Mutation) -> Self {
        MutantHarness {
            inner: MemoryHarness::new(),
            mutation,
            arrivals: Arc::new(AtomicU64::new(0)),
            required_only: false,
        }
    }

    fn required_only(mut self) -> Self {
        self.required_only = true;
        self
    }
}

#[derive(Debug)]
struct MutantProvider {
    inner: MemoryLockProvider,
    mutation: Mutation,
    arrivals: Arc<AtomicU64>,
    /// Retries of a polling mutant, counted as wake-ups (`WaitKind::Poll`).
    retries: Arc<AtomicU64>,
}

#[derive(Debug)]
struct MutantLock {
    inner: Arc<dyn DistributedLock>,
    provider: MemoryLockProvider,
    mutation: Mutation,
    arrivals: Arc<AtomicU64>,
    retries: Arc<AtomicU64>,
}

struct MutantGuard {
    inner: Guard,
    provider: MemoryLockProvider,
    mutation: Mutation,
    /// Kept, never fired (LostNeverFires).
    _silent: Option<LostNotifier>,
}

impl fmt::Debug for MutantGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutantGuard")
            .field("inner", &self.inner)
            .finish()
    }
}

#[async_trait]
impl GuardBackend for MutantGuard {
    fn backend(&self) -> &'static str {
        "mutant"
    }

    async fn release(&mut self) -> Result<(), LockError> {
        match self.inner.release().await {
            Err(LockError::Lost { .. }) if self.mutation == Mutation::UnconditionalRelease => {
                // Frees whoever holds the lock now.
                let _ = self.provider.revoke(self.inner.name().as_str());
                Ok(())
            }
            other => other,
        }
    }

    fn release_on_drop(self: Box<Self>) {
        drop(self.inner);
    }
}

impl MutantLock {
    fn wrap(&self, inner: Guard) -> Guard {
        let name = inner.name().clone();
        let token = match self.mutation {
            Mutation::NonMonotonicToken => FencingToken(1_000_000 - inner.fencing_token().get()),
            _ => inner.fencing_token(),
        };
        let silenced = matches!(
            self.mutation,
            Mutation::LostNeverFires | Mutation::NoLostDetection
        );
        let (silent, lost) = if silenced {
            let (notifier, signal) = lost_signal();
            (Some(notifier), signal)
        } else {
            (None, inner.lost())
        };
        Guard::new(
            name,
            token,
            lost,
            Box::new(MutantGuard {
                inner,
                provider: self.provider.clone(),
                mutation: self.mutation,
                _silent: silent,
            }),
        )
    }

    /// A guard for a lock that this client does not hold.
    fn counterfeit(&self) -> Guard {
        counterfeit(self.inner.name().clone())
    }
}

/// A guard for a lock or an election that nobody granted.
fn counterfeit(name: LockName) -> Guard {
    #[derive(Debug)]
    struct Nothing;
    #[async_trait]
    impl GuardBackend for Nothing {
        fn backend(&self) -> &'static str {
            "mutant"
        }
        async fn release(&mut self) -> Result<(), LockError> {
            Ok(())
        }
        fn release_on_drop(self: Box<Self>) {}
    }
    let (_notifier, lost) = lost_signal();
    Guard::new(name, FencingToken(u64::MAX), lost, Box::new(Nothing))
}

#[derive(Debug)]
struct MutantElection {
    inner: Arc<dyn Election>,
    mutation: Mutation,
}

/// A won election's guard, over the real leadership.
#[derive(Debug)]
struct MutantOffice {
    /// Always `Some` until dropped.
    inner: Option<Leadership>,
    mutation: Mutation,
}

impl Drop for MutantOffice {
    fn drop(&mut self) {
        if self.mutation == Mutation::ResignDoesNothing {
            // Leads on for as long as the session lives.
            std::mem::forget(self.inner.take());
        }
    }
}

#[async_trait]
impl GuardBackend for MutantOffice {
    fn backend(&self) -> &'static str {
        "mutant"
    }

    async fn release(&mut self) -> Result<(), LockError> {
        match &mut self.inner {
            Some(_) if self.mutation == Mutation::ResignDoesNothing => Ok(()),
            Some(inner) => inner.resign().await,
            None => Ok(()),
        }
    }

    fn release_on_drop(self: Box<Self>) {
        drop(self);
    }
}

/// A leader source whose changes never come.
struct Stuck(Arc<dyn Election>);

#[async_trait]
impl LeaderSource for Stuck {
    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        self.0.leader().await
    }

    async fn changed(&self, _seen: &Option<LeaderInfo>) -> Result<(), LockError> {
        std::future::pending().await
    }
}

#[async_trait]
impl Election for MutantElection {
    fn name(&self) -> &LockName {
        self.inner.name()
    }

    async fn campaign(
        &self,
        value: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Leadership, LockError> {
        let won = if self.mutation == Mutation::TwoLeaders {
            match self.inner.campaign(value, Some(Duration::ZERO)).await {
                Err(LockError::Timeout { .. }) => {
                    return Ok(Leadership::new(counterfeit(self.name().clone()), value));
                }
                other => other?,
            }
        } else {
            self.inner.campaign(value, timeout).await?
        };
        let term = match self.mutation {
            Mutation::DecreasingTerms => FencingToken(1_000_000 - won.term().get()),
            _ => won.term(),
        };
        let lost = won.lost();
        let office = MutantOffice {
            inner: Some(won),
            mutation: self.mutation,
        };
        let guard = Guard::new(self.name().clone(), term, lost, Box::new(office));
        Ok(Leadership::new(guard, value))
    }

    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        self.inner.leader().await
    }

    async fn observe(self: Arc<Self>) -> Result<LeaderWatch, LockError> {
        if self.mutation == Mutation::StuckObserver {
            return follow(Stuck(Arc::clone(&self.inner)), "mutant", self.name()).await;
        }
        Arc::clone(&self.inner).observe().await
    }
}

#[async_trait]
impl DistributedLock for MutantLock {
    fn name(&self) -> &LockName {
        self.inner.name()
    }

    async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
        match self.inner.try_acquire().await? {
            Some(guard) => Ok(Some(self.wrap(guard))),
            None if self.mutation == Mutation::NotExclusive => Ok(Some(self.counterfeit())),
            None => Ok(None),
        }
    }

    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        match self.mutation {
            Mutation::NotExclusive => match self.inner.try_acquire().await? {
                Some(guard) => Ok(self.wrap(guard)),
                None => Ok(self.counterfeit()),
            },
            Mutation::NotCancelSafe => {
                // The real waiter lives in a detached task that outlives a dropped caller.
                let inner = Arc::clone(&self.inner);
                let task = tokio::spawn(async move { inner.acquire(timeout).await });
                let guard = task
                    .await
                    .map_err(|e| LockError::other("mutant", e.to_string()))??;
                Ok(self.wrap(guard))
            }
            Mutation::FifoViolated => {
                let arrival = self.arrivals.fetch_add(1, Ordering::SeqCst);
                // The earliest arrival polls slowest, so a later one wins the next grant.
                let pause =
                    Duration::from_millis((500u64 >> arrival.min(8).saturating_mul(3)).max(2));
                let deadline = timeout.and_then(|t| tokio::time::Instant::now().checked_add(t));
                loop {
                    if let Some(guard) = self.inner.try_acquire().await? {
                        return Ok(self.wrap(guard));
                    }
                    if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                        return Err(LockError::Timeout {
                            backend: "mutant",
                            name: self.name().to_string(),
                            waited: timeout.unwrap_or_default(),
                        });
                    }
                    tokio::time::sleep(pause).await;
                }
            }
            Mutation::PollNotCancelSafe => loop {
                // The server answers the try at once; its reply comes back through a task
                // that keeps the grant when nobody waits for it any more.
                let tried = self.inner.try_acquire().await?;
                let (reply, grant) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    if let Err(Some(stranded)) = reply.send(tried) {
                        eprintln!("STRANDED");
                        std::mem::forget(stranded);
                    }
                });
                if let Ok(Some(guard)) = grant.await {
                    return Ok(self.wrap(guard));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                self.retries.fetch_add(1, Ordering::SeqCst);
            },
            _ => Ok(self.wrap(self.inner.acquire(timeout).await?)),
        }
    }
}

impl LockProvider for MutantProvider {
    fn backend(&self) -> &'static str {
        "mutant"
    }
    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.capabilities();
        match self.mutation {
            Mutation::NoLostDetection | Mutation::LostUndeclared => caps.with_lost_detection(false),
            Mutation::CrashBoundOverHarness => {
                caps.with_crash_release_bound(Some(Duration::from_secs(3600)))
            }
            Mutation::PollNotCancelSafe => {
                let mut caps = caps;
                caps.wait = WaitKind::Poll;
                caps
            }
            _ => caps,
        }
    }
    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        Ok(Arc::new(MutantLock {
            inner: self.inner.lock(name)?,
            provider: self.inner.clone(),
            mutation: self.mutation,
            arrivals: Arc::clone(&self.arrivals),
            retries: Arc::clone(&self.retries),
        }))
    }
    fn election(&self, name: &str) -> Result<Arc<dyn Election>, LockError> {
        Ok(Arc::new(MutantElection {
            inner: self.inner.election(name)?,
            mutation: self.mutation,
        }))
    }
    fn metrics(&self) -> MetricsSnapshot {
        let mut metrics = self.inner.metrics();
        metrics.wakeups += self.retries.load(Ordering::SeqCst);
        metrics
    }
}

/// A session expiry that ends nothing.
struct ExpiryDoesNothing;

#[async_trait]
impl SessionExpiry for ExpiryDoesNothing {
    async fn expire_session(&self) -> FaultResult {
        Ok(())
    }
}

#[async_trait]
impl Harness for MutantHarness {
    async fn client(&self) -> Result<Client, LockError> {
        let provider = self.inner.server().provider();
        let session: Arc<dyn SessionExpiry> = match self.mutation {
            Mutation::ExpiryKeepsLocks => Arc::new(ExpiryDoesNothing),
            _ => Arc::new(MemorySession(provider.clone())),
        };
        let mutant = MutantProvider {
            inner: provider,
            mutation: self.mutation,
            arrivals: Arc::clone(&self.arrivals),
            retries: Arc::new(AtomicU64::new(0)),
        };
        Ok(Client::new(Arc::new(mutant), session))
    }
    fn timing(&self) -> Timing {
        self.inner.timing()
    }
    fn faults(&self) -> Option<&dyn Faults> {
        if self.required_only {
            return None;
        }
        self.inner.faults()
    }
    fn inspector(&self) -> Option<&dyn Inspector> {
        // A polling mutant queues nothing on the server: without an inspector, A9 must
        // catch it by the grant order alone.
        if self.required_only || self.mutation == Mutation::FifoViolated {
            return None;
        }
        self.inner.inspector()
    }
    fn unproven(&self) -> Vec<Unproven> {
        self.inner.unproven()
    }
}

/// Runs the named cases against the mutant; returns the ids of those that failed.
fn failing_cases(mutation: Mutation, ids: &[&str]) -> Vec<String> {
    failing_cases_of(|| MutantHarness::new(mutation), ids)
}

/// Runs the named cases, each against a new harness; returns the ids of those that failed.
fn failing_cases_of(harness: impl Fn() -> MutantHarness, ids: &[&str]) -> Vec<String> {
    ids.iter()
        .filter(|id| match outcome(harness(), id) {
            Err(failure) => {
                eprintln!("{:?} fails {id}: {failure}", harness().mutation);
                true
            }
            Ok(_) => false,
        })
        .map(|id| (*id).to_owned())
        .collect()
}

/// Runs one case against `harness`.
fn outcome(harness: MutantHarness, id: &str) -> lock_conformance::CaseResult {
    let case = cases::find(id).unwrap_or_else(|| panic!("no case {id}"));
    lock_conformance::runner::block_on(async { (case.run)(&harness).await })
}

#[test]
fn not_exclusive_is_caught() {
    let failed = failing_cases(Mutation::NotExclusive, &["A2", "A7", "A8"]);
    assert_eq!(failed, ["A2", "A7", "A8"]);
}

#[test]
fn unconditional_release_is_caught() {
    let failed = failing_cases(Mutation::UnconditionalRelease, &["C3"]);
    assert_eq!(failed, ["C3"]);
}

/// With only what every harness must offer (no revoke, no inspector), the stale-holder cases
/// still run: the session expiry makes the stale holder.
#[test]
fn unconditional_release_is_caught_without_optional_hooks() {
    let mutant = || MutantHarness::new(Mutation::UnconditionalRelease).required_only();
    assert_eq!(failing_cases_of(mutant, &["C3"]), ["C3"]);
    // The same cases run, and pass, for an honest backend with the same few hooks.
    for id in ["C3", "E2", "E3", "B8", "D1"] {
        let honest = MutantHarness::new(Mutation::None).required_only();
        let result = outcome(honest, id);
        assert!(matches!(result, Ok(Outcome::Passed)), "{id}: {result:?}");
    }
}

/// A polling acquire whose winning try outlives a dropped caller strands the lock: B9
/// drops it at each poll after the release.
#[test]
fn a_polling_acquire_that_strands_its_grant_is_caught() {
    assert_eq!(failing_cases(Mutation::PollNotCancelSafe, &["B9"]), ["B9"]);
}

/// The stale-holder cases take the lock away through the session's end even where a
/// revoke is offered: an expiry that leaves the locks alive fails them, with or without
/// the revoke.
#[test]
fn an_expiry_that_keeps_the_locks_is_caught_beside_a_revoke() {
    let stale_holder_cases = ["C3", "D1", "D2", "E2", "E3"];
    let with_revoke = || MutantHarness::new(Mutation::ExpiryKeepsLocks);
    assert_eq!(
        failing_cases_of(with_revoke, &stale_holder_cases),
        stale_holder_cases
    );
    let without = || MutantHarness::new(Mutation::ExpiryKeepsLocks).required_only();
    assert_eq!(
        failing_cases_of(without, &stale_holder_cases),
        stale_holder_cases
    );
    // An honest harness with a revoke passes them, through both ways.
    for id in stale_holder_cases {
        let result = outcome(MutantHarness::new(Mutation::None), id);
        assert!(matches!(result, Ok(Outcome::Passed)), "{id}: {result:?}");
    }
}

#[test]
fn non_monotonic_token_is_caught() {
    let failed = failing_cases(Mutation::NonMonotonicToken, &["E1", "E2"]);
    assert_eq!(failed, ["E1", "E2"]);
}

#[test]
fn not_cancel_safe_is_caught() {
    let failed = failing_cases(Mutation::NotCancelSafe, &["B5", "B6"]);
    assert!(!failed.is_empty(), "no cancellation case caught the mutant");
}

#[test]
fn lost_signal_never_firing_is_caught() {
    let failed = failing_cases(Mutation::LostNeverFires, &["D1", "D2"]);
    assert_eq!(failed, ["D1", "D2"]);
}

#[test]
fn lost_signal_firing_without_the_capability_is_caught() {
    let failed = failing_cases(Mutation::LostUndeclared, &["D5"]);
    assert_eq!(failed, ["D5"]);
    // A backend that declares no lost detection and keeps to it passes D5 (and is not
    // asked for D1 and D2).
    let failed = failing_cases(Mutation::NoLostDetection, &["D1", "D2", "D5"]);
    assert!(failed.is_empty(), "{failed:?}");
    let outcome = lock_conformance::runner::block_on(async {
        let harness = MutantHarness::new(Mutation::NoLostDetection);
        (cases::find("D5").unwrap().run)(&harness).await
    });
    assert!(
        matches!(outcome, Ok(lock_conformance::Outcome::Passed)),
        "{outcome:?}"
    );
}

#[test]
fn a_harness_waiting_less_than_the_declared_crash_release_bound_is_caught() {
    let failed = failing_cases(Mutation::CrashBoundOverHarness, &["C4", "C5", "C6"]);
    assert_eq!(failed, ["C4", "C5", "C6"]);
}

#[test]
fn fifo_violation_is_caught() {
    let failed = failing_cases(Mutation::FifoViolated, &["A9"]);
    assert_eq!(failed, ["A9"]);
}

#[test]
fn two_leaders_at_once_are_caught() {
    assert_eq!(failing_cases(Mutation::TwoLeaders, &["L1"]), ["L1"]);
}

#[test]
fn decreasing_terms_are_caught() {
    let failed = failing_cases(Mutation::DecreasingTerms, &["L1", "L2", "L5"]);
    assert_eq!(failed, ["L1", "L2", "L5"]);
}

#[test]
fn a_resignation_that_keeps_leading_is_caught() {
    let failed = failing_cases(Mutation::ResignDoesNothing, &["L2", "L4"]);
    assert_eq!(failed, ["L2", "L4"]);
}

#[test]
fn an_observer_that_misses_changes_is_caught() {
    assert_eq!(failing_cases(Mutation::StuckObserver, &["L3"]), ["L3"]);
}

/// The unmutated wrapper passes the same cases: the mutants fail for their mutation only.
#[test]
fn the_wrapper_itself_is_sound() {
    lock_conformance::runner::block_on(async {
        for id in [
            "A2", "A7", "A8", "A9", "B5", "B6", "C3", "D1", "D2", "E1", "E2",
        ] {
            let harness = MemoryHarness::new();
            let case = cases::find(id).unwrap();
            if let Err(failure) = (case.run)(&harness).await {
                panic!("{id} fails on the plain memory backend: {failure}");
            }
        }
        for id in ["L1", "L2", "L3", "L4", "L5", "L6", "L7"] {
            let harness = MutantHarness::new(Mutation::None);
            let case = cases::find(id).unwrap();
            if let Err(failure) = (case.run)(&harness).await {
                panic!("{id} fails on the unmutated election wrapper: {failure}");
            }
        }
    });
}
