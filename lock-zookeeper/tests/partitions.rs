//! Real network partitions of a three-member ZooKeeper ensemble in containers: each member
//! is cut off from the others' network (`docker network disconnect`) while its clients stay
//! connected to it. Needs a Docker engine and the image `scripts/ensure-docker` builds; the
//! tests skip with the reason without them, except under `LOCK_CONFORMANCE_STRICT`.
//!
//! The invariant checked throughout: no instant has two clients that both believe they hold
//! the lock. A client believes from its grant until it releases or its lost signal fires;
//! every grant and loss is stamped on one clock and the belief intervals are compared.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test fixtures: a failed set-up must fail the test; the timings are reported"
)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{admin_client, children, lock_dir, zk_options};
use lock_conformance::observe_until;
use lock_core::{Guard, LockError, LockProvider};
use lock_testbed::servers::containers;
use lock_testbed::servers::{ServerMode, ZkEnsemble};
use lock_zookeeper::{ZkConfig, ZkLockProvider, ZkStrategy};
use tokio::time::Instant;

/// Longer than the ensemble's failure detection (syncLimit 5 × tick 500 ms), so that a
/// partition is noticed by the servers well inside a session.
const SESSION_TIMEOUT: Duration = Duration::from_secs(4);

/// Whether the engine and the image are there; a skip (with the reason) otherwise, except
/// under `LOCK_CONFORMANCE_STRICT`, where they must be.
async fn containers_available() -> bool {
    match containers::check_ready().await {
        Ok(()) => true,
        Err(why) => {
            assert!(
                !lock_conformance::runner::strict(),
                "containers are required under STRICT: {why}"
            );
            eprintln!("skip reason: {why}");
            false
        }
    }
}

async fn ensemble() -> ZkEnsemble {
    let ensemble = ZkEnsemble::start_in(ServerMode::Containers, 3, zk_options())
        .await
        .expect("a three-member ensemble in containers");
    ensemble
        .wait_for_leader(Duration::from_secs(30))
        .await
        .expect("a leader");
    ensemble
}

/// The session of the waiter that a short cut must not expire: the longest the servers
/// allow (20 ticks), so that the cut, which lasts until the cut-off follower has noticed
/// it (syncLimit 5 × tick 500 ms, longer on a loaded machine), stays well inside it.
const LONG_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// A client that can reach only the members `members` of `ensemble`.
async fn client_of(ensemble: &ZkEnsemble, members: &[usize]) -> ZkLockProvider {
    client_with_session(ensemble, members, SESSION_TIMEOUT).await
}

/// [`client_of`] with the session timeout `session`.
async fn client_with_session(
    ensemble: &ZkEnsemble,
    members: &[usize],
    session: Duration,
) -> ZkLockProvider {
    let hosts: Vec<String> = members
        .iter()
        .map(|&i| ensemble.address(i).unwrap())
        .collect();
    let config = ZkConfig::new(hosts)
        .with_strategy(ZkStrategy::SequentialPredecessor)
        .with_session_timeout(session)
        .with_connect_timeout(Duration::from_secs(10));
    ZkLockProvider::connect(config)
        .await
        .expect("a client of the ensemble")
}

/// What each client believed, and when, on one clock.
#[derive(Default, Clone)]
struct Timeline {
    events: Arc<Mutex<Vec<Belief>>>,
}

#[derive(Debug, Clone)]
struct Belief {
    client: &'static str,
    token: u64,
    granted: Instant,
    /// When it stopped believing: released, or its lost signal fired.
    ended: Option<Instant>,
}

impl Timeline {
    /// Records a grant, and the loss when the guard's lost signal fires.
    fn granted(&self, client: &'static str, guard: &Guard) -> usize {
        let index = {
            let mut events = self.events.lock().unwrap();
            events.push(Belief {
                client,
                token: guard.fencing_token().0,
                granted: Instant::now(),
                ended: None,
            });
            events.len() - 1
        };
        let lost = guard.lost();
        let events = Arc::clone(&self.events);
        tokio::spawn(async move {
            if lost.wait().await.is_some() {
                let now = Instant::now();
                let mut events = events.lock().unwrap();
                let ended = &mut events[index].ended;
                *ended = Some(ended.map_or(now, |at| at.min(now)));
            }
        });
        index
    }

