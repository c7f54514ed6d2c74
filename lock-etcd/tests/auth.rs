//! Authentication and roles on a real server: a user whose role covers one prefix locks
//! there, is refused elsewhere with `PermissionDenied` (and leaves nothing behind), and wrong
//! credentials are an `Auth` error at connect.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::Duration;

use common::{EtcdHarness, SECURED_PREFIX};
use etcd_client::{Client as EtcdClient, ConnectOptions, GetOptions};
use lock_core::{LockError, LockProvider};
use lock_etcd::{EtcdConfig, EtcdLockProvider, EtcdStrategy};

fn config(endpoint: String, prefix: &str, password: &str) -> EtcdConfig {
    EtcdConfig::new([endpoint])
        .with_prefix(prefix)
        .with_user("locker", password)
        .with_timeout(Duration::from_secs(2))
}

/// Every key on the server, as `root` sees them.
async fn all_keys(endpoint: &str) -> Vec<String> {
    let options = ConnectOptions::new().with_user("root", "root");
    let root = EtcdClient::connect([endpoint], Some(options))
        .await
        .expect("root connects");
    let found = root
        .kv_client()
        .get("", Some(GetOptions::new().with_all_keys().with_keys_only()))
        .await
        .expect("a listing");
    found
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_limited_to_the_prefix_locks_there_only() {
    let h = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let endpoint = h.secured_server().await.unwrap().client_address();

    let allowed = EtcdLockProvider::connect(config(endpoint.clone(), SECURED_PREFIX, "right"))
        .await
        .expect("the rightful user connects");
    let mut guard = allowed
        .lock("jobs")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("a free lock under the user's prefix");
    guard.release().await.unwrap();

    let outside = EtcdLockProvider::connect(config(endpoint.clone(), "/elsewhere", "right"))
        .await
        .expect("the rightful user connects, whatever its prefix");
    let refused = outside.lock("jobs").unwrap().try_acquire().await;
    assert!(
        matches!(refused, Err(LockError::PermissionDenied { .. })),
        "a lock outside the role's prefix: {refused:?}"
    );
    drop((allowed, outside));
    let left: Vec<String> = all_keys(&endpoint)
        .await
        .into_iter()
        .filter(|key| key.starts_with(SECURED_PREFIX) || key.starts_with("/elsewhere"))
        .collect();
    assert!(left.is_empty(), "keys left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_an_auth_error_at_connect() {
    let h = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let endpoint = h.secured_server().await.unwrap().client_address();
    let refused = EtcdLockProvider::connect(config(endpoint, SECURED_PREFIX, "wrong")).await;
    assert!(
        matches!(refused, Err(LockError::Auth { .. })),
        "wrong password: {refused:?}"
    );
}

/// A password kept apart from the URL (`password_file=`) reaches the server: the right one
/// locks, a wrong one is an `Auth` error that shows neither password, an unreadable file is
/// a configuration error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_file_authenticates_the_user() {
    let h = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let endpoint = h.secured_server().await.unwrap().client_address();
    let endpoint = endpoint.trim_start_matches("http://");
    let dir = tempfile::tempdir().unwrap();
    let (right, wrong) = (dir.path().join("right"), dir.path().join("wrong"));
    std::fs::write(&right, "right\n").unwrap();
    std::fs::write(&wrong, "wr0ng-planted\n").unwrap();
    let url = |file: &std::path::Path| {
        format!(
            "etcd://locker@{endpoint}?prefix={SECURED_PREFIX}&timeout=2s&password_file={}",
            file.display()
        )
    };

    let allowed = EtcdLockProvider::connect_url(&url(&right))
        .await
        .expect("the password from the file is the user's");
    let mut guard = allowed.lock("filed").unwrap().try_acquire().await.unwrap();
    guard
        .as_mut()
        .expect("a free lock")
        .release()
        .await
        .unwrap();

    let refused = EtcdLockProvider::connect_url(&url(&wrong))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(refused, LockError::Auth { .. }),
        "a wrong password: {refused}"
    );
    let shown = format!("{refused} {refused:?}");
    assert!(!shown.contains("wr0ng-planted"), "{shown}");

    let missing = dir.path().join("missing");
    let unreadable = EtcdLockProvider::connect_url(&url(&missing))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&unreadable, LockError::Config { message } if message.contains("missing")),
        "an unreadable password file: {unreadable}"
    );
}
