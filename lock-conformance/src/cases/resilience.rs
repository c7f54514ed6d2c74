//! H. Errors and resilience: bounded errors, nothing left behind, recovery after faults.

use std::time::Duration;

use lock_core::LockError;
use tokio::time::Instant;

use crate::ensure;
use crate::harness::{Client, Entries, FaultError, FaultResult, Harness};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{Occupancy, expect_entries, no_residue, take, unique_name, within};

/// Retries `attempt` while it fails with a retryable error, for at most `bound`.
async fn retrying<T, F, Fut>(bound: Duration, what: &str, mut attempt: F) -> Result<T, CaseFailure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LockError>>,
{
    let deadline = Instant::now() + bound;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(CaseFailure::new(format!("{what}: {error}"))),
        }
    }
}

fn skip_unsupported<T>(result: FaultResult<T>, hook: &str) -> Result<Option<T>, CaseFailure> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(FaultError::Unsupported) => {
            let _ = hook;
            Ok(None)
        }
        Err(other) => Err(other.into()),
    }
}

/// H1: server unreachable: Err(Connection), retryable, within a bounded time.
pub async fn h1_unreachable_is_connection_error(h: &dyn Harness) -> CaseResult {
    let Some(faults) = h.faults() else {
        return Ok(Outcome::Skipped(Skip::missing_hook("server fault", None)));
    };
    let timing = h.timing();
    let bound = timing.loss_bound + timing.operation_slack;
    let started = Instant::now();
    let Some(made) = skip_unsupported(
        within(
            bound,
            "creating a provider of an unreachable server",
            faults.unreachable_provider(),
        )
        .await?,
        "unreachable_provider",
    )?
    else {
        return Ok(Outcome::Skipped(Skip::missing_hook(
            "unreachable_provider",
            None,
        )));
    };
    let error = match made {
        Err(error) => error,
        Ok(provider) => {
            let name = unique_name("h1");
            let lock = provider.lock(&name)?;
            match within(
                bound,
                "acquire on an unreachable server",
                lock.acquire(Some(timing.short_timeout)),
            )
            .await?
            {
                Ok(_) => {
                    return Err(CaseFailure::new(
                        "acquire succeeded against an unreachable server",
                    ));
                }
                Err(error) => error,
            }
        }
    };
    ensure!(
        matches!(error, LockError::Connection { .. }),
        "expected a Connection error, got {error}"
    );
    ensure!(
        error.is_retryable(),
        "the connection error is not retryable"
    );
    ensure!(
        started.elapsed() <= bound,
        "the error took {:?}; the bound is {bound:?}",
        started.elapsed()
    );
    Ok(Outcome::Passed)
}

/// H2 (fault): wrong credentials: an auth error, nothing left behind.
pub async fn h2_wrong_credentials(h: &dyn Harness) -> CaseResult {
    let Some(faults) = h.faults() else {
        return Ok(Outcome::Skipped(Skip::missing_hook("server fault", None)));
    };
    let timing = h.timing();
    let Some(made) = skip_unsupported(
        faults.wrong_credentials_provider().await,
        "wrong_credentials_provider",
    )?
    else {
        return Ok(Outcome::Skipped(Skip::missing_hook(
            "wrong_credentials_provider",
            None,
        )));
    };
    let name = unique_name("h2");
    let error = match made {
        Err(error) => error,
        Ok(provider) => {
            let lock = provider.lock(&name)?;
            match within(
                timing.loss_bound,
                "acquire with wrong credentials",
                lock.acquire(Some(timing.short_timeout)),
            )
            .await?
            {
                Ok(_) => return Err(CaseFailure::new("acquire succeeded with wrong credentials")),
                Err(error) => error,
            }
        }
    };
    ensure!(
        matches!(
            error,
            LockError::Auth { .. } | LockError::PermissionDenied { .. }
        ),
        "expected an auth error, got {error}"
    );
    no_residue(h, &name, "after the refused acquire").await?;
    Ok(Outcome::Passed)
}

