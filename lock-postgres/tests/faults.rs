//! Faults the conformance cases do not look into, on real servers: a holder's server
//! process terminated, a server restarted or paused, a grant's reply lost, a role without
//! rights, and psql on the other side of a lock.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::Duration;

use common::{
    KEEPALIVE, PgHarness, admin_client, advisory_locks, server_address, terminate_holders,
};
use lock_conformance::unique_name;
use lock_core::{LockError, LockProvider, LossReason};
use lock_postgres::{PostgresConfig, PostgresLockProvider, PostgresStrategy};
use lock_testbed::proxy::{FaultProxy, ReplyKind};
use lock_testbed::servers::{PostgresOptions, PostgresTarget};

/// A provider of the server at `url` (the superuser), with the harness's keepalive.
async fn provider_of(url: &str) -> PostgresLockProvider {
    let mut config = PostgresConfig::new(url);
    config.keepalive = KEEPALIVE;
    config.timeout = Duration::from_secs(2);
    PostgresLockProvider::connect(config).await.unwrap()
}

/// Waits until `check` holds, for at most `bound`.
async fn eventually<F, Fut>(bound: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {bound:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The server grants the lock, and its reply is lost on the way (a proxy drops it and cuts
/// the connection): the acquisition fails retryably or is granted on another connection,
/// and never is the lock left held by nobody. The lost grant did run, so the next holder's
/// token is above the one it raised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_reply_leaves_no_lock_held_by_nobody() {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let proxy = FaultProxy::start(server_address(h.url())).unwrap();
    let config = h.config_at(proxy.address(), "distlock-lost-grant-reply", "public");
    let behind = PostgresLockProvider::connect(config).await.unwrap();
    let other = provider_of(h.url()).await;
    for round in 0..5 {
        let name = unique_name("lost-grant-reply");
        let swallow = proxy.swallow_next_reply(ReplyKind::PgStatement("pg_try_advisory"));
        let lock = behind.lock(&name).unwrap();
        let outcome = lock.acquire(Some(Duration::from_secs(5))).await;
        let lost = tokio::time::timeout(Duration::from_secs(5), swallow.wait()).await;
        assert!(
            lost.is_ok(),
            "round {round}: no grant's reply was swallowed"
        );
        let lost_token = match outcome {
            Err(error) => {
                assert!(error.is_retryable(), "round {round}: {error}");
                1
            }
            Ok(mut granted) => {
                let token = granted.fencing_token().get();
                assert!(
                    token > 1,
                    "round {round}: granted with the lost grant's token"
                );
                granted.release().await.unwrap();
                token
            }
        };
        let bound = KEEPALIVE * 2 + Duration::from_secs(2);
        let taken = tokio::time::timeout(bound, other.lock(&name).unwrap().acquire(None)).await;
        let mut taken = taken.expect("free again within the crash bound").unwrap();
        assert!(taken.fencing_token().get() > lost_token, "round {round}");
        taken.release().await.unwrap();
        eventually(bound, "nothing left on the server", || async {
            advisory_locks(h.admin(), "public", &name).await == (0, 0)
        })
        .await;
    }
}

/// A waiter queued on the server whose connection is gone, and whose cancel request cannot
/// reach the server either (a proxy cuts every connection and refuses new ones): the server
/// drops its place in the queue within a few seconds, while the holder still holds, rather
/// than keep it until the lock is free (and then grant it to nobody).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cut_off_from_the_server_leaves_the_queue() {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let proxy = FaultProxy::start(server_address(h.url())).unwrap();
    let config = h.config_at(proxy.address(), "distlock-cut-waiter", "public");
    let behind = PostgresLockProvider::connect(config).await.unwrap();
    let holder_provider = provider_of(h.url()).await;
    let name = unique_name("cut-waiter");
    let mut held = holder_provider
        .lock(&name)
        .unwrap()
        .acquire(None)
        .await
        .unwrap();
    let lock = behind.lock(&name).unwrap();
    let waiting = tokio::spawn(async move { lock.acquire(Some(Duration::from_secs(30))).await });
    eventually(Duration::from_secs(5), "the waiter is queued", || async {
        advisory_locks(h.admin(), "public", &name).await == (1, 1)
    })
    .await;
    proxy.cut();
    let outcome = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the cut waiter is told within 5s")
        .unwrap();
    match outcome {
        Err(error) => assert!(error.is_retryable(), "{error}"),
        Ok(guard) => panic!("granted while held: {}", guard.fencing_token()),
    }
    eventually(
        Duration::from_secs(3),
        "the cut waiter leaves the queue",
        || async { advisory_locks(h.admin(), "public", &name).await == (1, 0) },
    )
    .await;
    assert!(!held.is_lost());
    held.release().await.unwrap();
}

/// `pg_terminate_backend` on the holder: its lost signal fires, its release says the lock
/// was lost, the waiter is granted with a larger token, and nothing is left on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_holder_loses_and_the_waiter_gets_a_larger_token() {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let (first, second) = (provider_of(h.url()).await, provider_of(h.url()).await);
    let name = unique_name("terminated");
    let mut holder = first.lock(&name).unwrap().acquire(None).await.unwrap();
    let lost = holder.lost();
    let lock = second.lock(&name).unwrap();
    let waiter = tokio::spawn(async move { lock.acquire(Some(Duration::from_secs(10))).await });
    eventually(Duration::from_secs(5), "the waiter queues", || async {
        advisory_locks(h.admin(), "public", &name).await == (1, 1)
    })
    .await;
    assert_eq!(terminate_holders(h.admin(), "public", &name).await, 1);
    let reason = tokio::time::timeout(KEEPALIVE * 3, lost.wait()).await;
    assert_eq!(reason.ok().flatten(), Some(LossReason::SessionExpired));
    let mut next = waiter.await.unwrap().unwrap();
    assert!(next.fencing_token() > holder.fencing_token());
    assert!(matches!(
        holder.release().await,
        Err(LockError::Lost { .. })
    ));
    next.release().await.unwrap();
    eventually(Duration::from_secs(5), "nothing is left", || async {
        advisory_locks(h.admin(), "public", &name).await == (0, 0)
    })
    .await;
}

