//! A. Exclusion: at most one holder, and the lock is usable again after release.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::LockError;

use crate::ensure;
use crate::harness::{Entries, Harness};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{Occupancy, expect_entries, no_residue, take, unique_name, within};

/// A1: try_acquire on a free lock returns a guard.
pub async fn a1_try_acquire_free(h: &dyn Harness) -> CaseResult {
    let name = unique_name("a1");
    let client = h.client().await?;
    let lock = client.provider.lock(&name)?;
    let mut guard = take(lock.as_ref(), "try_acquire on a free lock").await?;
    ensure!(
        guard.name().as_str() == name,
        "the guard is for {:?}, not {name:?}",
        guard.name()
    );
    guard.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// A2: try_acquire from another client while held returns Ok(None) within the operation slack.
pub async fn a2_try_acquire_held_returns_none(h: &dyn Harness) -> CaseResult {
    let name = unique_name("a2");
    let (a, b) = (h.client().await?, h.client().await?);
    let mut held = take(a.provider.lock(&name)?.as_ref(), "first holder").await?;
    let slack = h.timing().operation_slack;
    let other = b.provider.lock(&name)?;
    let attempt = within(slack, "try_acquire of a held lock", other.try_acquire()).await??;
    ensure!(attempt.is_none(), "a second client got a held lock");
    held.release().await?;
    Ok(Outcome::Passed)
}

/// A3: not re-entrant: a second acquire from the same provider queues; its try returns None.
pub async fn a3_not_reentrant(h: &dyn Harness) -> CaseResult {
    let name = unique_name("a3");
    let client = h.client().await?;
    let lock = client.provider.lock(&name)?;
    let mut held = take(lock.as_ref(), "first acquire").await?;
    ensure!(
        lock.try_acquire().await?.is_none(),
        "a held lock was granted again to the same provider (re-entrant)"
    );
    let again = client.provider.lock(&name)?;
    ensure!(
        again.try_acquire().await?.is_none(),
        "a second handle of the same provider got the held lock"
    );
    let timeout = h.timing().short_timeout;
    match lock.acquire(Some(timeout)).await {
        Err(LockError::Timeout { .. }) => {}
        Ok(_) => {
            return Err(CaseFailure::new(
                "acquire of a lock the provider holds succeeded (re-entrant)",
            ));
        }
        Err(other) => return Err(CaseFailure::new(format!("expected Timeout, got {other}"))),
    }
    held.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// A4: different names are independent locks.
pub async fn a4_names_are_independent(h: &dyn Harness) -> CaseResult {
    let (first, second) = (unique_name("a4"), unique_name("a4"));
    let (a, b) = (h.client().await?, h.client().await?);
    let mut one = take(a.provider.lock(&first)?.as_ref(), "first name").await?;
    let mut two = take(
        b.provider.lock(&second)?.as_ref(),
        "second name while the first is held",
    )
    .await?;
    ensure!(
        b.provider.lock(&first)?.try_acquire().await?.is_none(),
        "the first lock was free to another client"
    );
    one.release().await?;
    two.release().await?;
    Ok(Outcome::Passed)
}

/// A5: release then acquire again works; the lock handle is reusable.
pub async fn a5_reacquire_after_release(h: &dyn Harness) -> CaseResult {
    let name = unique_name("a5");
    let client = h.client().await?;
    let lock = client.provider.lock(&name)?;
    for round in 0..5 {
        let mut guard = within(
            h.timing().operation_slack,
            "acquire of a free lock",
            lock.acquire(None),
        )
        .await?
        .map_err(|e| CaseFailure::new(format!("round {round}: {e}")))?;
        guard.release().await?;
    }
    no_residue(h, &name, "after the last release").await?;
    Ok(Outcome::Passed)
}

/// A6: a release wakes a blocked waiter within the handoff bound.
pub async fn a6_release_wakes_waiter(h: &dyn Harness) -> CaseResult {
    let name = unique_name("a6");
    let (a, b) = (h.client().await?, h.client().await?);
    let timing = h.timing();
    let mut held = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let waiter = b.provider.lock(&name)?;
    let waiting = tokio::spawn(async move { waiter.acquire(None).await });
    expect_entries(h, &name, Entries::new(1, 1), "the waiter is queued").await?;
    tokio::time::sleep(timing.operation_slack / 4).await;
    ensure!(
        !waiting.is_finished(),
        "the waiter got the lock while it was held"
    );
    held.release().await?;
    let mut next = within(timing.handoff_bound, "the handoff to the waiter", waiting)
        .await?
        .map_err(|e| CaseFailure::new(format!("waiter task: {e}")))??;
    next.release().await?;
    no_residue(h, &name, "after the waiter's release").await?;
    Ok(Outcome::Passed)
}

/// A7: stress — several clients × tasks × rounds on one name: occupancy never exceeds one,
/// every task finishes before the deadline, total grants = clients × tasks × rounds.
pub async fn a7_stress(h: &dyn Harness) -> CaseResult {
    const CLIENTS: usize = 4;
    const TASKS: usize = 4;
    const ROUNDS: usize = 5;
    let name = unique_name("a7");
    let timing = h.timing();
    let occupancy = Occupancy::new();
    let grants = Arc::new(Mutex::new(0usize));
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for client_index in 0..CLIENTS {
        let client = h.client().await?;
        for task_index in 0..TASKS {
            let lock = client.provider.lock(&name)?;
            let (occupancy, grants) = (occupancy.clone(), Arc::clone(&grants));
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    // Mix the two ways of taking the lock.
                    let mut guard = if (client_index + task_index + round) % 4 == 0 {
                        loop {
                            if let Some(guard) = lock.try_acquire().await? {
                                break guard;
                            }
                            tokio::time::sleep(Duration::from_millis(fastrand::u64(1..5))).await;
                        }
                    } else {
                        lock.acquire(None).await?
                    };
                    {
                        let _inside = occupancy.enter();
                        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..3))).await;
                    }
                    *grants.lock().unwrap_or_else(PoisonError::into_inner) += 1;
                    guard.release().await?;
                }
                Ok::<(), LockError>(())
            }));
        }
        clients.push(client);
    }
    let total = (CLIENTS * TASKS * ROUNDS) as u32;
    let deadline = timing.handoff_bound * total + timing.operation_slack * 4;
    let all = async {
        for task in tasks {
            task.await
                .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
        }
        Ok::<(), CaseFailure>(())
    };
    within(deadline, "the stress run", all).await??;
    ensure!(
        occupancy.peak() == 1,
        "{} holders were inside the critical section at once",
        occupancy.peak()
    );
    let granted = *grants.lock().unwrap_or_else(PoisonError::into_inner);
    ensure!(
        granted == total as usize,
        "{granted} grants, expected {total}"
    );
    no_residue(h, &name, "after the stress run").await?;
    Ok(Outcome::Passed)
}