    /// Records that the grant `index` was given up (a release, successful or not).
    fn released(&self, index: usize) {
        let now = Instant::now();
        let mut events = self.events.lock().unwrap();
        let ended = &mut events[index].ended;
        *ended = Some(ended.map_or(now, |at| at.min(now)));
    }

    fn belief(&self, index: usize) -> Belief {
        self.events.lock().unwrap()[index].clone()
    }

    /// Panics if two beliefs overlap, or tokens do not grow with grant order.
    fn assert_one_believer(&self) {
        let mut events = self.events.lock().unwrap().clone();
        events.sort_by_key(|belief| belief.granted);
        for pair in events.windows(2) {
            let (earlier, later) = (&pair[0], &pair[1]);
            let ended = earlier
                .ended
                .unwrap_or_else(|| panic!("{earlier:?} never ended"));
            assert!(
                ended <= later.granted,
                "two believers: {} held until {:?} after {} was granted ({earlier:?}, {later:?})",
                earlier.client,
                ended - later.granted,
                later.client,
            );
            assert!(
                later.token > earlier.token,
                "tokens must grow with grant order: {earlier:?} then {later:?}"
            );
        }
    }
}

/// Waits (at most `bound`) until the lock directory `dir` holds `len` nodes.
async fn queue_reaches(admin: &zookeeper_client::Client, dir: &str, len: usize, bound: Duration) {
    observe_until(
        bound,
        &format!("{len} nodes in {dir}"),
        || children(admin, dir),
        |queue| queue.as_ref().is_ok_and(|queue| queue.len() == len),
    )
    .await
    .unwrap()
    .unwrap();
}

/// Every member serves again, and a fresh client on each member alone can take and give
/// back the lock; nothing of it is left on the servers afterwards.
async fn everyone_can_lock_again(ensemble: &ZkEnsemble, name: &str) {
    for index in 0..ensemble.len() {
        observe_until(
            Duration::from_secs(30),
            "every member serving after the heal",
            || async { ensemble.mode(index).await.unwrap() },
            Option::is_some,
        )
        .await
        .unwrap();
    }
    for index in 0..ensemble.len() {
        let client = client_of(ensemble, &[index]).await;
        let mut guard = client
            .lock(name)
            .unwrap()
            .acquire(Some(Duration::from_secs(15)))
            .await
            .unwrap_or_else(|error| panic!("a client of member {index} after the heal: {error}"));
        guard.release().await.unwrap();
    }
    let admin = admin_client(&ensemble.connect_string()).await;
    let dir = lock_dir(ZkConfig::DEFAULT_ROOT, name);
    let left = observe_until(
        Duration::from_secs(15),
        "the lock directory to empty",
        || children(&admin, &dir),
        |left| left.as_ref().is_ok_and(Vec::is_empty),
    )
    .await;
    assert!(left.is_ok(), "nodes left behind: {left:?}");
}

/// The leader is cut off from both followers while a client connected to it (and to it
/// only) holds the lock. That client's guard reports lost before the majority side can have
/// expired its session; a client of the majority gets the lock with a larger token; no
/// instant has two believers. Healed, the old leader rejoins and every member's clients can
/// lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cut_off_while_its_client_holds() {
    if !containers_available().await {
        return;
    }
    let ensemble = ensemble().await;
    let leader = ensemble.leader().await.expect("a leader");
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let name = "partition-leader";
    let timeline = Timeline::default();

    let on_leader = client_of(&ensemble, &[leader]).await;
    // The majority's client waits through the followers' election of a new leader, which
    // on a loaded machine took longer than the short session once (its session expired
    // before any member served again); how long the cut-off client's session lasts is what
    // orders its loss before the majority's grant, not this one's.
    let on_majority = client_with_session(&ensemble, &followers, LONG_SESSION_TIMEOUT).await;
    let mut stale = on_leader.lock(name).unwrap().acquire(None).await.unwrap();
    let stale_grant = timeline.granted("leader's client", &stale);
    let majority_lock = on_majority.lock(name).unwrap();
    let waiter =
        tokio::spawn(async move { majority_lock.acquire(Some(Duration::from_secs(60))).await });

    let cut = Instant::now();
    ensemble.partition(leader).await.unwrap();
    let mut fresh = waiter
        .await
        .unwrap()
        .expect("the majority's client gets the lock");
    let fresh_grant = timeline.granted("majority's client", &fresh);
    assert!(
        stale.is_lost(),
        "the cut-off client must know it lost the lock before the majority grants it"
    );
    let lost_at = timeline.belief(stale_grant).ended.unwrap();
    let granted_at = timeline.belief(fresh_grant).granted;
    eprintln!(
        "partitions::leader: lost {:?} after the cut, majority grant {:?} after it (margin {:?}); tokens {} then {}",
        lost_at - cut,
        granted_at - cut,
        granted_at - lost_at,
        stale.fencing_token().0,
        fresh.fencing_token().0,
    );
    assert!(fresh.fencing_token() > stale.fencing_token());

    ensemble.heal(leader).await.unwrap();
    let stale_release = stale.release().await;
    timeline.released(stale_grant);
    assert!(
        matches!(stale_release, Err(LockError::Lost { .. })),
        "the stale holder's release must say it had lost the lock: {stale_release:?}"
    );
    assert!(!fresh.is_lost(), "the majority's grant survives the heal");
    fresh.release().await.unwrap();
    timeline.released(fresh_grant);
    timeline.assert_one_believer();

    everyone_can_lock_again(&ensemble, name).await;
}

