//! Benchmarks of distlock: what waiting for a lock costs as contenders grow.
//!
//! - The `herd` binary runs the herd scenario ([`scenario`]): for each strategy
//!   ([`Strategy`]) and number of contenders, each contender its own client, it measures
//!   throughput, handoff latency against the floor of raw client operations, wake-ups and
//!   server requests per handoff, and fairness; it prints a table and writes JSON, SVG plots
//!   and a summary ([`report`]). Each backend's herd-free strategy is measured against a
//!   peer's lock on the same server: zookeeper-client's recipe (`zk-recipe`) and etcd's own
//!   lock service (`etcd-v3lock`). `herd --scale N` holds N locks from one provider
//!   ([`scale`]). `cargo run --release -p distlock-benches --bin herd -- --help`.
//! - The criterion benches in `benches/` measure one acquire-release cycle without
//!   contention and the handoff latency from one holder to the next under contention.
//!   Run them with `cargo bench -p distlock-benches`.

pub mod measure;
mod peers;
pub mod report;
pub mod scale;
pub mod scenario;
pub mod strategy;

pub use measure::{Measurement, ScaleMeasurement};
pub use strategy::{Backend, Servers, Strategy};

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lock_core::{LockError, LockProvider};

/// Handoff timings of one contended run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Handoffs {
    /// Handoffs measured (grants after the first).
    pub count: u32,
    /// Sum of the times from a release to the next grant.
    pub total: Duration,
}

/// Every client acquires the lock `name` `rounds` times, waiting with `acquire`, and
/// releases at once; returns the time from each release to the next grant.
///
/// Each client stands for a separate process (its own provider and session).
///
/// # Errors
///
/// The first error a contender met.
pub async fn measure_handoffs(
    clients: &[Arc<dyn LockProvider>],
    name: &str,
    rounds: u32,
) -> Result<Handoffs, LockError> {
    let last_release = Arc::new(Mutex::new((None::<Instant>, Handoffs::default())));
    let mut tasks = Vec::new();
    for client in clients {
        let lock = client.lock(name)?;
        let last_release = Arc::clone(&last_release);
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let mut guard = lock.acquire(None).await?;
                let granted = Instant::now();
                {
                    let mut shared = last_release.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(released) = shared.0.take() {
                        shared.1.count += 1;
                        shared.1.total += granted.saturating_duration_since(released);
                    }
                    shared.0 = Some(Instant::now());
                }
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|join| {
            LockError::other("bench", format!("a contender task failed: {join}")).for_lock(name)
        })??;
    }
    let handoffs = last_release
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .1;
    Ok(handoffs)
}
