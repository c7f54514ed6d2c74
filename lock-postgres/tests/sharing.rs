//! Many locks from one provider, on real servers: they share a few connections, a name is
//! never taken twice on one connection, nothing is left after the release, the end of a
//! connection fires the lost signal of every lock it held, and a full lock table is a
//! clear error.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::{Duration, Instant};

use common::{KEEPALIVE, PgHarness, admin_client, server_address};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lock_conformance::unique_name;
use lock_core::{Guard, LockProvider, LossReason};
use lock_postgres::{PostgresConfig, PostgresLockProvider, PostgresStrategy};
use lock_testbed::servers::{PostgresOptions, PostgresTarget};

/// How many locks the provider holds at once.
const LOCKS: usize = 2_000;

/// How many acquisitions are in flight at once.
const IN_FLIGHT: usize = 64;

/// A provider whose connections the server names `application`.
async fn provider_as(h: &PgHarness, application: &str) -> PostgresLockProvider {
    let config = h.config_at(server_address(h.url()), application, "public");
    PostgresLockProvider::connect(config).await.unwrap()
}

/// The server's connections of `application`, and the advisory locks they hold.
async fn seen(h: &PgHarness, application: &str) -> (i64, i64) {
    let row = h
        .admin()
        .query_one(
            "SELECT count(DISTINCT a.pid), count(l.pid) FROM pg_stat_activity a \
             LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted \
             WHERE a.application_name = $1",
            &[&application],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Takes every lock of `names` from `provider`, half by `try_acquire` and half by
/// `acquire`, [`IN_FLIGHT`] at a time.
async fn take_all(provider: &PostgresLockProvider, names: &[String]) -> Vec<Guard> {
    let mut guards = Vec::with_capacity(names.len());
    for chunk in names.chunks(IN_FLIGHT) {
        let mut running: FuturesUnordered<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let lock = provider.lock(name).unwrap();
                async move {
                    if i % 2 == 0 {
                        lock.try_acquire().await.unwrap().expect("a free lock")
                    } else {
                        lock.acquire(Some(Duration::from_secs(10))).await.unwrap()
                    }
                }
            })
            .collect();
        while let Some(guard) = running.next().await {
            guards.push(guard);
        }
    }
    guards
}

/// 2 000 locks held by one provider of `strategy` take a few connections (a connection each, as a lock
/// per connection would need, is more than the server allows), each lock held once; a
/// second acquisition of a held name by the same provider is busy (the server would stack
/// it on the holder's connection); after the release nothing is held and the connections
/// left idle are few.
async fn many_locks_share_few_connections_and_leave_nothing(strategy: PostgresStrategy) {
    let h = PgHarness::new(strategy).await;
    let application = format!("distlock-sharing-{}", uuid::Uuid::new_v4().simple());
    let provider = provider_as(&h, &application).await;
    let names: Vec<String> = (0..LOCKS).map(|_| unique_name("sharing")).collect();
    let guards = take_all(&provider, &names).await;
    let (connections, held) = seen(&h, &application).await;
    assert_eq!(held, LOCKS as i64, "every lock held once on the server");
    assert!(
        connections <= 4,
        "{LOCKS} locks took {connections} connections"
    );
    for name in names.iter().take(20) {
        let lock = provider.lock(name).unwrap();
        assert!(lock.try_acquire().await.unwrap().is_none(), "{name} twice");
        let waited = lock.acquire(Some(Duration::from_millis(50))).await;
        assert!(waited.is_err(), "{name} twice, by a wait");
    }
    let releases: FuturesUnordered<_> = guards
        .into_iter()
        .map(|mut guard| async move { guard.release().await })
        .collect();
    let released: Vec<_> = releases.collect().await;
    assert!(released.iter().all(Result::is_ok));
    let (connections, held) = seen(&h, &application).await;
    assert_eq!(held, 0, "nothing held after the release");
    assert!(connections <= 16, "{connections} idle connections kept");
}

/// The server process of a connection holding 2 000 locks is terminated: every one of
/// their lost signals fires, with the session's end as the reason, sooner than the
/// keepalive's check would find it (the connection's watch sees the end at once); another
/// provider then takes them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_ended_fires_every_lock_it_held() {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let application = format!("distlock-sharing-{}", uuid::Uuid::new_v4().simple());
    let provider = provider_as(&h, &application).await;
    let names: Vec<String> = (0..LOCKS).map(|_| unique_name("sharing-end")).collect();
    let guards = take_all(&provider, &names).await;
    let signals: Vec<_> = guards.iter().map(Guard::lost).collect();
    let ended = Instant::now();
    h.admin()
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&application],
        )
        .await
        .unwrap();
    for signal in &signals {
        let reason = tokio::time::timeout(KEEPALIVE * 3, signal.wait()).await;
        assert_eq!(reason.ok().flatten(), Some(LossReason::SessionExpired));
    }
    let all_fired = ended.elapsed();
    assert!(
        all_fired < KEEPALIVE,
        "{LOCKS} lost signals took {all_fired:?}"
    );
    let other = provider_as(&h, &format!("{application}-next")).await;
    let mut next = take_all(&other, &names).await;
    assert_eq!(next.len(), LOCKS);
    for guard in &mut next {
        guard.release().await.unwrap();
    }
    drop(guards);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_locks_share_few_connections_and_leave_nothing() {
    many_locks_share_few_connections_and_leave_nothing(PostgresStrategy::Advisory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_locks_share_few_connections_and_leave_nothing() {
    many_locks_share_few_connections_and_leave_nothing(PostgresStrategy::Notify).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_locks_share_few_connections_and_leave_nothing() {
    many_locks_share_few_connections_and_leave_nothing(PostgresStrategy::Polling).await;
}

/// A server whose lock table is small: taking more locks than it has room for fails with a
/// retryable error that names the setting to raise, holds nothing for the failed grant, and
/// works again once locks are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_lock_table_is_a_retryable_error_naming_the_setting() {
    let options = PostgresOptions::default()
        .with_setting("max_connections", "20")
        .with_setting("max_locks_per_transaction", "10");
    let server = PostgresTarget::start(options).await.unwrap();
    let mut config = PostgresConfig::new(server.url());
    config.keepalive = KEEPALIVE;
    let provider = PostgresLockProvider::connect(config).await.unwrap();
    let mut held = Vec::new();
    let refused = loop {
        assert!(held.len() < 20_000, "the lock table never filled");
        let lock = provider.lock(&format!("full-{}", held.len())).unwrap();
        match lock.try_acquire().await {
            Ok(guard) => held.push(guard.expect("a free lock")),
            Err(error) => break error,
        }
    };
    assert!(refused.is_retryable(), "{refused}");
    assert!(
        refused.to_string().contains("max_locks_per_transaction"),
        "{refused}"
    );
    let failed = format!("full-{}", held.len());
    for guard in &mut held {
        guard.release().await.unwrap();
    }
    let admin = admin_client(&server.url()).await;
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "advisory locks left after the release");
    let mut again = provider
        .lock(&failed)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("room again after the release");
    again.release().await.unwrap();
}
