//! Several locks at once, all or none: moving money between two accounts while another
//! client moves it the other way. The set is taken in one order by name, whatever order it
//! is asked in, so the two never wait on each other.
//!
//! ```text
//! cargo run -p distlock --example transfer                        # in-memory backend
//! cargo run -p distlock --features postgres --example transfer -- postgres://app@127.0.0.1/app
//! ```

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows on the terminal what it does"
)]

use std::time::Duration;

use distlock::LockError;
use distlock::multi::MultiLock;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // Two clients of one server (the in-memory one is named so that both reach it).
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://transfer-example".to_owned());
    let alice = tokio::spawn(transfers(url.clone(), "account/17", "account/4"));
    let bob = tokio::spawn(transfers(url, "account/4", "account/17"));
    for client in [alice, bob] {
        client
            .await
            .map_err(|e| LockError::other("example", e.to_string()))??;
    }
    Ok(())
}

/// Ten transfers from `from` to `to`, each under both accounts' locks.
async fn transfers(url: String, from: &str, to: &str) -> Result<(), LockError> {
    let locks = distlock::connect(&url).await?;
    let accounts = MultiLock::locks(locks.as_ref(), [from, to])?;
    for round in 1..=10 {
        // One timeout for the whole set; on a timeout or an error nothing stays held.
        let mut both = accounts.acquire(Some(Duration::from_secs(10))).await?;
        // The tokens, in the order the names were given: fence each account's write.
        let tokens = both.fencing_tokens();
        println!(
            "{from} -> {to}, transfer {round}: tokens {} and {}",
            tokens[0], tokens[1]
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        // Releases every member, and reports each one that failed.
        both.release().await.map_err(|failed| failed.into_error())?;
    }
    Ok(())
}