/// H3 (fault): server restarted while idle: new acquisitions work again.
pub async fn h3_restart_while_idle(h: &dyn Harness) -> CaseResult {
    let Some(faults) = h.faults() else {
        return Ok(Outcome::Skipped(Skip::missing_hook("server fault", None)));
    };
    let timing = h.timing();
    let name = unique_name("h3");
    let a = h.client().await?;
    let mut before = take(a.provider.lock(&name)?.as_ref(), "before the restart").await?;
    before.release().await?;
    if skip_unsupported(faults.restart_server().await, "restart_server")?.is_none() {
        return Ok(Outcome::Skipped(Skip::missing_hook("restart_server", None)));
    }
    let bound = timing.crash_release_bound + timing.loss_bound;
    let lock = a.provider.lock(&name)?;
    let mut after = retrying(bound, "acquire after the restart (same client)", || {
        lock.acquire(Some(timing.short_timeout))
    })
    .await?;
    after.release().await?;
    let b = h.client().await?;
    let mut fresh = retrying(bound, "acquire after the restart (new client)", || async {
        b.provider
            .lock(&name)?
            .acquire(Some(timing.short_timeout))
            .await
    })
    .await?;
    fresh.release().await?;
    Ok(Outcome::Passed)
}

/// H4 (fault, ZooKeeper): the reply to a create is lost: no orphan node, no deadlock.
pub async fn h4_lost_create_reply(h: &dyn Harness) -> CaseResult {
    let timing = h.timing();
    let name = unique_name("h4");
    let (a, b) = (h.client().await?, h.client().await?);
    let Some(faults) = a.faults.clone() else {
        return Ok(Outcome::Skipped(Skip::missing_hook("client fault", None)));
    };
    for round in 0..5 {
        if skip_unsupported(
            faults.lose_next_create_reply().await,
            "lose_next_create_reply",
        )?
        .is_none()
        {
            return Ok(Outcome::Skipped(Skip::missing_hook(
                "lose_next_create_reply",
                None,
            )));
        }
        let lock = a.provider.lock(&name)?;
        let bound = timing.loss_bound + timing.operation_slack;
        // The acquire may succeed (the node was found and adopted) or fail retryably.
        match within(
            bound,
            &format!("round {round}: acquire with a lost create reply"),
            lock.acquire(Some(bound)),
        )
        .await?
        {
            Ok(mut guard) => {
                expect_entries(
                    h,
                    &name,
                    Entries::new(1, 0),
                    "exactly one node after an adopted create",
                )
                .await?;
                guard.release().await?;
            }
            Err(error) if error.is_retryable() => {}
            Err(error) => return Err(CaseFailure::new(format!("round {round}: {error}"))),
        }
        // No orphan: another client gets the lock, and nothing is left after it.
        let mut other = within(
            timing.crash_release_bound + timing.handoff_bound,
            &format!("round {round}: another client's acquire"),
            b.provider.lock(&name)?.acquire(None),
        )
        .await??;
        other.release().await?;
        no_residue(h, &name, &format!("round {round}: no orphan node")).await?;
    }
    Ok(Outcome::Passed)
}

