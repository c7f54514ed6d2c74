//! The handles a thread keeps per recorder, and the gauges' bookkeeping, read from local
//! recorders (this binary installs no global one: a lock acquired with none in place must
//! be recorded nowhere).
#![cfg(feature = "memory")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed check must fail the test"
)]

use std::future::Future;
use std::pin::Pin;

use lock_core::LockProvider;
use lock_core::memory::{MemoryLockProvider, MemoryServer};
use lock_core::observe::{ACQUISITIONS, HELD, HOLD_SECONDS, WAITING};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// What a recorder holds, by metric, summed over labels (a counter's or a gauge's
/// value, a histogram's number of samples); taking it resets the recorder.
fn taken(recorder: &DebuggingRecorder) -> std::collections::HashMap<String, f64> {
    let mut taken = std::collections::HashMap::new();
    for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
        let value = match value {
            DebugValue::Counter(count) => count as f64,
            DebugValue::Gauge(value) => value.into_inner(),
            DebugValue::Histogram(samples) => samples.len() as f64,
        };
        *taken.entry(key.key().name().to_owned()).or_insert(0.0) += value;
    }
    taken
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Each thread keeps the handles it registered, by recorder: a recorder that comes
/// after the lock (and its handles) were made gets every event from then on, and the
/// one before gets no more.
#[test]
fn handles_follow_the_recorder_in_place() {
    let runtime = runtime();
    let provider = MemoryLockProvider::new();
    let lock = provider.lock("handles").expect("a valid name");
    let cycle = || {
        runtime.block_on(async {
            let mut guard = lock.acquire(None).await.expect("a free lock");
            guard.release().await.expect("a release");
        });
    };
    let (first, second) = (DebuggingRecorder::new(), DebuggingRecorder::new());
    metrics::with_local_recorder(&first, || (cycle(), cycle()));
    metrics::with_local_recorder(&second, cycle);
    cycle();
    let (first, second) = (taken(&first), taken(&second));
    assert_eq!(first.get(ACQUISITIONS), Some(&2.0), "{first:?}");
    assert_eq!(second.get(ACQUISITIONS), Some(&1.0), "{second:?}");
    assert_eq!(second.get(HOLD_SECONDS), Some(&1.0), "{second:?}");
    assert_eq!(second.get(HELD), Some(&0.0), "{second:?}");
    assert_eq!(
        second.get(WAITING),
        None,
        "granted as they asked: {second:?}"
    );
}

/// A hold that began with no recorder installed (traced, so measured) moves no gauge
/// when it ends under one (the gauge would go below zero), and an `acquire` granted as it asks is never
/// counted as waiting, while one that waits is, until it ends.
#[test]
fn gauges_count_only_what_they_saw_begin() {
    let runtime = runtime();
    let server = MemoryServer::new();
    let (a, b) = (server.provider(), server.provider());
    let (lock_a, lock_b) = (
        a.lock("gauges").expect("a valid name"),
        b.lock("gauges").expect("a valid name"),
    );
    // Traced, so that the hold is measured, with no recorder to count it.
    let traced = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(std::io::sink)
        .finish();
    let unrecorded = tracing::subscriber::with_default(traced, || {
        runtime.block_on(lock_a.acquire(None)).expect("a free lock")
    });
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            drop(unrecorded);
            let held = lock_a.acquire(None).await.expect("a free lock");
            let mut waiter = Box::pin(lock_b.acquire(None));
            let polled = futures_poll_once(waiter.as_mut()).await;
            assert!(polled.is_none(), "the lock was held");
            // Taking the values resets them: what follows are changes.
            let waiting = taken(&recorder);
            assert_eq!(waiting.get(WAITING), Some(&1.0), "{waiting:?}");
            assert_eq!(waiting.get(HELD), Some(&1.0), "{waiting:?}");
            drop(held);
            let guard = waiter.await.expect("the grant after the drop");
            drop(guard);
        });
    });
    let after = taken(&recorder);
    assert_eq!(after.get(WAITING), Some(&-1.0), "{after:?}");
    assert_eq!(after.get(HELD), Some(&-1.0), "{after:?}");
    assert_eq!(after.get(HOLD_SECONDS), Some(&2.0), "{after:?}");
}

/// Polls `future` once: its output if it is ready.
async fn futures_poll_once<F: Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match Pin::new(&mut future).poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await
}
