//! Redis Sentinel: the conformance suite on a primary with two replicas under three
//! sentinels (each case a set of its own), and a lock that follows failovers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::Duration;

use common::ADMIN_PASSWORD;
use common::sentinel::SENTINEL_TTL as TTL;
use common::sentinel::{SentinelHarness, start_set};
use lock_conformance::unique_name;
use lock_core::{LockError, LockProvider};
use lock_redis::{RedisConfig, RedisLockProvider, RedisStrategy};
use tokio::time::Instant;

mod queue {
    use super::*;
    lock_conformance::conformance_suite!(4, SentinelHarness::new(RedisStrategy::Queue).await);
}

/// Takes and releases `name` within `bound`, retrying retryable errors (the failover in
/// progress) and a release that finds the grant gone (a grant made on the old primary in
/// Sentinel's window, lost with it): the token of the grant.
async fn take_and_release(provider: &RedisLockProvider, name: &str, bound: Duration) -> u64 {
    let deadline = Instant::now() + bound;
    loop {
        let attempt = async {
            let mut guard = provider.lock(name)?.acquire(Some(TTL)).await?;
            let token = guard.fencing_token().0;
            guard.release().await?;
            Ok::<_, LockError>(token)
        };
        match attempt.await {
            Ok(token) => return token,
            Err(error)
                if (error.is_retryable() || matches!(error, LockError::Lost { .. }))
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("no grant within {bound:?}: {error}"),
        }
    }
}

/// Takes and releases `name` until the provider talks to `primary` (within `bound`): the
/// last token, and how long it took.
async fn until_on(
    provider: &RedisLockProvider,
    name: &str,
    primary: std::net::SocketAddr,
    bound: Duration,
) -> (u64, Duration) {
    let began = Instant::now();
    loop {
        let token = take_and_release(provider, name, bound).await;
        if format!("{provider:?}").contains(&format!("\"{primary}\"")) {
            return (token, began.elapsed());
        }
        assert!(
            began.elapsed() < bound,
            "still not on {primary} after {bound:?}: {provider:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_lock_follows_the_primary_through_failovers() {
    let mut set = start_set().await;
    let url = set.url(Some(("default", ADMIN_PASSWORD)));
    let config = RedisConfig::from_url(&url).unwrap().with_ttl(TTL);
    let provider = RedisLockProvider::connect(config).await.unwrap();
    let name = unique_name("sentinel");
    let primary = set.primary().await.unwrap();
    let (first, _) = until_on(&provider, &name, primary, Duration::ZERO).await;
    common::replicated(primary, 2).await.unwrap();

    // A promotion on demand: the old primary becomes a replica and refuses writes (until
    // the sentinels have told it so, it still takes them: Sentinel's window, whose grants
    // are lost with it).
    let promoted = set.failover().await.unwrap();
    let (second, promotion) = until_on(&provider, &name, promoted, Duration::from_secs(10)).await;
    // Both replicas (the old primary once demoted): the sentinels promote either one next.
    let demoting = Instant::now();
    common::replicated(promoted, 2).await.unwrap();
    let demoted = demoting.elapsed();

    // A killed primary: the sentinels need their second to call it down.
    let (_, after_kill) = set.kill_primary().await.unwrap();
    let (third, kill) = until_on(&provider, &name, after_kill, Duration::from_secs(10)).await;
    // What reached the replicas before a failover is kept: the tokens go on from there.
    assert!(first < second && second < third, "{first} {second} {third}");
    eprintln!(
        "sentinel: followed a promotion in {promotion:?} (both replicas caught up after \
         {demoted:?}), a killed primary in {kill:?}"
    );
}

#[tokio::test]
async fn no_sentinel_answers_is_a_bounded_connection_error() {
    let port = lock_testbed::servers::free_port().unwrap();
    let url = format!("redis+sentinel://127.0.0.1:{port}/distlock?timeout=1s");
    let began = Instant::now();
    let connected = RedisLockProvider::connect_url(&url).await;
    assert!(
        matches!(connected, Err(LockError::Connection { .. })),
        "{connected:?}"
    );
    assert!(began.elapsed() < Duration::from_secs(3));
    let set = start_set().await;
    let wrong = set.url(Some(("default", "wrong")));
    let refused = RedisLockProvider::connect_url(&wrong).await;
    assert!(
        matches!(refused, Err(LockError::Auth { .. })),
        "{refused:?}"
    );
    let unknown = set.url(None).replace("/distlock", "/other");
    let unknown = RedisLockProvider::connect_url(&format!("{unknown}?timeout=1s")).await;
    assert!(
        unknown
            .is_err_and(|error| error.is_retryable() || matches!(error, LockError::Backend { .. }))
    );
}

#[tokio::test]
async fn a_queued_waiter_is_served_across_a_promotion() {
    let set = start_set().await;
    let url = set.url(Some(("default", ADMIN_PASSWORD)));
    let connect = || async {
        let config = RedisConfig::from_url(&url).unwrap().with_ttl(TTL);
        RedisLockProvider::connect(config).await.unwrap()
    };
    let (holder, waiter) = (connect().await, connect().await);
    let name = unique_name("sentinel-queue");
    let mut held = holder.lock(&name).unwrap().acquire(None).await.unwrap();
    let lock = waiter.lock(&name).unwrap();
    let waiting = tokio::spawn(async move { lock.acquire(None).await });
    common::wait_until(
        Duration::from_secs(5),
        "the waiter queued",
        || async {
            holder
                .holders(&name)
                .await
                .map(|h| h.queue.len())
                .unwrap_or(0)
        },
        |queued| *queued == 1,
    )
    .await;
    common::replicated(set.primary().await.unwrap(), 2)
        .await
        .unwrap();

    let old = set.primary_index().await.unwrap();
    let promoted = set.failover().await.unwrap();
    // Until the sentinels demote it, the old primary still takes writes, which are lost with
    // it (Sentinel's window): a release there, and the grant it hands on, would vanish.
    set.wait_until_replica(old).await.unwrap();
    // The holder keeps its lock (its lease outlasts the failover), then lets go on the new
    // primary, which hands the lock to the waiter queued there.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match held.release().await {
            Ok(()) => break,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("release after the promotion: {error}"),
        }
    }
    let released = Instant::now();
    let mut next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is served within 10 s")
        .unwrap()
        .unwrap();
    let served = released.elapsed();
    assert!(next.fencing_token() > held.fencing_token());
    assert!(
        format!("{waiter:?}").contains(&format!("\"{promoted}\"")),
        "{waiter:?}"
    );
    next.release().await.unwrap();
    eprintln!("sentinel: a queued waiter served {served:?} after the release");
}

