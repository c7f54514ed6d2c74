//! M: sets of locks taken all or none ([`lock_core::multi::MultiLock`]) over the backend's
//! mutexes.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::multi::MultiLock;
use lock_core::{Fencing, FencingToken, LockError};

use crate::ensure;
use crate::harness::{Client, Entries, Harness};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::runner::multi_rounds;
use crate::support::{
    Occupancy, TakeAway, expect_entries, fencing_of, no_residue, take, take_away, unique_name,
    within,
};

/// M1: clients taking sets of names in opposite and random orders never deadlock (every set
/// is taken within its own timeout) and never hold a name together: two clients asking for
/// one pair in opposite orders, then five asking for random sets of two and three of four
/// names ([`MULTI_ROUNDS_ENV`](crate::runner::MULTI_ROUNDS_ENV) rounds each, 100 and 20 by
/// default). Where the backend fences, each name's tokens increase from grant to grant.
pub async fn m1_opposite_orders_never_deadlock(h: &dyn Harness) -> CaseResult {
    let names: Vec<String> = (0..4).map(|i| unique_name(&format!("m1-{i}"))).collect();
    let timing = h.timing();
    let fenced = fencing_of(h).await? != Fencing::None;
    // Each name's last token granted, across both rounds of clients.
    let tokens: Arc<Vec<Mutex<Option<FencingToken>>>> =
        Arc::new(names.iter().map(|_| Mutex::new(None)).collect());
    for (clients, rounds) in [(2_usize, multi_rounds(100)), (5, multi_rounds(20))] {
        // A set waits at most for every other client's set, member by member.
        let per_set = timing.handoff_bound * u32::try_from(clients * 3).unwrap_or(u32::MAX)
            + timing.operation_slack;
        let occupancy: Arc<Vec<Occupancy>> =
            Arc::new(names.iter().map(|_| Occupancy::new()).collect());
        let mut tasks = Vec::new();
        let mut kept: Vec<Client> = Vec::new();
        for index in 0..clients {
            let client = h.client().await?;
            let (provider, names, occupancy, tokens) = (
                Arc::clone(&client.provider),
                names.clone(),
                Arc::clone(&occupancy),
                Arc::clone(&tokens),
            );
            tasks.push(tokio::spawn(async move {
                for round in 0..rounds {
                    let mut picked: Vec<usize> = match clients {
                        2 => vec![0, 1],
                        _ => (0..names.len()).collect(),
                    };
                    if clients == 2 && index == 1 {
                        picked.reverse();
                    } else if clients > 2 {
                        fastrand::shuffle(&mut picked);
                        picked.truncate(2 + round % 2);
                    }
                    let set = MultiLock::locks(
                        provider.as_ref(),
                        picked.iter().map(|&i| names[i].as_str()),
                    )?;
                    let mut held = match set.acquire(Some(per_set)).await {
                        Err(LockError::Timeout { .. }) => {
                            return Err(CaseFailure::new(format!(
                                "client {index}'s set {picked:?} of round {round} was not \
                                 taken within {per_set:?} (a deadlock?)"
                            )));
                        }
                        held => held?,
                    };
                    {
                        let _inside: Vec<_> =
                            picked.iter().map(|&i| occupancy[i].enter()).collect();
                        let granted = held.fencing_tokens();
                        for (&i, &token) in picked.iter().zip(&granted).filter(|_| fenced) {
                            let mut last = tokens[i].lock().unwrap_or_else(PoisonError::into_inner);
                            if let Some(last) = last.filter(|last| token <= *last) {
                                return Err(CaseFailure::new(format!(
                                    "name {i}'s token went from {last:?} to {token:?}"
                                )));
                            }
                            *last = Some(token);
                        }
                        tokio::task::yield_now().await;
                    }
                    held.release().await.map_err(|e| e.into_error())?;
                }
                Ok::<(), CaseFailure>(())
            }));
            kept.push(client);
        }
        // The clients run side by side, each taking its sets one after the other.
        let bound = per_set * u32::try_from(rounds).unwrap_or(u32::MAX);
        let all = async {
            for task in tasks {
                task.await
                    .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
            }
            Ok::<(), CaseFailure>(())
        };
        within(
            bound,
            &format!("{clients} clients' sets (a deadlock?)"),
            all,
        )
        .await??;
        for (name, occupancy) in names.iter().zip(occupancy.iter()) {
            ensure!(
                occupancy.peak() <= 1,
                "{} clients held {name:?} at once",
                occupancy.peak()
            );
        }
    }
    for name in &names {
        no_residue(h, name, "after the sets").await?;
    }
    Ok(Outcome::Passed)
}

