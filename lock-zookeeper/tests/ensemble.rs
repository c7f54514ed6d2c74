//! The conformance suite for the default strategy on a three-member ZooKeeper ensemble.
//!
//! One ensemble serves the whole test binary (started on first use, killed when the binary
//! exits): processes, or containers under `LOCK_TEST_SERVERS=containers`, where a member is
//! killed and restarted through the engine. Clients' sessions last 4 s, so that a leader's
//! failover fits in one. Its cases take turns: the harness of one case holds the ensemble until the case
//! ends, so a leader killed by one case never disturbs another. `kill_leader` kills the
//! leader, waits for a new one and restarts the killed member; `restart_server` is a rolling
//! restart of every member; `pause_server` silences this case's clients' proxies (see
//! `common::ZkHarness`).
#![allow(
    clippy::expect_used,
    clippy::panic,
    reason = "test fixtures: a failed set-up must fail the test"
)]

mod common;

use std::sync::OnceLock;

use common::{SharedEnsemble, ZkHarness};
use lock_conformance::Outcome;
use lock_testbed::servers::ServerError;
use lock_zookeeper::ZkStrategy;

static ENSEMBLE: OnceLock<Result<SharedEnsemble, ServerError>> = OnceLock::new();

/// The binary's three-member ensemble, started on first use. Like
/// `lock_testbed::servers::shared_zk`, it lives in a static and is tied to no test's
/// runtime; a start-up failure is kept and reported to every test.
fn shared_ensemble() -> &'static SharedEnsemble {
    match ENSEMBLE.get_or_init(|| SharedEnsemble::start_blocking(3)) {
        Ok(ensemble) => ensemble,
        Err(error) => panic!("a three-member ZooKeeper ensemble: {error}"),
    }
}

async fn harness() -> ZkHarness {
    ZkHarness::on_ensemble(ZkStrategy::SequentialPredecessor, shared_ensemble()).await
}

mod ensemble {
    use super::*;
    lock_conformance::conformance_tests!(harness().await);
}

/// H5 proves its invariants on this harness rather than skipping: the leader is killed
/// while a lock is held with waiters queued.
#[test]
fn h5_runs_rather_than_skips() {
    lock_conformance::runner::block_on(async {
        let harness = harness().await;
        let outcome = lock_conformance::cases::resilience::h5_leader_failover(&harness).await;
        assert_eq!(outcome, Ok(Outcome::Passed), "H5 on the ensemble");
    });
}