#[tokio::test]
async fn wait_replicas_holds_grants_and_renewals_to_the_replicas() {
    let set = start_set().await;
    // The wait is long enough for healthy replicas beside a loaded machine (200 ms missed
    // acknowledgements while the rest of the suite ran), and short against the refusal's
    // bound below.
    let url = format!(
        "{}?wait_replicas=2&wait_timeout=1s",
        set.url(Some(("default", ADMIN_PASSWORD)))
    );
    let connect = || async {
        let config = RedisConfig::from_url(&url).unwrap().with_ttl(TTL);
        assert_eq!(config.wait_replicas, 2);
        RedisLockProvider::connect(config).await.unwrap()
    };
    let (holder, other) = (connect().await, connect().await);
    let name = unique_name("wait");
    let held = holder.lock(&name).unwrap().acquire(None).await.unwrap();
    // A hand-off to a queued waiter is confirmed as well.
    let handed = unique_name("wait-handoff");
    let mut first = other.lock(&handed).unwrap().acquire(None).await.unwrap();
    let lock = holder.lock(&handed).unwrap();
    let waiting = tokio::spawn(async move { lock.acquire(None).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.release().await.unwrap();
    let mut second = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the hand-off within 5 s")
        .unwrap()
        .unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    second.release().await.unwrap();
    // Renewals every ttl/3, each acknowledged by both replicas.
    tokio::time::sleep(TTL).await;
    assert!(!held.is_lost() && !held.is_suspect());

    // One replica stops answering: no grant or renewal reaches two replicas any more.
    let replica = &set.data_servers()[1];
    replica.pause().await.unwrap();
    let other_name = unique_name("wait-other");
    let began = Instant::now();
    let refused = other.lock(&other_name).unwrap().try_acquire().await;
    let took = began.elapsed();
    assert!(
        matches!(&refused, Err(error) if error.is_retryable()
            && error.to_string().contains("the grant reached 1 of 2 replicas")),
        "{refused:?}"
    );
    assert!(took < Duration::from_secs(2), "refused in {took:?}");
    let primary = set.primary().await.unwrap();
    let admin = common::admin_at(&format!("redis://:{ADMIN_PASSWORD}@{primary}")).await;
    common::wait_until(
        Duration::from_secs(3),
        "the unconfirmed grant given back",
        || {
            let (mut admin, name) = (admin.clone(), other_name.clone());
            async move { common::keys_of(&mut admin, &name).await }
        },
        |keys| !keys.iter().any(|key| key.ends_with(":owner")),
    )
    .await;
    let lost = tokio::time::timeout(TTL * 2, held.lost().wait()).await;
    assert!(
        lost.is_ok(),
        "a holder whose renewals the replicas miss loses the lock"
    );
    replica.resume().await.unwrap();
}
