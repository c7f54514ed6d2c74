//! distlock's etcd lock and etcd's own (`etcdctl lock`, etcd's `concurrency.Mutex`) on one
//! name exclude each other, in both orders, and agree on who comes first; so do their
//! elections (`etcdctl elect`, etcd's `concurrency.Election`).
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    reason = "test fixtures: a failed set-up must fail the test"
)]

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{EtcdHarness, contenders};
use lock_conformance::unique_name;
use lock_core::{LockName, LockProvider};
use lock_etcd::{EtcdConfig, EtcdLockProvider, EtcdStrategy};
use tokio::process::{Child, Command};

/// How long a step may take on a loaded machine.
const BOUND: Duration = Duration::from_secs(20);

/// `etcdctl lock NAME sh -c SCRIPT` against the shared server, where NAME is distlock's
/// directory of the lock without its trailing `/` (etcd's mutex adds it).
fn etcdctl_lock(endpoint: &str, name: &str, script: &str) -> Child {
    let escaped = LockName::new(name).unwrap().escaped();
    Command::new("etcdctl")
        .args(["--endpoints", endpoint, "lock", "--ttl=5"])
        .arg(format!("{}/{escaped}", EtcdConfig::DEFAULT_PREFIX))
        .args(["--", "sh", "-c", script])
        .env("ETCDCTL_API", "3")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("etcdctl runs (Debian's etcd-client package)")
}

async fn until_exists(path: &Path) {
    let began = tokio::time::Instant::now();
    while !path.exists() {
        assert!(began.elapsed() < BOUND, "{} never appeared", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until the lock directory holds `keys` keys.
async fn until_queued(harness: &EtcdHarness, name: &str, keys: usize) {
    let began = tokio::time::Instant::now();
    let prefix = EtcdConfig::DEFAULT_PREFIX;
    while contenders(harness.admin(), prefix, name).await.len() < keys {
        assert!(
            began.elapsed() < BOUND,
            "{keys} keys never queued for {name}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn provider(harness: &EtcdHarness) -> EtcdLockProvider {
    EtcdLockProvider::connect(harness.config(EtcdConfig::DEFAULT_PREFIX))
        .await
        .expect("a provider")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_holds_and_distlock_waits() {
    let harness = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let dir = tempfile::tempdir().unwrap();
    let (held, stop) = (dir.path().join("held"), dir.path().join("stop"));
    let name = unique_name("interop-etcdctl-first");
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.02; done",
        held.display(),
        stop.display()
    );
    let mut etcdctl = etcdctl_lock(&harness.endpoint(), &name, &script);
    until_exists(&held).await;

    let locks = provider(&harness).await;
    let lock = locks.lock(&name).unwrap();
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "etcdctl holds it"
    );
    let waiting = tokio::spawn(async move { lock.acquire(Some(BOUND)).await });
    // Queued behind etcdctl's key, in the same directory.
    until_queued(&harness, &name, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "distlock waits while etcdctl holds");

    std::fs::write(&stop, b"").unwrap();
    let mut guard = waiting
        .await
        .unwrap()
        .expect("granted once etcdctl lets go");
    let status = tokio::time::timeout(BOUND, etcdctl.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "etcdctl: {status}");
    assert_eq!(
        contenders(harness.admin(), EtcdConfig::DEFAULT_PREFIX, &name)
            .await
            .len(),
        1,
        "only distlock's key is left"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_holds_and_etcdctl_waits() {
    let harness = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let name = unique_name("interop-distlock-first");
    let locks = provider(&harness).await;
    let mut guard = locks
        .lock(&name)
        .unwrap()
        .acquire(Some(BOUND))
        .await
        .unwrap();

    let mut etcdctl = etcdctl_lock(
        &harness.endpoint(),
        &name,
        &format!("touch {}", ran.display()),
    );
    until_queued(&harness, &name, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!ran.exists(), "etcdctl waits while distlock holds");

    guard.release().await.unwrap();
    until_exists(&ran).await;
    let status = tokio::time::timeout(BOUND, etcdctl.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "etcdctl: {status}");
}

/// `etcdctl elect NAME PROPOSAL` on distlock's election directory (without its trailing
/// `/`): a campaign that leads until interrupted, or with `-l` an observer printing each
/// leader's key and value.
fn etcdctl_elect(endpoint: &str, name: &str, args: &[&str]) -> Child {
    let escaped = LockName::new(name).unwrap().escaped();
    Command::new("etcdctl")
        .args(["--endpoints", endpoint, "elect"])
        .args(args.iter().filter(|arg| arg.starts_with('-')))
        .arg(format!("{}/{escaped}.election", EtcdConfig::DEFAULT_PREFIX))
        .args(args.iter().filter(|arg| !arg.starts_with('-')))
        .env("ETCDCTL_API", "3")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("etcdctl runs (Debian's etcd-client package)")
}

/// etcd's own election (`etcdctl elect`) and distlock's share one election: each sees the
/// other's leader with its value, a distlock candidate waits behind etcdctl's leader and
/// takes over when it resigns, and `etcdctl elect -l` reports distlock's leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_and_distlock_see_each_others_leaders() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let harness = EtcdHarness::new(EtcdStrategy::Predecessor).await;
    let name = unique_name("interop-elect");
    let endpoint = harness.endpoint();
    let mut etcdctl = etcdctl_elect(&endpoint, &name, &["etcdctl-host"]);
    let locks = provider(&harness).await;
    let election = locks.election(&name).unwrap();
    let began = tokio::time::Instant::now();
    loop {
        let leader = election.leader().await.unwrap();
        if leader.as_ref().is_some_and(|l| l.value == b"etcdctl-host") {
            break;
        }
        assert!(
            began.elapsed() < BOUND,
            "distlock never saw etcdctl lead: {leader:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let campaign = tokio::spawn({
        let election = std::sync::Arc::clone(&election);
        async move { election.campaign(b"distlock-host", Some(BOUND)).await }
    });
    let dir = format!(
        "{}/{}.election/",
        EtcdConfig::DEFAULT_PREFIX,
        LockName::new(&name).unwrap().escaped()
    );
    let began = tokio::time::Instant::now();
    while common::keys(harness.admin(), &dir).await.len() < 2 {
        assert!(began.elapsed() < BOUND, "distlock's candidate never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!campaign.is_finished(), "two leaders: etcdctl and distlock");

    let mut observer = etcdctl_elect(&endpoint, &name, &["-l"]);
    let mut lines = BufReader::new(observer.stdout.take().unwrap()).lines();
    // etcdctl resigns when interrupted.
    let pid = etcdctl.id().unwrap().to_string();
    let interrupted = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .unwrap();
    assert!(interrupted.success());
    let mut leadership = tokio::time::timeout(BOUND, campaign)
        .await
        .expect("distlock leads once etcdctl resigns")
        .unwrap()
        .unwrap();
    tokio::time::timeout(BOUND, etcdctl.wait())
        .await
        .unwrap()
        .unwrap();
    let seen = tokio::time::timeout(BOUND, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "distlock-host" {
                return true;
            }
        }
        false
    })
    .await
    .expect("etcdctl elect -l reports a leader in time");
    assert!(seen, "etcdctl elect -l never reported distlock's leader");
    leadership.resign().await.unwrap();
    assert!(election.leader().await.unwrap().is_none());
}
