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
use lock_conformance::cases::herd::{
    Settling, judge_rw_queue, judge_semaphore_queue, serve_rw_queue, serve_semaphore_queue,
};
use lock_conformance::cases::rw::rw_stress;
use lock_conformance::cases::semaphore::semaphore_stress;
use lock_conformance::{CaseFailure, Client, LockKind, async_trait, observe_until};
use lock_zookeeper::{ZkConfig, ZkLockProvider, ZkStrategy};

/// The herd-prone and the herd-free strategy.
const STRATEGIES: [ZkStrategy; 2] = [ZkStrategy::WholeQueue, ZkStrategy::SequentialPredecessor];

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

/// The herd-evidence scenarios' view of a ZooKeeper queue: its waiters are settled when
/// none has a wake-up under way and (herd-free) each watches the node it waits for.
struct ZkSettling<'h> {
    h: &'h ZkHarness,
    providers: Vec<Arc<ZkLockProvider>>,
    strategy: ZkStrategy,
}

impl<'h> ZkSettling<'h> {
    /// `count` clients of their own, with a view of their providers.
    async fn clients(
        h: &'h ZkHarness,
        strategy: ZkStrategy,
        count: usize,
    ) -> (Vec<Client>, ZkSettling<'h>) {
        let (mut clients, mut providers) = (Vec::new(), Vec::new());
        for _ in 0..count {
            let (client, provider) = h.zk_client().await.unwrap();
            clients.push(client);
            providers.push(provider);
        }
        let settling = ZkSettling {
            h,
            providers,
            strategy,
        };
        (clients, settling)
    }
}

#[async_trait]
impl Settling for ZkSettling<'_> {
    async fn waiters_settled(&self, kind: LockKind, name: &str) -> Result<(), CaseFailure> {
        let dir = lock_dir(ZkConfig::DEFAULT_ROOT, name);
        let queue = match kind {
            LockKind::Semaphore => format!("{dir}.semaphore/locks"),
            _ => format!("{dir}.rwlock"),
        };
        settle(self.h, &self.providers, name, &queue, 1, self.strategy).await;
        Ok(())
    }

    async fn semaphore_contender_ready(&self, name: &str, permits: u32) -> Result<(), CaseFailure> {
        let dir = lock_dir(ZkConfig::DEFAULT_ROOT, name);
        let leases = format!("{dir}.semaphore/leases");
        let (h, leases) = (self.h, leases.as_str());
        observe_until(
            STEP,
            &format!("{}: the mutex holder makes its lease", self.strategy),
            move || h.children(leases),
            |leases| leases.len() == permits as usize + 1,
        )
        .await
        .map(drop)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_herd_free_wakes_only_those_who_enter() {
    let mut runs = Vec::new();
    for strategy in STRATEGIES {
        let h = ZkHarness::new(strategy).await;
        let (clients, settling) = ZkSettling::clients(&h, strategy, 25).await;
        runs.push(serve_rw_queue(&h, clients, &settling).await.unwrap());
    }
    let [herd, herd_free] = runs[..] else {
        unreachable!("one run per strategy")
    };
    eprintln!("20 readers + 5 writers behind a writer: herd {herd:?}, herd-free {herd_free:?}");
    judge_rw_queue(25, herd, herd_free).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_lets_one_waiter_watch_the_leases() {
    let mut runs = Vec::new();
    for strategy in STRATEGIES {
        let h = ZkHarness::new(strategy).await;
        let (clients, settling) = ZkSettling::clients(&h, strategy, 6).await;
        runs.push(
            serve_semaphore_queue(&h, clients, 2, &settling)
                .await
                .unwrap(),
        );
    }
    let [herd, herd_free] = runs[..] else {
        unreachable!("one run per strategy")
    };
    eprintln!("6 queued for 2 permits: herd {herd:?}, herd-free {herd_free:?}");
    judge_semaphore_queue(herd, herd_free).unwrap();
}
