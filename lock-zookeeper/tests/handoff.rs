//! The herd-free handoff on the shared server: a waiter that only its blocker kept out holds
//! the moment the blocker's node is deleted, without listing the directory again; every
//! other wake-up lists again (a blocker that was itself waiting, a foreign node that was not
//! the head, a writer behind readers, a reconnection), and a waiter whose own node was
//! deleted is never granted.
//!
//! Each test tells the two kinds of wake-up apart by the requests the waiter's provider
//! made, and checks who holds and who waits.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ZkHarness, lock_dir, wait_until};
use lock_conformance::{Client, unique_name};
use lock_core::{Guard, LockError, LockProvider, MetricsSnapshot};
use lock_zookeeper::{ZkConfig, ZkLockProvider, ZkStrategy};
use tokio::task::JoinHandle;
use zookeeper_client::{Acls, CreateMode};

/// How long one step of a queue (a settle, a grant) may take on a loaded machine.
const STEP: Duration = Duration::from_secs(5);

/// A waiter's requests when it is granted on its blocker's deletion, having queued once:
/// the create and the listing sent with it, and the watches on its blocker and on its own
/// node, sent together.
const QUEUED: u64 = 4;

/// A waiter's requests for each time it lists again: the listing, and the watch on its new
/// blocker (the watch on its own node stays).
const RELISTED: u64 = 2;

/// The side a contender takes.
#[derive(Debug, Clone, Copy)]
enum Side {
    Mutex,
    Read,
    Write,
}

/// A contender with its own session, and its acquisition running in a task.
struct Contender {
    name: String,
    client: Client,
    provider: Arc<ZkLockProvider>,
    session: i64,
    before: MetricsSnapshot,
    task: JoinHandle<Result<Guard, LockError>>,
}

impl Contender {
    /// Starts `side`'s acquisition of `name` on a client of its own.
    async fn start(h: &ZkHarness, name: &str, side: Side) -> Self {
        let (client, provider) = h.zk_client().await.unwrap();
        let session = provider.session_id().expect("a session");
        let before = provider.metrics();
        let wait = Some(Duration::from_secs(600));
        let task = match side {
            Side::Mutex => {
                let lock = client.provider.lock(name).unwrap();
                tokio::spawn(async move { lock.acquire(wait).await })
            }
            Side::Read => {
                let lock = client.provider.rw_lock(name).unwrap();
                tokio::spawn(async move { lock.read(wait).await })
            }
            Side::Write => {
                let lock = client.provider.rw_lock(name).unwrap();
                tokio::spawn(async move { lock.write(wait).await })
            }
        };
        Contender {
            name: name.to_owned(),
            client,
            provider,
            session,
            before,
            task,
        }
    }

    /// Starts `side`'s acquisition and waits for its grant.
    async fn holding(h: &ZkHarness, name: &str, side: Side) -> (Self, Guard) {
        let mut contender = Self::start(h, name, side).await;
        let guard = contender.granted().await;
        (contender, guard)
    }

    /// A mutex holder of `name`, and a waiter settled right behind it.
    async fn holder_and_waiter(h: &ZkHarness, name: &str) -> (Self, Guard, Self) {
        let (holder, held) = Self::holding(h, name, Side::Mutex).await;
        let waiter = Self::start(h, name, Side::Mutex).await;
        waiter.settles(h, &dir(name), 0, QUEUED).await;
        (holder, held, waiter)
    }

    /// Cuts this contender's connection and waits until its client notices; returns the
    /// faults, to restore the connection with.
    async fn disconnect(&self) -> Arc<dyn lock_conformance::ClientFaults> {
        let faults = self.client.faults.clone().expect("the harness's proxies");
        faults.cut_connection().await.unwrap();
        let client = self.provider.client().expect("the contender's client");
        wait_until(
            STEP,
            "the contender notices the disconnection",
            || async { client.state() },
            |state| *state == zookeeper_client::SessionState::Disconnected,
        )
        .await;
        faults
    }

    /// The requests this contender's provider made since it started.
    fn requests(&self) -> u64 {
        self.provider.metrics().since(&self.before).server_requests
    }

    /// The guard, once granted; panics after [`STEP`] or on an error.
    async fn granted(&mut self) -> Guard {
        tokio::time::timeout(STEP, &mut self.task)
            .await
            .expect("a grant within the step")
            .unwrap()
            .expect("a grant")
    }

    /// The acquisition's error, once it failed; panics after [`STEP`] or on a grant.
    async fn failed(&mut self) -> LockError {
        match tokio::time::timeout(STEP, &mut self.task)
            .await
            .expect("an outcome within the step")
            .unwrap()
        {
            Ok(guard) => panic!("granted {guard:?}, expected a failure"),
            Err(error) => error,
        }
    }

