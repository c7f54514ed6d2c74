//! What the store a lock protects must do: refuse a write whose fencing token is older than
//! one it has already seen.
//!
//! A lock alone cannot stop a holder that was paused (a GC pause, a frozen VM, a slow
//! network) past its session or lease: by the time its write arrives, someone else holds
//! the lock. The token orders the holders, so the store can refuse the late one.
//!
//! ```text
//! cargo run -p distlock --example fenced_store                    # in-memory backend
//! cargo run -p distlock --features etcd --example fenced_store -- etcd://127.0.0.1:2379
//! ```

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows on the terminal what it does"
)]

use std::sync::Mutex;

use distlock::{FencingToken, LockError};

/// A value guarded by fencing tokens: the store side of the bargain.
#[derive(Default)]
struct FencedStore {
    /// The largest token a write came with, and the value written.
    state: Mutex<(Option<FencingToken>, String)>,
}

impl FencedStore {
    /// Writes `value` unless a later holder has written already. The check and the write
    /// are one step (here a mutex; in a database, a conditional `UPDATE ... WHERE token <=
    /// $1`).
    fn write(&self, token: FencingToken, value: &str) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(seen) = state.0.filter(|seen| token < *seen) {
            return Err(format!("stale token {token}: the store has seen {seen}"));
        }
        *state = (Some(token), value.to_owned());
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    let locks = distlock::connect(&url).await?;
    let lock = locks.lock("accounts/17")?;
    let store = FencedStore::default();

    // Client A holds the lock and writes; then it stalls, and its lock goes to client B
    // (released here; in real life, its session or lease ran out while A was frozen).
    let mut a = lock.acquire(None).await?;
    let a_token = a.fencing_token();
    store.write(a_token, "A: balance 100").map_err(other)?;
    a.release().await?;

    let mut b = lock.acquire(None).await?;
    store
        .write(b.fencing_token(), "B: balance 90")
        .map_err(other)?;
    println!(
        "A wrote with token {a_token}, then B with {}",
        b.fencing_token()
    );

    // A wakes up and sends the write it had prepared: the store refuses it.
    match store.write(a_token, "A: balance 150") {
        Err(refused) => println!("A's late write refused: {refused}"),
        Ok(()) => return Err(other("a stale write was accepted".to_owned())),
    }
    b.release().await?;
    Ok(())
}

fn other(message: String) -> LockError {
    LockError::other("fenced_store example", message)
}
