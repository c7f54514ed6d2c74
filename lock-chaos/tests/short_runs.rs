//! Short chaos runs, one per backend, one at a time: a minute of five clients under the
//! nemesis with a fixed seed (1, or 4 for the ZooKeeper ensemble in containers), held to
//! the backend's targets (see `Backend::targets`): progress after every fault and no
//! residue everywhere; no stale write accepted; for ZooKeeper, etcd and memory also no lost
//! update, no token granted twice and no overlap beyond the session. The ZooKeeper ensemble
//! runs in containers, where its members are also cut off from each other (with processes
//! when no engine answers, except under `LOCK_CONFORMANCE_STRICT`). `scripts/chaos` runs
//! longer ones.
#![allow(
    clippy::expect_used,
    clippy::print_stderr,
    reason = "test code: a run that cannot be made fails the test; the summary is printed"
)]

use std::time::Duration;

use lock_chaos::FaultKind;
use lock_chaos::run::{Backend, Outcome, RunOptions, run};
use lock_testbed::servers::ServerMode;
use lock_testbed::servers::containers;
use tokio::sync::Mutex;

/// The runs share two cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

async fn short_run(backend: Backend, servers: ServerMode, seed: u64) -> Outcome {
    let _turn = ONE_AT_A_TIME.lock().await;
    let out = tempfile::tempdir().expect("a directory for the run");
    let options = RunOptions::new(
        backend,
        Duration::from_secs(60),
        5,
        seed,
        env!("CARGO_BIN_EXE_chaos"),
        out.path(),
    )
    .with_servers(servers);
    let outcome = run(&options).await.expect("the run");
    eprintln!("{}", outcome.summary());
    let report = &outcome.report;
    assert!(
        outcome.violations.is_empty(),
        "{}: {:?}\n{}",
        backend.as_str(),
        outcome.violations,
        outcome.summary()
    );
    assert!(
        report.faults >= 10,
        "only {} faults injected",
        report.faults
    );
    assert!(
        report.writes_accepted >= 100,
        "only {} increments in a minute",
        report.writes_accepted
    );
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_ensemble_keeps_its_targets() {
    if let Err(why) = containers::check_ready().await {
        assert!(
            !lock_conformance::runner::strict(),
            "containers are required under STRICT: {why}"
        );
        eprintln!("no member partitions, the servers run as processes: {why}");
        short_run(Backend::Zookeeper, ServerMode::Processes, 1).await;
        return;
    }
    // Seed 4's plan cuts a member off six times and kills the leader five times.
    let outcome = short_run(Backend::Zookeeper, ServerMode::Containers, 4).await;
    assert!(
        outcome
            .faults
            .iter()
            .any(|fault| fault.kind == FaultKind::MemberPartition),
        "no member was cut off from the ensemble"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_keeps_its_targets() {
    short_run(Backend::Etcd, ServerMode::Processes, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_fencing() {
    short_run(Backend::Redis, ServerMode::Processes, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_fencing() {
    short_run(Backend::Redlock, ServerMode::Processes, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_keeps_its_targets() {
    short_run(Backend::Memory, ServerMode::Processes, 1).await;
}

/// A Redis Cluster (three primaries with a replica each) through failovers of the lock's
/// primary, killed primaries and the other faults: progress after each and no residue (the
/// grants a failover loses are measured, not judged, as under Sentinel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_keeps_its_targets() {
    let outcome = short_run(Backend::RedisCluster, ServerMode::Processes, 1).await;
    for kind in [FaultKind::Failover, FaultKind::LeaderKill] {
        assert!(
            outcome.faults.iter().any(|fault| fault.kind == kind),
            "no {} in the run",
            kind.as_str()
        );
    }
}
