//! F. Leases: a lease backend keeps a held lock alive and never hands out an expired one.

use std::time::{Duration, Instant};

use crate::ensure;
use crate::harness::{FaultError, Harness, Property};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{expire_session, lost_by_validity, no_residue, take, unique_name};

const CAPABILITY: &str = "leases";

/// The lease length: the crash-release bound a lease backend declares.
async fn lease_length(h: &dyn Harness) -> Result<Option<Duration>, CaseFailure> {
    let caps = h.client().await?.provider.capabilities();
    Ok(if caps.leases {
        caps.crash_release_bound
    } else {
        None
    })
}

/// F1: holding for three lease lengths keeps the lock (auto-extension); nobody else gets it.
pub async fn f1_auto_extension(h: &dyn Harness) -> CaseResult {
    let Some(ttl) = lease_length(h).await? else {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    };
    let name = unique_name("f1");
    let (a, b) = (h.client().await?, h.client().await?);
    let mut guard = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let other = b.provider.lock(&name)?;
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        ensure!(
            other.try_acquire().await?.is_none(),
            "another client got the lock while it was held and renewed"
        );
        ensure!(
            !guard.is_lost(),
            "the guard was lost although it was renewed"
        );
        tokio::time::sleep(ttl / 4).await;
    }
    guard.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// F2: valid_until is in the future at grant and not later than grant + ttl; and, where the
/// backend declares lost detection, when the holder's session ends (its renewals fail) the
/// lost signal fires by the last `valid_until` plus the operation slack.
pub async fn f2_valid_until_bounds(h: &dyn Harness) -> CaseResult {
    let Some(ttl) = lease_length(h).await? else {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    };
    let name = unique_name("f2");
    let a = h.client().await?;
    let lock = a.provider.lock(&name)?;
    let asked = Instant::now();
    let mut guard = take(lock.as_ref(), "holder").await?;
    let granted = Instant::now();
    let Some(valid_until) = guard.valid_until() else {
        return Err(CaseFailure::new(
            "a lease backend's guard has no valid_until",
        ));
    };
    ensure!(
        valid_until > granted,
        "valid_until is already past at grant"
    );
    ensure!(
        valid_until <= asked + ttl,
        "valid_until is later than the request time plus the ttl {ttl:?}"
    );
    if !a.provider.capabilities().lost_detection {
        guard.release().await?;
        return Ok(Outcome::Passed);
    }
    let timing = h.timing();
    let watching = lost_by_validity(
        &guard,
        ttl + timing.loss_bound + timing.operation_slack,
        timing.operation_slack,
        "the holder's session ended",
    );
    let (expired, reason) = tokio::join!(expire_session(&a), watching);
    expired?;
    ensure!(reason?.is_some(), "the lost signal ended without a loss");
    drop(guard);
    no_residue(h, &name, "after the session's end").await?;
    Ok(Outcome::Passed)
}

/// F3: an acquire that cannot finish inside the validity window fails instead of returning
/// an almost-expired guard.
pub async fn f3_no_expired_grant(h: &dyn Harness) -> CaseResult {
    let Some(ttl) = lease_length(h).await? else {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    };
    let name = unique_name("f3");
    let a = h.client().await?;
    let Some(faults) = a.faults.clone() else {
        return Ok(Outcome::Skipped(Skip::unproven(
            h,
            Property::NoExpiredGrant,
        )));
    };
    match faults.delay_connection(ttl).await {
        Ok(()) => {}
        Err(FaultError::Unsupported) => {
            return Ok(Outcome::Skipped(Skip::unproven(
                h,
                Property::NoExpiredGrant,
            )));
        }
        Err(other) => return Err(other.into()),
    }
    let result = a.provider.lock(&name)?.try_acquire().await;
    faults.restore().await?;
    if let Ok(Some(guard)) = &result {
        let left = guard
            .valid_until()
            .map(|at| at.saturating_duration_since(Instant::now()));
        ensure!(
            left.is_some_and(|left| !left.is_zero()),
            "a grant that took longer than the ttl was returned already expired (valid for {left:?})"
        );
    }
    drop(result);
    Ok(Outcome::Passed)
}
