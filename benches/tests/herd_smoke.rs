//! A smoke run of the `herd` binary on servers it starts itself: N = 1 and 5, a few
//! handoffs per strategy. It checks the JSON's shape and the direction of the wake-up
//! counts, not performance.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check must fail the test"
)]

use std::process::Command;

use serde_json::Value;

const FIELDS: &[&str] = &[
    "strategy",
    "backend",
    "contenders",
    "handoffs",
    "throughput_per_s",
    "handoff_p50_us",
    "handoff_p99_us",
    "floor_p50_us",
    "wakeups_per_handoff",
    "futile_wakeups_per_handoff",
    "server_requests_per_handoff",
    "min_grants",
    "max_grants",
    "fifo_violations",
];

/// Runs `herd` with `args`, its JSON written into `dir`; the runs it reports.
fn run_herd(args: &[&str], dir: &std::path::Path) -> Vec<Value> {
    let json = dir.join("herd.json");
    let output = Command::new(env!("CARGO_BIN_EXE_herd"))
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("the herd binary runs");
    assert!(
        output.status.success(),
        "herd failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// What every smoke run takes: 20 handoffs, each held 10 ms. That is long enough for every
/// waiter to be back waiting before the next release, even on a loaded machine (etcd's
/// single-key waiter takes two round trips, a create and a watch, to be back): the herd's
/// size is then N - 1, not a matter of timing.
const SMALL: &[&str] = &[
    "--handoffs",
    "20",
    "--floor-rounds",
    "10",
    "--hold-ms",
    "10",
];

/// A small run of `strategies` at N = 5 on the servers `servers` says.
fn run_small(servers: &[&str], strategies: &str, dir: &std::path::Path) -> Vec<Value> {
    let which = ["--strategies", strategies, "--contenders", "5"];
    run_herd(&[servers, &which[..], SMALL].concat(), dir)
}

/// The run of `strategy` with `n` contenders.
fn run_of<'r>(runs: &'r [Value], strategy: &str, n: u64) -> &'r Value {
    runs.iter()
        .find(|run| run["strategy"] == strategy && run["contenders"] == n)
        .unwrap_or_else(|| panic!("no run of {strategy} N={n}"))
}

fn wakeups(runs: &[Value], strategy: &str, n: u64) -> f64 {
    run_of(runs, strategy, n)["wakeups_per_handoff"]
        .as_f64()
        .unwrap_or_else(|| panic!("no wake-up count for {strategy} N={n}"))
}

/// The queue of `runs` at N = `n`: herd-free (one wake-up per handoff), FIFO, and with the
/// server requests counted.
fn queue_is_herd_free(runs: &[Value], n: u64) {
    let queue = run_of(runs, "redis-queue", n);
    let wakeups = queue["wakeups_per_handoff"].as_f64().unwrap();
    assert!(
        wakeups <= 1.05,
        "redis-queue: {wakeups} wake-ups per handoff"
    );
    assert_eq!(queue["fifo_violations"].as_u64(), Some(0), "{queue}");
    let requests = queue["server_requests_per_handoff"].as_f64().unwrap();
    assert!(
        requests > 1.0,
        "redis-queue: {requests} server requests per handoff"
    );
}

