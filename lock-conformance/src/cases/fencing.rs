//! E. Fencing: tokens strictly increase across holders, and a fenced store shuts out a
//! stale holder.

use lock_core::{Fencing, FencingToken, LockError};

use crate::ensure;
use crate::harness::{FaultError, Harness, Property};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{
    FencedStore, TakeAway, by_every_take_away, fencing_of, no_residue, not_offered, take,
    take_over, unique_name, within,
};

const CAPABILITY: &str = "fencing";

/// E1: tokens strictly increase across successive holders, same client and different clients.
pub async fn e1_tokens_increase(h: &dyn Harness) -> CaseResult {
    if fencing_of(h).await? == Fencing::None {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let name = unique_name("e1");
    let clients = [h.client().await?, h.client().await?, h.client().await?];
    let mut last: Option<FencingToken> = None;
    // Same client twice in a row, then the others.
    for index in [0usize, 0, 1, 2, 1, 0, 2, 2] {
        let mut guard = take(
            clients[index].provider.lock(&name)?.as_ref(),
            "successive holder",
        )
        .await?;
        let token = guard.fencing_token();
        if let Some(last) = last {
            ensure!(
                token > last,
                "token {token} after {last}: not strictly increasing"
            );
        }
        last = Some(token);
        guard.release().await?;
    }
    no_residue(h, &name, "after the last release").await?;
    Ok(Outcome::Passed)
}

/// E2: the holder after a take-over (the stale holder's session's end, and a revoke where
/// the harness offers one) has a larger token than the stale holder.
pub async fn e2_token_after_takeover_is_larger(h: &dyn Harness) -> CaseResult {
    if fencing_of(h).await? == Fencing::None {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    by_every_take_away(|how| e2_by(h, how)).await
}

async fn e2_by(h: &dyn Harness, how: TakeAway) -> CaseResult {
    let name = unique_name("e2");
    let (a, b) = (h.client().await?, h.client().await?);
    let stale = take(a.provider.lock(&name)?.as_ref(), "first holder").await?;
    let Some(mut fresh) = take_over(h, &a, &b, &name, how).await? else {
        return Ok(not_offered(how));
    };
    ensure!(
        fresh.fencing_token() > stale.fencing_token(),
        "the new holder's token {} is not above the stale holder's {}",
        fresh.fencing_token(),
        stale.fencing_token()
    );
    drop(stale);
    fresh.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// E3: a fenced store accepts the new holder's writes and rejects the stale holder's
/// (after each way of taking the lock away, as E2).
pub async fn e3_fenced_store_rejects_stale(h: &dyn Harness) -> CaseResult {
    if fencing_of(h).await? == Fencing::None {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    by_every_take_away(|how| e3_by(h, how)).await
}

async fn e3_by(h: &dyn Harness, how: TakeAway) -> CaseResult {
    let name = unique_name("e3");
    let store = FencedStore::new();
    let (a, b) = (h.client().await?, h.client().await?);
    let stale = take(a.provider.lock(&name)?.as_ref(), "first holder").await?;
    store
        .write(stale.fencing_token(), "stale holder, while it held")
        .context_stale()?;
    let Some(mut fresh) = take_over(h, &a, &b, &name, how).await? else {
        return Ok(not_offered(how));
    };
    store
        .write(fresh.fencing_token(), "new holder")
        .context_stale()?;
    // The stale holder wakes from its pause and writes with its old token.
    ensure!(
        store
            .write(stale.fencing_token(), "stale holder, after the take-over")
            .is_err(),
        "the fenced store accepted the stale holder's write"
    );
    let writers: Vec<_> = store.writes().into_iter().map(|(_, value)| value).collect();
    ensure!(
        writers == ["stale holder, while it held", "new holder"],
        "the store holds {writers:?}"
    );
    drop(stale);
    fresh.release().await?;
    Ok(Outcome::Passed)
}

trait StaleContext {
    fn context_stale(self) -> Result<(), CaseFailure>;
}

impl StaleContext for Result<(), crate::support::StaleToken> {
    fn context_stale(self) -> Result<(), CaseFailure> {
        self.map_err(|e| {
            CaseFailure::new(format!("the fenced store rejected a current holder: {e}"))
        })
    }
}

/// E4 (cap monotonic, fault): tokens keep increasing across a server restart or leader
/// failover.
pub async fn e4_tokens_survive_restart(h: &dyn Harness) -> CaseResult {
    if fencing_of(h).await? != Fencing::Monotonic {
        return Ok(Outcome::Skipped(Skip::not_declared("monotonic fencing")));
    }
    let Some(faults) = h.faults() else {
        return Ok(Outcome::Skipped(Skip::unproven(
            h,
            Property::TokensSurviveRestart,
        )));
    };
    let name = unique_name("e4");
    let timing = h.timing();
    let a = h.client().await?;
    let mut before = take(
        a.provider.lock(&name)?.as_ref(),
        "holder before the restart",
    )
    .await?;
    let token_before = before.fencing_token();
    before.release().await?;
    let restarted = match faults.restart_server().await {
        Ok(()) => "restart",
        Err(FaultError::Unsupported) => match faults.kill_leader().await {
            Ok(()) => "leader failover",
            Err(FaultError::Unsupported) => {
                return Ok(Outcome::Skipped(Skip::unproven(
                    h,
                    Property::TokensSurviveRestart,
                )));
            }
            Err(other) => return Err(other.into()),
        },
        Err(other) => return Err(other.into()),
    };
    let b = h.client().await?;
    let mut after = within(
        timing.crash_release_bound + timing.loss_bound,
        &format!("an acquire after the {restarted}"),
        async {
            loop {
                match b.provider.lock(&name)?.try_acquire().await {
                    Ok(Some(guard)) => return Ok::<_, LockError>(guard),
                    Ok(None) => {}
                    Err(error) if error.is_retryable() => {}
                    Err(error) => return Err(error),
                }
                tokio::time::sleep(timing.operation_slack / 4).await;
            }
        },
    )
    .await??;
    ensure!(
        after.fencing_token() > token_before,
        "after the {restarted} the token {} is not above {token_before}",
        after.fencing_token()
    );
    after.release().await?;
    Ok(Outcome::Passed)
}