    /// Waits until the server shows this waiter queued in `dir`, watching its own node and
    /// the node of the contender at `blocker` (an index into the queue), its provider has
    /// made `requests` requests, and their replies have reached it. Then it is settled: the
    /// next event decides.
    async fn settles(&self, h: &ZkHarness, dir: &str, blocker: usize, requests: u64) {
        let session = self.session;
        wait_until(
            STEP,
            &format!("session {session:#x} waits in {dir} for contender {blocker}"),
            move || async move {
                let queue = h.owned_queue(dir).await;
                let watches = h
                    .data_watches()
                    .await
                    .expect("the server lists its watches (wchc)");
                let watched = |node: &str| {
                    watches
                        .get(&session)
                        .is_some_and(|paths| paths.iter().any(|p| *p == format!("{dir}/{node}")))
                };
                let own = queue.iter().find(|(_, owner)| *owner == session);
                let settled = own.is_some_and(|(node, _)| watched(node))
                    && queue.get(blocker).is_some_and(|(node, _)| watched(node));
                (settled, self.requests(), queue)
            },
            |(settled, made, _)| *settled && *made == requests,
        )
        .await;
        // The server has set the watches; one more question on the waiter's session, which
        // the server answers after those requests, makes sure their replies have arrived
        // (a cut before they do would fail them with a connection loss).
        self.provider
            .contenders(&self.name)
            .await
            .expect("the waiter's session answers");
        assert!(
            !self.task.is_finished(),
            "a settled waiter is still waiting"
        );
    }

    /// This contender's node in `dir`.
    async fn node(&self, h: &ZkHarness, dir: &str) -> String {
        let node = h
            .owned_queue(dir)
            .await
            .into_iter()
            .find(|(_, owner)| *owner == self.session)
            .map(|(node, _)| node)
            .expect("the contender's node");
        format!("{dir}/{node}")
    }
}

/// Client sessions long enough that a loaded machine's stall (the client gives up on a
/// silent connection after 2/5 of the session) or a deliberate cut never ends one: a
/// reconnection would make a waiter list again, and change the counts these tests check.
const SESSION: Duration = Duration::from_secs(8);

async fn harness() -> ZkHarness {
    ZkHarness::new(ZkStrategy::SequentialPredecessor)
        .await
        .with_session_timeout(SESSION)
}

/// The directory of the mutex named `name`.
fn dir(name: &str) -> String {
    lock_dir(ZkConfig::DEFAULT_ROOT, name)
}

