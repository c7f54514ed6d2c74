//! The Redis backend on a Redis Cluster (three primaries with a replica each, made with
//! `redis-cli --cluster create`): the conformance suite with the queue strategy; with the
//! polling strategy, the cases whose path differs from the queue's (the grant, the
//! waiting, a failover under waiters); a slot migrated while waiters wait.

mod common;

use common::cluster::ClusterHarness;
use lock_redis::RedisStrategy;

mod queue {
    use super::*;
    // Each case on a cluster of its own, four at a time: one at a time, the suite took
    // minutes.
    lock_conformance::conformance_suite!(4, ClusterHarness::new(RedisStrategy::Queue).await);
}

/// Stamps a test per listed case, run on a cluster of its own with the polling strategy.
macro_rules! polling_cases {
    ($($group:ident :: $case:ident => $id:literal;)*) => {
        mod polling {
            use super::*;
            $(
                #[test]
                fn $case() {
                    let recording = lock_conformance::runner::Recording::new(
                        concat!(env!("CARGO_PKG_NAME"), " ", module_path!()),
                        $id,
                        stringify!($case),
                    );
                    lock_conformance::runner::block_on(async {
                        let harness = ClusterHarness::new(RedisStrategy::Polling).await;
                        let (result, not_checked) = lock_conformance::runner::run_case(
                            lock_conformance::cases::$group::$case(&harness),
                        )
                        .await;
                        recording.conclude(result, &not_checked);
                    });
                }
            )*
        }
    };
}

polling_cases! {
    exclusion::a6_release_wakes_waiter => "A6";
    exclusion::a7_stress => "A7";
    exclusion::a8_concurrent_try_exactly_one => "A8";
    timeouts::b1_timeout_bounds => "B1";
    release::c5_client_death_frees => "C5";
    loss::d1_revoke_fires_lost => "D1";
    fencing::e1_tokens_increase => "E1";
    resilience::h5_leader_failover => "H5";
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
    assert_eq!(most.load(Ordering::SeqCst), 1, "one holder at a time");
    for _ in 0..100 {
        if h.entries(&name).await.unwrap() == Entries::new(0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(h.entries(&name).await.unwrap(), Entries::new(0, 0));
}
