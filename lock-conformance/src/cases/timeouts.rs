//! B. Timeouts and cancellation: bounded waits, and nothing left behind by a waiter that
//! gives up.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{DistributedLock, Guard, LockError, LockProvider, WaitKind};
use tokio::time::Instant;

use crate::ensure;
use crate::harness::{Entries, Harness};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{
    PollBudget, expect_entries, expire_session, no_residue, take, unique_name, within,
};

/// B1: acquire(Some(t)) while held fails with Timeout after at least t and at most t + slack.
pub async fn b1_timeout_bounds(h: &dyn Harness) -> CaseResult {
    let name = unique_name("b1");
    let timing = h.timing();
    let (a, b) = (h.client().await?, h.client().await?);
    let mut held = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let lock = b.provider.lock(&name)?;
    let wait = timing.short_timeout;
    let started = Instant::now();
    let result = lock.acquire(Some(wait)).await;
    let took = started.elapsed();
    match result {
        Err(LockError::Timeout {
            waited, ref name, ..
        }) => {
            ensure!(
                waited == wait,
                "Timeout reports {waited:?}, the timeout was {wait:?}"
            );
            ensure!(name == lock.name().as_str(), "Timeout names {name:?}");
        }
        Ok(_) => {
            return Err(CaseFailure::new(
                "acquire succeeded while another client held the lock",
            ));
        }
        Err(other) => return Err(CaseFailure::new(format!("expected Timeout, got {other}"))),
    }
    ensure!(
        took >= wait,
        "the timeout fired after {took:?}, before {wait:?}"
    );
    ensure!(
        took <= wait + timing.operation_slack,
        "the timeout fired after {took:?}; the bound is {wait:?} + {:?}",
        timing.operation_slack
    );
    held.release().await?;
    no_residue(h, &name, "after the timeout and the release").await?;
    Ok(Outcome::Passed)
}

