//! D. Loss detection: the lost signal fires when the backend can no longer vouch for the
//! lock, and only then.

use lock_core::LockError;

use crate::ensure;
use crate::harness::{FaultError, Harness, Property};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{
    TakeAway, by_every_take_away, lost_by_validity, no_residue, not_offered, take, take_away,
    unique_name, within,
};

const CAPABILITY: &str = "lost_detection";

/// D1: taking the lock away (the holder's session's end, and a revoke where the harness
/// offers one) fires the lost signal within the bound.
pub async fn d1_revoke_fires_lost(h: &dyn Harness) -> CaseResult {
    by_every_take_away(|how| d1_by(h, how)).await
}

async fn d1_by(h: &dyn Harness, how: TakeAway) -> CaseResult {
    let a = h.client().await?;
    if !a.provider.capabilities().lost_detection {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let name = unique_name("d1");
    let guard = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let lost = guard.lost();
    let waiter = tokio::spawn({
        let lost = lost.clone();
        async move { lost.wait().await }
    });
    if !take_away(h, &a, &name, how).await? {
        return Ok(not_offered(how));
    }
    let reason = within(
        h.timing().loss_bound,
        &format!("the lost signal after a {how}"),
        waiter,
    )
    .await?
    .map_err(|e| CaseFailure::new(format!("task failed: {e}")))?;
    ensure!(
        reason.is_some(),
        "the lost signal ended without a loss after a {how}"
    );
    ensure!(guard.is_lost(), "the guard does not report the loss");
    drop(guard);
    no_residue(h, &name, "after the loss").await?;
    Ok(Outcome::Passed)
}

/// D2: subscribing after the loss still sees it (after each way of taking the lock away,
/// as D1).
pub async fn d2_late_subscriber_sees_loss(h: &dyn Harness) -> CaseResult {
    by_every_take_away(|how| d2_by(h, how)).await
}

async fn d2_by(h: &dyn Harness, how: TakeAway) -> CaseResult {
    let a = h.client().await?;
    if !a.provider.capabilities().lost_detection {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let name = unique_name("d2");
    let guard = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    if !take_away(h, &a, &name, how).await? {
        return Ok(not_offered(how));
    }
    let first = guard.lost();
    within(
        h.timing().loss_bound,
        &format!("the lost signal after a {how}"),
        first.wait(),
    )
    .await?;
    let late = guard.lost();
    ensure!(
        late.is_lost(),
        "a subscription made after the loss does not see it"
    );
    let reason = within(h.timing().operation_slack, "a late wait()", late.wait()).await?;
    ensure!(reason.is_some(), "a late wait() returned no reason");
    drop(guard);
    no_residue(h, &name, "after the loss").await?;
    Ok(Outcome::Passed)
}

/// D3: release while a task waits on the lost signal: no panic, no hang.
pub async fn d3_release_while_waiting_on_lost(h: &dyn Harness) -> CaseResult {
    let name = unique_name("d3");
    let a = h.client().await?;
    let mut guard = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let lost = guard.lost();
    let waiter = tokio::spawn(async move { lost.wait().await });
    tokio::task::yield_now().await;
    within(h.timing().operation_slack, "release", guard.release()).await??;
    let reason = within(
        h.timing().operation_slack,
        "the lost-signal waiter after a release",
        waiter,
    )
    .await?
    .map_err(|e| CaseFailure::new(format!("the waiting task failed: {e}")))?;
    ensure!(
        reason.is_none(),
        "a normal release reported a loss: {reason:?}"
    );
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// D4 (fault): server paused past the session/lease: lost fires (where the guard has a
/// validity, by its `valid_until` plus the operation slack); after resume the stale release
/// returns Err(Lost) if someone else holds.
pub async fn d4_server_pause_fires_lost(h: &dyn Harness) -> CaseResult {
    let a = h.client().await?;
    if !a.provider.capabilities().lost_detection {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let Some(faults) = h.faults() else {
        return Ok(Outcome::Skipped(Skip::unproven(
            h,
            Property::LossOnServerPause,
        )));
    };
    let timing = h.timing();
    let name = unique_name("d4");
    let mut stale = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let pause = timing.crash_release_bound + timing.operation_slack;
    let pausing = faults.pause_server(pause);
    let watching = lost_by_validity(
        &stale,
        pause + timing.loss_bound,
        timing.operation_slack,
        "the server paused",
    );
    let (paused, reason) = tokio::join!(pausing, watching);
    match paused {
        Ok(()) => {}
        Err(FaultError::Unsupported) => {
            return Ok(Outcome::Skipped(Skip::unproven(
                h,
                Property::LossOnServerPause,
            )));
        }
        Err(other) => return Err(other.into()),
    }
    ensure!(reason?.is_some(), "the lost signal ended without a loss");
    let b = h.client().await?;
    let mut fresh = within(
        timing.crash_release_bound + timing.handoff_bound + timing.operation_slack,
        "another client's acquire after the pause",
        async {
            loop {
                match b.provider.lock(&name)?.acquire(None).await {
                    Err(error) if error.is_retryable() => {
                        tokio::time::sleep(timing.operation_slack / 4).await
                    }
                    other => return other,
                }
            }
        },
    )
    .await??;
    ensure!(
        matches!(stale.release().await, Err(LockError::Lost { .. })),
        "the stale release after the pause did not return Lost"
    );
    ensure!(!fresh.is_lost(), "the stale release hurt the new holder");
    fresh.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// D5: without the capability, a loss that is not the holder's own doing (a revoke) never
/// fires the signal. (Closing one's own provider fires it on every backend: see
/// [`Capabilities::lost_detection`](lock_core::Capabilities::lost_detection).)
pub async fn d5_without_detection_never_fires(h: &dyn Harness) -> CaseResult {
    let a = h.client().await?;
    if a.provider.capabilities().lost_detection {
        return Ok(Outcome::Skipped(Skip::because(
            "the backend declares lost_detection; D1 to D4 cover it",
        )));
    }
    let Some(faults) = h.faults() else {
        return Ok(Outcome::Skipped(Skip::missing_hook("revoke", None)));
    };
    let name = unique_name("d5");
    let mut guard = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    match faults.revoke(&name).await {
        Ok(_) => {}
        Err(FaultError::Unsupported) => {
            guard.release().await?;
            return Ok(Outcome::Skipped(Skip::missing_hook("revoke", None)));
        }
        Err(other) => return Err(other.into()),
    }
    tokio::time::sleep(h.timing().operation_slack).await;
    ensure!(
        !guard.is_lost(),
        "the backend does not declare lost_detection, yet a revoke fired the signal"
    );
    let _ = guard.release().await;
    Ok(Outcome::Passed)
}
