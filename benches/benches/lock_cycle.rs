//! Acquire-release cycles per backend: uncontended, and the handoff under contention.
#![allow(
    clippy::expect_used,
    reason = "a benchmark cannot go on without its fixture; failing loudly is right"
)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use distlock_benches::measure_handoffs;
use lock_core::LockProvider;
use lock_core::memory::MemoryServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let provider = MemoryServer::new().provider();
    let lock = provider.lock("bench/uncontended").expect("valid name");
    c.bench_function("memory/uncontended_acquire_release", |b| {
        b.to_async(&rt).iter(|| async {
            let mut guard = lock.acquire(None).await.expect("free lock");
            guard.release().await.expect("release");
        });
    });
}

fn handoff(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("memory/handoff");
    for contenders in [2usize, 10, 50] {
        group.bench_with_input(
            BenchmarkId::from_parameter(contenders),
            &contenders,
            |b, &n| {
                b.to_async(&rt).iter_custom(|iters| async move {
                    let server = MemoryServer::new();
                    let clients: Vec<Arc<dyn LockProvider>> = (0..n)
                        .map(|_| Arc::new(server.provider()) as Arc<dyn LockProvider>)
                        .collect();
                    let rounds = u32::try_from(iters.div_ceil(n as u64)).unwrap_or(u32::MAX);
                    let handoffs = measure_handoffs(&clients, "bench/handoff", rounds)
                        .await
                        .expect("contended run");
                    // Scale to the requested iteration count: criterion divides by `iters`.
                    let per = handoffs
                        .total
                        .checked_div(handoffs.count.max(1))
                        .unwrap_or(Duration::ZERO);
                    per * u32::try_from(iters).unwrap_or(u32::MAX)
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, uncontended, handoff);
criterion_main!(benches);