/// A restart of the server: the holder's lost signal fires, and tokens keep increasing
/// (the counter row is committed before a grant is answered); the provider's next acquire
/// works on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_restart() {
    let mut server = PostgresTarget::start(PostgresOptions::default())
        .await
        .unwrap();
    let provider = provider_of(&server.url()).await;
    let lock = provider.lock("restarted").unwrap();
    let mut before = lock.acquire(None).await.unwrap();
    let lost = before.lost();
    server.restart().await.unwrap();
    let reason = tokio::time::timeout(KEEPALIVE * 3, lost.wait()).await;
    assert!(reason.is_ok(), "the holder did not learn of the restart");
    assert!(before.release().await.is_err());
    let mut after = None;
    for _ in 0..3 {
        match lock.acquire(Some(Duration::from_secs(5))).await {
            Ok(guard) => {
                after = Some(guard);
                break;
            }
            Err(error) => assert!(error.is_retryable(), "{error}"),
        }
    }
    let mut after = after.expect("an acquire after the restart");
    assert!(after.fencing_token() > before.fencing_token());
    after.release().await.unwrap();
}

/// A server that stops answering (SIGSTOP) for longer than the keepalive: the holder's lost
/// signal fires within three keepalives, and once the server goes on, the lock is free
/// again (the holder closed its connection) within the crash bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_makes_the_holder_lose() {
    let server = PostgresTarget::start(PostgresOptions::default())
        .await
        .unwrap();
    let provider = provider_of(&server.url()).await;
    let name = "paused";
    let holder = provider.lock(name).unwrap().acquire(None).await.unwrap();
    let lost = holder.lost();
    server.pause().await.unwrap();
    let reason = tokio::time::timeout(KEEPALIVE * 3, lost.wait()).await;
    server.resume().await.unwrap();
    assert_eq!(reason.ok().flatten(), Some(LossReason::Disconnected));
    let other = provider_of(&server.url()).await;
    let bound = provider.capabilities().crash_release_bound.unwrap();
    let mut next = other
        .lock(name)
        .unwrap()
        .acquire(Some(bound))
        .await
        .unwrap();
    assert!(next.fencing_token() > holder.fencing_token());
    next.release().await.unwrap();
}

/// psql and distlock exclude each other on the documented key, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_and_distlock_exclude_each_other() {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let provider = provider_of(h.url()).await;
    let name = unique_name("psql");
    let key = format!("hashtextextended('public/{name}', 0)");
    let psql = |statements: Vec<String>| {
        let mut command = tokio::process::Command::new("psql");
        command.arg(h.url()).args(["-X", "-q", "-t", "-A"]);
        for statement in statements {
            command.arg("-c").arg(statement);
        }
        command.kill_on_drop(true);
        command
    };
    // psql holds: distlock's try finds the lock busy, and takes it once psql is done.
    let mut holding = psql(vec![
        format!("SELECT pg_advisory_lock({key})"),
        "SELECT pg_sleep(2)".to_owned(),
    ])
    .stdout(std::process::Stdio::null())
    .spawn()
    .expect("psql runs (Debian's postgresql-client)");
    eventually(Duration::from_secs(5), "psql holds", || async {
        advisory_locks(h.admin(), "public", &name).await == (1, 0)
    })
    .await;
    let lock = provider.lock(&name).unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none());
    let mut guard = lock.acquire(Some(Duration::from_secs(10))).await.unwrap();
    assert!(holding.wait().await.unwrap().success());
    // distlock holds: psql's try fails.
    let tried = psql(vec![format!("SELECT pg_try_advisory_lock({key})")])
        .output()
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&tried.stdout).trim(), "f");
    guard.release().await.unwrap();
    let tried = psql(vec![format!("SELECT pg_try_advisory_lock({key})")])
        .output()
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&tried.stdout).trim(), "t");
}

