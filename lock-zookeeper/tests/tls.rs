//! `zks://` against a real ZooKeeper serving a secure client port (Netty, a PEM key store
//! from certificates made for the test by `lock_testbed::certs`): locks over TLS, the
//! conformance suite on the secure port, and the connections that must be refused.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{ZkHarness, children, lock_dir, tls_server};
use lock_conformance::unique_name;
use lock_core::{LockError, LockProvider};
use lock_testbed::certs;
use lock_testbed::servers::ZkServer;
use lock_zookeeper::{ZkLockProvider, ZkStrategy};

mod over_tls {
    use super::*;
    lock_conformance::conformance_suite!(
        4,
        ZkHarness::over_tls(ZkStrategy::SequentialPredecessor).await
    );
}

/// How long a refused connection may take: the connect timeout of the URLs below and the
/// diagnosing handshake, with slack for a loaded machine.
const REFUSAL_BOUND: Duration = Duration::from_secs(6);

/// Connecting with `url` fails with a connection error within [`REFUSAL_BOUND`]; its
/// message.
async fn refused(url: &str) -> String {
    let asked = Instant::now();
    let error = ZkLockProvider::connect_url(url)
        .await
        .err()
        .unwrap_or_else(|| {
            panic!("{url}: connected");
        });
    assert!(
        asked.elapsed() < REFUSAL_BOUND,
        "{url}: refused after {:?}",
        asked.elapsed()
    );
    match error {
        LockError::Connection { ref message, .. } => message.clone(),
        other => panic!("{url}: not a connection error: {other}"),
    }
}

fn path(path: &Path) -> String {
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_urls_lock_over_tls_and_refuse_what_they_must() {
    let server = tls_server();
    let secure = server.secure_connect_string().unwrap();
    let authority = path(&server.trusted_authority().unwrap());
    let root = format!("/{}", unique_name("tls"));
    let url = |hosts: &str, ca: &str| {
        format!("zks://{hosts}?root={root}&session_timeout=2s&connect_timeout=2s&tls_ca={ca}")
    };

    // Trusting the server's authority: two providers exclude each other over TLS, the
    // release hands the lock on with a greater token, and nothing is left behind.
    let a = ZkLockProvider::connect_url(&url(&secure, &authority))
        .await
        .unwrap();
    let b = ZkLockProvider::connect_url(&url(&secure, &authority))
        .await
        .unwrap();
    let name = unique_name("held");
    let mut held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
    let waiter = b.lock(&name).unwrap();
    assert!(
        waiter.try_acquire().await.unwrap().is_none(),
        "two holders over TLS"
    );
    let waiting = tokio::spawn(async move { waiter.acquire(Some(Duration::from_secs(5))).await });
    held.release().await.unwrap();
    let mut next = waiting.await.unwrap().unwrap();
    assert!(next.fencing_token() > held.fencing_token());
    next.release().await.unwrap();
    let admin = common::admin_client(&server.connect_string()).await;
    assert_eq!(
        children(&admin, &lock_dir(&root, &name)).await.unwrap(),
        Vec::<String>::new(),
        "nodes left behind"
    );

    // An authority that did not sign the server's certificate: refused, and the error
    // says why.
    let dir = tempfile::tempdir().unwrap();
    certs::authority(dir.path(), "stranger").unwrap();
    let message = refused(&url(&secure, &path(&dir.path().join("stranger.crt")))).await;
    assert!(
        message.contains("TLS handshake") && message.contains("invalid peer certificate"),
        "a stranger's authority: {message}"
    );

    // A TLS client at the plain port, and a plain client at the secure port: refused.
    let message = refused(&url(&server.connect_string(), &authority)).await;
    assert!(
        message.contains("TLS handshake"),
        "TLS at the plain port: {message}"
    );
    refused(&format!("zk://{secure}?connect_timeout=2s")).await;

    // A missing authority file is a configuration error naming it.
    let missing = ZkLockProvider::connect_url(&url(&secure, "/nonexistent/ca.crt"))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&missing, LockError::Config { message } if message.contains("/nonexistent/ca.crt")),
        "a missing tls_ca: {missing}"
    );
}

/// A server that asks for a client certificate (`ssl.clientAuth=need`) takes a client that
/// presents one its authority signed, and refuses one without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_takes_the_signed_client_only() {
    let dir = tempfile::tempdir().unwrap();
    certs::authority(dir.path(), "ca").unwrap();
    certs::server_certificate(dir.path(), "ca").unwrap();
    certs::client_certificate(dir.path(), "ca", "app").unwrap();
    certs::authority(dir.path(), "stranger").unwrap();
    certs::client_certificate(dir.path(), "stranger", "intruder").unwrap();
    let server = ZkServer::start(common::zk_options().with_tls(dir.path(), true))
        .await
        .unwrap();
    let file = |name: &str| path(&dir.path().join(name));
    let url = |identity: &str| {
        format!(
            "zks://{}?connect_timeout=2s&tls_ca={}{identity}",
            server.secure_connect_string().unwrap(),
            file("ca.crt")
        )
    };

    let client = ZkLockProvider::connect_url(&url(&format!(
        "&tls_cert={}&tls_key={}",
        file("app.crt"),
        file("app.key")
    )))
    .await
    .unwrap();
    let name = unique_name("mutual");
    let mut guard = client
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();

    refused(&url("")).await;
    refused(&url(&format!(
        "&tls_cert={}&tls_key={}",
        file("intruder.crt"),
        file("intruder.key")
    )))
    .await;
    assert!(server.pid().is_some(), "{}", server.condition());
}
