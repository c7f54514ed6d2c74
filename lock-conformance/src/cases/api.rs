//! K. API and metrics: the object-safe contract, and the wake-ups a strategy declares.

use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{
    Capabilities, DistributedLock, Guard, LockError, LockProvider, MetricsSnapshot, WaitKind,
};

use crate::ensure;
use crate::harness::{Client, Entries, Harness, Inspector, LockKind, Timing};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{expect_entries, no_residue, take, unique_name, within};

fn send_static<T: Send + 'static>(_: &T) {}

/// K2: `Arc<dyn DistributedLock>` and `Arc<dyn LockProvider>` work; `Guard: Send + 'static`;
/// `Debug` everywhere.
pub async fn k2_object_safe_and_debug(h: &dyn Harness) -> CaseResult {
    let name = unique_name("k2");
    let client = h.client().await?;
    let provider: Arc<dyn LockProvider> = Arc::clone(&client.provider);
    let lock: Arc<dyn DistributedLock> = provider.lock(&name)?;
    let guard: Guard = take(lock.as_ref(), "holder").await?;
    send_static(&guard);
    // A guard can move to another task and be released there.
    let moved = tokio::spawn(async move {
        let mut guard = guard;
        guard.release().await
    });
    moved
        .await
        .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    for (what, text) in [
        ("provider", format!("{provider:?}")),
        ("lock", format!("{lock:?}")),
        ("capabilities", format!("{:?}", provider.capabilities())),
        ("metrics", format!("{:?}", provider.metrics())),
    ] {
        ensure!(!text.is_empty(), "the {what}'s Debug output is empty");
    }
    let guard = take(lock.as_ref(), "holder").await?;
    ensure!(
        format!("{guard:?}").contains("Guard"),
        "the guard's Debug output is unhelpful"
    );
    drop(guard);
    no_residue(h, &name, "after drop").await?;
    Ok(Outcome::Passed)
}

/// K3: metrics — a release with W waiters adds the wake-ups the strategy declares (1 for
/// herd-free, W for herd strategies), and the wake-ups in vain that go with them (none for
/// herd-free, nearly W − 1 for herd strategies).
pub async fn k3_wakeups_per_release(h: &dyn Harness) -> CaseResult {
    const WAITERS: usize = 5;
    let holder = h.client().await?;
    let wait = holder.provider.capabilities().wait;
    if wait == WaitKind::Poll {
        return Ok(Outcome::Skipped(Skip::not_declared("notify-based waiting")));
    }
    let timing = h.timing();
    let name = unique_name("k3");
    let mut held = take(holder.provider.lock(&name)?.as_ref(), "holder").await?;
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    let (grants_tx, mut grants_rx) = tokio::sync::mpsc::unbounded_channel();
    for index in 0..WAITERS {
        let client = h.client().await?;
        let lock = client.provider.lock(&name)?;
        let grants = grants_tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.acquire(None).await?;
            // Hold until the case has read the counters.
            let _ = grants.send((index, guard));
            Ok::<(), lock_core::LockError>(())
        }));
        clients.push(client);
    }
    expect_entries(h, &name, Entries::new(1, WAITERS), "the waiters are queued").await?;
    tokio::time::sleep(timing.operation_slack / 2).await;
    let before: Vec<_> = clients.iter().map(|c| c.provider.metrics()).collect();
    held.release().await?;
    let (_, mut winner) = within(timing.handoff_bound, "the handoff", grants_rx.recv())
        .await?
        .ok_or_else(|| CaseFailure::new("no waiter was granted the lock"))?;
    // Let every wake-up caused by this one release land.
    tokio::time::sleep(timing.operation_slack / 2).await;
    let (woken, futile) = clients
        .iter()
        .zip(&before)
        .map(|(client, before)| client.provider.metrics().since(before))
        .fold((0, 0), |(woken, futile), delta| {
            (woken + delta.wakeups, futile + delta.futile_wakeups)
        });
    match wait {
        WaitKind::NotifyOne => ensure!(
            woken == 1 && futile == 0,
            "a herd-free strategy woke {woken} waiters ({futile} in vain) for one release"
        ),
        _ => ensure!(
            woken >= (WAITERS - 1) as u64 && futile >= (WAITERS - 2) as u64,
            "a herd strategy woke only {woken} of {WAITERS} waiters ({futile} in vain) for one release"
        ),
    }
    winner.release().await?;
    // Serve the rest so nothing is left behind.
    for _ in 1..WAITERS {
        let (_, mut guard) = within(
            timing.handoff_bound * 2,
            "serving the remaining waiters",
            grants_rx.recv(),
        )
        .await?
        .ok_or_else(|| CaseFailure::new("a waiter was never served"))?;
        guard.release().await?;
    }
    for task in tasks {
        task.await
            .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    }
    no_residue(h, &name, "after every waiter").await?;
    Ok(Outcome::Passed)
}