#[test]
fn a_smoke_run_reports_every_strategy_and_the_herd() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let report_arg = report.to_str().unwrap();
    let which = ["--contenders", "1,5", "--report", report_arg];
    let runs = run_herd(&[&which[..], SMALL].concat(), dir.path());
    let strategies = [
        "zk-single",
        "zk-children",
        "zk-predecessor",
        "zk-recipe",
        "redis-polling",
        "redis-pubsub",
        "redis-queue",
        "etcd-single",
        "etcd-prefix",
        "etcd-predecessor",
        "etcd-v3lock",
        "pg-advisory",
        "pg-notify",
        "pg-polling",
    ];
    assert_eq!(
        runs.len(),
        strategies.len() * 2,
        "one object per (strategy, N)"
    );
    for run in &runs {
        for field in FIELDS {
            assert!(run.get(field).is_some(), "{field} missing in {run}");
        }
        let handoffs = run["handoffs"].as_u64().unwrap();
        assert!(handoffs >= 1, "no handoff measured: {run}");
        assert!(run["throughput_per_s"].as_f64().unwrap() > 0.0, "{run}");
        assert!(run["floor_p50_us"].as_f64().unwrap() > 0.0, "{run}");
    }
    // Herd-free: one wake-up per handoff; herd: more, growing with N.
    for strategy in [
        "zk-predecessor",
        "redis-queue",
        "etcd-predecessor",
        "pg-advisory",
    ] {
        let w = wakeups(&runs, strategy, 5);
        assert!(w <= 1.05, "{strategy}: {w} wake-ups per handoff at N=5");
    }
    // FIFO: with 2 ms held per grant every waiter is queued long before the next release.
    for strategy in [
        "zk-predecessor",
        "redis-queue",
        "etcd-predecessor",
        "pg-advisory",
    ] {
        let run = run_of(&runs, strategy, 5);
        assert_eq!(
            run["fifo_violations"].as_u64(),
            Some(0),
            "{strategy}: FIFO violated at N=5: {run}"
        );
    }
    for strategy in [
        "zk-single",
        "zk-children",
        "redis-pubsub",
        "etcd-single",
        "etcd-prefix",
        "pg-notify",
    ] {
        let w = wakeups(&runs, strategy, 5);
        assert!(
            w > 1.5 && w > wakeups(&runs, strategy, 1),
            "{strategy}: {w} wake-ups per handoff at N=5 is no herd"
        );
    }
    // PostgreSQL keeps no request count a run can read: its clients count their statements.
    let requests = run_of(&runs, "pg-advisory", 5)["server_requests_per_handoff"].as_f64();
    assert!(
        requests.is_some_and(|r| r >= 1.0),
        "pg-advisory: {requests:?} requests per handoff"
    );
    for file in ["summary.md", "throughput.svg", "wakeups.svg"] {
        assert!(report.join(file).exists(), "{file} not written");
    }
}

/// `--redis-cluster`: the Redis strategies on a Redis Cluster the benchmark starts (three
/// primaries). The queue stays herd-free and FIFO, pub/sub (sharded) wakes the herd, and
/// the server requests are counted on every node.
#[test]
fn a_cluster_run_reports_the_redis_strategies() {
    let dir = tempfile::tempdir().unwrap();
    let runs = run_small(&["--redis-cluster"], "redis-pubsub,redis-queue", dir.path());
    assert_eq!(runs.len(), 2, "one object per strategy: {runs:?}");
    queue_is_herd_free(&runs, 5);
    let w = wakeups(&runs, "redis-pubsub", 5);
    assert!(w > 1.5, "redis-pubsub: {w} wake-ups per handoff is no herd");
}

/// `--zk-ensemble 3`: the ZooKeeper strategies on an ensemble the benchmark starts, its
/// contenders connected to any member. The predecessor-watch stays herd-free, every waiter
/// watching the children is woken, and the server requests are counted on every member
/// (one member alone sees about a third of them).
#[test]
fn an_ensemble_run_reports_the_zookeeper_strategies() {
    let dir = tempfile::tempdir().unwrap();
    let runs = run_small(
        &["--zk-ensemble", "3"],
        "zk-children,zk-predecessor",
        dir.path(),
    );
    assert_eq!(runs.len(), 2, "one object per strategy: {runs:?}");
    let predecessor = run_of(&runs, "zk-predecessor", 5);
    let w = wakeups(&runs, "zk-predecessor", 5);
    assert!(w <= 1.05, "zk-predecessor: {w} wake-ups per handoff");
    assert_eq!(
        predecessor["fifo_violations"].as_u64(),
        Some(0),
        "{predecessor}"
    );
    let requests = predecessor["server_requests_per_handoff"].as_f64().unwrap();
    assert!(
        requests >= 4.0,
        "zk-predecessor: {requests} server requests per handoff (every member counted?)"
    );
    let w = wakeups(&runs, "zk-children", 5);
    assert!(w > 1.5, "zk-children: {w} wake-ups per handoff is no herd");
}

/// `--redis redis+sentinel://…`: the Redis strategies through the sentinels of a primary
/// with two replicas (started here); the floor, the server requests and the leftovers are
/// measured on the primary they name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_run_reports_the_redis_strategies() {
    use lock_testbed::servers::{RedisSentinelOptions, RedisSentinelSet};

    let set = RedisSentinelSet::start(RedisSentinelOptions::default())
        .await
        .unwrap();
    let url = set.url(None);
    let runs = tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().unwrap();
        run_herd(
            &[
                "--redis",
                &url,
                "--strategies",
                "redis-pubsub,redis-queue",
                "--contenders",
                "3",
                "--handoffs",
                "10",
                "--floor-rounds",
                "5",
                "--hold-ms",
                "10",
            ],
            dir.path(),
        )
    })
    .await
    .unwrap();
    assert_eq!(runs.len(), 2, "one object per strategy: {runs:?}");
    queue_is_herd_free(&runs, 3);
}

