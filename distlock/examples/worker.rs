//! A worker: take the lock, write to the store with the lock's fencing token, stop if the
//! lock is lost, release.
//!
//! ```text
//! cargo run -p distlock --example worker                          # in-memory backend
//! cargo run -p distlock --features zookeeper --example worker -- zk://127.0.0.1:2181/app
//! ```

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows on the terminal what it does"
)]

use std::time::Duration;

use distlock::{FencingToken, LockError};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    // One provider per process: it is the session every lock of this process lives in.
    let locks = distlock::connect(&url).await?;
    let lock = locks.lock("reports/nightly")?;

    // Wait at most 10 s for the lock; busy past that is `LockError::Timeout`.
    let mut guard = lock.acquire(Some(Duration::from_secs(10))).await?;
    let token = guard.fencing_token();
    let lost = guard.lost();
    println!("holding {} with fencing token {token}", lock.name());

    // The work, raced against the lost signal: a lock the backend can no longer vouch for
    // (session expired, lease not renewed, key deleted) must stop the work at once.
    tokio::select! {
        reason = lost.wait() => {
            // Stopped before the next write; the exit status tells a script it did not finish.
            return Err(LockError::other("worker", format!("lost the lock ({reason:?})")));
        }
        () = write_report(token) => {}
    }

    // Conditional: frees the lock only if this guard still holds it (`Err(Lost)` otherwise).
    guard.release().await?;
    println!("released");
    Ok(())
}

/// Every write carries the token, so that the store can refuse a writer that lost the lock
/// without knowing it (see the `fenced_store` example).
async fn write_report(token: FencingToken) {
    for part in 1..=3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        println!("  wrote part {part} of the report, fenced by token {token}");
    }
}
