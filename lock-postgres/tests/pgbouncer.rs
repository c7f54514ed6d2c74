//! Through a real PgBouncer: in transaction and statement mode the provider refuses to
//! connect, naming `pool_mode=session`; in session mode locks exclude each other, and a
//! holder that disconnects frees its lock (PgBouncer resets the server session); a lock
//! inside the caller's transaction works through transaction pooling.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::Duration;

use common::{PgHarness, advisory_locks, hand_over, server_address};
use lock_conformance::unique_name;
use lock_core::{LockError, LockProvider};
use lock_postgres::{PostgresConfig, PostgresLockProvider, PostgresStrategy, TransactionLock};
use lock_testbed::servers::{PgBouncer, PgBouncerSpec, PoolMode};
use tokio_postgres::NoTls;

/// PgBouncer in `mode` in front of the binary's server.
async fn bouncer(mode: PoolMode) -> (PgHarness, PgBouncer) {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let bouncer = PgBouncer::in_front_of(server_address(h.url()), mode)
        .await
        .expect("PgBouncer starts (Debian's pgbouncer package)");
    (h, bouncer)
}

/// A provider through `bouncer`.
async fn through(bouncer: &PgBouncer) -> Result<PostgresLockProvider, LockError> {
    let mut config = PostgresConfig::new(bouncer.url());
    config.timeout = Duration::from_secs(2);
    PostgresLockProvider::connect(config).await
}

/// Transaction and statement pooling hand one server session to several clients: the
/// provider refuses them with an error that names the setting to use, and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_and_statement_pooling_are_refused() {
    for mode in [PoolMode::Transaction, PoolMode::Statement] {
        let (_h, bouncer) = bouncer(mode).await;
        for _ in 0..3 {
            let refused = through(&bouncer).await;
            let Err(LockError::Config { message }) = &refused else {
                panic!("{mode}: expected a refusal, got {refused:?}");
            };
            assert!(message.contains("pool_mode=session"), "{mode}: {message}");
        }
    }
}

/// The server process serving `client`'s next statement.
async fn backend_pid(client: &tokio_postgres::Client) -> i32 {
    // One flight (no named statement prepared on one server connection and run on another).
    let rows = client.query_typed("SELECT pg_backend_pid()", &[]).await;
    rows.unwrap()[0].get(0)
}

/// PgBouncer handing its server connections out in turn (`server_round_robin`), with two
/// or three of them open: two client connections reach different server processes, so the
/// check of two connections alone would pass, but one connection asked again reaches
/// another process, and the provider refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_transaction_pooling_is_refused() {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    for open in [2, 3] {
        let settings = [("server_round_robin", "1")];
        let bouncer = PgBouncer::start(PgBouncerSpec::new(
            server_address(h.url()),
            PoolMode::Transaction,
            &settings,
        ))
        .await
        .expect("PgBouncer starts (Debian's pgbouncer package)");
        // `open` transactions at once make `open` server connections, idle afterwards.
        let mut clients = Vec::new();
        for _ in 0..open {
            let (client, connection) = tokio_postgres::connect(&bouncer.url(), NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client.batch_execute("BEGIN; SELECT 1").await.unwrap();
            clients.push(client);
        }
        for client in &clients {
            client.batch_execute("COMMIT").await.unwrap();
        }
        let (a, b) = (
            backend_pid(&clients[0]).await,
            backend_pid(&clients[1]).await,
        );
        assert_ne!(a, b, "{open} open: taken in turn");
        let refused = through(&bouncer).await;
        let Err(LockError::Config { message }) = &refused else {
            panic!("{open} open: expected a refusal, got {refused:?}");
        };
        assert!(
            message.contains("several server processes"),
            "{open} open: {message}"
        );
        assert!(
            message.contains("pool_mode=session"),
            "{open} open: {message}"
        );
    }
}

/// Session pooling keeps a client on one server session: locks exclude each other, a
/// release frees, and a holder that disconnects frees its lock (PgBouncer's reset of the
/// server session unlocks it) for a waiter, whose token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_locks_and_frees() {
    let (h, bouncer) = bouncer(PoolMode::Session).await;
    let name = unique_name("bouncer");
    let (one, two) = (
        through(&bouncer).await.unwrap(),
        through(&bouncer).await.unwrap(),
    );
    let mut held = one.lock(&name).unwrap().acquire(None).await.unwrap();
    assert!(
        two.lock(&name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(advisory_locks(h.admin(), "public", &name).await, (1, 0));
    hand_over(&mut held, &two, &name).await;
    assert_eq!(advisory_locks(h.admin(), "public", &name).await, (0, 0));

    let gone = through(&bouncer).await.unwrap();
    let dropped = gone.lock(&name).unwrap().acquire(None).await.unwrap();
    let waiter = two.lock(&name).unwrap();
    let waiting = tokio::spawn(async move { waiter.acquire(Some(Duration::from_secs(10))).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let token = dropped.fencing_token();
    // The holder goes without releasing: its guard never unlocks, and closing its
    // provider closes its connections (PgBouncer then resets the server session).
    std::mem::forget(dropped);
    drop(gone);
    let mut after = waiting.await.unwrap().unwrap();
    assert!(after.fencing_token() > token);
    after.release().await.unwrap();
    assert_eq!(advisory_locks(h.admin(), "public", &name).await, (0, 0));
}

/// A lock inside the caller's transaction needs no session of its own: through transaction
/// pooling it excludes a direct session's holder, ends with the transaction, and a wait that
/// times out leaves the transaction usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_locks_work_through_transaction_pooling() {
    let (h, bouncer) = bouncer(PoolMode::Transaction).await;
    let name = unique_name("bouncer-tx");
    // Connected directly: it makes sure the fencing table exists.
    let direct = PostgresLockProvider::connect(PostgresConfig::new(h.url()))
        .await
        .unwrap();
    let lock = TransactionLock::new("public", &name).unwrap();
    let (mut client, connection) = tokio_postgres::connect(&bouncer.url(), NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut tx = client.transaction().await.unwrap();
    let token = lock
        .lock(&mut tx, Some(Duration::from_secs(2)))
        .await
        .unwrap();
    let session = direct.lock(&name).unwrap();
    assert!(session.try_acquire().await.unwrap().is_none());
    tx.commit().await.unwrap();
    let mut next = session
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the commit");
    assert!(next.fencing_token() > token);
    let mut tx = client.transaction().await.unwrap();
    let waited = lock.lock(&mut tx, Some(Duration::from_millis(300))).await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    tx.query_one("SELECT 1", &[])
        .await
        .expect("the transaction is usable");
    tx.rollback().await.unwrap();
    next.release().await.unwrap();
    assert_eq!(advisory_locks(h.admin(), "public", &name).await, (0, 0));
}
