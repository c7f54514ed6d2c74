//! The conformance suite for the default strategy on a three-member etcd cluster.
//!
//! One cluster serves the whole test binary (started on first use, killed when the binary
//! exits). Its cases take turns: the harness of one case holds the cluster until the case
//! ends, so that a leader killed by one case never disturbs another. `pause_server` freezes
//! every member, `kill_leader` kills the leader, waits for a new one and restarts the
//! killed member, and `restart_server` is a rolling restart (see `common::EtcdHarness`).
#![allow(
    clippy::expect_used,
    clippy::panic,
    reason = "test fixtures: a failed set-up must fail the test"
)]

mod common;

use std::sync::OnceLock;

use common::EtcdHarness;
use common::cluster::SharedCluster;
use lock_conformance::Outcome;
use lock_etcd::EtcdStrategy;
use lock_testbed::servers::ServerError;

static CLUSTER: OnceLock<Result<SharedCluster, ServerError>> = OnceLock::new();

/// The binary's three-member cluster, started on first use. Like
/// `lock_testbed::servers::shared_etcd`, it lives in a static and is tied to no test's
/// runtime; a start-up failure is kept and reported to every test.
fn shared_cluster() -> &'static SharedCluster {
    match CLUSTER.get_or_init(|| SharedCluster::start_blocking(3)) {
        Ok(cluster) => cluster,
        Err(error) => panic!("a three-member etcd cluster: {error}"),
    }
}

async fn harness() -> EtcdHarness {
    EtcdHarness::on_cluster(EtcdStrategy::Predecessor, shared_cluster()).await
}

mod cluster {
    use super::*;
    lock_conformance::conformance_tests!(harness().await);
}

/// The fault cases prove their invariants on this harness rather than skipping.
#[test]
fn fault_cases_run_rather_than_skip() {
    use lock_conformance::cases::{fencing, loss, resilience};
    lock_conformance::runner::block_on(async {
        let harness = harness().await;
        let outcome = resilience::h5_leader_failover(&harness).await;
        assert_eq!(outcome, Ok(Outcome::Passed), "H5 on the cluster");
        let outcome = loss::d4_server_pause_fires_lost(&harness).await;
        assert_eq!(outcome, Ok(Outcome::Passed), "D4 on the cluster");
        let outcome = fencing::e4_tokens_survive_restart(&harness).await;
        assert_eq!(outcome, Ok(Outcome::Passed), "E4 on the cluster");
        let outcome = resilience::h2_wrong_credentials(&harness).await;
        assert_eq!(outcome, Ok(Outcome::Passed), "H2 on the cluster");
    });
}