/// A follower is cut off while two clients connected to it (and to it only) wait for the
/// lock. Healed within their session, they are served after the heal; cut off past it, they
/// get `SessionExpired`. Never a double grant; healed, every member's clients can lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_cut_off_with_waiters() {
    if !containers_available().await {
        return;
    }
    let ensemble = ensemble().await;
    let leader = ensemble.leader().await.expect("a leader");
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let name = "partition-follower";
    let timeline = Timeline::default();

    let holder = client_of(&ensemble, &[leader]).await;
    let mut held = holder.lock(name).unwrap().acquire(None).await.unwrap();
    let held_grant = timeline.granted("holder", &held);

    // A short cut: shorter than the session, longer than the servers' failure detection.
    let short = client_with_session(&ensemble, &[follower], LONG_SESSION_TIMEOUT).await;
    let short_lock = short.lock(name).unwrap();
    let short_waiter =
        tokio::spawn(async move { short_lock.acquire(Some(Duration::from_secs(60))).await });
    let admin = admin_client(&ensemble.address(leader).unwrap()).await;
    let dir = lock_dir(ZkConfig::DEFAULT_ROOT, name);
    queue_reaches(&admin, &dir, 2, Duration::from_secs(10)).await;
    let short_cut = Instant::now();
    ensemble.partition(follower).await.unwrap();
    observe_until(
        Duration::from_secs(15),
        "the cut-off follower to stop serving",
        || async { ensemble.mode(follower).await.unwrap() },
        Option::is_none,
    )
    .await
    .unwrap();
    ensemble.heal(follower).await.unwrap();
    let short_cut = short_cut.elapsed();
    held.release().await.unwrap();
    timeline.released(held_grant);
    let mut served = short_waiter.await.unwrap().unwrap_or_else(|error| {
        panic!(
            "a waiter whose session ({LONG_SESSION_TIMEOUT:?}) outlived the cut ({short_cut:?}) \
             is served after the heal: {error:?}"
        )
    });
    let served_grant = timeline.granted("short-cut waiter", &served);
    served.release().await.unwrap();
    timeline.released(served_grant);

    // A long cut: past the session. The majority expires the waiter's session and serves
    // others meanwhile; the waiter learns of the expiry when it can reach a server again.
    let mut held = holder.lock(name).unwrap().acquire(None).await.unwrap();
    let held_grant = timeline.granted("holder again", &held);
    let long = client_of(&ensemble, &[follower]).await;
    let long_lock = long.lock(name).unwrap();
    let long_waiter =
        tokio::spawn(async move { long_lock.acquire(Some(Duration::from_secs(60))).await });
    queue_reaches(&admin, &dir, 2, Duration::from_secs(10)).await;
    let cut = Instant::now();
    ensemble.partition(follower).await.unwrap();
    // The waiter's node goes with its session: the majority saw it expire.
    queue_reaches(&admin, &dir, 1, SESSION_TIMEOUT * 4).await;
    held.release().await.unwrap();
    timeline.released(held_grant);
    let mut other = holder.lock(name).unwrap().acquire(None).await.unwrap();
    let other_grant = timeline.granted("holder, during the cut", &other);
    other.release().await.unwrap();
    timeline.released(other_grant);
    ensemble.heal(follower).await.unwrap();
    let outcome = long_waiter.await.unwrap();
    eprintln!(
        "partitions::follower: the long-cut waiter ended {:?} after the cut: {:?}",
        cut.elapsed(),
        outcome.as_ref().map(|guard| guard.fencing_token())
    );
    assert!(
        matches!(outcome, Err(LockError::SessionExpired { .. })),
        "a waiter whose session expired during the cut: {outcome:?}"
    );
    timeline.assert_one_believer();

    everyone_can_lock_again(&ensemble, name).await;
}

