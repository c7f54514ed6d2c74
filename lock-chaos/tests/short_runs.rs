//! Short chaos runs, one per backend, one at a time: a minute of five clients under the
//! nemesis with a fixed seed, held to the backend's targets (see `Backend::targets`):
//! progress after every fault and no residue everywhere; no stale write accepted where the
//! tokens strictly increase (ZooKeeper, etcd, Redis); for ZooKeeper and etcd also no lost
//! update, no token granted twice and no overlap beyond the session. Redlock's best-effort
//! tokens are measured. `scripts/chaos` runs longer ones.
#![allow(
    clippy::expect_used,
    clippy::print_stderr,
    reason = "test code: a run that cannot be made fails the test; the summary is printed"
)]

use std::time::Duration;

use lock_chaos::run::{Backend, RunOptions, run};
use tokio::sync::Mutex;

/// The runs share two cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

async fn short_run(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let out = tempfile::tempdir().expect("a directory for the run");
    let options = RunOptions::new(
        backend,
        Duration::from_secs(60),
        5,
        1,
        env!("CARGO_BIN_EXE_chaos"),
        out.path(),
    );
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_ensemble_keeps_its_targets() {
    short_run(Backend::Zookeeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_keeps_its_targets() {
    short_run(Backend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_fencing() {
    short_run(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_progress_and_leaves_nothing() {
    short_run(Backend::Redlock).await;
}
