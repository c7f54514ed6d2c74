//! Herd evidence for read-write locks and semaphores: who wakes up when a queue moves.
//!
//! Not cases of the suite: they need many clients, and a backend's help to know when its
//! waiters have settled. A backend's own tests run them for a herd and a herd-free strategy
//! and compare the wake-ups (see `lock-zookeeper/tests/rw_semaphore.rs`).

use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Guard, LockError, MetricsSnapshot};
use tokio::sync::mpsc;

use crate::ensure;
use crate::harness::{Client, Entries, Harness, LockKind};
use crate::outcome::CaseFailure;
use crate::support::{expect_entries_of, unique_name};

/// How long a queue may take to move one step.
const STEP: Duration = Duration::from_secs(5);

/// How long nobody else may enter beside a group that was just served.
const ALONE: Duration = Duration::from_millis(200);

/// The wake-ups a scenario caused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueWakeups {
    /// Wake-ups of the queued clients, from the first release on.
    pub woken: u64,
    /// Those of them that did not let the client in (or move it on).
    pub futile: u64,
    /// Releases made.
    pub releases: u64,
}

/// What a scenario needs to know from the backend beyond the harness.
#[async_trait]
pub trait Settling: Send + Sync {
    /// Returns once every waiter of the lock `name` of `kind` is settled in its wait (its
    /// watch set, no wake-up under way), so that the wake-ups counted from then on are the
    /// scenario's own. The default returns at once: right for a backend whose waiters are
    /// woken by deletions only, which the arrivals do not cause.
    async fn waiters_settled(&self, kind: LockKind, name: &str) -> Result<(), CaseFailure> {
        let _ = (kind, name);
        Ok(())
    }

    /// Returns once the semaphore `name`'s next contender is ready to be woken by a
    /// release: in the design of Curator's `InterProcessSemaphoreV2`, once the holder of
    /// the internal mutex has made its lease (`permits + 1` leases in all).
    async fn semaphore_contender_ready(&self, name: &str, permits: u32) -> Result<(), CaseFailure>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Read,
    Write,
}

/// Wake-ups and wake-ups in vain summed over `clients` since `before`.
fn woken(clients: &[Client], before: &[MetricsSnapshot]) -> (u64, u64) {
    clients
        .iter()
        .zip(before)
        .map(|(client, before)| client.provider.metrics().since(before))
        .fold((0, 0), |(woken, futile), delta| {
            (woken + delta.wakeups, futile + delta.futile_wakeups)
        })
}

/// The next grant, within [`STEP`].
async fn next_grant(
    granted: &mut mpsc::UnboundedReceiver<(usize, Result<Guard, LockError>)>,
    what: &str,
) -> Result<(usize, Guard), CaseFailure> {
    match tokio::time::timeout(STEP, granted.recv()).await {
        Ok(Some((index, guard))) => Ok((index, guard?)),
        _ => Err(CaseFailure::new(format!(
            "{what}: not served within {STEP:?}"
        ))),
    }
}

/// One writer holds; `clients` queue behind it in groups of four readers and a writer (so
/// their number should be a multiple of five), one at a time. The queue is then served
/// group by group, each group released in queue order; every group must enter together and
/// alone, in queue order. A herd-free backend wakes each waiter once, when it can enter.
///
/// # Errors
///
/// A [`CaseFailure`] for a group served out of order or beside another, or a client's error.
pub async fn serve_rw_queue(
    h: &dyn Harness,
    clients: Vec<Client>,
    settling: &dyn Settling,
) -> Result<QueueWakeups, CaseFailure> {
    let name = unique_name("rw-herd");
    let holder = h.client().await?;
    let mut held = holder
        .provider
        .rw_lock(&name)?
        .try_write()
        .await?
        .ok_or_else(|| CaseFailure::new("the write hold of a free lock was refused"))?;
    let plan: Vec<Side> = (0..clients.len())
        .map(|index| match index % 5 {
            4 => Side::Write,
            _ => Side::Read,
        })
        .collect();
    let (grants, mut granted) = mpsc::unbounded_channel();
    for (index, (client, side)) in clients.iter().zip(&plan).enumerate() {
        let lock = client.provider.rw_lock(&name)?;
        let (grants, side) = (grants.clone(), *side);
        tokio::spawn(async move {
            let guard = match side {
                Side::Read => lock.read(None).await,
                Side::Write => lock.write(None).await,
            };
            let _ = grants.send((index, guard));
        });
        // One at a time, so that the queue's order is the plan's.
        let queued = Entries::new(1, index + 1);
        expect_entries_of(h, LockKind::ReadWrite, &name, queued, "queued").await?;
    }
    settling.waiters_settled(LockKind::ReadWrite, &name).await?;
    let before: Vec<_> = clients.iter().map(|c| c.provider.metrics()).collect();
    held.release().await?;
    let mut releases = 1;
    let mut next = 0;
    while next < plan.len() {
        // The group that must enter together: a writer alone, or the readers up to the next
        // writer.
        let size = match plan[next] {
            Side::Write => 1,
            Side::Read => plan[next..]
                .iter()
                .take_while(|side| **side == Side::Read)
                .count(),
        };
        let mut group = Vec::new();
        for _ in 0..size {
            group.push(next_grant(&mut granted, &format!("the group at {next}")).await?);
        }
        group.sort_by_key(|(index, _)| *index);
        let indices: Vec<_> = group.iter().map(|(index, _)| *index).collect();
        ensure!(
            indices == (next..next + size).collect::<Vec<_>>(),
            "served out of order: {indices:?} where the group at {next} was due"
        );
        ensure!(
            tokio::time::timeout(ALONE, granted.recv()).await.is_err(),
            "someone entered beside the group at {next}"
        );
        for (_, mut guard) in group {
            guard.release().await?;
            releases += 1;
        }
        next += size;
    }
    // Every waiter has been granted: its acquire, and every wake-up it counts, is over.
    let (woken, futile) = woken(&clients, &before);
    expect_entries_of(h, LockKind::ReadWrite, &name, Entries::new(0, 0), "served").await?;
    Ok(QueueWakeups {
        woken,
        futile,
        releases,
    })
}

