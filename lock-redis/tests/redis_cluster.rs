//! The Redis backend on a Redis Cluster (three primaries with a replica each, made with
//! `redis-cli --cluster create`): the conformance suite with the queue strategy; with the
//! polling and pub/sub strategies, the cases whose path differs from the queue's (the
//! grant, the waiting, a failover under waiters); a slot migrated while waiters wait, with
//! the queue and with pub/sub; the documented ACL rule.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed step fails the test"
)]

mod common;

use common::cluster::ClusterHarness;
use lock_redis::RedisStrategy;

mod queue {
    use super::*;
    // Each case on a cluster of its own, four at a time: one at a time, the suite took
    // minutes.
    lock_conformance::conformance_suite!(4, ClusterHarness::new(RedisStrategy::Queue).await);
}

/// Stamps a test per listed case, each run on a cluster of its own with `strategy`.
macro_rules! strategy_cases {
    ($module:ident, $strategy:expr) => {
        mod $module {
            use super::*;
            strategy_cases! {
                @cases $strategy,
                exclusion::a6_release_wakes_waiter => "A6";
                exclusion::a7_stress => "A7";
                exclusion::a8_concurrent_try_exactly_one => "A8";
                timeouts::b1_timeout_bounds => "B1";
                release::c5_client_death_frees => "C5";
                loss::d1_revoke_fires_lost => "D1";
                fencing::e1_tokens_increase => "E1";
                resilience::h5_leader_failover => "H5";
            }
        }
    };
    (@cases $strategy:expr, $($group:ident :: $case:ident => $id:literal;)*) => {
        $(
            #[test]
            fn $case() {
                let recording = lock_conformance::runner::Recording::new(
                    concat!(env!("CARGO_PKG_NAME"), " ", module_path!()),
                    $id,
                    stringify!($case),
                );
                lock_conformance::runner::block_on(async {
                    let harness = ClusterHarness::new($strategy).await;
                    let (result, not_checked) = lock_conformance::runner::run_case(
                        lock_conformance::cases::$group::$case(&harness),
                    )
                    .await;
                    recording.conclude(result, &not_checked);
                });
            }
        )*
    };
}

// The cases whose path differs from the queue's: the grant, the waiting (by back-off, or
// on the release broadcast of sharded pub/sub), a failover under waiters.
strategy_cases!(polling, RedisStrategy::Polling);
strategy_cases!(pubsub, RedisStrategy::PubSub);

/// The grants after a migration: `tokens` (the holder's, then the waiters' in the order
/// served) increase, every waiter acquired and released, and at most one held at a time.
async fn all_served(
    tokens: &[u64],
    waiting: Vec<tokio::task::JoinHandle<Result<(), lock_core::LockError>>>,
    most: &std::sync::atomic::AtomicUsize,
) {
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens increase: {tokens:?}"
    );
    for waiter in waiting {
        waiter
            .await
            .unwrap()
            .expect("every waiter acquires and releases");
    }
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(most, 1, "one holder at a time");
}

