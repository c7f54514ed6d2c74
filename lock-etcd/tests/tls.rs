//! `etcds://` against a real etcd serving clients over TLS, its certificate signed by a
//! certificate authority made for the test (`lock_testbed::certs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed set-up or check must fail the test"
)]

use std::time::{Duration, Instant};

use lock_conformance::unique_name;
use lock_core::{LockError, LockProvider};
use lock_etcd::EtcdLockProvider;
use lock_testbed::certs;
use lock_testbed::servers::{EtcdOptions, EtcdServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_urls_lock_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    certs::authority(dir.path(), "ca").unwrap();
    certs::authority(dir.path(), "stranger").unwrap();
    certs::server_certificate(dir.path(), "ca").unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let server =
        EtcdServer::start(EtcdOptions::default().with_tls(file("server.crt"), file("server.key")))
            .await
            .unwrap();
    let endpoint = server.tls_endpoint().expect("a TLS endpoint");
    let address = endpoint.trim_start_matches("https://");
    let url = |ca: &str| {
        format!(
            "etcds://{address}?lease_ttl=2s&timeout=2s&tls_ca={}",
            file(&format!("{ca}.crt"))
        )
    };

    // Trusting the server's authority: two providers exclude each other over TLS, and the
    // release hands the lock on with a greater token.
    let a = EtcdLockProvider::connect_url(&url("ca")).await.unwrap();
    let b = EtcdLockProvider::connect_url(&url("ca")).await.unwrap();
    let name = unique_name("tls");
    let mut held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    let waiter = b.lock(&name).unwrap();
    assert!(
        waiter.try_acquire().await.unwrap().is_none(),
        "two holders over TLS"
    );
    let waiting = tokio::spawn(async move { waiter.acquire(Some(Duration::from_secs(5))).await });
    held.release().await.unwrap();
    let mut next = waiting.await.unwrap().unwrap();
    assert!(next.fencing_token() > held.fencing_token());
    next.release().await.unwrap();

    // Trusting another authority: a bounded connection error, not a hang.
    let asked = Instant::now();
    let refused = EtcdLockProvider::connect_url(&url("stranger"))
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
    let missing = EtcdLockProvider::connect_url(&url("missing"))
        .await
        .unwrap_err();
    assert!(
        matches!(&missing, LockError::Config { message } if message.contains("missing.crt")),
        "a missing tls_ca: {missing}"
    );
}
