//! The read-write lock and the semaphore on a real server, bigger than the conformance
//! cases: stress with many clients, and who wakes up when a queue moves (herd evidence).
//! Run with `--nocapture` to see the figures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test code: a failed set-up or check must fail the test; the figures are printed"
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ZkHarness, lock_dir, wait_until, waking, watches_in};
use lock_conformance::cases::rw::rw_stress;
use lock_conformance::cases::semaphore::semaphore_stress;
use lock_conformance::{Client, Entries, Harness, LockKind, expect_entries_of, unique_name};
use lock_core::{Guard, MetricsSnapshot};
use lock_zookeeper::{ZkConfig, ZkLockProvider, ZkStrategy};
use tokio::sync::mpsc;

/// The herd-prone and the herd-free strategy.
const STRATEGIES: [ZkStrategy; 2] = [
    ZkStrategy::SequentialChildren,
    ZkStrategy::SequentialPredecessor,
];

/// How long a queue may take to move one step.
const STEP: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_stress_with_many_clients() {
    for strategy in STRATEGIES {
        let h = ZkHarness::new(strategy).await;
        let report = rw_stress(&h, 20, 8).await.unwrap();
        eprintln!("{strategy}: {report:?}");
        assert!(report.writes > 0, "{strategy}: no writer in {report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_stress_with_many_clients() {
    for strategy in STRATEGIES {
        let h = ZkHarness::new(strategy).await;
        let peak = semaphore_stress(&h, 4, 12, 6).await.unwrap();
        eprintln!("{strategy}: peak {peak} of 4 permits");
    }
}

/// Waits until every waiter is settled in its wait, so that the wake-ups counted from then on
/// are the ones the test causes: none of `providers` has a wake-up under way (see
/// [`waking`]: every notification sent so far has reached it and been dealt with), and under
/// the herd-free strategy every waiting contender in `dir` (every node but the first
/// `holders`) watches the node it waits for. (The herd strategy's waiters watch the
/// directory: the server does not list child watches.) Panics after [`STEP`].
async fn settle(
    h: &ZkHarness,
    providers: &[Arc<ZkLockProvider>],
    name: &str,
    dir: &str,
    holders: usize,
    strategy: ZkStrategy,
) {
    let herd_free = strategy == ZkStrategy::SequentialPredecessor;
    wait_until(
        STEP,
        &format!("{strategy}: the waiters in {dir} settle in their wait"),
        move || async move {
            let waking = waking(providers, name).await;
            let mut unwatched = Vec::new();
            if herd_free {
                let watches = h.data_watches().await;
                for (node, session) in h.owned_queue(dir).await.into_iter().skip(holders) {
                    if !watches_in(watches.as_ref(), session, dir, &node) {
                        unwatched.push(node);
                    }
                }
            }
            (waking, unwatched)
        },
        |(waking, unwatched)| waking.is_empty() && unwatched.is_empty(),
    )
    .await;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Read,
    Write,
}

/// Wake-ups and wake-ups in vain summed over `clients` since `before`.
fn woken(clients: &[Client], before: &[MetricsSnapshot]) -> (u64, u64) {
    clients
        .iter()
        .zip(before)
        .map(|(client, before)| client.provider.metrics().since(before))
        .fold((0, 0), |(woken, futile), delta| {
            (woken + delta.wakeups, futile + delta.futile_wakeups)
        })
}

/// One writer holds; 20 readers and 5 writers queue behind it in groups (four readers, then
/// a writer). The queue is then served group by group, each group released in queue order.
/// Returns the wake-ups and the wake-ups in vain of the 25 waiting clients.
async fn serve_rw_queue(strategy: ZkStrategy) -> (u64, u64) {
    let h = ZkHarness::new(strategy).await;
    let name = unique_name("rw-herd");
    let holder = h.client().await.unwrap();
    let mut held = holder
        .provider
        .rw_lock(&name)
        .unwrap()
        .try_write()
        .await
        .unwrap()
        .expect("the write hold of a free lock");
    let plan: Vec<Side> = (0..5)
        .flat_map(|_| [Side::Read, Side::Read, Side::Read, Side::Read, Side::Write])
        .collect();
    let (grants, mut granted) = mpsc::unbounded_channel::<(usize, Guard)>();
    let mut clients = Vec::new();
    let mut providers = Vec::new();
    for (index, side) in plan.iter().copied().enumerate() {
        let (client, provider) = h.zk_client().await.unwrap();
        providers.push(provider);
        let lock = client.provider.rw_lock(&name).unwrap();
        let grants = grants.clone();
        tokio::spawn(async move {
            let guard = match side {
                Side::Read => lock.read(None).await,
                Side::Write => lock.write(None).await,
            };
            let _ = grants.send((index, guard.expect("a grant")));
        });
        clients.push(client);
        // One at a time, so that the queue's order is the plan's.
        expect_entries_of(
            &h,
            LockKind::ReadWrite,
            &name,
            Entries::new(1, index + 1),
            "queued",
        )
        .await
        .unwrap();
    }
    // The herd variant's waiters may still be waking for the last arrivals, and the
    // herd-free ones setting their watch: let them settle, so that the counts below hold
    // this run's wake-ups only.
    let dir = format!("{}.rwlock", lock_dir(ZkConfig::DEFAULT_ROOT, &name));
    settle(&h, &providers, &name, &dir, 1, strategy).await;
    let before: Vec<_> = clients.iter().map(|c| c.provider.metrics()).collect();
    held.release().await.unwrap();
    let mut next = 0;
    while next < plan.len() {
        // The group that must enter together: a writer alone, or the readers up to the next
        // writer.
        let size = match plan[next] {
            Side::Write => 1,
            Side::Read => plan[next..]
                .iter()
                .take_while(|side| **side == Side::Read)
                .count(),
        };
        let mut group = Vec::new();
        for _ in 0..size {
            let grant = tokio::time::timeout(STEP, granted.recv())
                .await
                .unwrap_or_else(|_| panic!("{strategy}: group at {next} not served"))
                .expect("a grant");
            group.push(grant);
        }
        group.sort_by_key(|(index, _)| *index);
        let indices: Vec<_> = group.iter().map(|(index, _)| *index).collect();
        assert_eq!(
            indices,
            (next..next + size).collect::<Vec<_>>(),
            "{strategy}: served out of order"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(200), granted.recv())
                .await
                .is_err(),
            "{strategy}: someone entered beside the group at {next}"
        );
        for (_, mut guard) in group {
            guard.release().await.unwrap();
        }
        next += size;
    }
    // Nothing is left to land: every waiter has been granted, so its acquire, and every
    // wake-up it counts, is over.
    let counts = woken(&clients, &before);
    expect_entries_of(&h, LockKind::ReadWrite, &name, Entries::new(0, 0), "served")
        .await
        .unwrap();
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_herd_free_wakes_only_those_who_enter() {
    let (herd_woken, herd_futile) = serve_rw_queue(ZkStrategy::SequentialChildren).await;
    let (woken, futile) = serve_rw_queue(ZkStrategy::SequentialPredecessor).await;
    eprintln!(
        "20 readers + 5 writers behind a writer: herd {herd_woken} wake-ups ({herd_futile} in vain), \
         herd-free {woken} ({futile} in vain)"
    );
    assert_eq!(
        (woken, futile),
        (25, 0),
        "herd-free: each waiter is woken once, when it can enter"
    );
    assert!(
        herd_futile > 25 && herd_woken > 50,
        "the herd variant should wake everyone on every change: {herd_woken} ({herd_futile} in vain)"
    );
}

/// Two permits held, six contenders queued; the holders and then each newcomer release one
/// at a time. Returns the wake-ups and wake-ups in vain of the queued contenders, and the
/// number of releases.
async fn serve_semaphore_queue(strategy: ZkStrategy) -> (u64, u64, u64) {
    const PERMITS: u32 = 2;
    const QUEUED: usize = 6;
    let h = ZkHarness::new(strategy).await;
    let name = unique_name("sem-herd");
    let mut holders = Vec::new();
    let mut holder_clients = Vec::new();
    for _ in 0..PERMITS {
        let client = h.client().await.unwrap();
        let semaphore = client.provider.semaphore(&name, PERMITS).unwrap();
        holders.push(
            semaphore
                .try_acquire()
                .await
                .unwrap()
                .expect("a free permit"),
        );
        holder_clients.push(client);
    }
    let (grants, mut granted) = mpsc::unbounded_channel::<(usize, Guard)>();
    let mut clients = Vec::new();
    let mut providers = Vec::new();
    for index in 0..QUEUED {
        let (client, provider) = h.zk_client().await.unwrap();
        providers.push(provider);
        let semaphore = client.provider.semaphore(&name, PERMITS).unwrap();
        let grants = grants.clone();
        tokio::spawn(async move {
            let permit = semaphore.acquire(None).await.expect("a permit");
            let _ = grants.send((index, permit));
        });
        clients.push(client);
        expect_entries_of(
            &h,
            LockKind::Semaphore,
            &name,
            Entries::new(PERMITS as usize, index + 1),
            "queued",
        )
        .await
        .unwrap();
    }
    // The first contender holds the mutex: it waits for a permit once it has made its lease
    // (which the counts above cannot tell from a held one). The others wait for the mutex;
    // the herd variant's may still be waking for the last arrivals.
    let dir = format!("{}.semaphore", lock_dir(ZkConfig::DEFAULT_ROOT, &name));
    let leases = format!("{dir}/leases");
    let (harness, leases) = (&h, leases.as_str());
    let made_lease = move |step: usize| async move {
        wait_until(
            STEP,
            &format!("{strategy}: the mutex holder after {step} grants makes its lease"),
            move || harness.children(leases),
            |leases| leases.len() == PERMITS as usize + 1,
        )
        .await;
    };
    made_lease(0).await;
    settle(&h, &providers, &name, &format!("{dir}/locks"), 1, strategy).await;
    let before: Vec<_> = clients.iter().map(|c| c.provider.metrics()).collect();
    let mut releases = 0;
    for expected in 0..QUEUED {
        let mut permit = holders.remove(0);
        permit.release().await.unwrap();
        releases += 1;
        let (index, permit) = tokio::time::timeout(STEP, granted.recv())
            .await
            .unwrap_or_else(|_| panic!("{strategy}: waiter {expected} not served"))
            .expect("a grant");
        assert_eq!(index, expected, "{strategy}: served out of order");
        holders.push(permit);
        // Let the next contender settle on the lease watch before the next release.
        if expected + 1 < QUEUED {
            expect_entries_of(
                &h,
                LockKind::Semaphore,
                &name,
                Entries::new(PERMITS as usize, QUEUED - expected - 1),
                "the next waits",
            )
            .await
            .unwrap();
            // The counts above cannot tell whether the next contender has made its lease
            // yet; wait until it has, so that each release wakes a lease watcher.
            made_lease(expected + 1).await;
        }
    }
    // Every queued contender has been granted: its acquire, and every wake-up it counts,
    // is over.
    let (woken, futile) = woken(&clients, &before);
    for mut permit in holders {
        permit.release().await.unwrap();
    }
    expect_entries_of(&h, LockKind::Semaphore, &name, Entries::new(0, 0), "served")
        .await
        .unwrap();
    (woken, futile, releases)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_lets_one_waiter_watch_the_leases() {
    let (herd_woken, herd_futile, releases) =
        serve_semaphore_queue(ZkStrategy::SequentialChildren).await;
    let (woken, futile, _) = serve_semaphore_queue(ZkStrategy::SequentialPredecessor).await;
    eprintln!(
        "{releases} releases, 6 queued for 2 permits: herd {herd_woken} wake-ups ({herd_futile} in vain), \
         herd-free {woken} ({futile} in vain)"
    );
    // Per release: the lease watcher is granted, and it hands the mutex to the next waiter.
    assert!(
        futile == 0 && woken <= 2 * releases,
        "herd-free: {woken} wake-ups ({futile} in vain) for {releases} releases"
    );
    assert!(
        herd_futile > 0,
        "the herd variant should wake all mutex waiters: {herd_woken} ({herd_futile} in vain)"
    );
}
