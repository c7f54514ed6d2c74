//! I. Read-write locks: readers share, a writer excludes everyone, and the queue is fair.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_core::{DistributedRwLock, Guard, LockError};

use crate::ensure;
use crate::harness::{Client, Entries, Harness, LockKind};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{expect_entries_of, no_residue, unique_name, within};

const CAPABILITY: &str = "reader_writer";

async fn rw(client: &Client, name: &str) -> Result<Arc<dyn DistributedRwLock>, CaseFailure> {
    Ok(client.provider.rw_lock(name)?)
}

async fn declared(h: &dyn Harness) -> Result<bool, CaseFailure> {
    Ok(h.client().await?.provider.capabilities().reader_writer)
}

async fn try_read(client: &Client, name: &str, what: &str) -> Result<Guard, CaseFailure> {
    rw(client, name)
        .await?
        .try_read()
        .await?
        .ok_or_else(|| CaseFailure::new(format!("{what}: a read hold was refused")))
}

/// I1: many readers hold together.
pub async fn i1_readers_share(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let name = unique_name("i1");
    let mut clients = Vec::new();
    let mut guards = Vec::new();
    for index in 0..4 {
        let client = h.client().await?;
        guards.push(try_read(&client, &name, &format!("reader {index}")).await?);
        clients.push(client);
    }
    expect_entries_of(
        h,
        LockKind::ReadWrite,
        &name,
        Entries::new(4, 0),
        "four readers hold",
    )
    .await?;
    for mut guard in guards {
        guard.release().await?;
    }
    no_residue(h, &name, "after the readers").await?;
    Ok(Outcome::Passed)
}

/// I2: a writer excludes readers and writers.
pub async fn i2_writer_excludes(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let name = unique_name("i2");
    let (a, b, c) = (h.client().await?, h.client().await?, h.client().await?);
    let mut writer = rw(&a, &name)
        .await?
        .try_write()
        .await?
        .ok_or_else(|| CaseFailure::new("the write hold of a free lock was refused"))?;
    ensure!(
        rw(&b, &name).await?.try_read().await?.is_none(),
        "a reader got in while a writer held"
    );
    ensure!(
        rw(&c, &name).await?.try_write().await?.is_none(),
        "a second writer got in"
    );
    ensure!(
        rw(&a, &name).await?.try_read().await?.is_none(),
        "the writer's own client got a read hold (no downgrade)"
    );
    writer.release().await?;
    let mut reader = try_read(&b, &name, "after the writer left").await?;
    ensure!(
        rw(&c, &name).await?.try_write().await?.is_none(),
        "a writer got in while a reader held"
    );
    reader.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

/// I3: a waiting writer blocks readers that arrive after it; readers queued behind one
/// writer enter together when it leaves.
pub async fn i3_fair_queue(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    const LATE_READERS: usize = 3;
    let timing = h.timing();
    let name = unique_name("i3");
    let (first, writer_client, probe) = (h.client().await?, h.client().await?, h.client().await?);
    let mut first_reader = try_read(&first, &name, "first reader").await?;
    let writer_lock = rw(&writer_client, &name).await?;
    let writer = tokio::spawn(async move { writer_lock.write(None).await });
    expect_entries_of(
        h,
        LockKind::ReadWrite,
        &name,
        Entries::new(1, 1),
        "the writer waits",
    )
    .await?;
    tokio::time::sleep(timing.operation_slack / 4).await;
    // Readers arriving after the waiting writer; each records when it got in and holds until
    // all of them are in (or the bound passes).
    let inside = Arc::new(AtomicUsize::new(0));
    let together = Arc::new(tokio::sync::Notify::new());
    let mut late = Vec::new();
    let mut late_clients = Vec::new();
    for _ in 0..LATE_READERS {
        let client = h.client().await?;
        let lock = rw(&client, &name).await?;
        let (inside, together) = (Arc::clone(&inside), Arc::clone(&together));
        let bound = timing.handoff_bound;
        late.push(tokio::spawn(async move {
            let mut guard = lock.read(None).await?;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            if now == LATE_READERS {
                together.notify_waiters();
            } else {
                let _ = tokio::time::timeout(bound, together.notified()).await;
            }
            let peak = inside.load(Ordering::SeqCst);
            guard.release().await?;
            Ok::<usize, LockError>(peak)
        }));
        late_clients.push(client);
    }
    expect_entries_of(
        h,
        LockKind::ReadWrite,
        &name,
        Entries::new(1, 1 + LATE_READERS),
        "the late readers queue behind the writer",
    )
    .await?;
    tokio::time::sleep(timing.operation_slack / 4).await;
    ensure!(
        rw(&probe, &name).await?.try_read().await?.is_none(),
        "a reader jumped a waiting writer"
    );
    ensure!(
        inside.load(Ordering::SeqCst) == 0,
        "a late reader got in before the waiting writer"
    );
    first_reader.release().await?;
    let mut write_guard = within(timing.handoff_bound, "the writer's grant", writer)
        .await?
        .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    tokio::time::sleep(timing.operation_slack / 4).await;
    ensure!(
        inside.load(Ordering::SeqCst) == 0,
        "a reader got in while the writer held"
    );
    write_guard.release().await?;
    let mut peaks = Vec::new();
    for reader in late {
        let peak = within(timing.handoff_bound * 2, "the late readers", reader)
            .await?
            .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
        peaks.push(peak);
    }
    ensure!(
        peaks.contains(&LATE_READERS),
        "the readers behind the writer did not hold together (peaks {peaks:?})"
    );
    no_residue(h, &name, "after everyone").await?;
    Ok(Outcome::Passed)
}

/// I4: randomized stress (~10% writers): never a writer with anyone; more than one reader
/// seen at once.
pub async fn i4_stress(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    rw_stress(h, 6, 15).await?;
    Ok(Outcome::Passed)
}

/// What a read-write stress run saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwStressReport {
    /// Read holds granted.
    pub reads: usize,
    /// Write holds granted.
    pub writes: usize,
    /// The most readers inside at once.
    pub most_readers: usize,
}