/// Which plain-lock view of another lock kind K1 checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adapter {
    OnePermit,
    WriteSide,
}

/// A provider whose `lock(name)` is a one-permit semaphore or the write side of a
/// read-write lock.
#[derive(Debug)]
struct AdaptedProvider {
    inner: Arc<dyn LockProvider>,
    adapter: Adapter,
}

impl LockProvider for AdaptedProvider {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        match self.adapter {
            Adapter::OnePermit => self.inner.semaphore(name, 1)?.as_lock(),
            Adapter::WriteSide => Ok(self.inner.rw_lock(name)?.write_lock()),
        }
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics()
    }
}

impl Adapter {
    fn kind(self) -> LockKind {
        match self {
            Adapter::OnePermit => LockKind::Semaphore,
            Adapter::WriteSide => LockKind::ReadWrite,
        }
    }
}

struct AdaptedHarness<'h> {
    inner: &'h dyn Harness,
    inspector: Option<AdaptedInspector<'h>>,
    adapter: Adapter,
}

impl<'h> AdaptedHarness<'h> {
    fn new(inner: &'h dyn Harness, adapter: Adapter) -> Self {
        AdaptedHarness {
            inner,
            inspector: inner
                .inspector()
                .map(|inner| AdaptedInspector { inner, adapter }),
            adapter,
        }
    }
}

/// The inner inspector, answering for the adapted kind where a case asks about mutexes.
struct AdaptedInspector<'h> {
    inner: &'h dyn Inspector,
    adapter: Adapter,
}

#[async_trait]
impl Inspector for AdaptedInspector<'_> {
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        self.inner.entries(name).await
    }

    fn records_waiters(&self, kind: LockKind) -> bool {
        let kind = match kind {
            LockKind::Mutex => self.adapter.kind(),
            other => other,
        };
        self.inner.records_waiters(kind)
    }
}

#[async_trait]
impl Harness for AdaptedHarness<'_> {
    async fn client(&self) -> Result<Client, LockError> {
        let client = self.inner.client().await?;
        Ok(Client {
            provider: Arc::new(AdaptedProvider {
                inner: client.provider,
                adapter: self.adapter,
            }),
            session: client.session,
            faults: client.faults,
        })
    }

    fn timing(&self) -> Timing {
        self.inner.timing()
    }

    fn inspector(&self) -> Option<&dyn Inspector> {
        self.inspector
            .as_ref()
            .map(|inspector| inspector as &dyn Inspector)
    }
}

/// The mutex cases an adapter must pass: exclusion, timeouts and cancellation, release.
const ADAPTED_CASES: &[&str] = &[
    "A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8", "B1", "B2", "B3", "B4", "B5", "B6", "B7", "C1",
    "C2", "C4", "C5", "C6",
];

/// K1: semaphore(1) and the write lock pass the exclusion, timeout and release cases.
pub async fn k1_adapters_pass_mutex_cases(h: &dyn Harness) -> CaseResult {
    let caps = h.client().await?.provider.capabilities();
    let mut adapters = Vec::new();
    if caps.semaphore {
        adapters.push(Adapter::OnePermit);
    }
    if caps.reader_writer {
        adapters.push(Adapter::WriteSide);
    }
    if adapters.is_empty() {
        return Ok(Outcome::Skipped(Skip::not_declared(
            "semaphore or reader_writer",
        )));
    }
    for adapter in adapters {
        let adapted = AdaptedHarness::new(h, adapter);
        for id in ADAPTED_CASES {
            let case =
                crate::cases::find(id).ok_or_else(|| CaseFailure::new(format!("no case {id}")))?;
            match (case.run)(&adapted).await {
                Ok(_) => {}
                Err(failure) => {
                    return Err(CaseFailure::new(format!(
                        "{adapter:?} adapter fails {id}: {failure}"
                    )));
                }
            }
        }
    }
    Ok(Outcome::Passed)
}
