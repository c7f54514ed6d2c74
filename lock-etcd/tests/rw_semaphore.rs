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

use std::time::Duration;

use common::{EtcdHarness, keys};
use lock_conformance::cases::herd::{
    Settling, judge_rw_queue, judge_semaphore_queue, serve_rw_queue, serve_semaphore_queue,
};
use lock_conformance::cases::rw::rw_stress;
use lock_conformance::cases::semaphore::semaphore_stress;
use lock_conformance::{CaseFailure, Client, Harness, async_trait, observe_until};
use lock_core::LockName;
use lock_etcd::{EtcdConfig, EtcdStrategy};

/// The herd-prone and the herd-free strategy.
const STRATEGIES: [EtcdStrategy; 2] = [EtcdStrategy::WholeQueue, EtcdStrategy::Predecessor];

/// How long a lease may take to be made.
const STEP: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_stress_with_many_clients() {
    for strategy in STRATEGIES {
        let h = EtcdHarness::new(strategy).await;
        let report = rw_stress(&h, 20, 8).await.unwrap();
        eprintln!("{strategy}: {report:?}");
        assert!(report.writes > 0, "{strategy}: no writer in {report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_stress_with_many_clients() {
    for strategy in STRATEGIES {
        let h = EtcdHarness::new(strategy).await;
        let peak = semaphore_stress(&h, 4, 12, 6).await.unwrap();
        eprintln!("{strategy}: peak {peak} of 4 permits");
    }
}

/// The herd-evidence scenarios' view of an etcd queue: waiters watch deletions only, so
/// they are settled once queued.
struct EtcdSettling<'h> {
    h: &'h EtcdHarness,
    strategy: EtcdStrategy,
}

#[async_trait]
impl Settling for EtcdSettling<'_> {
    async fn semaphore_contender_ready(&self, name: &str, permits: u32) -> Result<(), CaseFailure> {
        let escaped = LockName::new(name)?.escaped();
        let leases = format!("{}/{escaped}.semaphore/leases/", EtcdConfig::DEFAULT_PREFIX);
        let (admin, leases) = (self.h.admin(), leases.as_str());
        observe_until(
            STEP,
            &format!("{}: the mutex holder makes its lease", self.strategy),
            move || keys(admin, leases),
            |leases| leases.len() == permits as usize + 1,
        )
        .await
        .map(drop)
    }
}

/// `count` clients of `h`.
async fn clients(h: &EtcdHarness, count: usize) -> Vec<Client> {
    let mut clients = Vec::new();
    for _ in 0..count {
        clients.push(h.client().await.unwrap());
    }
    clients
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_herd_free_wakes_only_those_who_enter() {
    let mut runs = Vec::new();
    for strategy in STRATEGIES {
        let h = EtcdHarness::new(strategy).await;
        let settling = EtcdSettling { h: &h, strategy };
        let clients = clients(&h, 25).await;
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
        let h = EtcdHarness::new(strategy).await;
        let settling = EtcdSettling { h: &h, strategy };
        let clients = clients(&h, 6).await;
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