/// B2: acquire(Some(0)) behaves as one try: never waits.
pub async fn b2_zero_timeout_is_one_try(h: &dyn Harness) -> CaseResult {
    let name = unique_name("b2");
    let timing = h.timing();
    let (a, b) = (h.client().await?, h.client().await?);
    let lock = b.provider.lock(&name)?;
    let mut free = within(
        timing.operation_slack,
        "acquire(0) of a free lock",
        lock.acquire(Some(Duration::ZERO)),
    )
    .await?
    .map_err(|e| CaseFailure::new(format!("acquire(0) of a free lock failed: {e}")))?;
    free.release().await?;
    let mut held = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    match within(
        timing.operation_slack,
        "acquire(0) of a held lock",
        lock.acquire(Some(Duration::ZERO)),
    )
    .await?
    {
        Err(LockError::Timeout { .. }) => {}
        Ok(_) => return Err(CaseFailure::new("acquire(0) got a held lock")),
        Err(other) => {
            return Err(CaseFailure::new(format!(
                "acquire(0) of a held lock: expected Timeout, got {other}"
            )));
        }
    }
    expect_entries(h, &name, Entries::new(1, 0), "acquire(0) leaves no waiter").await?;
    held.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// B3: huge timeouts (up to Duration::MAX) are accepted or rejected as InvalidArgument; no panic.
pub async fn b3_huge_timeouts(h: &dyn Harness) -> CaseResult {
    let name = unique_name("b3");
    let timing = h.timing();
    let client = h.client().await?;
    let lock = client.provider.lock(&name)?;
    for huge in [
        Duration::MAX,
        Duration::from_secs(u64::MAX / 2),
        Duration::from_secs(1 << 40),
    ] {
        let attempt = tokio::spawn({
            let lock = Arc::clone(&lock);
            async move { lock.acquire(Some(huge)).await }
        });
        match within(
            timing.operation_slack,
            "acquire of a free lock with a huge timeout",
            attempt,
        )
        .await?
        {
            Ok(Ok(mut guard)) => guard.release().await?,
            Ok(Err(LockError::InvalidArgument { .. })) => {}
            Ok(Err(other)) => return Err(CaseFailure::new(format!("timeout {huge:?}: {other}"))),
            Err(join) => {
                return Err(CaseFailure::new(format!(
                    "timeout {huge:?} made acquire panic: {join}"
                )));
            }
        }
    }
    no_residue(h, &name, "after the huge timeouts").await?;
    Ok(Outcome::Passed)
}

/// B4: after a timeout no waiter residue remains; the holder is untouched; the next
/// contender is not delayed.
pub async fn b4_timeout_leaves_no_residue(h: &dyn Harness) -> CaseResult {
    let name = unique_name("b4");
    let timing = h.timing();
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    let mut held = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let lock = b.provider.lock(&name)?;
    for _ in 0..3 {
        match lock.acquire(Some(timing.short_timeout)).await {
            Err(LockError::Timeout { .. }) => {}
            other => {
                return Err(CaseFailure::new(format!(
                    "expected Timeout while held, got {:?}",
                    other.map(|guard| guard.fencing_token())
                )));
            }
        }
    }
    expect_entries(
        h,
        &name,
        Entries::new(1, 0),
        "timed-out waiters leave nothing",
    )
    .await?;
    ensure!(
        !held.is_lost(),
        "the holder lost its lock to timed-out waiters"
    );
    let next_lock = c.provider.lock(&name)?;
    let next = tokio::spawn(async move { next_lock.acquire(None).await });
    tokio::time::sleep(timing.operation_slack / 4).await;
    held.release().await?;
    let mut next = within(timing.handoff_bound, "the next contender's grant", next)
        .await?
        .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    next.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// B5: dropping a waiting acquire future leaves no residue and holds nothing.
pub async fn b5_dropped_acquire_leaves_nothing(h: &dyn Harness) -> CaseResult {
    let name = unique_name("b5");
    let timing = h.timing();
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    let mut held = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let lock = b.provider.lock(&name)?;
    let waiting = tokio::spawn(async move { lock.acquire(None).await });
    expect_entries(h, &name, Entries::new(1, 1), "the waiter is queued").await?;
    tokio::time::sleep(timing.operation_slack / 4).await;
    waiting.abort();
    let _ = waiting.await;
    expect_entries(
        h,
        &name,
        Entries::new(1, 0),
        "the dropped waiter's entry is removed",
    )
    .await?;
    held.release().await?;
    let mut next = within(
        timing.handoff_bound,
        "another client's acquire after the dropped waiter",
        c.provider.lock(&name)?.acquire(None),
    )
    .await??;
    next.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// The result of driving an acquire future for a limited number of polls.
enum Driven {
    /// It completed within the budget.
    Completed(Result<Guard, LockError>),
    /// The budget ran out, or the slack did; the future was dropped there. `settled` when it
    /// had reached its waiting state by then (see [`drive_then_drop`]): more polls would
    /// only take it round the same await points again.
    Dropped { settled: bool },
}

/// Polls `lock.acquire(None)` up to `polls` times (letting the runtime wake it between
/// polls), then drops it.
///
/// A waiting future has *settled* when its await points start to repeat:
/// - a notifying backend parks: pending, and not woken again within `slack`;
/// - a polling backend (`WaitKind::Poll`) goes round its retry loop: its provider counts two
///   wake-ups (the naps between attempts; the metrics contract) while it is driven, so the
///   first attempt, a nap and a whole retry have each been cancelled in by a smaller budget.
///   A poll loop is never silent for long, so waiting for a park would only measure its
///   retry period against the slack.
async fn drive_then_drop(
    provider: &dyn LockProvider,
    lock: &Arc<dyn DistributedLock>,
    polls: usize,
    slack: Duration,
) -> Driven {
    let polling = provider.capabilities().wait == WaitKind::Poll;
    let before = provider.metrics();
    let future = PollBudget::new(lock.acquire(None), polls);
    let parked = match tokio::time::timeout(slack, future).await {
        Ok(Some(result)) => return Driven::Completed(result),
        Ok(None) => false,
        Err(_) => true,
    };
    let retried = polling && provider.metrics().since(&before).wakeups >= 2;
    Driven::Dropped {
        settled: parked || retried,
    }
}

/// B6: cancel at every await point — poll the acquire future k times then drop it, for each
/// k until it completes (free lock) or settles in its wait (held lock: parked, or for a
/// polling backend twice round its retry loop): no residue, no lock held, every time.
pub async fn b6_cancel_at_every_await_point(h: &dyn Harness) -> CaseResult {
    const MAX_POLLS: usize = 64;
    let timing = h.timing();
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    // While the lock is held, the future must settle after finitely many polls; on a free
    // lock it must complete. Either way, a cancel at any poll count leaves nothing behind.
    for held_by_other in [true, false] {
        let name = unique_name("b6");
        let lock = b.provider.lock(&name)?;
        let mut finished = false;
        for polls in 0..=MAX_POLLS {
            let mut holder = if held_by_other {
                Some(take(a.provider.lock(&name)?.as_ref(), "holder").await?)
            } else {
                None
            };
            match drive_then_drop(b.provider.as_ref(), &lock, polls, timing.operation_slack).await {
                Driven::Completed(result) => {
                    let mut guard = result.map_err(|e| {
                        CaseFailure::new(format!("acquire after {polls} polls: {e}"))
                    })?;
                    ensure!(
                        !held_by_other,
                        "acquire completed while another client held the lock"
                    );
                    guard.release().await?;
                    finished = true;
                }
                Driven::Dropped { settled } => {
                    if settled && held_by_other {
                        finished = true; // more polls would find it in the same state
                    }
                }
            }
            let expected = Entries::new(usize::from(held_by_other), 0);
            expect_entries(
                h,
                &name,
                expected,
                &format!("after a cancel at poll {polls}"),
            )
            .await?;
            if let Some(holder) = holder.as_mut() {
                holder.release().await?;
            }
            // Nothing held on the cancelled caller's behalf: another client gets the lock.
            let mut probe = within(
                timing.handoff_bound,
                &format!("another client's acquire after a cancel at poll {polls}"),
                c.provider.lock(&name)?.acquire(None),
            )
            .await??;
            probe.release().await?;
            no_residue(h, &name, &format!("after a cancel at poll {polls}")).await?;
            if finished {
                break;
            }
        }
        ensure!(
            finished,
            "acquire neither completed nor settled in its wait within {MAX_POLLS} polls: a \
             waiter settles when it parks (pending, and not woken again within the operation \
             slack) or, declaring WaitKind::Poll, once its provider's metrics count two \
             retries as wake-ups (see WaitKind::Poll)"
        );
    }
    Ok(Outcome::Passed)
}

/// B7: a cancel that races a grant does not strand the lock: the next waiter gets it.
pub async fn b7_cancel_racing_grant(h: &dyn Harness) -> CaseResult {
    let name = unique_name("b7");
    let timing = h.timing();
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    for _round in 0..3 {
        let mut held = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
        let lock_b = b.provider.lock(&name)?;
        // B queues first and is then dropped right after the release, racing its grant. It
        // is polled until the server records it waiting: a slow client's first requests
        // may take a while.
        let mut racing = Box::pin(lock_b.acquire(None));
        tokio::select! {
            got = racing.as_mut() => {
                return Err(CaseFailure::new(format!(
                    "the first waiter got a held lock: {:?}",
                    got.map(|guard| guard.fencing_token())
                )));
            }
            queued = expect_entries(h, &name, Entries::new(1, 1), "the first waiter is queued") => {
                queued?;
            }
        }
        let lock_c = c.provider.lock(&name)?;
        let behind = tokio::spawn(async move { lock_c.acquire(None).await });
        expect_entries(h, &name, Entries::new(1, 2), "both waiters are queued").await?;
        if h.inspector().is_none() {
            tokio::time::sleep(timing.operation_slack / 2).await;
        }
        held.release().await?;
        drop(racing);
        let mut next = within(
            timing.handoff_bound + timing.operation_slack,
            "the waiter behind a cancelled one",
            behind,
        )
        .await?
        .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
        next.release().await?;
        no_residue(h, &name, "after the round").await?;
    }
    Ok(Outcome::Passed)
}

/// B9 (`WaitKind::Poll`): a polling acquire dropped after the holder released — at each of
/// its next few polls, so also while the retry that would win is on its way — holds
/// nothing and leaves nothing: another client gets the lock at once.
pub async fn b9_cancel_during_winning_attempt(h: &dyn Harness) -> CaseResult {
    const POLLS_AFTER_RELEASE: usize = 8;
    let timing = h.timing();
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    if b.provider.capabilities().wait != WaitKind::Poll {
        return Ok(Outcome::Skipped(Skip::not_declared(
            "polling (WaitKind::Poll)",
        )));
    }
    let bound = timing.handoff_bound + timing.operation_slack;
    for polls in 0..=POLLS_AFTER_RELEASE {
        let name = unique_name("b9");
        let mut held = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
        let lock = b.provider.lock(&name)?;
        let mut acquiring = Box::pin(lock.acquire(None));
        // Once round the retry loop while the lock is held.
        let before = b.provider.metrics();
        let retried = || b.provider.metrics().since(&before).wakeups >= 1;
        let first = drive_until(acquiring.as_mut(), retried);
        ensure!(
            within(bound, "the waiter's first retry", first)
                .await?
                .is_none(),
            "the waiter got a held lock"
        );
        held.release().await?;
        // Dropped right after its `polls`-th poll from here, before another wake-up.
        let mut polled = 0;
        let granted = match polls {
            0 => None,
            _ => {
                let after = drive_until(acquiring.as_mut(), || {
                    polled += 1;
                    polled >= polls
                });
                within(bound, "the waiter's polls after the release", after).await?
            }
        };
        drop(acquiring);
        if let Some(result) = granted {
            // Granted within the budget: nothing left to cancel in this round.
            result?.release().await?;
        }
        let what = format!("after a cancel {polls} poll(s) past the release");
        let mut next = within(
            bound,
            &format!("another client's acquire {what}"),
            c.provider.lock(&name)?.acquire(None),
        )
        .await??;
        next.release().await?;
        no_residue(h, &name, &what).await?;
    }
    Ok(Outcome::Passed)
}

/// Polls `future` as the runtime wakes it until it completes (`Some`) or, after a poll that
/// left it pending, `done` holds (`None`; the future is left where that poll left it).
async fn drive_until<F: Future + ?Sized>(
    mut future: std::pin::Pin<&mut F>,
    mut done: impl FnMut() -> bool,
) -> Option<F::Output> {
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        std::task::Poll::Ready(output) => std::task::Poll::Ready(Some(output)),
        std::task::Poll::Pending if done() => std::task::Poll::Ready(None),
        std::task::Poll::Pending => std::task::Poll::Pending,
    })
    .await
}

/// B8: a waiter whose own session ends while it waits returns an error and never wins later.
pub async fn b8_waiter_session_death(h: &dyn Harness) -> CaseResult {
    let name = unique_name("b8");
    let timing = h.timing();
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    let mut held = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let lock = b.provider.lock(&name)?;
    let waiting = tokio::spawn(async move { lock.acquire(None).await });
    expect_entries(h, &name, Entries::new(1, 1), "the waiter is queued").await?;
    expire_session(&b).await?;
    let result = within(
        timing.loss_bound,
        "the dead waiter's acquire to fail",
        waiting,
    )
    .await?
    .map_err(|e| CaseFailure::new(format!("task failed: {e}")))?;
    ensure!(
        result.is_err(),
        "a waiter whose session died was granted the lock"
    );
    held.release().await?;
    let mut next = within(
        timing.handoff_bound,
        "a live contender's acquire",
        c.provider.lock(&name)?.acquire(None),
    )
    .await??;
    next.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}
