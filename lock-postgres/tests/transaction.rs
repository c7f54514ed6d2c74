//! Locks inside the caller's transaction, on a real server: they exclude the session locks
//! of the name, end with the transaction (commit or rollback, together with its writes),
//! and a timed-out wait leaves the transaction usable.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::{Duration, Instant};

use common::{PgHarness, admin_client, advisory_locks};
use lock_conformance::unique_name;
use lock_core::{LockError, LockProvider};
use lock_postgres::{PostgresConfig, PostgresLockProvider, PostgresStrategy};

/// A provider, an admin client and a table of writes, over the binary's server.
async fn set_up() -> (
    PgHarness,
    PostgresLockProvider,
    tokio_postgres::Client,
    String,
) {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let provider = PostgresLockProvider::connect(PostgresConfig::new(h.url()))
        .await
        .unwrap();
    let client = admin_client(h.url()).await;
    let table = format!("writes_{}", uuid::Uuid::new_v4().simple());
    client
        .batch_execute(&format!("CREATE TABLE {table} (token bigint NOT NULL)"))
        .await
        .unwrap();
    (h, provider, client, table)
}

/// The tokens written to `table`.
async fn written(client: &tokio_postgres::Client, table: &str) -> Vec<i64> {
    client
        .query(&format!("SELECT token FROM {table} ORDER BY token"), &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A transaction's lock excludes the session lock of the name until the transaction
/// commits; its write commits with it, and the next holder's token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_and_its_writes_commit_together() {
    let (h, provider, mut client, table) = set_up().await;
    let name = unique_name("tx-commit");
    let lock = provider.transaction_lock(&name).unwrap();
    let mut tx = client.transaction().await.unwrap();
    let token = lock.lock(&mut tx, None).await.unwrap();
    let session = provider.lock(&name).unwrap();
    assert!(session.try_acquire().await.unwrap().is_none(), "held twice");
    assert_eq!(advisory_locks(h.admin(), "public", &name).await, (1, 0));
    let as_number = i64::try_from(token.0).unwrap();
    tx.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&as_number])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(written(h.admin(), &table).await, [as_number]);
    let mut next = session
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the commit");
    assert!(
        next.fencing_token() > token,
        "{:?} after {token:?}",
        next.fencing_token()
    );
    // And the other way round: a session's holder makes a transaction's try come back empty.
    let mut tx = client.transaction().await.unwrap();
    assert_eq!(lock.try_lock(&mut tx).await.unwrap(), None);
    tx.query_one("SELECT 1", &[])
        .await
        .expect("the transaction is usable");
    next.release().await.unwrap();
    let after = lock
        .try_lock(&mut tx)
        .await
        .unwrap()
        .expect("free after the release");
    assert!(after > next.fencing_token());
    tx.rollback().await.unwrap();
}

/// A rolled-back transaction frees the lock and keeps none of its writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_and_its_writes_roll_back_together() {
    let (h, provider, mut client, table) = set_up().await;
    let name = unique_name("tx-rollback");
    let lock = provider.transaction_lock(&name).unwrap();
    let mut tx = client.transaction().await.unwrap();
    let token = lock
        .lock(&mut tx, Some(Duration::from_secs(2)))
        .await
        .unwrap();
    let as_number = i64::try_from(token.0).unwrap();
    tx.execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&as_number])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(written(h.admin(), &table).await, Vec::<i64>::new());
    assert_eq!(advisory_locks(h.admin(), "public", &name).await, (0, 0));
    let mut next = provider.lock(&name).unwrap().try_acquire().await.unwrap();
    next.as_mut()
        .expect("free after the rollback")
        .release()
        .await
        .unwrap();
}

/// A wait that times out comes back within its bound, and the transaction goes on with
/// its own `lock_timeout`, as after a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_wait_leaves_the_transaction_usable() {
    let (h, provider, mut client, _) = set_up().await;
    let name = unique_name("tx-timeout");
    let lock = provider.transaction_lock(&name).unwrap();
    let mut held = provider.lock(&name).unwrap().acquire(None).await.unwrap();
    let mut tx = client.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL lock_timeout = '7s'")
        .await
        .unwrap();
    let timeout = Duration::from_millis(300);
    let began = Instant::now();
    let waited = lock.lock(&mut tx, Some(timeout)).await;
    let took = began.elapsed();
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(1),
        "{took:?}"
    );
    let setting = |row: tokio_postgres::Row| row.get::<_, String>(0);
    let show = "SHOW lock_timeout";
    assert_eq!(setting(tx.query_one(show, &[]).await.unwrap()), "7s");
    assert_eq!(advisory_locks(h.admin(), "public", &name).await, (1, 0));
    // Granted once the holder releases, and the setting is the transaction's again.
    let releasing = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        held.release().await.unwrap();
    };
    let (token, ()) = tokio::join!(lock.lock(&mut tx, Some(Duration::from_secs(5))), releasing);
    assert!(token.unwrap() > held.fencing_token());
    assert_eq!(setting(tx.query_one(show, &[]).await.unwrap()), "7s");
    tx.commit().await.unwrap();
    assert_eq!(advisory_locks(h.admin(), "public", &name).await, (0, 0));
}

/// A `REPEATABLE READ` transaction that waited for a transaction's holder to commit cannot
/// raise the token its snapshot does not see: a retryable serialization failure, as the
/// documentation says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_read_waiter_fails_retryably() {
    let (h, provider, mut client, _) = set_up().await;
    let name = unique_name("tx-repeatable");
    let lock = provider.transaction_lock(&name).unwrap();
    let mut holder = client.transaction().await.unwrap();
    lock.lock(&mut holder, None).await.unwrap();
    let mut other = admin_client(h.url()).await;
    let waiter_lock = lock.clone();
    let waiter = tokio::spawn(async move {
        let mut tx = other
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .start()
            .await
            .unwrap();
        waiter_lock.lock(&mut tx, None).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.commit().await.unwrap();
    let waited = waiter.await.unwrap();
    assert!(
        matches!(&waited, Err(error) if error.is_retryable()),
        "{waited:?}"
    );
}