/// A randomized stress run: `clients` clients each take the read-write lock `rounds` times,
/// about one time in ten as writers, holding for a few milliseconds. Checks that no writer
/// ever shares the lock, that readers do share it, and that nothing is left behind.
///
/// I4 runs it with six clients; a backend's own tests can run it bigger.
///
/// # Errors
///
/// A [`CaseFailure`] naming the broken invariant, or the error a client met.
pub async fn rw_stress(
    h: &dyn Harness,
    clients: usize,
    rounds: usize,
) -> Result<RwStressReport, CaseFailure> {
    let timing = h.timing();
    let name = unique_name("rw-stress");
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let writes = Arc::new(AtomicUsize::new(0));
    let mut connected = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = h.client().await?;
        let lock = rw(&client, &name).await?;
        let (readers, writers, most_readers, overlaps, writes) = (
            readers.clone(),
            writers.clone(),
            most_readers.clone(),
            overlaps.clone(),
            writes.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let writing = fastrand::u8(0..10) == 0;
                let mut guard = if writing {
                    lock.write(None).await?
                } else {
                    lock.read(None).await?
                };
                if writing {
                    writes.fetch_add(1, Ordering::SeqCst);
                    let w = writers.fetch_add(1, Ordering::SeqCst) + 1;
                    if w > 1 || readers.load(Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(1..4))).await;
                    writers.fetch_sub(1, Ordering::SeqCst);
                } else {
                    let r = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    most_readers.fetch_max(r, Ordering::SeqCst);
                    if writers.load(Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(2..8))).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                }
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        }));
        connected.push(client);
    }
    let bound = timing.handoff_bound * (clients * rounds) as u32;
    within(bound, "the read-write stress run", async {
        for task in tasks {
            task.await
                .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
        }
        Ok::<(), CaseFailure>(())
    })
    .await??;
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(overlaps == 0, "a writer shared the lock {overlaps} times");
    let most_readers = most_readers.load(Ordering::SeqCst);
    ensure!(
        most_readers > 1,
        "never more than {most_readers} reader at once: readers do not share"
    );
    no_residue(h, &name, "after the stress run").await?;
    let writes = writes.load(Ordering::SeqCst);
    Ok(RwStressReport {
        reads: clients * rounds - writes,
        writes,
        most_readers,
    })
}

/// I5: timeouts and cancels of read and write acquisitions leave no residue.
pub async fn i5_timeouts_and_cancels_leave_nothing(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let timing = h.timing();
    let name = unique_name("i5");
    let (a, b) = (h.client().await?, h.client().await?);
    let lock = rw(&b, &name).await?;
    // A writer holds: a read and a write time out, and a cancelled read leaves nothing.
    let mut writer = rw(&a, &name)
        .await?
        .try_write()
        .await?
        .ok_or_else(|| CaseFailure::new("write hold refused"))?;
    let short = Some(timing.short_timeout);
    ensure!(
        matches!(lock.read(short).await, Err(LockError::Timeout { .. })),
        "read did not time out under a writer"
    );
    ensure!(
        matches!(lock.write(short).await, Err(LockError::Timeout { .. })),
        "write did not time out under a writer"
    );
    cancel_queued(
        h,
        &name,
        &lock,
        Side::Read,
        "a cancelled read under a writer",
    )
    .await?;
    writer.release().await?;
    // A reader holds: a write times out, and a cancelled write leaves nothing.
    let mut reader = try_read(&a, &name, "reader").await?;
    ensure!(
        matches!(lock.write(short).await, Err(LockError::Timeout { .. })),
        "write did not time out under a reader"
    );
    cancel_queued(
        h,
        &name,
        &lock,
        Side::Write,
        "a cancelled write under a reader",
    )
    .await?;
    // Nothing left blocks a newcomer reader.
    let mut another = within(
        timing.operation_slack,
        "a read after the cancelled writer",
        lock.read(None),
    )
    .await??;
    another.release().await?;
    reader.release().await?;
    no_residue(h, &name, "after release").await?;
    Ok(Outcome::Passed)
}

#[derive(Clone, Copy)]
enum Side {
    Read,
    Write,
}

/// Queues a read or write behind the one holder, cancels it, and checks that only the
/// holder is left on the server.
async fn cancel_queued(
    h: &dyn Harness,
    name: &str,
    lock: &Arc<dyn DistributedRwLock>,
    side: Side,
    what: &str,
) -> Result<(), CaseFailure> {
    let lock = Arc::clone(lock);
    let queued = tokio::spawn(async move {
        match side {
            Side::Read => lock.read(None).await,
            Side::Write => lock.write(None).await,
        }
    });
    expect_entries_of(
        h,
        LockKind::ReadWrite,
        name,
        Entries::new(1, 1),
        &format!("{what}: queued"),
    )
    .await?;
    queued.abort();
    let _ = queued.await;
    expect_entries_of(
        h,
        LockKind::ReadWrite,
        name,
        Entries::new(1, 0),
        &format!("{what}: removed"),
    )
    .await
}