/// The directory of the read-write lock named `name`.
fn rw_dir(name: &str) -> String {
    format!("{}.rwlock", dir(name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_the_holder_holds_on_its_deletion_without_listing() {
    let h = harness().await;
    let name = unique_name("handoff-head");
    let dir = dir(&name);
    let (holder, mut held, mut waiter) = Contender::holder_and_waiter(&h, &name).await;
    held.release().await.unwrap();
    let guard = waiter.granted().await;
    let counted = waiter.provider.metrics().since(&waiter.before);
    assert_eq!(
        (
            counted.server_requests,
            counted.wakeups,
            counted.futile_wakeups
        ),
        (QUEUED, 1, 0),
        "granted on the event, with no listing after it"
    );
    assert!(guard.fencing_token() > held.fencing_token());
    // The watch on its own node, set while it queued, now guards the hold.
    let node = waiter.node(&h, &dir).await;
    h.admin().delete(&node, None).await.unwrap();
    tokio::time::timeout(STEP, guard.lost().wait())
        .await
        .expect("the deletion of the holder's node is noticed");
    drop(holder);
}

/// Another client's change of a held node's data is no loss: the session watches the node
/// anew (one request), and the node's deletion afterwards is still noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_nodes_data_change_is_watched_anew_and_its_deletion_still_noticed() {
    /// A grant at once in a standing directory: the create, the listing sent with it, and
    /// the watch on its own node.
    const HELD_AT_ONCE: u64 = 3;
    let h = harness().await;
    let name = unique_name("held-data-changed");
    let dir = dir(&name);
    // The directory is made by a first grant, given back at once.
    let (_first, mut first) = Contender::holding(&h, &name, Side::Mutex).await;
    first.release().await.unwrap();
    let (holder, held) = Contender::holding(&h, &name, Side::Mutex).await;
    let requests = || async { holder.requests() };
    wait_until(STEP, "the held node's watch is set", requests, |n| {
        *n == HELD_AT_ONCE
    })
    .await;
    let node = holder.node(&h, &dir).await;
    h.admin().set_data(&node, b"changed", None).await.unwrap();
    wait_until(STEP, "the held node is watched anew", requests, |n| {
        *n == HELD_AT_ONCE + 1
    })
    .await;
    assert!(!held.is_lost(), "a data change is no loss");
    h.admin().delete(&node, None).await.unwrap();
    tokio::time::timeout(STEP, held.lost().wait())
        .await
        .expect("the deletion of the holder's node is noticed");
}

/// A guard dropped without release: its node's delete is sent as the guard drops, ahead of
/// anything the session asks next, so the session's next acquisition of the lock finds no
/// node ahead of its own and holds at once; nothing is left once that one is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guards_node_goes_ahead_of_the_sessions_next_acquisition() {
    let h = harness().await;
    let name = unique_name("handoff-drop");
    let dir = dir(&name);
    let (contender, mut held) = Contender::holding(&h, &name, Side::Mutex).await;
    let lock = contender.client.provider.lock(&name).unwrap();
    for _ in 0..20 {
        let before = contender.provider.metrics();
        drop(held);
        let guard = tokio::time::timeout(STEP, lock.try_acquire())
            .await
            .expect("a try within the step")
            .unwrap()
            .expect("the dropped guard's node is gone before the try's create");
        let counted = contender.provider.metrics().since(&before);
        assert_eq!(counted.wakeups, 0, "the try never waited");
        held = guard;
    }
    drop(held);
    wait_until(
        STEP,
        "the last dropped guard's node is deleted",
        || async { h.owned_queue(&dir).await },
        |queue| queue.is_empty(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_blocker_gave_up_behind_the_holder_lists_again() {
    let h = harness().await;
    let name = unique_name("handoff-gave-up");
    let dir = dir(&name);
    let (_holder, mut held) = Contender::holding(&h, &name, Side::Mutex).await;
    let first = Contender::start(&h, &name, Side::Mutex).await;
    first.settles(&h, &dir, 0, QUEUED).await;
    let mut second = Contender::start(&h, &name, Side::Mutex).await;
    second.settles(&h, &dir, 1, QUEUED).await;
    // The first waiter is cancelled: its node goes, but the holder still holds.
    first.task.abort();
    second.settles(&h, &dir, 0, QUEUED + RELISTED).await;
    assert!(!held.is_lost());
    assert_eq!(second.provider.metrics().futile_wakeups, 1);
    held.release().await.unwrap();
    let mut guard = second.granted().await;
    assert_eq!(
        second.requests(),
        QUEUED + RELISTED,
        "no listing after the grant's event"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_behind_readers_lists_again_and_the_reader_behind_it_does_not() {
    let h = harness().await;
    let name = unique_name("handoff-rw");
    let dir = rw_dir(&name);
    let (_r1, mut first_read) = Contender::holding(&h, &name, Side::Read).await;
    let (_r2, mut second_read) = Contender::holding(&h, &name, Side::Read).await;
    let mut writer = Contender::start(&h, &name, Side::Write).await;
    writer.settles(&h, &dir, 1, QUEUED).await;
    let mut reader = Contender::start(&h, &name, Side::Read).await;
    reader.settles(&h, &dir, 2, QUEUED).await;
    // The writer's blocker leaves while another reader still holds: it must look again.
    second_read.release().await.unwrap();
    writer.settles(&h, &dir, 0, QUEUED + RELISTED).await;
    assert!(
        !reader.task.is_finished(),
        "the reader waits behind the writer"
    );
    first_read.release().await.unwrap();
    let mut written = writer.granted().await;
    assert_eq!(writer.requests(), QUEUED + RELISTED);
    assert!(!reader.task.is_finished(), "a writer excludes readers");
    written.release().await.unwrap();
    // The writer was the only contender ahead that excluded the reader.
    let mut read = reader.granted().await;
    assert_eq!(reader.requests(), QUEUED, "the reader never listed again");
    read.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_a_writer_that_gave_up_joins_the_readers() {
    let h = harness().await;
    let name = unique_name("handoff-rw-gave-up");
    let dir = rw_dir(&name);
    let (_r1, mut first_read) = Contender::holding(&h, &name, Side::Read).await;
    let writer = Contender::start(&h, &name, Side::Write).await;
    writer.settles(&h, &dir, 0, QUEUED).await;
    let mut reader = Contender::start(&h, &name, Side::Read).await;
    reader.settles(&h, &dir, 1, QUEUED).await;
    writer.task.abort();
    let mut read = reader.granted().await;
    assert_eq!(
        reader.requests(),
        QUEUED,
        "granted on the writer's deletion"
    );
    assert!(!first_read.is_lost(), "both readers hold");
    read.release().await.unwrap();
    first_read.release().await.unwrap();
}

/// Creates a node in `dir` as another lock client would (Curator's naming), from the test's
/// own session; returns its path.
async fn foreign_node(h: &ZkHarness, dir: &str) -> String {
    let prefix = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (_, sequence) = h.admin().create(&prefix, &[], &options).await.unwrap();
    format!("{prefix}{sequence}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_node_that_leaves_from_behind_the_holder_makes_the_waiter_list_again() {
    let h = harness().await;
    let name = unique_name("handoff-foreign");
    let dir = dir(&name);
    let (_holder, mut held) = Contender::holding(&h, &name, Side::Mutex).await;
    let foreign = foreign_node(&h, &dir).await;
    let mut waiter = Contender::start(&h, &name, Side::Mutex).await;
    waiter.settles(&h, &dir, 1, QUEUED).await;
    h.admin().delete(&foreign, None).await.unwrap();
    waiter.settles(&h, &dir, 0, QUEUED + RELISTED).await;
    held.release().await.unwrap();
    let mut guard = waiter.granted().await;
    assert_eq!(waiter.requests(), QUEUED + RELISTED);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_holder_hands_over_on_its_deletion() {
    let h = harness().await;
    let name = unique_name("handoff-foreign-head");
    let dir = dir(&name);
    // The directory is made by a first grant, given back at once.
    let (_first, mut first) = Contender::holding(&h, &name, Side::Mutex).await;
    let foreign = foreign_node(&h, &dir).await;
    first.release().await.unwrap();
    let mut waiter = Contender::start(&h, &name, Side::Mutex).await;
    waiter.settles(&h, &dir, 0, QUEUED).await;
    h.admin().delete(&foreign, None).await.unwrap();
    let mut guard = waiter.granted().await;
    assert_eq!(waiter.requests(), QUEUED);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_node_was_deleted_fails_at_once() {
    let h = harness().await;
    let name = unique_name("handoff-own-deleted");
    let dir = dir(&name);
    let (_holder, mut held, mut waiter) = Contender::holder_and_waiter(&h, &name).await;
    let node = waiter.node(&h, &dir).await;
    h.admin().delete(&node, None).await.unwrap();
    let error = waiter.failed().await;
    assert!(error.is_retryable(), "{error}");
    assert!(!held.is_lost(), "the holder holds on");
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_node_went_with_its_blocker_is_not_granted() {
    let h = harness().await;
    let name = unique_name("handoff-both-deleted");
    let dir = dir(&name);
    let (holder, held, mut waiter) = Contender::holder_and_waiter(&h, &name).await;
    let (own, blocker) = (waiter.node(&h, &dir).await, holder.node(&h, &dir).await);
    // One transaction: the waiter's node first, then its blocker's. The waiter hears of
    // both; it must not take the blocker's deletion for its turn.
    let mut both = h.admin().new_multi_writer();
    both.add_delete(&own, None).unwrap();
    both.add_delete(&blocker, None).unwrap();
    both.commit().await.unwrap();
    let error = waiter.failed().await;
    assert!(error.is_retryable(), "{error}");
    tokio::time::timeout(STEP, held.lost().wait())
        .await
        .expect("the holder notices its node's deletion");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_reconnected_during_its_wait_lists_again() {
    let h = harness().await;
    let name = unique_name("handoff-reconnected");
    let (_holder, mut held, mut waiter) = Contender::holder_and_waiter(&h, &name).await;
    // Released while the waiter is disconnected: the server tells it on reconnection.
    let faults = waiter.disconnect().await;
    held.release().await.unwrap();
    faults.restore().await.unwrap();
    let mut guard = waiter.granted().await;
    assert_eq!(
        waiter.requests(),
        QUEUED + 1,
        "after a reconnection the waiter lists before it holds"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_node_was_deleted_while_disconnected_is_not_granted() {
    let h = harness().await;
    let name = unique_name("handoff-reconnected-deleted");
    let dir = dir(&name);
    let (_holder, mut held, mut waiter) = Contender::holder_and_waiter(&h, &name).await;
    let own = waiter.node(&h, &dir).await;
    let faults = waiter.disconnect().await;
    h.admin().delete(&own, None).await.unwrap();
    held.release().await.unwrap();
    faults.restore().await.unwrap();
    let error = waiter.failed().await;
    assert!(error.is_retryable(), "{error}");
}
