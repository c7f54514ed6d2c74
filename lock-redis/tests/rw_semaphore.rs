//! The read-write lock and the semaphore on a real server, bigger than the conformance
//! cases: stress with many clients, and who wakes up when a queue moves (herd evidence:
//! a release wakes only the waiters it admits). Run with `--nocapture` to see the figures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test code: a failed set-up or check must fail the test; the figures are printed"
)]

mod common;

use common::RedisHarness;
use lock_conformance::cases::herd::{Settling, serve_rw_queue, serve_semaphore_queue};
use lock_conformance::cases::rw::rw_stress;
use lock_conformance::cases::semaphore::semaphore_stress;
use lock_conformance::{CaseFailure, Client, Harness, async_trait};
use lock_redis::RedisStrategy;

/// A Redis waiter is settled once queued: a release pushes the token onto the list of the
/// waiter it admits, whether or not that waiter is blocked on it yet.
struct Queued;

#[async_trait]
impl Settling for Queued {
    async fn semaphore_contender_ready(
        &self,
        _name: &str,
        _permits: u32,
    ) -> Result<(), CaseFailure> {
        Ok(())
    }
}

/// `count` clients of `h`.
async fn clients(h: &RedisHarness, count: usize) -> Vec<Client> {
    let mut clients = Vec::new();
    for _ in 0..count {
        clients.push(h.client().await.unwrap());
    }
    clients
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_stress_with_many_clients() {
    let h = RedisHarness::new(RedisStrategy::Queue).await;
    let report = rw_stress(&h, 20, 8).await.unwrap();
    eprintln!("{report:?}");
    assert!(report.writes > 0, "no writer in {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_stress_with_many_clients() {
    let h = RedisHarness::new(RedisStrategy::Queue).await;
    let peak = semaphore_stress(&h, 4, 12, 6).await.unwrap();
    eprintln!("peak {peak} of 4 permits");
}

/// Whatever the provider's strategy (the read-write lock always queues): each of 25
/// waiters is woken once, when it can enter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_wakes_only_those_who_enter() {
    for strategy in [RedisStrategy::Polling, RedisStrategy::Queue] {
        let h = RedisHarness::new(strategy).await;
        let clients = clients(&h, 25).await;
        let run = serve_rw_queue(&h, clients, &Queued).await.unwrap();
        eprintln!("{strategy}: 20 readers + 5 writers behind a writer: {run:?}");
        assert_eq!(
            (run.woken, run.futile),
            (25, 0),
            "{strategy}: each waiter woken once, when it can enter: {run:?}"
        );
    }
}

/// Each release of a permit wakes one waiter: the one it admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_release_wakes_the_waiter_it_admits() {
    let h = RedisHarness::new(RedisStrategy::Queue).await;
    let clients = clients(&h, 6).await;
    let run = serve_semaphore_queue(&h, clients, 2, &Queued)
        .await
        .unwrap();
    eprintln!("6 queued for 2 permits: {run:?}");
    assert_eq!(
        (run.woken, run.futile),
        (run.releases, 0),
        "one wake-up per release, none in vain: {run:?}"
    );
}

/// A writer that gives up at the head of the queue lets in at once the readers it kept
/// out, rather than at their next refresh (a third of the lease, 667 ms here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_giving_up_lets_the_readers_behind_it_in() {
    use std::time::Duration;
    use tokio::time::Instant;

    let h = RedisHarness::new(RedisStrategy::Queue).await;
    let [reader, writer, late] = [
        h.client().await.unwrap(),
        h.client().await.unwrap(),
        h.client().await.unwrap(),
    ];
    let name = lock_conformance::unique_name("rw-cancel");
    let mut first = reader
        .provider
        .rw_lock(&name)
        .unwrap()
        .try_read()
        .await
        .unwrap()
        .expect("a free lock");
    let writing = writer.provider.rw_lock(&name).unwrap();
    let waiting =
        tokio::spawn(async move { writing.write(Some(Duration::from_millis(300))).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reading = late.provider.rw_lock(&name).unwrap();
    let behind = tokio::spawn(async move {
        let guard = reading.read(Some(Duration::from_secs(5))).await;
        (Instant::now(), guard)
    });
    let gave_up = waiting.await.unwrap();
    let gave_up_at = Instant::now();
    assert!(gave_up.is_err(), "the writer timed out behind the reader");
    let (entered, guard) = behind.await.unwrap();
    let mut guard = guard.unwrap();
    let after = entered.saturating_duration_since(gave_up_at);
    assert!(
        after < Duration::from_millis(250),
        "the reader behind the writer entered {after:?} after the writer gave up"
    );
    guard.release().await.unwrap();
    first.release().await.unwrap();
}