/// M2: a set that times out, and one dropped at each of its waits (the members before it
/// held) or at any moment of an acquire that meets nobody (its requests in flight), holds
/// nothing and leaves nothing; another client then takes every member.
pub async fn m2_timeout_and_cancel_leave_nothing(h: &dyn Harness) -> CaseResult {
    let timing = h.timing();
    let names = [
        unique_name("m2-a"),
        unique_name("m2-b"),
        unique_name("m2-c"),
    ];
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    // Named last first: taken a, b, c all the same.
    let set = MultiLock::locks(a.provider.as_ref(), names.iter().rev().map(String::as_str))?;
    let mut busy = take(
        c.provider.lock(&names[2])?.as_ref(),
        "the last member's holder",
    )
    .await?;
    match set.acquire(Some(timing.short_timeout)).await {
        Err(LockError::Timeout { .. }) => {}
        other => {
            return Err(CaseFailure::new(format!(
                "a set with a held member: expected a timeout, got {other:?}"
            )));
        }
    }
    for name in &names[..2] {
        free_for(h, &b, name, "after the timeout").await?;
    }
    expect_entries(
        h,
        &names[2],
        Entries::new(1, 0),
        "the holder alone after the timeout",
    )
    .await?;
    busy.release().await?;
    for (at, name) in names.iter().enumerate() {
        let mut busy = take(c.provider.lock(name)?.as_ref(), "a member's holder").await?;
        let waiting = {
            let set = set.clone();
            tokio::spawn(async move { set.acquire(None).await })
        };
        let when = format!("the set dropped while it waited for member {at}");
        expect_entries(h, name, Entries::new(1, 1), &format!("{when}: it waits")).await?;
        waiting.abort();
        let _ = waiting.await;
        // The members taken before were dropped with the future: released in the background.
        for other in names.iter().filter(|other| *other != name) {
            no_residue(h, other, &when).await?;
        }
        expect_entries(h, name, Entries::new(1, 0), &when).await?;
        busy.release().await?;
    }
    for _ in 0..10 {
        let acquiring = {
            let set = set.clone();
            tokio::spawn(async move { set.acquire(None).await })
        };
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..3_000))).await;
        acquiring.abort();
        let _ = acquiring.await;
    }
    for name in &names {
        free_for(h, &b, name, "after the drops").await?;
        no_residue(h, name, "after the drops").await?;
    }
    Ok(Outcome::Passed)
}

/// M3: (lost_detection) a member of a held set lost (the holder's session ends) fires the
/// set's signal, and its release reports that member.
pub async fn m3_member_lost_fires_the_sets_signal(h: &dyn Harness) -> CaseResult {
    let a = h.client().await?;
    if !a.provider.capabilities().lost_detection {
        return Ok(Outcome::Skipped(Skip::not_declared("lost_detection")));
    }
    let (first, second) = (unique_name("m3-a"), unique_name("m3-b"));
    let set = MultiLock::locks(a.provider.as_ref(), [first.as_str(), second.as_str()])?;
    let mut held = within(h.timing().operation_slack, "the set", set.acquire(None)).await??;
    let lost = held.lost();
    take_away(h, &a, &first, TakeAway::SessionExpiry).await?;
    let reason = within(h.timing().loss_bound, "the set's lost signal", lost.wait()).await?;
    ensure!(reason.is_some(), "the set's signal ended without a loss");
    ensure!(held.is_lost(), "the set does not report the loss");
    match held.release().await {
        Err(failed) => ensure!(
            failed
                .failures
                .iter()
                .any(|(_, e)| matches!(e, LockError::Lost { .. })),
            "the release reports no lost member: {failed}"
        ),
        Ok(()) => {
            return Err(CaseFailure::new(
                "a set with a lost member released cleanly",
            ));
        }
    }
    for name in [&first, &second] {
        no_residue(h, name, "after the loss").await?;
    }
    Ok(Outcome::Passed)
}

/// Another client takes `name` (and gives it back) within the crash-release bound: the
/// set's member may have been released in the background.
async fn free_for(
    h: &dyn Harness,
    client: &Client,
    name: &str,
    when: &str,
) -> Result<(), CaseFailure> {
    let lock = client.provider.lock(name)?;
    let bound = h.timing().crash_release_bound + h.timing().handoff_bound;
    let what = format!("another client's acquire of {name:?} {when}");
    let mut guard = within(bound, &what, lock.acquire(None)).await??;
    guard.release().await?;
    Ok(())
}
