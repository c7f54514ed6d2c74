//! Foreign clients on the same path: zookeeper-client's own Curator-compatible lock recipe,
//! and a kazoo-format node, exclude distlock and are excluded by it; Curator- and
//! kazoo-named election candidates and distlock's share an election.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::time::Duration;

use common::{data_watches, owned_queue, wait_until, watches_in};
use lock_conformance::unique_name;
use lock_core::{LockName, LockProvider};
use lock_testbed::servers::shared_zk;
use lock_zookeeper::{ZkConfig, ZkLockProvider, ZkStrategy};
use zookeeper_client::{Acls, Client, CreateMode, LockOptions, LockPrefix};

const BOUND: Duration = Duration::from_secs(5);

async fn provider(strategy: ZkStrategy) -> ZkLockProvider {
    let server = shared_zk().expect("a ZooKeeper server for the tests");
    let config = ZkConfig::new(server.connect_string().split(','))
        .with_strategy(strategy)
        .with_session_timeout(Duration::from_secs(2));
    ZkLockProvider::connect(config).await.unwrap()
}

async fn peer() -> Client {
    Client::connect(&shared_zk().unwrap().connect_string())
        .await
        .unwrap()
}

fn dir_of(name: &str) -> String {
    format!(
        "{}/{}",
        ZkConfig::DEFAULT_ROOT,
        LockName::new(name).unwrap().escaped()
    )
}

/// Waits until the session `waiter` waits in `dir`: it has a node there behind another, and
/// when it waits herd-free, it watches a node of `dir` other than its own (a waiter under the
/// herd strategy watches the directory, which the server does not list). Panics after
/// [`BOUND`].
async fn waits_in(admin: &Client, dir: &str, waiter: i64, herd_free: bool, what: &str) {
    wait_until(
        BOUND,
        what,
        move || async move {
            let queue = owned_queue(admin, dir).await.unwrap();
            let watches = if herd_free {
                data_watches().await
            } else {
                None
            };
            let watching = queue.iter().skip(1).any(|(node, session)| {
                *session == waiter && watches_in(watches.as_ref(), waiter, dir, node)
            });
            (queue, watching)
        },
        |(_, watching)| *watching,
    )
    .await;
}