/// `permits` permits held; `clients` queue for the semaphore one at a time; then the
/// holders, and after them each newcomer, release one at a time, each release letting the
/// next queued client in, in queue order. A herd-free backend wakes at most two clients
/// per release: the one it lets in, and the one that takes its place at the head.
///
/// # Errors
///
/// A [`CaseFailure`] for a client served out of order, or a client's error.
pub async fn serve_semaphore_queue(
    h: &dyn Harness,
    clients: Vec<Client>,
    permits: u32,
    settling: &dyn Settling,
) -> Result<QueueWakeups, CaseFailure> {
    let name = unique_name("sem-herd");
    let mut holders = Vec::new();
    let mut holder_clients = Vec::new();
    for _ in 0..permits {
        let client = h.client().await?;
        let semaphore = client.provider.semaphore(&name, permits)?;
        let permit = semaphore.try_acquire().await?;
        holders.push(permit.ok_or_else(|| CaseFailure::new("a free permit was refused"))?);
        holder_clients.push(client);
    }
    let (grants, mut granted) = mpsc::unbounded_channel();
    for (index, client) in clients.iter().enumerate() {
        let semaphore = client.provider.semaphore(&name, permits)?;
        let grants = grants.clone();
        tokio::spawn(async move {
            let _ = grants.send((index, semaphore.acquire(None).await));
        });
        let queued = Entries::new(permits as usize, index + 1);
        expect_entries_of(h, LockKind::Semaphore, &name, queued, "queued").await?;
    }
    settling.semaphore_contender_ready(&name, permits).await?;
    settling.waiters_settled(LockKind::Semaphore, &name).await?;
    let before: Vec<_> = clients.iter().map(|c| c.provider.metrics()).collect();
    let mut releases = 0;
    for expected in 0..clients.len() {
        let mut permit = holders.remove(0);
        permit.release().await?;
        releases += 1;
        let (index, permit) = next_grant(&mut granted, &format!("waiter {expected}")).await?;
        ensure!(
            index == expected,
            "served out of order: {index} where {expected} was due"
        );
        holders.push(permit);
        if expected + 1 < clients.len() {
            let waiting = Entries::new(permits as usize, clients.len() - expected - 1);
            expect_entries_of(h, LockKind::Semaphore, &name, waiting, "the next waits").await?;
            // The counts above cannot tell whether the next contender is ready; wait until
            // it is, so that each release wakes it.
            settling.semaphore_contender_ready(&name, permits).await?;
        }
    }
    // Every queued contender has been granted: its acquire, and every wake-up it counts,
    // is over.
    let (woken, futile) = woken(&clients, &before);
    for mut permit in holders {
        permit.release().await?;
    }
    expect_entries_of(h, LockKind::Semaphore, &name, Entries::new(0, 0), "served").await?;
    Ok(QueueWakeups {
        woken,
        futile,
        releases,
    })
}

/// The verdict on [`serve_rw_queue`] run with `clients` queued, once with a herd strategy
/// and once with a herd-free one: herd-free, each waiter is woken once, when it can enter;
/// the herd wakes everyone on every change.
///
/// # Errors
///
/// A [`CaseFailure`] with both runs' figures when either falls short.
pub fn judge_rw_queue(
    clients: u64,
    herd: QueueWakeups,
    herd_free: QueueWakeups,
) -> Result<(), CaseFailure> {
    ensure!(
        (herd_free.woken, herd_free.futile) == (clients, 0),
        "herd-free: each of {clients} waiters should be woken once, when it can enter: \
         {herd_free:?} (herd: {herd:?})"
    );
    ensure!(
        herd.futile > clients && herd.woken > 2 * clients,
        "the herd variant should wake everyone on every change: {herd:?}"
    );
    Ok(())
}

/// The verdict on [`serve_semaphore_queue`] run once with a herd strategy and once with a
/// herd-free one: herd-free, a release wakes at most the contender it lets in and the next
/// one at the head, never in vain; the herd wakes every waiter.
///
/// # Errors
///
/// A [`CaseFailure`] with both runs' figures when either falls short.
pub fn judge_semaphore_queue(
    herd: QueueWakeups,
    herd_free: QueueWakeups,
) -> Result<(), CaseFailure> {
    ensure!(
        herd_free.futile == 0 && herd_free.woken <= 2 * herd_free.releases,
        "herd-free: at most two wake-ups per release, none in vain: {herd_free:?} (herd: {herd:?})"
    );
    ensure!(
        herd.futile > 0,
        "the herd variant should wake all waiters: {herd:?}"
    );
    Ok(())
}
