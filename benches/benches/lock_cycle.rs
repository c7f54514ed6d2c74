//! Acquire-release cycles per backend and strategy, and for the peers' locks: uncontended
//! (and on the memory backend with a metrics recorder),
//! and the handoff under contention (N = 2, 10, 50). The ZooKeeper, Redis, etcd and
//! PostgreSQL servers are started by the bench on free loopback ports (or taken from
//! `LOCK_TEST_ZK`, `LOCK_TEST_REDIS`, `LOCK_TEST_ETCD` and `LOCK_TEST_POSTGRES`).
#![allow(
    clippy::expect_used,
    reason = "a benchmark cannot go on without its fixture; failing loudly is right"
)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use distlock_benches::measure_handoffs;
use distlock_benches::strategy::{Servers, Strategy};
use lock_core::LockProvider;
use lock_core::memory::MemoryServer;
use lock_testbed::servers::{shared_etcd, shared_postgres, shared_redis, shared_zk};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn servers() -> Servers {
    let zk = shared_zk().expect("a ZooKeeper server for the benches");
    let redis = shared_redis().expect("a Redis server for the benches");
    let etcd = shared_etcd().expect("an etcd server for the benches");
    let postgres = shared_postgres().expect("a PostgreSQL server for the benches");
    Servers::new(Some(zk.connect_string()), Some(redis.url()))
        .with_etcd(Some(etcd.client_address()))
        .with_postgres(Some(postgres.url()))
}

/// The memory backend and every strategy: one client, acquire then release.
fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("uncontended_acquire_release");
    let memory: Arc<dyn LockProvider> = Arc::new(MemoryServer::new().provider());
    let servers = servers();
    let mut providers = vec![("memory".to_owned(), memory)];
    for strategy in Strategy::ALL {
        let provider = rt
            .block_on(strategy.connect(&servers))
            .expect("a client of the strategy");
        providers.push((strategy.to_string(), provider));
    }
    for (name, provider) in providers {
        let lock = provider.lock("bench/uncontended").expect("valid name");
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let mut guard = lock.acquire(None).await.expect("free lock");
                guard.release().await.expect("release");
            });
        });
    }
    group.finish();
}

/// The mean time from a release to the next grant with N contenders, each its own client.
fn handoff(c: &mut Criterion) {
    let rt = runtime();
    let servers = servers();
    let mut group = c.benchmark_group("handoff");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    let mut kinds: Vec<Option<Strategy>> = vec![None];
    kinds.extend(Strategy::ALL.into_iter().map(Some));
    for kind in kinds {
        let label = kind.map_or_else(|| "memory".to_owned(), |s| s.to_string());
        for contenders in [2usize, 10, 50] {
            let memory = MemoryServer::new();
            let clients: Vec<Arc<dyn LockProvider>> = (0..contenders)
                .map(|_| match kind {
                    None => Arc::new(memory.provider()) as Arc<dyn LockProvider>,
                    Some(strategy) => rt
                        .block_on(strategy.connect(&servers))
                        .expect("a client of the strategy"),
                })
                .collect();
            group.bench_with_input(
                BenchmarkId::new(label.clone(), contenders),
                &contenders,
                |b, &n| {
                    b.to_async(&rt).iter_custom(|iters| {
                        let clients = clients.clone();
                        async move {
                            let rounds =
                                u32::try_from(iters.div_ceil(n as u64)).unwrap_or(u32::MAX);
                            let handoffs = measure_handoffs(&clients, "bench/handoff", rounds)
                                .await
                                .expect("contended run");
                            // Scale to the requested iteration count: criterion divides by
                            // `iters`.
                            let per = handoffs
                                .total
                                .checked_div(handoffs.count.max(1))
                                .unwrap_or(Duration::ZERO);
                            per * u32::try_from(iters).unwrap_or(u32::MAX)
                        }
                    });
                },
            );
        }
    }
    group.finish();
}

/// The memory backend's uncontended cycle with a `metrics` recorder in place (one that keeps
/// every value, as an exporter would aggregate them, and Prometheus's exporter), and with
/// none: the cost of the metrics that every lock records. Each recorder is the main thread's own while its
/// run lasts (`block_on` polls there).
fn uncontended_recorded(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("uncontended_recorded");
    let provider = MemoryServer::new().provider();
    let lock = provider.lock("bench/uncontended").expect("valid name");
    let mut cycles = |name: &str| {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let mut guard = lock.acquire(None).await.expect("free lock");
                guard.release().await.expect("release");
            });
        });
    };
    // The same cycle with no recorder, beside them: the servers the other groups start
    // are not warming up meanwhile.
    cycles("memory_unrecorded");
    let debugging = metrics_util::debugging::DebuggingRecorder::new();
    metrics::with_local_recorder(&debugging, || cycles("memory"));
    // The recorder's histograms keep every value until read.
    drop(debugging.snapshotter().snapshot());
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    metrics::with_local_recorder(&prometheus, || cycles("memory_prometheus"));
    drop(prometheus.handle().render());
    group.finish();
}

criterion_group!(benches, uncontended, handoff, uncontended_recorded);
criterion_main!(benches);
