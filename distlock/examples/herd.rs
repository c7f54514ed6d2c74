//! The herd question in miniature: N clients wait for one lock; how many of them wake up
//! for each release?
//!
//! Told of every release, every waiter wakes and tries, and all but one go back to wait:
//! about N − 1 wake-ups per release, in vain. Queued, each waiter waits for the one before it
//! and only the next one wakes: 1 per release. (`scripts/herd` measures this on real
//! servers; this is the same question on a small scale.)
//!
//! ```text
//! cargo run -p distlock --example herd                            # in-memory backend
//! cargo run -p distlock --features zookeeper --example herd -- zk://127.0.0.1:2181 whole-queue predecessor
//! ```
//!
//! With a URL, the two strategies given (the herd one, then the herd-free one) are compared
//! through the backend's own wake-up counts. Against the in-memory backend, which always
//! queues, the herd side is built here: every waiter is told of every release and tries.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows on the terminal what it does"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use distlock::{LockError, LockProvider};
use tokio::sync::watch;

/// Clients waiting for the lock, and times each of them takes it.
const CLIENTS: usize = 10;
const ROUNDS: usize = 5;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "memory://herd-example".to_owned());
    println!("{CLIENTS} clients, each taking the lock {ROUNDS} times\n");
    println!("| waiters woken by | releases | wake-ups per release | in vain per release |");
    println!("| --- | --- | --- | --- |");
    let rows = match (args.next(), args.next()) {
        (Some(herd), Some(queued)) => vec![
            (
                herd.clone(),
                queued_run(&with_strategy(&url, &herd), &herd).await?,
            ),
            (
                queued.clone(),
                queued_run(&with_strategy(&url, &queued), &queued).await?,
            ),
        ],
        _ => vec![
            (
                "every release (told all)".to_owned(),
                told_all_run(&url).await?,
            ),
            (
                "their turn (the backend's queue)".to_owned(),
                queued_run(&url, "queue").await?,
            ),
        ],
    };
    for (label, counts) in rows {
        let releases = counts.releases as f64;
        println!(
            "| {label} | {} | {:.2} | {:.2} |",
            counts.releases,
            counts.wakeups as f64 / releases,
            counts.futile as f64 / releases
        );
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Counts {
    releases: u64,
    wakeups: u64,
    futile: u64,
}

/// `url` with `strategy=` set.
fn with_strategy(url: &str, strategy: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}strategy={strategy}")
}

async fn clients(url: &str) -> Result<Vec<Arc<dyn LockProvider>>, LockError> {
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(distlock::connect(url).await?);
    }
    Ok(clients)
}

fn task_error(error: tokio::task::JoinError) -> LockError {
    LockError::other("example", error.to_string())
}

/// Every client waits in the backend's queue (`acquire`) for a lock of the run's own; the
/// wake-ups are the backend's.
async fn queued_run(url: &str, run: &str) -> Result<Counts, LockError> {
    let clients = clients(url).await?;
    let before: Vec<_> = clients.iter().map(|c| c.metrics()).collect();
    let name = format!("herd-{run}-{}", std::process::id());
    let mut tasks = Vec::new();
    for client in &clients {
        let lock = client.lock(&name)?;
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let mut guard = lock.acquire(Some(Duration::from_secs(30))).await?;
                tokio::time::sleep(Duration::from_millis(1)).await;
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for task in tasks {
        task.await.map_err(task_error)??;
    }
    let mut counts = Counts {
        releases: (CLIENTS * ROUNDS) as u64,
        ..Counts::default()
    };
    for (client, before) in clients.iter().zip(&before) {
        let done = client.metrics().since(before);
        counts.wakeups += done.wakeups;
        counts.futile += done.futile_wakeups;
    }
    Ok(counts)
}

/// Every client is told of every release (a broadcast, as a watch on the whole lock
/// directory would tell it) and tries; a busy try waits for the next release.
async fn told_all_run(url: &str) -> Result<Counts, LockError> {
    let clients = clients(url).await?;
    let (released, _) = watch::channel(0_u64);
    let released = Arc::new(released);
    let (wakeups, futile) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let name = format!("herd-told-{}", std::process::id());
    let mut tasks = Vec::new();
    for client in &clients {
        let lock = client.lock(&name)?;
        let (released, wakeups, futile) = (
            Arc::clone(&released),
            Arc::clone(&wakeups),
            Arc::clone(&futile),
        );
        tasks.push(tokio::spawn(async move {
            let mut releases = released.subscribe();
            for _ in 0..ROUNDS {
                let mut woken = false;
                let mut guard = loop {
                    releases.borrow_and_update();
                    match lock.try_acquire().await? {
                        Some(guard) => break guard,
                        None if woken => {
                            futile.fetch_add(1, Ordering::Relaxed);
                        }
                        None => {}
                    }
                    // Busy: wait to be told of the next release, then try again.
                    let _ = releases.changed().await;
                    wakeups.fetch_add(1, Ordering::Relaxed);
                    woken = true;
                };
                tokio::time::sleep(Duration::from_millis(1)).await;
                guard.release().await?;
                released.send_modify(|count| *count += 1);
            }
            Ok::<(), LockError>(())
        }));
    }
    for task in tasks {
        task.await.map_err(task_error)??;
    }
    Ok(Counts {
        releases: (CLIENTS * ROUNDS) as u64,
        wakeups: wakeups.load(Ordering::Relaxed),
        futile: futile.load(Ordering::Relaxed),
    })
}