/// The leader member is cut off while a client connected to it alone leads an election,
/// with a candidate and an observer on the majority side. The cut-off leader learns it lost
/// before the majority's candidate leads, the new term is larger, the observer follows to
/// the new leader, and no instant has two leaders. Healed, the stale leader's resignation
/// says it had lost, and the election empties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cut_off_while_its_client_leads_an_election() {
    if !containers_available().await {
        return;
    }
    let ensemble = ensemble().await;
    let leader = ensemble.leader().await.expect("a leader");
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let name = "partition-election";
    let timeline = Timeline::default();
    let bound = Duration::from_secs(30);

    let on_leader = client_of(&ensemble, &[leader]).await;
    // The majority's client waits through the followers' election of a new leader, which
    // on a loaded machine took longer than the short session once (its session expired
    // before any member served again); how long the cut-off client's session lasts is what
    // orders its loss before the majority's grant, not this one's.
    let on_majority = client_with_session(&ensemble, &followers, LONG_SESSION_TIMEOUT).await;
    let mut stale = on_leader
        .election(name)
        .unwrap()
        .campaign(b"cut-off", Some(Duration::ZERO))
        .await
        .unwrap();
    let stale_office = timeline.granted("cut-off leader", stale.guard());
    let mut watch = on_majority.election(name).unwrap().observe().await.unwrap();
    let candidate = on_majority.election(name).unwrap();
    let campaign =
        tokio::spawn(async move { candidate.campaign(b"majority", Some(bound * 2)).await });
    let admin = admin_client(&ensemble.address(followers[0]).unwrap()).await;
    let dir = format!("{}.election", lock_dir(ZkConfig::DEFAULT_ROOT, name));
    queue_reaches(&admin, &dir, 2, Duration::from_secs(10)).await;
    let first = watch.current().unwrap();
    assert_eq!(
        first.as_ref().map(|leader| leader.value.as_slice()),
        Some(&b"cut-off"[..]),
        "the observer starts with the first leader"
    );

    let cut = Instant::now();
    ensemble.partition(leader).await.unwrap();
    let mut fresh = campaign
        .await
        .unwrap()
        .expect("the majority's candidate leads");
    let fresh_office = timeline.granted("majority's leader", fresh.guard());
    assert!(
        stale.is_lost(),
        "the cut-off leader must know it lost before the majority's candidate leads"
    );
    assert!(fresh.term() > stale.term(), "terms grow across leaders");
    let followed = tokio::time::timeout(
        bound,
        watch.wait_for(|leader| leader.is_some_and(|leader| leader.value == b"majority")),
    )
    .await
    .expect("the observer follows to the new leader within the bound")
    .unwrap();
    assert_eq!(followed.map(|leader| leader.term), Some(fresh.term()));
    let lost_at = timeline.belief(stale_office).ended.unwrap();
    let led_at = timeline.belief(fresh_office).granted;
    eprintln!(
        "partitions::election: lost {:?} after the cut, majority leads {:?} after it (margin {:?}); terms {} then {}",
        lost_at - cut,
        led_at - cut,
        led_at - lost_at,
        stale.term(),
        fresh.term(),
    );

    ensemble.heal(leader).await.unwrap();
    let stale_resign = stale.resign().await;
    timeline.released(stale_office);
    assert!(
        matches!(stale_resign, Err(LockError::Lost { .. })),
        "the stale leader's resignation must say it had lost: {stale_resign:?}"
    );
    assert!(
        !fresh.is_lost(),
        "the majority's leadership survives the heal"
    );
    fresh.resign().await.unwrap();
    timeline.released(fresh_office);
    timeline.assert_one_believer();
    queue_reaches(&admin, &dir, 0, Duration::from_secs(15)).await;
    tokio::time::timeout(bound, watch.wait_for(|leader| leader.is_none()))
        .await
        .expect("the observer sees that nobody leads")
        .unwrap();
}
