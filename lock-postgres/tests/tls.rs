//! TLS against a real PostgreSQL serving it, its certificate signed by an authority made
//! for the test (`lock_testbed::certs`): the provider's connections are encrypted and
//! verified, a waiter that gives up is cancelled over TLS, and an untrusted certificate, a
//! server without TLS or an unreadable authority is a clear error, never a plain connection.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::{Duration, Instant};

use common::{PgHarness, admin_client, hand_over, server_address};
use lock_conformance::unique_name;
use lock_core::{LockError, LockProvider};
use lock_postgres::{PostgresLockProvider, PostgresStrategy};
use lock_testbed::certs;
use lock_testbed::servers::{PostgresOptions, PostgresServer};

/// How many of `name`'s mutex locks are held and waited for, and how many of them over an
/// encrypted connection.
async fn locks(admin: &tokio_postgres::Client, name: &str) -> (i64, i64, i64) {
    let row = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE l.granted), count(*) FILTER (WHERE NOT l.granted), \
             count(*) FILTER (WHERE s.ssl) FROM pg_locks l JOIN pg_stat_ssl s ON s.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.objsubid = 1 \
             AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid \
             AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid",
            &[&format!("public/{name}")],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_verified_tls() {
    let dir = tempfile::tempdir().unwrap();
    certs::authority(dir.path(), "ca").unwrap();
    certs::authority(dir.path(), "stranger").unwrap();
    certs::server_certificate(dir.path(), "ca").unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let server = PostgresServer::start(PostgresOptions::default().with_tls(dir.path()))
        .await
        .unwrap();
    let admin = admin_client(&server.url()).await;
    let url = |mode: &str, authority: &str| {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode={mode}&sslrootcert={}",
            server.port(),
            file(authority)
        )
    };

    // libpq's strictest mode: the certificate's chain and host name verified.
    let name = unique_name("tls");
    let provider = PostgresLockProvider::connect_url(&url("verify-full", "ca.crt"))
        .await
        .unwrap();
    let mut held = provider.lock(&name).unwrap().acquire(None).await.unwrap();
    assert_eq!(locks(&admin, &name).await, (1, 0, 1), "held over TLS");
    // A waiter that gives up is cancelled on the server (the cancel request over TLS too).
    let other = PostgresLockProvider::connect_url(&url("require", "ca.crt"))
        .await
        .unwrap();
    let waited = other
        .lock(&name)
        .unwrap()
        .acquire(Some(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while locks(&admin, &name).await != (1, 0, 1) {
        assert!(Instant::now() < deadline, "the given-up waiter still waits");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hand_over(&mut held, &other, &name).await;

    // A certificate another authority signed: refused, promptly, not retried as a network
    // error.
    let began = Instant::now();
    let refused = PostgresLockProvider::connect_url(&url("require", "stranger.crt")).await;
    assert!(
        matches!(&refused, Err(LockError::Auth { message, .. }) if message.contains("certificate")),
        "{refused:?}"
    );
    assert!(began.elapsed() < Duration::from_secs(5));

    // An authority file that is not there: a configuration error naming it.
    let missing = PostgresLockProvider::connect_url(&url("require", "missing.crt")).await;
    assert!(
        matches!(&missing, Err(LockError::Config { message }) if message.contains("sslrootcert")),
        "{missing:?}"
    );
}

/// A server without TLS, when the authority is given: refused, never a plain connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tls_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    certs::authority(dir.path(), "ca").unwrap();
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let url = format!(
        "postgres://postgres@{}/postgres?sslrootcert={}",
        server_address(h.url()),
        dir.path().join("ca.crt").display()
    );
    let refused = PostgresLockProvider::connect_url(&url).await;
    assert!(
        matches!(&refused, Err(LockError::Auth { message, .. }) if message.contains("TLS")),
        "{refused:?}"
    );
}
