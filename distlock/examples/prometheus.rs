//! A service that takes a lock per request, with a Prometheus exporter: after a contended
//! run it prints what its `/metrics` page shows of the locks (`distlock_*`).
//!
//! ```text
//! cargo run -p distlock --example prometheus                          # in-memory backend
//! cargo run -p distlock --features redis --example prometheus -- redis://127.0.0.1:6379
//! ```
//!
//! A real service serves `handle.render()` on its `/metrics` route (or installs the
//! exporter with its HTTP listener); the locks need nothing more than the recorder.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows on the terminal what it does"
)]

use std::sync::Arc;
use std::time::Duration;

use distlock::{LockError, LockProvider};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Workers serving requests at once, requests each serves, and accounts they touch: eight
/// workers on three accounts wait for each other.
const WORKERS: usize = 8;
const REQUESTS: usize = 25;
const ACCOUNTS: usize = 3;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    // Histograms as buckets (from 100 µs to 10 s), as dashboards graph them.
    let buckets = [0.0001, 0.001, 0.01, 0.1, 1.0, 10.0];
    let exporter = PrometheusBuilder::new()
        .set_buckets(&buckets)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|error| LockError::config(format!("the Prometheus exporter: {error}")))?;

    let locks = distlock::connect(&url).await?;
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let locks = Arc::clone(&locks);
        workers.push(tokio::spawn(
            async move { serve(worker, locks.as_ref()).await },
        ));
    }
    let mut busy = 0;
    for worker in workers {
        busy += worker
            .await
            .map_err(|e| LockError::other("example", e.to_string()))??;
    }
    println!(
        "served {} requests on {ACCOUNTS} accounts, {busy} of them refused as busy\n",
        WORKERS * REQUESTS
    );

    // What the exporter's /metrics page shows of the locks.
    let page = exporter.render();
    let shown: Vec<&str> = page
        .lines()
        .filter(|line| line.contains("distlock_"))
        .filter(|line| !line.contains("_bucket{"))
        .collect();
    for line in &shown {
        println!("{line}");
    }
    if !page.contains("distlock_acquisitions_total{") || !page.contains("distlock_wait_seconds") {
        return Err(LockError::other(
            "example",
            "the exporter shows no acquisitions or waits",
        ));
    }
    Ok(())
}

/// One worker's requests: each takes its account's lock (a wait of at most 2 s), or, one
/// request in five, only tries it and is refused while another holds it.
async fn serve(worker: usize, locks: &dyn LockProvider) -> Result<usize, LockError> {
    let mut busy = 0;
    for request in 0..REQUESTS {
        let account = locks.lock(&format!("accounts/{}", (worker + request) % ACCOUNTS))?;
        let guard = if request % 5 == 0 {
            account.try_acquire().await?
        } else {
            Some(account.acquire(Some(Duration::from_secs(2))).await?)
        };
        let Some(mut guard) = guard else {
            busy += 1;
            continue;
        };
        // The request's work on the account, under its lock.
        tokio::time::sleep(Duration::from_millis(1)).await;
        guard.release().await?;
    }
    Ok(busy)
}
