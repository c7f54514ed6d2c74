//! Choosing the backend: the URL's scheme picks it at run time, among those compiled in by
//! cargo features (`memory` by default; `zookeeper`, `redis`, `etcd`, `postgres`).
//!
//! ```text
//! cargo run -p distlock --example choose_backend                  # what this build accepts
//! cargo run -p distlock --features redis --example choose_backend -- redis://127.0.0.1:6379
//! ```

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows on the terminal what it does"
)]

use distlock::{BackendConfig, LockError};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // Parsing checks the URL without connecting: a scheme whose feature is off is an error
    // that names the feature to enable.
    for url in [
        "memory://",
        "zk://127.0.0.1:2181/app?session_timeout=10s",
        "redis://127.0.0.1:6379?strategy=queue",
        "etcd://127.0.0.1:2379",
        "postgres://app@127.0.0.1/app",
        // A misspelt parameter is an error that lists the right ones (with the feature on).
        "zk://127.0.0.1:2181?sesion_timeout=10s",
    ] {
        match BackendConfig::from_url(url) {
            Ok(config) => println!("{url}\n  -> the {} backend", config.backend()),
            Err(error) => println!("{url}\n  -> {error}"),
        }
    }

    // Connecting gives the provider; its capabilities say what it promises.
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    let locks = distlock::connect(&url).await?;
    let capabilities = locks.capabilities();
    println!(
        "connected to {url}: backend {}, fencing {:?}, lost detection {}, waiters woken {:?}",
        locks.backend(),
        capabilities.fencing,
        capabilities.lost_detection,
        capabilities.wait,
    );
    Ok(())
}