fn peer_options() -> LockOptions<'static> {
    LockOptions::new(Acls::anyone_all())
        .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_recipe_and_distlock_exclude_each_other() {
    for strategy in [ZkStrategy::SequentialPredecessor, ZkStrategy::WholeQueue] {
        let name = unique_name("interop");
        let dir = dir_of(&name);
        let ours = provider(strategy).await;
        let lock = ours.lock(&name).unwrap();
        let peer = peer().await;

        // The peer holds: distlock waits behind it, and gets the lock when the peer lets go.
        let held = peer
            .lock(
                LockPrefix::new_curator(&dir, "lock-").unwrap(),
                b"",
                peer_options(),
            )
            .await
            .unwrap();
        assert!(
            lock.try_acquire().await.unwrap().is_none(),
            "{strategy}: distlock jumped the peer"
        );
        let waiting = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.acquire(Some(BOUND)).await })
        };
        waits_in(
            &peer,
            &dir,
            ours.session_id().expect("a session"),
            strategy == ZkStrategy::SequentialPredecessor,
            &format!("{strategy}: distlock queues behind the peer"),
        )
        .await;
        assert!(
            !waiting.is_finished(),
            "{strategy}: distlock got the lock while the peer held it"
        );
        drop(held); // the recipe deletes its node in the background
        let mut guard = tokio::time::timeout(BOUND, waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap();

        // distlock holds: the peer waits behind it, and gets the lock after the release.
        let contending = tokio::time::timeout(
            Duration::from_millis(500),
            peer.lock(
                LockPrefix::new_curator(&dir, "lock-").unwrap(),
                b"",
                peer_options(),
            ),
        )
        .await;
        assert!(
            contending.is_err(),
            "{strategy}: the peer got the lock while distlock held it"
        );
        guard.release().await.unwrap();
        let peer_guard = tokio::time::timeout(
            BOUND,
            peer.lock(
                LockPrefix::new_curator(&dir, "lock-").unwrap(),
                b"",
                peer_options(),
            ),
        )
        .await
        .expect("the peer gets the lock after distlock's release")
        .unwrap();
        drop(peer_guard);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_format_node_is_a_contender() {
    let name = unique_name("kazoo");
    let dir = dir_of(&name);
    let raw = peer().await;
    raw.mkdir(&dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .unwrap();
    // kazoo's Lock names its nodes `<hex32>__lock__<sequence>`.
    let (_, sequence) = raw
        .create(
            &format!("{dir}/0123456789abcdef0123456789abcdef__lock__"),
            b"",
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let ours = provider(ZkStrategy::SequentialPredecessor).await;
    let lock = ours.lock(&name).unwrap();
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "the kazoo node holds the lock"
    );
    raw.delete(
        &format!("{dir}/0123456789abcdef0123456789abcdef__lock__{sequence}"),
        None,
    )
    .await
    .unwrap();
    let mut guard = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("free once the kazoo node is gone");
    guard.release().await.unwrap();
}

/// A foreign reader's node, as Curator's `InterProcessReadWriteLock` or kazoo's `ReadLock`
/// names it, created by a raw client in `dir`; returns its path.
async fn foreign_reader(raw: &Client, dir: &str, prefix: &str) -> String {
    raw.mkdir(dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .unwrap();
    let (_, sequence) = raw
        .create(
            &format!("{dir}/{prefix}"),
            b"",
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    format!("{dir}/{prefix}{sequence}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_readers_share_and_keep_writers_out() {
    for (strategy, prefix) in [
        (
            ZkStrategy::SequentialPredecessor,
            "_c_0b6e2d1c-8d7a-4d1e-9a55-3f1f2c3d4e5f-__READ__",
        ),
        (
            ZkStrategy::WholeQueue,
            "0123456789abcdef0123456789abcdef__rlock__",
        ),
    ] {
        let name = unique_name("rw-interop");
        let dir = format!("{}.rwlock", dir_of(&name));
        let raw = peer().await;
        let reader = foreign_reader(&raw, &dir, prefix).await;
        let ours = provider(strategy).await;
        let lock = ours.rw_lock(&name).unwrap();
        let mut shared = lock
            .try_read()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{prefix}: our reader shares with the foreign one"));
        shared.release().await.unwrap();
        assert!(
            lock.try_write().await.unwrap().is_none(),
            "{prefix}: our writer jumped the foreign reader"
        );
        let writing = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.write(Some(BOUND)).await })
        };
        waits_in(
            &raw,
            &dir,
            ours.session_id().expect("a session"),
            strategy == ZkStrategy::SequentialPredecessor,
            &format!("{prefix}: our writer queues behind the foreign reader"),
        )
        .await;
        assert!(!writing.is_finished(), "{prefix}: wrote beside a reader");
        raw.delete(&reader, None).await.unwrap();
        let mut guard = tokio::time::timeout(BOUND, writing)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_named_writer_and_distlock_readers_exclude_each_other() {
    let name = unique_name("rw-interop");
    let dir = format!("{}.rwlock", dir_of(&name));
    let ours = provider(ZkStrategy::SequentialPredecessor).await;
    let lock = ours.rw_lock(&name).unwrap();
    let admin = peer().await;
    let peer = peer().await;
    // zookeeper-client's recipe with a Curator write node's name, every child a contender:
    // the write side of Curator's InterProcessReadWriteLock.
    let writer_prefix = format!("{dir}/_c_9f0c3a52-1d4e-4b8e-8a57-0c2d1e3f4a5b-__WRIT__");
    let held = peer
        .lock(
            LockPrefix::new_custom(writer_prefix.clone(), "").unwrap(),
            b"",
            peer_options(),
        )
        .await
        .unwrap();
    assert!(
        lock.try_read().await.unwrap().is_none(),
        "our reader got in under the Curator-named writer"
    );
    let reading = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.read(Some(BOUND)).await })
    };
    waits_in(
        &admin,
        &dir,
        ours.session_id().expect("a session"),
        true,
        "our reader queues behind the writer",
    )
    .await;
    assert!(!reading.is_finished(), "read beside the writer");
    drop(held);
    let mut reader = tokio::time::timeout(BOUND, reading)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Now our reader holds: the peer writer waits for it.
    let peer_session = peer.session_id().0;
    let peer_writing = tokio::spawn(async move {
        let prefix = LockPrefix::new_custom(writer_prefix, "").unwrap();
        let held = peer.lock(prefix, b"", peer_options()).await;
        held.map(drop)
    });
    // The peer's recipe watches the node before its own.
    waits_in(
        &admin,
        &dir,
        peer_session,
        true,
        "the peer writer queues behind our reader",
    )
    .await;
    assert!(
        !peer_writing.is_finished(),
        "the peer writer got in beside our reader"
    );
    reader.release().await.unwrap();
    tokio::time::timeout(BOUND, peer_writing)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Curator's `LeaderLatch` (`_c_<uuid>-latch-<sequence>`) and kazoo's `Election`
/// (`<hex32>__lock__<sequence>`) candidates, each holding its participant id, lead a
/// distlock election of the same path, which reports their ids; a distlock leader's node
/// holds its value for them to read, and is first in their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_kazoo_candidates_and_distlock_share_an_election() {
    for prefix in [
        "_c_0b6e2d1c-8d7a-4d1e-9a55-3f1f2c3d4e5f-latch-",
        "0123456789abcdef0123456789abcdef__lock__",
    ] {
        let name = unique_name("election");
        let dir = format!("{}.election", dir_of(&name));
        let raw = peer().await;
        raw.mkdir(&dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
            .await
            .unwrap();
        let (stat, sequence) = raw
            .create(
                &format!("{dir}/{prefix}"),
                b"foreign-host",
                &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
            )
            .await
            .unwrap();
        let ours = provider(ZkStrategy::SequentialPredecessor).await;
        let election = ours.election(&name).unwrap();
        let leader = election
            .leader()
            .await
            .unwrap()
            .expect("the foreign leader");
        assert_eq!(leader.value, b"foreign-host", "{prefix}");
        assert_eq!(leader.term.get(), u64::try_from(stat.czxid).unwrap());
        let campaign = tokio::spawn({
            let election = std::sync::Arc::clone(&election);
            async move { election.campaign(b"distlock-host", None).await }
        });
        wait_until(
            BOUND,
            "distlock's candidate queues behind the foreign one",
            || async { raw.list_children(&dir).await.unwrap().len() },
            |queued| *queued == 2,
        )
        .await;
        assert!(!campaign.is_finished(), "{prefix}: two leaders");
        raw.delete(&format!("{dir}/{prefix}{sequence}"), None)
            .await
            .unwrap();
        let mut leadership = tokio::time::timeout(BOUND, campaign)
            .await
            .expect("distlock leads once the foreign leader resigns")
            .unwrap()
            .unwrap();
        // What a Curator or kazoo participant reads: the first node holds distlock's value.
        let children = raw.list_children(&dir).await.unwrap();
        assert_eq!(children.len(), 1);
        let (value, _) = raw
            .get_data(&format!("{dir}/{}", children[0]))
            .await
            .unwrap();
        assert_eq!(value, b"distlock-host");
        assert!(
            children[0].contains("-latch-"),
            "distlock names its candidates as LeaderLatch does: {}",
            children[0]
        );
        leadership.resign().await.unwrap();
        assert!(election.leader().await.unwrap().is_none());
    }
}