/// Providers that connect at once to a schema without the tables all connect: the ones
/// that meet another's half-made table try again and find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_creating_the_tables_at_once_all_connect() {
    const PROVIDERS: usize = 16;
    const ROUNDS: usize = 10;
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    for _ in 0..ROUNDS {
        let schema = format!("fresh_{}", uuid::Uuid::new_v4().simple());
        h.admin()
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        let connecting = (0..PROVIDERS).map(|_| {
            let mut config = PostgresConfig::new(h.url());
            config.schema = schema.clone();
            tokio::spawn(PostgresLockProvider::connect(config))
        });
        for connected in futures_util::future::join_all(connecting).await {
            let provider = connected
                .unwrap()
                .unwrap_or_else(|e| panic!("{schema}: {e}"));
            let mut guard = provider.lock("jobs").unwrap().acquire(None).await.unwrap();
            guard.release().await.unwrap();
        }
        let tables: i64 = h
            .admin()
            .query_one(
                "SELECT count(*) FROM pg_tables WHERE schemaname = $1",
                &[&schema],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            tables, 2,
            "{schema}: the fencing and leaders' tables, once each"
        );
    }
}

/// A schema that does not exist is the server's error, not a refusal to create the tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_is_named() {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let mut config = PostgresConfig::new(h.url());
    config.schema = "no_such_schema".to_owned();
    let error = PostgresLockProvider::connect(config).await.unwrap_err();
    assert!(
        !matches!(error, LockError::PermissionDenied { .. })
            && error.to_string().contains("no_such_schema"),
        "{error}"
    );
}

/// A role that may not create the fencing table is told the statements an administrator
/// must run; once they have run, it locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_create_is_told_what_to_run() {
    let h = PgHarness::new(PostgresStrategy::Advisory).await;
    let schema = format!("locked_{}", uuid::Uuid::new_v4().simple());
    let role = format!("role_{}", uuid::Uuid::new_v4().simple());
    h.admin()
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE ROLE {role} LOGIN; \
             GRANT USAGE ON SCHEMA {schema} TO {role};"
        ))
        .await
        .unwrap();
    let address = server_address(h.url());
    let mut config = PostgresConfig::new(format!("postgres://{role}@{address}/postgres"));
    config.schema = schema.clone();
    let refused = PostgresLockProvider::connect(config.clone()).await;
    let Err(LockError::PermissionDenied { message, .. }) = refused else {
        panic!("expected a refusal, got {refused:?}");
    };
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {schema}.distlock_fencing (name text PRIMARY KEY, token \
         bigint NOT NULL); CREATE TABLE IF NOT EXISTS {schema}.distlock_leaders (name text \
         PRIMARY KEY, term bigint NOT NULL, value bytea NOT NULL, pid integer NOT NULL)"
    );
    assert!(message.contains(&create), "{message}");
    let admin = admin_client(h.url()).await;
    admin
        .batch_execute(&format!(
            "{create}; GRANT SELECT, INSERT, UPDATE ON {schema}.distlock_fencing, \
             {schema}.distlock_leaders TO {role}"
        ))
        .await
        .unwrap();
    let provider = PostgresLockProvider::connect(config).await.unwrap();
    let mut guard = provider.lock("jobs").unwrap().acquire(None).await.unwrap();
    assert_eq!(guard.fencing_token().0, 1);
    guard.release().await.unwrap();
}

/// A password kept apart from the URL (`password_file=`) reaches a server that asks for
/// one: the right one locks, a wrong one is an `Auth` error that shows neither password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_file_authenticates_the_role() {
    let server = PostgresTarget::start(PostgresOptions::default().with_password("right"))
        .await
        .unwrap();
    let address = server_address(&server.url());
    let dir = tempfile::tempdir().unwrap();
    let (right, wrong) = (dir.path().join("right"), dir.path().join("wrong"));
    std::fs::write(&right, "right\n").unwrap();
    std::fs::write(&wrong, "wr0ng-planted\n").unwrap();
    let url = |file: &std::path::Path| {
        format!(
            "postgres://postgres@{address}/postgres?timeout=2s&password_file={}",
            file.display()
        )
    };

    let allowed = PostgresLockProvider::connect_url(&url(&right))
        .await
        .expect("the password from the file is the role's");
    let mut guard = allowed
        .lock(&unique_name("filed"))
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    guard
        .as_mut()
        .expect("a free lock")
        .release()
        .await
        .unwrap();

    let refused = PostgresLockProvider::connect_url(&url(&wrong))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(refused, LockError::Auth { .. }),
        "a wrong password: {refused}"
    );
    let shown = format!("{refused} {refused:?}");
    assert!(!shown.contains("wr0ng-planted"), "{shown}");
}
