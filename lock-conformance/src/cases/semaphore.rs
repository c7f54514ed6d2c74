//! J. Semaphores: at most N holders, every permit a full guard.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::{FencingToken, LockError};

use crate::ensure;
use crate::harness::{Entries, Harness, LockKind};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{expect_entries_of, expire_session, no_residue, unique_name, within};

const CAPABILITY: &str = "semaphore";

async fn declared(h: &dyn Harness) -> Result<bool, CaseFailure> {
    Ok(h.client().await?.provider.capabilities().semaphore)
}

/// J1: N permits: N acquire, the next try returns None; one release lets the next in.
pub async fn j1_n_permits(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    const N: u32 = 3;
    let timing = h.timing();
    let name = unique_name("j1");
    let mut clients = Vec::new();
    let mut permits = Vec::new();
    for index in 0..N {
        let client = h.client().await?;
        let semaphore = client.provider.semaphore(&name, N)?;
        ensure!(
            semaphore.permits() == N,
            "the semaphore reports {} permits",
            semaphore.permits()
        );
        permits.push(
            semaphore
                .try_acquire()
                .await?
                .ok_or_else(|| CaseFailure::new(format!("permit {index} of {N} refused")))?,
        );
        clients.push(client);
    }
    let extra = h.client().await?;
    let semaphore = extra.provider.semaphore(&name, N)?;
    ensure!(
        semaphore.try_acquire().await?.is_none(),
        "a permit beyond {N} was granted"
    );
    let waiting = tokio::spawn({
        let semaphore = Arc::clone(&semaphore);
        async move { semaphore.acquire(None).await }
    });
    expect_entries_of(
        h,
        LockKind::Semaphore,
        &name,
        Entries::new(N as usize, 1),
        "the extra client waits",
    )
    .await?;
    let mut first = permits.remove(0);
    first.release().await?;
    let mut next = within(
        timing.handoff_bound,
        "the next permit after a release",
        waiting,
    )
    .await?
    .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    next.release().await?;
    for mut permit in permits {
        permit.release().await?;
    }
    no_residue(h, &name, "after every permit").await?;
    Ok(Outcome::Passed)
}

/// J2: stress: concurrency never exceeds N and does reach N.
pub async fn j2_stress(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    semaphore_stress(h, 3, 6, 10).await?;
    Ok(Outcome::Passed)
}

/// A stress run: `clients` clients each take a permit of a `permits`-permit semaphore
/// `rounds` times, holding for a few milliseconds. Checks that the holders never exceed
/// `permits`, that they do reach it, and that nothing is left behind. Returns the most
/// holders seen at once.
///
/// J2 runs it with three permits and six clients; a backend's own tests can run it bigger.
///
/// # Errors
///
/// A [`CaseFailure`] naming the broken invariant, or the error a client met.
pub async fn semaphore_stress(
    h: &dyn Harness,
    permits: u32,
    clients: usize,
    rounds: usize,
) -> Result<usize, CaseFailure> {
    let timing = h.timing();
    let name = unique_name("semaphore-stress");
    let current = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut connected = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = h.client().await?;
        let semaphore = client.provider.semaphore(&name, permits)?;
        let (current, peak) = (current.clone(), peak.clone());
        let rendezvous_bound = timing.handoff_bound;
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let mut permit = semaphore.acquire(None).await?;
                let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                // Until N holders have been seen at once, each holder waits for the others
                // (up to the handoff bound): whether the semaphore can reach N must not
                // depend on how its grant latency compares with the short holds below.
                let rendezvous = tokio::time::Instant::now() + rendezvous_bound;
                while peak.load(Ordering::SeqCst) < permits as usize
                    && tokio::time::Instant::now() < rendezvous
                {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..15))).await;
                current.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
            }
            Ok::<(), LockError>(())
        }));
        connected.push(client);
    }
    let bound = timing.handoff_bound * (clients * rounds) as u32;
    within(bound, "the semaphore stress run", async {
        for task in tasks {
            task.await
                .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
        }
        Ok::<(), CaseFailure>(())
    })
    .await??;
    let peak = peak.load(Ordering::SeqCst);
    ensure!(
        peak <= permits as usize,
        "{peak} holders at once; the semaphore has {permits} permits"
    );
    ensure!(
        peak == permits as usize,
        "never more than {peak} of {permits} permits in use at once"
    );
    no_residue(h, &name, "after the stress run").await?;
    Ok(peak)
}

/// J3: permits carry fencing tokens and lost signals like mutex guards.
pub async fn j3_permits_are_full_guards(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let timing = h.timing();
    let name = unique_name("j3");
    let (a, b) = (h.client().await?, h.client().await?);
    let caps = a.provider.capabilities();
    let mut last: Option<FencingToken> = None;
    for client in [&a, &b, &a] {
        let mut permit = client
            .provider
            .semaphore(&name, 2)?
            .try_acquire()
            .await?
            .ok_or_else(|| CaseFailure::new("a permit of a free semaphore was refused"))?;
        if caps.fencing != lock_core::Fencing::None
            && let Some(last) = last
        {
            ensure!(
                permit.fencing_token() > last,
                "permit token {} after {last}",
                permit.fencing_token()
            );
        }
        last = Some(permit.fencing_token());
        permit.release().await?;
    }
    if !caps.lost_detection {
        return Ok(Outcome::Passed);
    }
    let permit = a
        .provider
        .semaphore(&name, 2)?
        .try_acquire()
        .await?
        .ok_or_else(|| CaseFailure::new("a permit of a free semaphore was refused"))?;
    expire_session(&a).await?;
    let reason = within(
        timing.loss_bound,
        "a permit's lost signal after session expiry",
        permit.lost().wait(),
    )
    .await?;
    ensure!(
        reason.is_some(),
        "a permit's lost signal ended without a loss"
    );
    drop(permit);
    no_residue(h, &name, "after the expiry").await?;
    Ok(Outcome::Passed)
}