/// H5 (fault, ensemble): leader killed while held with waiters queued: held throughout, no
/// double grant, waiters served after release.
pub async fn h5_leader_failover(h: &dyn Harness) -> CaseResult {
    let Some(faults) = h.faults() else {
        return Ok(Outcome::Skipped(Skip::missing_hook("server fault", None)));
    };
    const WAITERS: usize = 3;
    let timing = h.timing();
    let name = unique_name("h5");
    let holder = h.client().await?;
    let occupancy = Occupancy::new();
    let mut held = take(holder.provider.lock(&name)?.as_ref(), "holder").await?;
    let inside = occupancy.enter();
    let mut waiters = Vec::new();
    let mut clients: Vec<Client> = Vec::new();
    for _ in 0..WAITERS {
        let client = h.client().await?;
        let lock = client.provider.lock(&name)?;
        let occupancy = occupancy.clone();
        waiters.push(tokio::spawn(async move {
            let waiting = lock.acquire(None).await;
            let mut guard =
                waiting.map_err(|e| CaseFailure::new(format!("a waiter's acquire: {e}")))?;
            {
                let _inside = occupancy.enter();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let released = guard.release().await;
            released.map_err(|e| CaseFailure::new(format!("a waiter's release: {e}")))
        }));
        clients.push(client);
    }
    expect_entries(h, &name, Entries::new(1, WAITERS), "the waiters are queued").await?;
    match faults.kill_leader().await {
        Ok(()) => {}
        Err(FaultError::Unsupported) => {
            drop(inside);
            held.release().await?;
            for waiter in waiters {
                let _ = waiter.await;
            }
            return Ok(Outcome::Skipped(Skip::missing_hook("kill_leader", None)));
        }
        Err(other) => return Err(other.into()),
    }
    tokio::time::sleep(timing.operation_slack).await;
    ensure!(!held.is_lost(), "the holder lost its lock in the failover");
    ensure!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter finished while the lock was held"
    );
    drop(inside);
    let deadline = Instant::now() + timing.loss_bound;
    loop {
        match held.release().await {
            Ok(()) => break,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => {
                return Err(CaseFailure::new(format!(
                    "release after the failover: {error}"
                )));
            }
        }
    }
    within(
        timing.handoff_bound * WAITERS as u32 + timing.loss_bound,
        "serving the waiters after the failover",
        async {
            for waiter in waiters {
                waiter
                    .await
                    .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
            }
            Ok::<(), CaseFailure>(())
        },
    )
    .await??;
    ensure!(
        occupancy.peak() == 1,
        "{} holders at once across the failover",
        occupancy.peak()
    );
    no_residue(h, &name, "after the failover").await?;
    Ok(Outcome::Passed)
}

/// H6 (fault): the waiter's own entry deleted by someone else while waiting: an error or a
/// re-queue; the waiters behind it proceed.
pub async fn h6_waiter_entry_deleted(h: &dyn Harness) -> CaseResult {
    let Some(faults) = h.faults() else {
        return Ok(Outcome::Skipped(Skip::missing_hook("server fault", None)));
    };
    let timing = h.timing();
    let name = unique_name("h6");
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    let mut held = take(a.provider.lock(&name)?.as_ref(), "holder").await?;
    let first_lock = b.provider.lock(&name)?;
    let first =
        tokio::spawn(async move { first_lock.acquire(Some(Duration::from_secs(3600))).await });
    expect_entries(h, &name, Entries::new(1, 1), "the first waiter is queued").await?;
    let second_lock = c.provider.lock(&name)?;
    let second = tokio::spawn(async move { second_lock.acquire(None).await });
    expect_entries(h, &name, Entries::new(1, 2), "the second waiter is queued").await?;
    if skip_unsupported(
        faults.delete_first_waiter(&name).await,
        "delete_first_waiter",
    )?
    .is_none()
    {
        first.abort();
        second.abort();
        held.release().await?;
        return Ok(Outcome::Skipped(Skip::missing_hook(
            "delete_first_waiter",
            None,
        )));
    }
    tokio::time::sleep(timing.operation_slack / 2).await;
    ensure!(!held.is_lost(), "deleting a waiter's entry hurt the holder");
    held.release().await?;
    // Either the first waiter re-queued (and is served) or it failed; the second is served.
    let bound = timing.handoff_bound * 2 + timing.loss_bound;
    let first_result = within(bound, "the first waiter to finish", first)
        .await?
        .map_err(|e| CaseFailure::new(format!("task failed: {e}")))?;
    if let Ok(mut guard) = first_result {
        guard.release().await?;
    }
    let mut guard = within(bound, "the second waiter's grant", second)
        .await?
        .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    guard.release().await?;
    no_residue(h, &name, "after both waiters").await?;
    Ok(Outcome::Passed)
}
