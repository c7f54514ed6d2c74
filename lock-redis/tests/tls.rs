//! `rediss://` against a real Redis server listening with TLS, its certificate signed by a
//! certificate authority made for the test (`lock_testbed::certs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::{Duration, Instant};

use lock_conformance::unique_name;
use lock_core::{LockError, LockProvider};
use lock_redis::{RedisLockProvider, RedlockProvider};
use lock_testbed::certs;
use lock_testbed::servers::{RedisOptions, RedisServer, free_port};

/// How long a waiter may wait, and the bound on it queueing.
const BOUND: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_urls_lock_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    certs::authority(dir.path(), "ca").unwrap();
    certs::authority(dir.path(), "stranger").unwrap();
    certs::server_certificate(dir.path(), "ca").unwrap();
    let tls_port = free_port().unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let _server = RedisServer::start(
        RedisOptions::default()
            .with_password(common::ADMIN_PASSWORD)
            .with_arg("--tls-port")
            .with_arg(tls_port.to_string())
            .with_arg("--tls-cert-file")
            .with_arg(file("server.crt"))
            .with_arg("--tls-key-file")
            .with_arg(file("server.key"))
            .with_arg("--tls-ca-cert-file")
            .with_arg(file("ca.crt"))
            .with_arg("--tls-auth-clients")
            .with_arg("no"),
    )
    .await
    .unwrap();
    let url = |ca: &str| {
        format!(
            "rediss://:{}@127.0.0.1:{tls_port}?ttl=2s&timeout=2s&tls_ca={}",
            common::ADMIN_PASSWORD,
            file(&format!("{ca}.crt"))
        )
    };

    // Trusting the server's authority: two providers exclude each other over TLS.
    let a = RedisLockProvider::connect_url(&url("ca")).await.unwrap();
    let b = RedisLockProvider::connect_url(&url("ca")).await.unwrap();
    let name = unique_name("tls");
    let mut held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    let waiter = b.lock(&name).unwrap();
    assert!(
        waiter.try_acquire().await.unwrap().is_none(),
        "two holders over TLS"
    );
    let waiting = tokio::spawn(async move { waiter.acquire(Some(BOUND)).await });
    // The release hands the lock to the waiter once it is in the queue.
    let _queued = common::wait_until(
        BOUND,
        "the waiter queues over TLS",
        || a.holders(&name),
        |holders| matches!(holders, Ok(holders) if holders.queue.len() == 1),
    )
    .await;
    held.release().await.unwrap();
    let mut next = waiting.await.unwrap().unwrap();
    assert!(next.fencing_token() > held.fencing_token());
    next.release().await.unwrap();

    // Redlock over TLS too.
    let redlock = RedlockProvider::connect_url(&format!(
        "redlock://:{}@127.0.0.1:{tls_port}?tls=true&ttl=2s&timeout=2s&tls_ca={}",
        common::ADMIN_PASSWORD,
        file("ca.crt")
    ))
    .await
    .unwrap();
    let mut guard = redlock
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();

    // Trusting another authority: a bounded connection error, not a hang.
    let asked = Instant::now();
    let refused = RedisLockProvider::connect_url(&url("stranger"))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LockError::Connection { .. }),
        "an untrusted certificate: {refused}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "took {:?}",
        asked.elapsed()
    );

    // A missing authority file is a configuration error naming it.
    let missing = RedisLockProvider::connect_url(&url("absent"))
        .await
        .unwrap_err();
    assert!(
        matches!(missing, LockError::Config { .. }) && missing.to_string().contains("absent.crt"),
        "{missing}"
    );
}
