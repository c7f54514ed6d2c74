//! C. Release: conditional, idempotent, and the lock freed when its holder goes away.

use std::time::Duration;

use lock_core::LockError;

use crate::ensure;
use crate::harness::Harness;
use crate::outcome::{CaseFailure, CaseResult, Outcome};
use crate::support::{
    TakeAway, by_every_take_away, crash_release_bound, no_residue, not_offered, take, take_over,
    unique_name, within,
};

/// C1: release returns Ok, frees the lock, and does not fire the lost signal.
pub async fn c1_release_frees_without_loss(h: &dyn Harness) -> CaseResult {
    let name = unique_name("c1");
    let (a, b) = (h.client().await?, h.client().await?);
    let mut guard = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let lost = guard.lost();
    within(h.timing().operation_slack, "release", guard.release()).await??;
    ensure!(!lost.is_lost(), "a normal release fired the lost signal");
    ensure!(guard.is_released(), "the guard does not report the release");
    let mut next = take(
        b.provider.lock(&name)?.as_ref(),
        "another client after release",
    )
    .await?;
    ensure!(
        !lost.is_lost(),
        "the next grant fired the released guard's lost signal"
    );
    next.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// C2: release twice, or drop after release: no-op; a later holder is untouched.
pub async fn c2_release_is_idempotent(h: &dyn Harness) -> CaseResult {
    let name = unique_name("c2");
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    let mut first = take(a.provider.lock(&name)?.as_ref(), "first holder").await?;
    first.release().await?;
    let mut later = take(b.provider.lock(&name)?.as_ref(), "later holder").await?;
    first
        .release()
        .await
        .map_err(|e| CaseFailure::new(format!("a second release failed: {e}")))?;
    drop(first);
    tokio::time::sleep(h.timing().operation_slack / 2).await;
    ensure!(
        !later.is_lost(),
        "a second release or a drop after release hurt the later holder"
    );
    ensure!(
        c.provider.lock(&name)?.try_acquire().await?.is_none(),
        "a second release or a drop after release freed the later holder's lock"
    );
    later.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// C3: stale guard — after its lock was taken away (its session's end, and a revoke where
/// the harness offers one) and another client acquired, release returns Err(Lost) and the
/// new holder still holds.
pub async fn c3_stale_release_is_lost(h: &dyn Harness) -> CaseResult {
    by_every_take_away(|how| c3_by(h, how)).await
}

async fn c3_by(h: &dyn Harness, how: TakeAway) -> CaseResult {
    let name = unique_name("c3");
    let timing = h.timing();
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    let mut stale = take(a.provider.lock(&name)?.as_ref(), "first holder").await?;
    let Some(mut fresh) = take_over(h, &a, &b, &name, how).await? else {
        return Ok(not_offered(how));
    };
    match stale.release().await {
        Err(LockError::Lost { .. }) => {}
        Ok(()) => return Err(CaseFailure::new("the stale guard's release returned Ok")),
        Err(other) => {
            return Err(CaseFailure::new(format!(
                "the stale release: expected Lost, got {other}"
            )));
        }
    }
    drop(stale);
    tokio::time::sleep(timing.operation_slack / 2).await;
    ensure!(
        !fresh.is_lost(),
        "the stale release fired the new holder's lost signal"
    );
    ensure!(
        c.provider.lock(&name)?.try_acquire().await?.is_none(),
        "the stale release freed the new holder's lock"
    );
    fresh.release().await?;
    no_residue(h, &name, "after the new holder's release").await?;
    Ok(Outcome::Passed)
}

/// C4: drop without release frees the lock within the crash-release bound.
pub async fn c4_drop_releases(h: &dyn Harness) -> CaseResult {
    let name = unique_name("c4");
    let timing = h.timing();
    let (a, b) = (h.client().await?, h.client().await?);
    let guard = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    drop(guard);
    let mut next = within(
        crash_release_bound(h, b.provider.as_ref())? + timing.handoff_bound,
        "another client's acquire after a dropped guard",
        b.provider.lock(&name)?.acquire(None),
    )
    .await??;
    next.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// C5: client death (provider dropped, connection closed) frees the lock within the bound
/// and a waiting contender acquires.
pub async fn c5_client_death_frees(h: &dyn Harness) -> CaseResult {
    let name = unique_name("c5");
    let timing = h.timing();
    let b = h.client().await?;
    let (guard, waiting) = {
        let a = h.client().await?;
        let guard = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
        let lock = b.provider.lock(&name)?;
        let waiting = tokio::spawn(async move { lock.acquire(None).await });
        tokio::time::sleep(timing.operation_slack / 4).await;
        (guard, waiting)
        // `a` and every lock handle of it are dropped here: the client is dead.
    };
    let mut next = within(
        crash_release_bound(h, b.provider.as_ref())? + timing.handoff_bound,
        "the waiter's grant after the holder's client died",
        waiting,
    )
    .await?
    .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    if b.provider.capabilities().lost_detection {
        ensure!(
            guard.is_lost(),
            "the dead client's guard does not report the loss"
        );
    }
    drop(guard);
    next.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// C6: mem::forget(guard) then drop the provider: freed within the bound.
pub async fn c6_forgotten_guard_freed_with_client(h: &dyn Harness) -> CaseResult {
    let name = unique_name("c6");
    let timing = h.timing();
    let b = h.client().await?;
    {
        let a = h.client().await?;
        let guard = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
        std::mem::forget(guard);
    }
    let mut next = within(
        crash_release_bound(h, b.provider.as_ref())?
            + timing.handoff_bound
            + Duration::from_millis(1),
        "another client's acquire after a forgotten guard's client was dropped",
        b.provider.lock(&name)?.acquire(None),
    )
    .await??;
    next.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}