/// `--etcd URL`: etcd's lock service on a server the benchmark cannot restart, twice at
/// N = 100, where cancelling every waiter at once deadlocks the server's lock service
/// (etcd-io/etcd#13336; the second run's queue then never forms, even in a debug build).
/// After them, a lock still passes from its holder to a waiter on that server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v3lock_run_leaves_the_etcd_it_was_given_working() {
    use etcd_client::{Client, LockOptions};
    use lock_testbed::servers::{EtcdOptions, EtcdServer};

    let server = EtcdServer::start(EtcdOptions::default()).await.unwrap();
    let endpoint = server.endpoint();
    let runs = tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().unwrap();
        let which = [
            "--etcd",
            &endpoint,
            "--strategies",
            "etcd-v3lock",
            "--contenders",
            "100,100",
        ];
        run_herd(&[&which[..], SMALL].concat(), dir.path())
    })
    .await
    .unwrap();
    assert_eq!(runs.len(), 2, "one object per run: {runs:?}");

    let client = Client::connect([server.endpoint()], None).await.unwrap();
    let lease = |ttl| {
        let mut leases = client.lease_client();
        async move { leases.grant(ttl, None).await.unwrap().id() }
    };
    let (first, second) = (lease(30).await, lease(30).await);
    let mut locks = client.lock_client();
    let held = locks
        .lock("probe", Some(LockOptions::new().with_lease(first)))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let mut locks = client.lock_client();
        async move {
            locks
                .lock("probe", Some(LockOptions::new().with_lease(second)))
                .await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the probe lock was granted twice");
    locks.unlock(held.key()).await.unwrap();
    let granted = tokio::time::timeout(std::time::Duration::from_secs(10), waiter).await;
    assert!(
        matches!(granted, Ok(Ok(Ok(_)))),
        "etcd's lock service no longer hands a lock to its waiter: {granted:?}"
    );
}

/// Scale mode at two sizes on two backends: each strategy and size runs in a process of its
/// own and the parent gathers them; every run leaves nothing behind, the servers that
/// report their memory report it, and closing the provider fires every lost signal.
#[test]
fn a_scale_run_of_two_sizes_reports_each_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let which = [
        "--scale",
        "50,200",
        "--strategies",
        "zk-predecessor,redis-queue",
    ];
    let runs = run_herd(&which, dir.path());
    let rows: Vec<(&str, u64)> = runs
        .iter()
        .map(|run| {
            (
                run["strategy"].as_str().unwrap(),
                run["locks"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("zk-predecessor", 50),
            ("zk-predecessor", 200),
            ("redis-queue", 50),
            ("redis-queue", 200)
        ]
    );
    for run in &runs {
        assert_eq!(run["leftovers"], 0, "{run}");
        assert!(run["acquire_per_s"].as_f64().unwrap() > 0.0, "{run}");
        assert!(
            run["server_bytes_per_lock"].is_f64(),
            "no server figure: {run}"
        );
        assert!(
            run["all_lost_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
            "no time to the last lost signal: {run}"
        );
        // ZooKeeper's server can end a session; Redis keeps none (its locks are leases).
        let server_ends = run["strategy"] == "zk-predecessor";
        assert_eq!(
            run["server_end_lost_ms"]
                .as_f64()
                .is_some_and(|ms| ms >= 0.0),
            server_ends,
            "{run}"
        );
        assert_eq!(run["server_end_requests"].is_u64(), server_ends, "{run}");
        // Where the server ends a session, how long that took is reported too.
        assert_eq!(
            run["server_end_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
            server_ends,
            "{run}"
        );
    }
}

/// A count of zero locks or contenders is refused before any server starts, with the
/// option named.
#[test]
fn zero_locks_or_contenders_are_refused() {
    for option in ["--scale", "--contenders"] {
        let output = Command::new(env!("CARGO_BIN_EXE_herd"))
            .args([option, "0"])
            .output()
            .expect("the herd binary runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{option} 0: {stderr}");
        assert!(
            stderr.contains(option) && stderr.contains("at least 1"),
            "{option} 0: {stderr}"
        );
    }
}
