//! Faults on one client's connection that the conformance cases do not look into: what a
//! lost create reply does, seen from the wire.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::Duration;

use common::{EtcdHarness, Proxies, contenders};
use lock_conformance::cases::observe::recorded_total;
use lock_conformance::{ClientFaults, unique_name};
use lock_core::observe::{RECONNECTS, RENEWALS};
use lock_core::{LockProvider, LossReason};
use lock_etcd::{EtcdConfig, EtcdLockProvider, EtcdStrategy};

/// The create's reply is lost (the server made the key): the acquire fails retryably or
/// adopts the key, and either way no key is left once it is over; the next acquire works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_reply_leaves_no_key() {
    let h = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let proxies = Proxies::start(&[h.endpoint()]);
    let config = EtcdConfig::new(proxies.endpoints())
        .with_lease_ttl(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(2));
    let provider = EtcdLockProvider::connect(config).await.unwrap();
    let name = unique_name("lost-create");
    let lock = provider.lock(&name).unwrap();
    for round in 0..5 {
        proxies.lose_next_create_reply().await.unwrap();
        let swallowed = proxies.swallowed();
        match lock.acquire(Some(Duration::from_secs(5))).await {
            Ok(mut guard) => guard.release().await.unwrap(),
            Err(error) => assert!(error.is_retryable(), "round {round}: {error}"),
        }
        assert!(
            proxies.swallowed() > swallowed,
            "round {round}: no reply was swallowed"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let left = contenders(h.admin(), EtcdConfig::DEFAULT_PREFIX, &name).await;
            if left.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: keys left behind: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut again = lock.acquire(Some(Duration::from_secs(5))).await.unwrap();
        again.release().await.unwrap();
    }
    assert!(
        proxies.swallowed() >= 5,
        "{} replies swallowed",
        proxies.swallowed()
    );
}

/// A holder's loss names its cause: its lease revoked on the server is the session's end
/// (seen from the key's deletion, long before the next keep-alive), its key deleted by
/// another client is a removed entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_names_whether_the_lease_or_the_key_went() {
    let h = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let config = || {
        EtcdConfig::new(vec![h.endpoint()])
            .with_lease_ttl(Duration::from_secs(30))
            .with_timeout(Duration::from_secs(2))
    };
    let revoked = EtcdLockProvider::connect(config()).await.unwrap();
    let guard = revoked
        .lock(&unique_name("revoked"))
        .unwrap()
        .acquire(None)
        .await
        .unwrap();
    let lease = revoked.lease_id().unwrap();
    h.admin().lease_client().revoke(lease).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost().wait()).await;
    assert_eq!(reason.unwrap(), Some(LossReason::SessionExpired));

    let deleted = EtcdLockProvider::connect(config()).await.unwrap();
    let name = unique_name("deleted");
    let guard = deleted.lock(&name).unwrap().acquire(None).await.unwrap();
    let keys = contenders(h.admin(), EtcdConfig::DEFAULT_PREFIX, &name).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    h.admin()
        .kv_client()
        .delete(keys[0].clone(), None)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost().wait()).await;
    assert_eq!(reason.unwrap(), Some(LossReason::EntryRemoved));
    assert!(deleted.lease_id().is_some(), "the session goes on");
}

/// The session's keep-alives are counted as renewals, and a session opened after the last
/// one ended as a reconnection (`distlock_renewals_total`, `distlock_reconnects_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_new_sessions_are_counted() {
    let h = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let counted = |labels: &[&str]| {
        let metric = if labels.contains(&"what=session") {
            RECONNECTS
        } else {
            RENEWALS
        };
        recorded_total(metric, labels).expect("the suite's recorder, this binary's only one")
    };
    let renewed = ["backend=etcd", "outcome=renewed"];
    let sessions = ["backend=etcd", "what=session"];
    let (renewals, reconnects) = (counted(&renewed), counted(&sessions));
    // A lease of 3 s is renewed every second.
    let config = EtcdConfig::new(vec![h.endpoint()])
        .with_lease_ttl(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(2));
    let provider = EtcdLockProvider::connect(config).await.unwrap();
    let name = unique_name("renewals");
    let guard = provider.lock(&name).unwrap().acquire(None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while counted(&renewed) <= renewals {
        assert!(tokio::time::Instant::now() < deadline, "no renewal counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lease = provider.lease_id().unwrap();
    h.admin().lease_client().revoke(lease).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost().wait()).await;
    assert_eq!(lost.unwrap(), Some(LossReason::SessionExpired));
    let mut again = provider.lock(&name).unwrap().acquire(None).await.unwrap();
    assert_ne!(provider.lease_id(), Some(lease), "a new session");
    assert!(counted(&sessions) > reconnects, "the new session counted");
    again.release().await.unwrap();
}

/// A revoked lease deletes every key the session holds at once: the session ends with one
/// question to the server, not one per held key, and every lost signal fires; the watches
/// that saw their deletion are not cancelled one by one either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_asked_about_once() {
    const LOCKS: usize = 2000;
    let h = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let config = EtcdConfig::new(vec![h.endpoint()])
        .with_lease_ttl(Duration::from_secs(30))
        .with_timeout(Duration::from_secs(5));
    let provider = EtcdLockProvider::connect(config).await.unwrap();
    let name = unique_name("revoked-many");
    let mut guards = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        let lock = provider.lock(&format!("{name}-{i}")).unwrap();
        guards.push(lock.try_acquire().await.unwrap().expect("a free lock"));
    }
    let before = provider.metrics().server_requests;
    let lease = provider.lease_id().unwrap();
    let revoked = tokio::time::Instant::now();
    h.admin().lease_client().revoke(lease).await.unwrap();
    for guard in &guards {
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost().wait()).await;
        assert_eq!(reason.unwrap(), Some(LossReason::SessionExpired));
    }
    let took = revoked.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = provider.metrics().server_requests - before;
    assert!(
        asked < LOCKS as u64 / 10,
        "{asked} requests after the revoke; all {LOCKS} lost after {took:?}"
    );
}