/// The lock's slot moves to another primary while a holder holds it and three waiters
/// wait, with a pause halfway through its keys (the lock's scripts meanwhile meet
/// `TRYAGAIN`, its moved keys `ASK`): the holder keeps the lock, nobody else gets in, and after the release the
/// waiters are served one at a time, first come first served, with increasing tokens,
/// leaving nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrates_under_a_held_lock_with_waiters() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use lock_conformance::{Entries, Harness, Inspector, unique_name};

    const WAITERS: usize = 3;
    let h = ClusterHarness::new(RedisStrategy::Queue).await;
    let name = unique_name("migrating");
    let holder = h.client().await.unwrap();
    let mut held = holder
        .provider
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("a free lock");
    let inside = Arc::new(AtomicUsize::new(1));
    let most = Arc::new(AtomicUsize::new(1));
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut clients = Vec::new();
    let mut waiting = Vec::new();
    for index in 0..WAITERS {
        let client = h.client().await.unwrap();
        let lock = client.provider.lock(&name).unwrap();
        let (inside, most, served) = (Arc::clone(&inside), Arc::clone(&most), served.clone());
        waiting.push(tokio::spawn(async move {
            let mut guard = lock.acquire(Some(Duration::from_secs(60))).await?;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let _ = served.send((index, guard.fencing_token().0));
            tokio::time::sleep(Duration::from_millis(20)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await
        }));
        clients.push(client);
        // Queued in this order.
        let queued = Entries::new(1, index + 1);
        for _ in 0..100 {
            if h.entries(&name).await.unwrap() == queued {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            h.entries(&name).await.unwrap(),
            queued,
            "waiter {index} queued"
        );
    }

    let set = h.set();
    let set = set.lock().await;
    let tag = common::tag(&name);
    let slot = set.slot_of(&tag).await.unwrap();
    let from = set.owner_of(slot).await.unwrap();
    let to = (from + 1) % 3;
    set.migrate_slot(slot, to, Duration::from_millis(1500))
        .await
        .unwrap();
    assert_eq!(set.owner_of(slot).await.unwrap(), to, "the slot moved");
    drop(set);
    // A renewal after the move, on the new owner.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!held.is_lost(), "the holder lost its lock in the migration");
    assert!(
        order.try_recv().is_err(),
        "a waiter got the lock while it was held"
    );
    assert_eq!(h.entries(&name).await.unwrap(), Entries::new(1, WAITERS));

    inside.fetch_sub(1, Ordering::SeqCst);
    let first = held.fencing_token().0;
    held.release().await.unwrap();
    let mut tokens = vec![first];
    for expected in 0..WAITERS {
        let (index, token) = tokio::time::timeout(Duration::from_secs(10), order.recv())
            .await
            .expect("the waiters are served after the release")
            .unwrap();
        assert_eq!(index, expected, "served first come first served");
        tokens.push(token);
    }
    all_served(&tokens, waiting, &most).await;
    common::expect_nothing_left(&h, &name).await;
}

/// How many subscribers the node at `node` counts on the sharded channel `channel`.
async fn shard_subscribers(node: &lock_testbed::servers::RedisServer, channel: &str) -> i64 {
    let mut admin = common::admin_of(node.socket_addr()).await;
    let (_, count): (String, i64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query_async(&mut admin)
        .await
        .unwrap();
    count
}

/// Pub/sub waiters on a cluster wait on their lock's sharded channel (`SSUBSCRIBE` on the
/// primary serving its slot; one subscription per provider, two of the three waiters
/// sharing one). When the slot moves to another primary, the old one ends those
/// subscriptions and the waiters subscribe again on the new one; then a release reaches
/// every waiter there (a wake-up counted by each provider), the waiters are served one at a
/// time with increasing tokens, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_waiters_follow_their_channel_across_a_slot_migration() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use lock_conformance::{Harness, unique_name};

    const WAITERS: usize = 3;
    const PROVIDERS: i64 = 2;
    let h = ClusterHarness::new(RedisStrategy::PubSub).await;
    let name = unique_name("sharded");
    let channel = format!("{}:released", common::tag(&name));
    let holder = h.client().await.unwrap();
    let mut held = holder
        .provider
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("a free lock");
    let set = h.set();
    let (from, to, slot) = {
        let set = set.lock().await;
        let slot = set.slot_of(&common::tag(&name)).await.unwrap();
        let from = set.owner_of(slot).await.unwrap();
        (from, (from + 1) % 3, slot)
    };
    // Waits until the node `index` counts `expected` subscribers on the channel.
    let subscribers_become = |index: usize, expected: i64| {
        let (set, channel) = (Arc::clone(&set), channel.clone());
        async move {
            let mut count = 0;
            for _ in 0..150 {
                count = shard_subscribers(&set.lock().await.nodes()[index], &channel).await;
                if count == expected {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            count
        }
    };

    let inside = Arc::new(AtomicUsize::new(1));
    let most = Arc::new(AtomicUsize::new(1));
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let clients = [h.client().await.unwrap(), h.client().await.unwrap()];
    let mut waiting = Vec::new();
    for index in 0..WAITERS {
        let client = &clients[index.min(1)];
        let lock = client.provider.lock(&name).unwrap();
        let (inside, most, served) = (Arc::clone(&inside), Arc::clone(&most), served.clone());
        waiting.push(tokio::spawn(async move {
            let mut guard = lock.acquire(Some(Duration::from_secs(60))).await?;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let _ = served.send(guard.fencing_token().0);
            tokio::time::sleep(Duration::from_millis(20)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await
        }));
    }
    assert_eq!(
        subscribers_become(from, PROVIDERS).await,
        PROVIDERS,
        "every provider subscribed on the slot's primary"
    );

    set.lock()
        .await
        .migrate_slot(slot, to, Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(
        set.lock().await.owner_of(slot).await.unwrap(),
        to,
        "the slot moved"
    );
    assert_eq!(
        subscribers_become(to, PROVIDERS).await,
        PROVIDERS,
        "the waiters subscribed again on the slot's new primary"
    );
    assert_eq!(
        subscribers_become(from, 0).await,
        0,
        "no subscription is left on the old primary"
    );
    assert!(!held.is_lost(), "the holder lost its lock in the migration");
    assert!(
        order.try_recv().is_err(),
        "a waiter got the lock while it was held"
    );

    let heard_before: Vec<u64> = clients
        .iter()
        .map(|c| c.provider.metrics().wakeups)
        .collect();
    inside.fetch_sub(1, Ordering::SeqCst);
    let mut tokens = vec![held.fencing_token().0];
    held.release().await.unwrap();
    for _ in 0..WAITERS {
        let token = tokio::time::timeout(Duration::from_secs(10), order.recv())
            .await
            .expect("the waiters are served after the release")
            .unwrap();
        tokens.push(token);
    }
    for (index, client) in clients.iter().enumerate() {
        assert!(
            client.provider.metrics().wakeups > heard_before[index],
            "provider {index}'s waiters heard no release on the new primary"
        );
    }
    all_served(&tokens, waiting, &most).await;
    assert_eq!(
        subscribers_become(to, 0).await,
        0,
        "the waiters unsubscribed"
    );
    common::expect_nothing_left(&h, &name).await;
}

/// The ACL rule the crate docs give for a user limited to the locks, with what they add on
/// a cluster, is enough there for every strategy: grant, wait, hand-off or broadcast,
/// renew, release; and the read-write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rule_is_enough_on_a_cluster() {
    use std::time::Duration;

    use lock_conformance::unique_name;
    use lock_core::LockProvider;
    use lock_redis::{RedisConfig, RedisLockProvider};

    let set = common::cluster::start_cluster().await;
    let rules = format!(
        "ACL SETUSER documented {} {}",
        common::DOCUMENTED_ACL_RULE,
        common::DOCUMENTED_CLUSTER_ACL_RULE
    );
    let rules: Vec<&str> = rules.split_whitespace().collect();
    common::on_each(common::cluster::running(&set), &rules)
        .await
        .unwrap();
    let url = set.url(Some(("documented", "s3cret")));
    for strategy in [
        RedisStrategy::Polling,
        RedisStrategy::PubSub,
        RedisStrategy::Queue,
    ] {
        let config = RedisConfig::from_url(&url)
            .unwrap()
            .with_strategy(strategy)
            .with_ttl(Duration::from_secs(2))
            .with_timeout(common::TIMEOUT);
        let (a, b) = (
            RedisLockProvider::connect(config.clone()).await.unwrap(),
            RedisLockProvider::connect(config).await.unwrap(),
        );
        let name = unique_name("acl-doc");
        let mut held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
        let waiter = b.lock(&name).unwrap();
        let waiting =
            tokio::spawn(async move { waiter.acquire(Some(Duration::from_secs(10))).await });
        // Two confirmed renewals (every ttl/3); a queue waiter refreshes its place
        // meanwhile.
        common::expect_renewals(&held, 2, Duration::from_secs(4)).await;
        assert!(!held.is_lost(), "{strategy}: the holder's renewals failed");
        assert!(
            !waiting.is_finished(),
            "{strategy}: the waiter got a held lock"
        );
        held.release().await.unwrap();
        let mut next = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap_or_else(|error| panic!("{strategy}: the waiter: {error}"));
        next.release().await.unwrap();
        let rw = a.rw_lock(&name).unwrap();
        let mut writing = rw
            .try_write()
            .await
            .unwrap()
            .expect("a free read-write lock");
        writing.release().await.unwrap();
    }
}