/// A8: many concurrent try_acquire on a free lock: exactly one wins.
pub async fn a8_concurrent_try_exactly_one(h: &dyn Harness) -> CaseResult {
    const CONTENDERS: usize = 8;
    let name = unique_name("a8");
    let mut clients = Vec::new();
    let mut locks = Vec::new();
    for _ in 0..CONTENDERS {
        let client = h.client().await?;
        locks.push(client.provider.lock(&name)?);
        clients.push(client);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(CONTENDERS));
    let tasks: Vec<_> = locks
        .into_iter()
        .map(|lock| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                lock.try_acquire().await
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        if let Some(guard) = task
            .await
            .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??
        {
            winners.push(guard);
        }
    }
    ensure!(
        winners.len() == 1,
        "{} of {CONTENDERS} concurrent tries won",
        winners.len()
    );
    for mut guard in winners {
        guard.release().await?;
    }
    no_residue(h, &name, "after the winner's release").await?;
    Ok(Outcome::Passed)
}

/// Queues `count` waiters on `name` one after another (each is queued before the next
/// starts) and returns their tasks, which record their index in `order` when granted.
async fn queue_in_order(
    h: &dyn Harness,
    name: &str,
    count: usize,
    order: &Arc<Mutex<Vec<usize>>>,
) -> Result<Vec<tokio::task::JoinHandle<Result<(), LockError>>>, CaseFailure> {
    let timing = h.timing();
    let mut tasks = Vec::new();
    for index in 0..count {
        let client = h.client().await?;
        let lock = client.provider.lock(name)?;
        let order = Arc::clone(order);
        tasks.push(tokio::spawn(async move {
            let _client = client; // the waiter's process lives as long as its task
            let mut guard = lock.acquire(None).await?;
            order
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(index);
            guard.release().await
        }));
        // Without an inspector, give the request time to reach the server.
        if h.inspector().is_some() {
            expect_entries(h, name, Entries::new(1, index + 1), "the waiter is queued").await?;
        } else {
            tokio::time::sleep(timing.operation_slack / 2).await;
        }
    }
    Ok(tasks)
}

/// A9 (cap fifo): waiters queued in a known order are granted in that order.
pub async fn a9_fifo_order(h: &dyn Harness) -> CaseResult {
    const WAITERS: usize = 5;
    let holder = h.client().await?;
    if !holder.provider.capabilities().fifo {
        return Ok(Outcome::Skipped(Skip::not_declared("fifo")));
    }
    let name = unique_name("a9");
    let mut held = take(holder.provider.lock(&name)?.as_ref(), "holder").await?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let tasks = queue_in_order(h, &name, WAITERS, &order).await?;
    held.release().await?;
    let bound = h.timing().handoff_bound * WAITERS as u32;
    within(bound, "serving every waiter", async {
        for task in tasks {
            task.await
                .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
        }
        Ok::<(), CaseFailure>(())
    })
    .await??;
    let granted = order.lock().unwrap_or_else(PoisonError::into_inner).clone();
    ensure!(
        granted == (0..WAITERS).collect::<Vec<_>>(),
        "grant order {granted:?}; waiters queued as 0..{WAITERS}"
    );
    no_residue(h, &name, "after every waiter").await?;
    Ok(Outcome::Passed)
}

