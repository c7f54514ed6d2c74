//! A lock's name becomes a metrics label only when the application asks for it. (What every
//! backend records is the conformance suite's case N1.)
#![cfg(feature = "memory")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed check must fail the test"
)]

use lock_core::LockProvider;
use lock_core::memory::MemoryLockProvider;
use lock_core::observe::{self, ACQUISITIONS};
use metrics_util::debugging::DebuggingRecorder;

#[tokio::test]
async fn a_locks_name_is_a_label_only_when_asked_for() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("this binary's only recorder");
    let provider = MemoryLockProvider::new();
    drop(
        provider
            .lock("customer-4711")
            .unwrap()
            .try_acquire()
            .await
            .unwrap(),
    );
    observe::label_lock_names(true);
    drop(
        provider
            .lock("customer-4712")
            .unwrap()
            .try_acquire()
            .await
            .unwrap(),
    );

    let labels: Vec<Vec<String>> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == ACQUISITIONS)
        .map(|(key, ..)| {
            key.key()
                .labels()
                .map(|label| format!("{}={}", label.key(), label.value()))
                .collect()
        })
        .collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(
        labels.iter().all(|l| !l.iter().any(|l| l.contains("4711"))),
        "a name in a label without being asked for: {labels:?}"
    );
    assert!(
        labels
            .iter()
            .any(|l| l.contains(&"lock=customer-4712".to_owned())),
        "the name asked for: {labels:?}"
    );
}