/// A10 (cap fifo): a waiter ahead that times out or is cancelled lets nobody jump the holder.
pub async fn a10_fifo_no_jump(h: &dyn Harness) -> CaseResult {
    let holder = h.client().await?;
    if !holder.provider.capabilities().fifo {
        return Ok(Outcome::Skipped(Skip::not_declared("fifo")));
    }
    let timing = h.timing();
    let name = unique_name("a10");
    let mut held = take(holder.provider.lock(&name)?.as_ref(), "holder").await?;
    // Ahead: one that times out, one that is cancelled; behind them: a patient waiter.
    let (timing_out, cancelled_client, patient_client) =
        (h.client().await?, h.client().await?, h.client().await?);
    let timing_out_lock = timing_out.provider.lock(&name)?;
    let short = timing.short_timeout;
    let timed = tokio::spawn(async move { timing_out_lock.acquire(Some(short)).await.map(|_| ()) });
    let cancelled_lock = cancelled_client.provider.lock(&name)?;
    let cancelled = tokio::spawn(async move { cancelled_lock.acquire(None).await.map(|_| ()) });
    tokio::time::sleep(timing.operation_slack / 2).await;
    let patient_lock = patient_client.provider.lock(&name)?;
    let patient = tokio::spawn(async move { patient_lock.acquire(None).await });
    tokio::time::sleep(timing.operation_slack / 2).await;
    cancelled.abort();
    match timed.await {
        Ok(Err(LockError::Timeout { .. })) => {}
        other => {
            return Err(CaseFailure::new(format!(
                "the timing-out waiter ended with {other:?}"
            )));
        }
    }
    tokio::time::sleep(timing.operation_slack / 2).await;
    ensure!(
        !patient.is_finished(),
        "a waiter got the lock while the holder still held it"
    );
    ensure!(
        holder.provider.lock(&name)?.try_acquire().await?.is_none(),
        "the lock was free to a try while held"
    );
    held.release().await?;
    let mut next = within(
        timing.handoff_bound + timing.operation_slack,
        "the patient waiter's grant",
        patient,
    )
    .await?
    .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    next.release().await?;
    no_residue(h, &name, "after the patient waiter").await?;
    Ok(Outcome::Passed)
}

/// A11: clients that only try, and try again each time they are told of a release, all
/// finish: tries that overlap never all fail while nobody holds the lock.
///
/// A backend whose try queues an entry and then withdraws it fails this: while the entry
/// of a try that lost stands, every other try finds it in the way, and once the holder has
/// released, a burst of tries can all fail with nobody left to release (the run stalls).
pub async fn a11_overlapping_tries_do_not_all_fail(h: &dyn Harness) -> CaseResult {
    const CLIENTS: usize = 6;
    const ROUNDS: usize = 8;
    let name = unique_name("a11");
    let timing = h.timing();
    let (released, _) = tokio::sync::watch::channel(0_u64);
    let released = Arc::new(released);
    let occupancy = Occupancy::default();
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = h.client().await?;
        let lock = client.provider.lock(&name)?;
        let (released, occupancy) = (Arc::clone(&released), occupancy.clone());
        tasks.push(tokio::spawn(async move {
            let mut releases = released.subscribe();
            for _ in 0..ROUNDS {
                let mut guard = loop {
                    releases.borrow_and_update();
                    if let Some(guard) = lock.try_acquire().await? {
                        break guard;
                    }
                    // Busy: wait to be told of the next release (the lock's holder sends
                    // it after its release), then try again.
                    let _ = releases.changed().await;
                };
                {
                    let _inside = occupancy.enter();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                guard.release().await?;
                released.send_modify(|count| *count += 1);
            }
            Ok::<(), LockError>(())
        }));
        clients.push(client);
    }
    let total = (CLIENTS * ROUNDS) as u32;
    let deadline = timing.handoff_bound * total + timing.operation_slack * 4;
    let aborts: Vec<_> = tasks.iter().map(|task| task.abort_handle()).collect();
    let all = async {
        for task in tasks {
            task.await
                .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
        }
        Ok::<(), CaseFailure>(())
    };
    let Ok(finished) = within(deadline, "the tries", all).await else {
        aborts.iter().for_each(tokio::task::AbortHandle::abort);
        return Err(CaseFailure::new(format!(
            "the tries did not finish within {deadline:?}: after {} of {total} releases, \
             every try failed while nobody held the lock",
            *released.borrow()
        )));
    };
    finished?;
    ensure!(
        occupancy.peak() == 1,
        "{} holders were inside the critical section at once",
        occupancy.peak()
    );
    no_residue(h, &name, "after the tries").await?;
    Ok(Outcome::Passed)
}
