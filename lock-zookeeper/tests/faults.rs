//! Fault tests of the ZooKeeper lock provider, each against a server or an ensemble of its
//! own or behind proxies of its own (tickTime 500 ms, client sessions of 2 s): leader
//! failover under a held lock, a partition past the session timeout, lost create replies,
//! mass cancellation, ACLs, an unreachable server, and handshakes closed while connecting.
//! Every test checks invariants — an occupancy counter, the nodes left in the lock
//! directory, who owns them, when grants happen — not just return values, and prints what
//! it measured (`cargo test --test faults -- --nocapture`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{
    Proxies, SESSION_TIMEOUT, TICK_TIME, admin_client, children, lock_dir, wait_until, zk_options,
};
use lock_conformance::cases::observe::recorded_total;
use lock_conformance::{Occupancy, PollBudget, unique_name};
use lock_core::observe::RECONNECTS;
use lock_core::{DistributedLock, Guard, LockError, LockProvider};
use lock_testbed::proxy::ReplyKind;
use lock_testbed::servers::{ZkEnsemble, ZkServer, free_port, shared_zk};
use lock_zookeeper::{AclPolicy, DigestAuth, ZkConfig, ZkLockProvider, ZkStrategy};
use tokio::time::{Instant, sleep, timeout};
use zookeeper_client::{Acls, Client as ZkClient, CreateMode};

/// Slack for one operation or one reaction on a loaded two-core machine.
const SLACK: Duration = Duration::from_secs(1);

#[allow(
    clippy::print_stderr,
    reason = "the measurements are part of what these tests are for"
)]
fn report(test: &str, line: impl Display) {
    eprintln!("faults::{test}: {line}");
}

fn config(hosts: Vec<String>, strategy: ZkStrategy) -> ZkConfig {
    ZkConfig::new(hosts)
        .with_strategy(strategy)
        .with_session_timeout(SESSION_TIMEOUT)
}

async fn connect(hosts: Vec<String>, strategy: ZkStrategy) -> ZkLockProvider {
    ZkLockProvider::connect(config(hosts, strategy))
        .await
        .expect("a provider")
}

/// The free lock `name`, taken at once on `provider`.
async fn take_free(provider: &ZkLockProvider, name: &str) -> Guard {
    provider
        .lock(name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the lock is free")
}

/// A standalone server of the test's own, and a raw client of it.
async fn standalone() -> (ZkServer, ZkClient) {
    let server = ZkServer::start(zk_options())
        .await
        .expect("a ZooKeeper server");
    let admin = admin_client(&server.address()).await;
    (server, admin)
}

/// Waits until `dir` has exactly `count` children; returns them. Panics after `bound`.
async fn expect_children(
    admin: &ZkClient,
    dir: &str,
    count: usize,
    bound: Duration,
    what: &str,
) -> Vec<String> {
    let deadline = Instant::now() + bound;
    loop {
        let now = children(admin, dir)
            .await
            .expect("listing the lock directory");
        if now.len() == count {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {dir} has {} children after {bound:?}, expected {count}: {now:?}",
            now.len()
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Releases `guard`, retrying retryable errors for at most `bound`; returns the attempts.
async fn release_retrying(guard: &mut Guard, bound: Duration) -> usize {
    let deadline = Instant::now() + bound;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match guard.release().await {
            Ok(()) => return attempts,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("release after {attempts} attempts: {error}"),
        }
    }
}

fn zxid(guard: &Guard) -> i64 {
    i64::try_from(guard.fencing_token().0).expect("a zxid")
}

/// What a guard showed while it was watched.
#[derive(Debug, Default)]
struct Observed {
    /// First and last moment it was seen suspect, from the start of the watch.
    suspect: Option<(Duration, Duration)>,
    /// When it was first seen lost.
    lost: Option<Duration>,
}

/// Samples `guard` every 10 ms from `from` until at least `min` has passed and it is no longer
/// suspect, or `max` has passed.
async fn observe(guard: &Guard, from: Instant, min: Duration, max: Duration) -> Observed {
    let mut observed = Observed::default();
    loop {
        let at = from.elapsed();
        let suspect = guard.is_suspect();
        if suspect {
            let first = observed.suspect.map_or(at, |(first, _)| first);
            observed.suspect = Some((first, at));
        }
        if guard.is_lost() && observed.lost.is_none() {
            observed.lost = Some(at);
        }
        if (at >= min && !suspect) || at >= max {
            return observed;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// (a) The leader of a three-member ensemble is killed while a lock is held and three
/// waiters are queued: the holder keeps its lock (its guard is neither lost nor taken over),
/// nobody else gets in while it holds, and after its release each waiter is served exactly
/// once, in queue order, with no node left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_keeps_the_holder_and_serves_each_waiter_once() {
    const TEST: &str = "leader_failover";
    const WAITERS: usize = 3;
    let began = Instant::now();
    let mut ensemble = ZkEnsemble::start(3, zk_options())
        .await
        .expect("a three-member ensemble");
    let connect_string = ensemble.connect_string();
    let hosts = || {
        connect_string
            .split(',')
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    report(TEST, format_args!("ensemble up in {:?}", began.elapsed()));
    let admin = admin_client(&connect_string).await;
    let strategy = ZkStrategy::default();
    let name = unique_name("failover");
    let dir = lock_dir(ZkConfig::DEFAULT_ROOT, &name);

    let holder = connect(hosts(), strategy).await;
    let mut held = take_free(&holder, &name).await;
    let occupancy = Occupancy::new();
    let inside = occupancy.enter();
    let holder_node = expect_children(&admin, &dir, 1, SLACK, "the holder's node").await;

    let served = Arc::new(AtomicUsize::new(0));
    let mut providers = Vec::new();
    let mut waiters = Vec::new();
    for index in 0..WAITERS {
        let provider = connect(hosts(), strategy).await;
        let lock = provider.lock(&name).unwrap();
        providers.push(provider);
        let occupancy = occupancy.clone();
        let served = Arc::clone(&served);
        waiters.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut attempts = 0;
            let mut guard = loop {
                attempts += 1;
                match lock.acquire(None).await {
                    Ok(guard) => break guard,
                    Err(error) if error.is_retryable() && Instant::now() < deadline => {
                        sleep(Duration::from_millis(100)).await;
                    }
                    Err(error) => return Err(error),
                }
            };
            served.fetch_add(1, Ordering::SeqCst);
            let granted = Instant::now();
            {
                let _inside = occupancy.enter();
                sleep(Duration::from_millis(20)).await;
            }
            let token = zxid(&guard);
            guard.release().await?;
            Ok::<_, LockError>((index, granted, token, attempts))
        }));
        // Queued in index order.
        expect_children(&admin, &dir, index + 2, SLACK * 2, "a waiter's node").await;
    }

    let leader = ensemble
        .wait_for_leader(Duration::from_secs(10))
        .await
        .expect("a leader");
    let killed = Instant::now();
    ensemble.kill(leader).await.expect("killing the leader");
    let failover = async {
        let new_leader = ensemble
            .wait_for_leader(Duration::from_secs(30))
            .await
            .expect("a new leader");
        (new_leader, killed.elapsed())
    };
    // Watch the holder's guard through the election and until it is connected again, for
    // at least two session timeouts.
    let watching = observe(&held, killed, SESSION_TIMEOUT * 2, Duration::from_secs(15));
    let ((new_leader, failover_took), observed) = tokio::join!(failover, watching);
    report(
        TEST,
        format_args!(
            "killed leader {leader}; member {new_leader} leads after {failover_took:?}; \
             holder's guard suspect {:?}, lost {:?}",
            observed.suspect, observed.lost
        ),
    );
    assert_ne!(new_leader, leader, "the killed member cannot lead");
    assert!(
        observed.lost.is_none() && !held.is_lost(),
        "the holder's guard was lost in the failover: {observed:?}"
    );
    assert!(!held.is_suspect(), "the holder never reconnected");
    assert_eq!(
        served.load(Ordering::SeqCst),
        0,
        "a waiter was granted while the holder held"
    );
    assert!(
        waiters.iter().all(|waiter| !waiter.is_finished()),
        "a waiter finished while the holder held"
    );
    // On the server: the holder's node is still first, every waiter still queued.
    let mut queue = children(&admin, &dir).await.unwrap();
    queue.sort_by_key(|child| common::sequence(child));
    assert_eq!(
        queue.len(),
        1 + WAITERS,
        "the queue after the failover: {queue:?}"
    );
    assert_eq!(
        queue[0], holder_node[0],
        "the holder's node is no longer first"
    );

    drop(inside);
    let released = Instant::now();
    let release_attempts = release_retrying(&mut held, Duration::from_secs(10)).await;
    let mut grants = Vec::new();
    for waiter in waiters {
        let result = timeout(Duration::from_secs(20), waiter)
            .await
            .expect("a waiter served within 20 s")
            .expect("the waiter task");
        grants.push(result.expect("the waiter's acquire and release"));
    }
    assert_eq!(
        served.load(Ordering::SeqCst),
        WAITERS,
        "each waiter is served exactly once"
    );
    assert_eq!(
        occupancy.peak(),
        1,
        "two holders at once across the failover"
    );
    grants.sort_by_key(|&(_, granted, _, _)| granted);
    for &(index, granted, token, _) in &grants {
        assert!(
            granted >= released,
            "waiter {index} was granted before the holder released"
        );
        assert!(
            token > zxid(&held),
            "waiter {index}'s token is not above the holder's"
        );
    }
    assert!(
        grants.windows(2).all(|pair| pair[0].2 < pair[1].2),
        "tokens do not increase with the grants: {grants:?}"
    );
    let retried = grants.iter().any(|&(_, _, _, attempts)| attempts > 1);
    if !retried {
        let order: Vec<_> = grants.iter().map(|&(index, ..)| index).collect();
        assert_eq!(
            order,
            (0..WAITERS).collect::<Vec<_>>(),
            "waiters served out of queue order"
        );
    }
    expect_children(&admin, &dir, 0, SLACK * 5, "nodes left after the waiters").await;
    report(
        TEST,
        format_args!(
            "released after {release_attempts} attempt(s); waiters served at {:?} after the \
             release (attempts {:?}); occupancy peak {}; nodes left 0; test took {:?}",
            grants
                .iter()
                .map(|&(index, granted, ..)| (index, granted - released))
                .collect::<Vec<_>>(),
            grants.iter().map(|g| g.3).collect::<Vec<_>>(),
            occupancy.peak(),
            began.elapsed()
        ),
    );
    drop(providers);
}

/// How the holder is cut off in [`partition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Partition {
    /// Its connections are closed and new ones refused: the client notices at once.
    Cut,
    /// Its connections stay open and carry nothing: the client notices only when its read
    /// timeout runs out.
    Silent,
}

/// (b) The holder is cut off for longer than its session: its guard becomes suspect, and
/// lost within the session timeout (plus slack) and before anyone else holds the lock; a
/// client that asks during the partition gets the lock only once the server can have
/// expired the holder's session; when the network comes back, the stale guard's release
/// returns `Lost` and leaves the new holder alone.
async fn partition(kind: Partition) {
    let test = format!("partition_{kind:?}").to_lowercase();
    let began = Instant::now();
    let (server, admin) = standalone().await;
    let proxies = Proxies::start(&[server.socket_addr()]);
    let strategy = ZkStrategy::default();
    let a = connect(proxies.hosts(), strategy).await;
    let b = connect(vec![server.address()], strategy).await;
    let c = connect(vec![server.address()], strategy).await;
    let session_timeout = a
        .capabilities()
        .crash_release_bound
        .expect("the negotiated session timeout");
    assert_eq!(
        session_timeout, SESSION_TIMEOUT,
        "the negotiated session timeout"
    );
    let name = unique_name("partition");
    let dir = lock_dir(ZkConfig::DEFAULT_ROOT, &name);
    let mut stale = take_free(&a, &name).await;
    let a_session = a.session_id().expect("a session");
    let lost = stale.lost();
    let lost_at = tokio::spawn({
        let lost = lost.clone();
        async move {
            let reason = lost.wait().await;
            (reason, Instant::now())
        }
    });

    // A request answered just before the partition: the server heard from the holder's
    // session at or after `touched`, so it cannot expire the session before
    // `touched + timeout`.
    let touched = Instant::now();
    a.client().unwrap().check_stat("/").await.unwrap();
    match kind {
        Partition::Cut => proxies.cut(),
        Partition::Silent => proxies.first().black_hole(),
    }
    let cut = Instant::now();
    let b_lock = b.lock(&name).unwrap();
    let contender = tokio::spawn({
        let lost = lost.clone();
        async move {
            let result = b_lock.acquire(Some(Duration::from_secs(15))).await;
            // Whether the old holder's guard already said so when B got the lock.
            let holder_lost = lost.is_lost();
            (result, Instant::now(), holder_lost)
        }
    });

    // Suspect once the client notices (at once for a cut; after its read timeout, 2/5 of
    // the session, when silent), and not yet lost then.
    let deadline = cut + session_timeout / 2 + Duration::from_millis(300);
    while !stale.is_suspect() && Instant::now() < deadline {
        sleep(Duration::from_millis(10)).await;
    }
    let suspect_after = cut.elapsed();
    assert!(
        stale.is_suspect(),
        "the guard is not suspect {suspect_after:?} into the partition"
    );
    assert!(
        !stale.is_lost(),
        "the guard was lost {suspect_after:?} into the partition"
    );
    assert!(
        !contender.is_finished(),
        "B got the lock during the partition"
    );

    let (reason, lost_at) = timeout(session_timeout + SLACK, lost_at)
        .await
        .expect("the lost signal within the session timeout and slack")
        .expect("the lost-signal task");
    let lost_after = lost_at - cut;
    assert!(reason.is_some(), "the lost signal ended without a loss");

    let (granted, granted_at, holder_lost) =
        timeout(session_timeout + TICK_TIME + SLACK * 4, contender)
            .await
            .expect("B's grant after the expiry")
            .expect("B's task");
    let mut fresh = granted.expect("B's acquire");
    let granted_after = granted_at - cut;
    assert!(
        granted_at >= touched + session_timeout,
        "B was granted {granted_after:?} after the cut, before the holder's session could \
         expire ({session_timeout:?} after the last exchange)"
    );
    assert!(
        granted_after <= session_timeout + TICK_TIME * 2 + SLACK * 2,
        "B waited {granted_after:?} after the cut"
    );
    assert!(
        holder_lost,
        "B was granted {granted_after:?} after the cut while the holder's guard still held \
         (lost only {lost_after:?} after the cut)"
    );

    proxies.pass();
    let release = timeout(SLACK * 5, stale.release())
        .await
        .expect("the stale release returns");
    assert!(
        matches!(release, Err(LockError::Lost { .. })),
        "the stale release returned {release:?}"
    );
    // B still holds: a third client is refused, and B's node is the only one, B's own.
    assert!(!fresh.is_lost(), "the stale release hurt the new holder");
    assert!(
        c.lock(&name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a third client got the lock B holds"
    );
    let nodes = children(&admin, &dir).await.unwrap();
    assert_eq!(nodes.len(), 1, "nodes while B holds: {nodes:?}");
    let stat = admin
        .check_stat(&format!("{dir}/{}", nodes[0]))
        .await
        .unwrap()
        .expect("B's node");
    assert_eq!(stat.czxid, zxid(&fresh), "the node left is not B's grant");
    assert_eq!(
        stat.ephemeral_owner,
        b.session_id().unwrap(),
        "the node left is not B's"
    );
    fresh.release().await.expect("B's release");

    // The holder's provider works again, on a new session (never the expired one).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = loop {
        match a.lock(&name).unwrap().try_acquire().await {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("the lock is free after B's release"),
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("acquire on A's provider after the partition: {error}"),
        }
    };
    assert_ne!(
        a.session_id(),
        Some(a_session),
        "the expired session was reused"
    );
    again.release().await.unwrap();
    expect_children(&admin, &dir, 0, SLACK, "nodes left").await;
    report(
        &test,
        format_args!(
            "suspect {suspect_after:?} after the cut; lost {lost_after:?} after the cut \
             ({reason:?}); B granted {granted_after:?} after the cut, {:?} after the last \
             exchange (session {session_timeout:?}); stale release Lost; nodes left 0; \
             took {:?}",
            granted_at - touched,
            began.elapsed()
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_past_the_session_timeout_cut() {
    partition(Partition::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_past_the_session_timeout_silent() {
    partition(Partition::Silent).await;
}

/// An observer cut off from the server (silently: its connection carries nothing) while the
/// leadership changes does not go on reporting the old leader: within the session timeout
/// and its read retries, its watch either follows to the new leader or ends with a
/// retryable error (the client ends a session it cannot reach within its timeout, which
/// wakes the watch). With the network back, the observer's provider reports the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_cut_off_does_not_report_the_old_leader_forever() {
    let (server, _admin) = standalone().await;
    let proxies = Proxies::start(&[server.socket_addr()]);
    let strategy = ZkStrategy::default();
    let observer = connect(proxies.hosts(), strategy).await;
    let candidates = connect(vec![server.address()], strategy).await;
    let name = unique_name("observer-cut");
    let election = candidates.election(&name).unwrap();
    let mut first = election
        .campaign(b"first", Some(Duration::ZERO))
        .await
        .unwrap();
    let mut watch = observer.election(&name).unwrap().observe().await.unwrap();
    assert_eq!(
        watch.current().unwrap().map(|leader| leader.value),
        Some(b"first".to_vec())
    );

    proxies.first().black_hole();
    let cut = Instant::now();
    let campaign = tokio::spawn({
        let election = Arc::clone(&election);
        async move { election.campaign(b"next", Some(SLACK * 5)).await }
    });
    first.resign().await.unwrap();
    let mut next = campaign.await.unwrap().expect("the next candidate leads");
    let bound = SESSION_TIMEOUT * 2 + SLACK * 2;
    let outcome = timeout(
        bound,
        watch.wait_for(|leader| leader.is_some_and(|leader| leader.value == b"next")),
    )
    .await;
    let Ok(outcome) = outcome else {
        panic!(
            "the cut-off observer still reports {:?} {bound:?} after the cut",
            watch.current()
        );
    };
    let ended = cut.elapsed();
    match &outcome {
        Ok(leader) => assert_eq!(leader.as_ref().map(|leader| leader.term), Some(next.term())),
        Err(error) => assert!(error.is_retryable(), "the observation ended with {error}"),
    }

    proxies.pass();
    let deadline = Instant::now() + SESSION_TIMEOUT * 2 + SLACK * 5;
    let leader = loop {
        match observer.election(&name).unwrap().leader().await {
            Ok(leader) => break leader,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("the observer's provider after the heal: {error}"),
        }
    };
    assert_eq!(leader.map(|leader| leader.term), Some(next.term()));
    next.resign().await.unwrap();
    report(
        "observer_cut_off",
        format_args!(
            "the cut-off observer's watch {} {ended:?} after the cut (session {SESSION_TIMEOUT:?})",
            match outcome {
                Ok(_) => "followed to the new leader".to_owned(),
                Err(error) => format!("ended with a retryable error ({error})"),
            }
        ),
    );
}

/// Adoption counts of one run of [`lost_create_replies`].
#[derive(Debug, Default)]
struct LostReplies {
    /// The swallowed create had made the node; the client found and kept it.
    adopted: usize,
    /// The client got the lock with another node (the swallowed reply was an error).
    recreated: usize,
    /// The acquire failed with a retryable error.
    failed: usize,
}

/// Which lock a lost-create test takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    /// The write side of a read-write lock.
    Writer,
    /// A one-permit semaphore; the lost reply is that of its internal mutex's node.
    OnePermit,
}

impl Kind {
    fn lock(self, provider: &ZkLockProvider, name: &str) -> Arc<dyn DistributedLock> {
        match self {
            Kind::Mutex => provider.lock(name).unwrap(),
            Kind::Writer => provider.rw_lock(name).unwrap().write_lock(),
            Kind::OnePermit => provider.semaphore(name, 1).unwrap().as_lock().unwrap(),
        }
    }

    /// The directory of the holder's node, and the other directories the lock uses.
    fn dirs(self, name: &str) -> (String, Vec<String>) {
        let dir = lock_dir(ZkConfig::DEFAULT_ROOT, name);
        match self {
            Kind::Mutex => (dir, Vec::new()),
            Kind::Writer => (format!("{dir}.rwlock"), Vec::new()),
            Kind::OnePermit => (
                format!("{dir}.semaphore/leases"),
                vec![format!("{dir}.semaphore/locks")],
            ),
        }
    }
}

/// (c) Fifty acquires whose create reply is lost (the server acts on the create, the client
/// sees its connection drop), alternately on a free lock and behind another holder: after
/// each, the directory holds exactly the holder's own node, nothing once released, and
/// another client gets the lock at once.
async fn lost_create_replies(strategy: ZkStrategy, kind: Kind) -> LostReplies {
    const ROUNDS: usize = 50;
    let (server, admin) = standalone().await;
    let proxies = Proxies::start(&[server.socket_addr()]);
    let proxy = proxies.first();
    let a = connect(proxies.hosts(), strategy).await;
    let b = connect(vec![server.address()], strategy).await;
    let name = unique_name("lost-create");
    let (dir, others) = kind.dirs(&name);
    let (a_lock, b_lock) = (kind.lock(&a, &name), kind.lock(&b, &name));
    let mut counts = LostReplies::default();
    for round in 0..ROUNDS {
        let blocker = if round % 2 == 1 {
            Some(
                b_lock
                    .try_acquire()
                    .await
                    .unwrap()
                    .expect("the lock is free"),
            )
        } else {
            None
        };
        let swallow = proxy.swallow_next_reply(ReplyKind::ZkCreate);
        let acquiring = a_lock.acquire(Some(Duration::from_secs(10)));
        let result = match blocker {
            None => acquiring.await,
            Some(mut blocker) => {
                // The other holder lets go once the contender's create reply is gone.
                let letting_go = async {
                    timeout(SLACK * 5, swallow.wait())
                        .await
                        .expect("the contender's create reply swallowed");
                    sleep(Duration::from_millis(100)).await;
                    blocker.release().await.expect("the other holder's release");
                };
                tokio::join!(acquiring, letting_go).0
            }
        };
        let event = swallow
            .event()
            .unwrap_or_else(|| panic!("round {round}: no reply swallowed"));
        match result {
            Ok(mut guard) => {
                let token = zxid(&guard);
                if event.err == Some(0) && event.zxid == Some(token) {
                    counts.adopted += 1;
                } else {
                    counts.recreated += 1;
                }
                let nodes = expect_children(
                    &admin,
                    &dir,
                    1,
                    SLACK,
                    &format!("round {round}: the holder's node"),
                )
                .await;
                let stat = admin
                    .check_stat(&format!("{dir}/{}", nodes[0]))
                    .await
                    .unwrap()
                    .expect("the holder's node");
                assert_eq!(
                    stat.czxid, token,
                    "round {round}: the only node is not the grant's"
                );
                assert_eq!(
                    stat.ephemeral_owner,
                    a.session_id().unwrap(),
                    "round {round}: the only node is not the holder's"
                );
                for other in &others {
                    expect_children(&admin, other, 0, SLACK, &format!("round {round}: {other}"))
                        .await;
                }
                guard.release().await.expect("the holder's release");
            }
            Err(error) if error.is_retryable() => counts.failed += 1,
            Err(error) => panic!("round {round}: {error}"),
        }
        for dir in std::iter::once(&dir).chain(&others) {
            expect_children(
                &admin,
                dir,
                0,
                SLACK * 3,
                &format!("round {round}: an orphan node"),
            )
            .await;
        }
        let mut next = timeout(SLACK * 2, b_lock.acquire(Some(SLACK * 2)))
            .await
            .unwrap_or_else(|_| panic!("round {round}: another client's acquire hangs"))
            .unwrap_or_else(|error| panic!("round {round}: another client's acquire: {error}"));
        next.release().await.unwrap();
        expect_children(
            &admin,
            &dir,
            0,
            SLACK,
            &format!("round {round}: nodes left"),
        )
        .await;
    }
    assert_eq!(
        usize::try_from(proxy.stats().swallowed).unwrap(),
        ROUNDS,
        "one reply swallowed per round"
    );
    assert_eq!(counts.adopted + counts.recreated + counts.failed, ROUNDS);
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_replies_leave_no_orphan_sequential() {
    let began = Instant::now();
    let counts = lost_create_replies(ZkStrategy::SequentialPredecessor, Kind::Mutex).await;
    report(
        "lost_create_replies_sequential",
        format_args!(
            "{counts:?} of 50; nodes left 0 after each round; took {:?}",
            began.elapsed()
        ),
    );
    assert!(counts.adopted > 0, "no swallowed create was adopted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_replies_leave_no_orphan_single_node() {
    let began = Instant::now();
    let counts = lost_create_replies(ZkStrategy::SingleNode, Kind::Mutex).await;
    report(
        "lost_create_replies_single_node",
        format_args!(
            "{counts:?} of 50; nodes left 0 after each round; took {:?}",
            began.elapsed()
        ),
    );
    assert!(counts.adopted > 0, "no swallowed create was adopted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_replies_leave_no_orphan_rw_and_semaphore() {
    for kind in [Kind::Writer, Kind::OnePermit] {
        let began = Instant::now();
        let counts = lost_create_replies(ZkStrategy::SequentialPredecessor, kind).await;
        report(
            "lost_create_replies_rw_and_semaphore",
            format_args!(
                "{kind:?}: {counts:?} of 50; nodes left 0 after each round; took {:?}",
                began.elapsed()
            ),
        );
        if kind == Kind::Writer {
            assert!(counts.adopted > 0, "no swallowed create was adopted");
        }
    }
}

/// A small deterministic generator (SplitMix64), seeded per contender.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % bound
    }
}

/// What the contenders of [`cancelled_acquires`] did.
#[derive(Debug, Default)]
struct Cancels {
    dropped_after_delay: AtomicUsize,
    dropped_after_polls: AtomicUsize,
    granted: AtomicUsize,
}

/// (d) Twenty contenders, each its own provider, make 200 acquires between them; most are
/// cancelled at a random point (dropped after 0–50 ms, or after a random number of polls),
/// the others run until they hold, and those that get the lock hold it briefly and release.
/// Exclusion holds throughout, and once they settle no node is left.
async fn cancelled_acquires(strategy: ZkStrategy) {
    let test = format!("cancelled_acquires_{strategy}");
    const CONTENDERS: u64 = 20;
    const ATTEMPTS: usize = 10;
    let began = Instant::now();
    let (server, admin) = standalone().await;
    let name = unique_name("cancels");
    let dir = lock_dir(ZkConfig::DEFAULT_ROOT, &name);
    let occupancy = Occupancy::new();
    let cancels = Arc::new(Cancels::default());
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let mut providers = Vec::new();
    let mut contenders = Vec::new();
    for index in 0..CONTENDERS {
        let provider = connect(vec![server.address()], strategy).await;
        let lock = provider.lock(&name).unwrap();
        providers.push(provider);
        let (occupancy, cancels) = (occupancy.clone(), Arc::clone(&cancels));
        let mut rng = Rng(seed.wrapping_mul(31).wrapping_add(index));
        contenders.push(tokio::spawn(async move {
            for _ in 0..ATTEMPTS {
                let granted = match rng.below(10) {
                    0..=3 => {
                        let delay = Duration::from_millis(rng.below(51));
                        match timeout(delay, lock.acquire(None)).await {
                            Ok(result) => Some(result),
                            Err(_) => {
                                cancels.dropped_after_delay.fetch_add(1, Ordering::SeqCst);
                                None
                            }
                        }
                    }
                    4..=7 => {
                        let polls = 1 + usize::try_from(rng.below(12)).unwrap();
                        let budget = PollBudget::new(lock.acquire(None), polls);
                        match timeout(Duration::from_millis(50), budget).await {
                            Ok(Some(result)) => Some(result),
                            Ok(None) | Err(_) => {
                                cancels.dropped_after_polls.fetch_add(1, Ordering::SeqCst);
                                None
                            }
                        }
                    }
                    _ => Some(lock.acquire(Some(Duration::from_secs(30))).await),
                };
                if let Some(result) = granted {
                    let mut guard = result.expect("an acquire that ran to its end");
                    {
                        let _inside = occupancy.enter();
                        sleep(Duration::from_millis(rng.below(4))).await;
                        assert!(!guard.is_lost(), "a holder lost its lock");
                    }
                    guard.release().await.expect("a holder's release");
                    cancels.granted.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for contender in contenders {
        timeout(Duration::from_secs(60), contender)
            .await
            .expect("a contender settles within 60 s")
            .expect("the contender task");
    }
    let settled = began.elapsed();
    expect_children(&admin, &dir, 0, SLACK * 5, "nodes left after the cancels").await;
    assert!(
        occupancy.peak() <= 1,
        "{} holders at once",
        occupancy.peak()
    );
    let granted = cancels.granted.load(Ordering::SeqCst);
    assert!(granted > 0, "no acquire ran to a grant");
    // Nothing is held on a cancelled caller's behalf: a newcomer gets the lock at once.
    let newcomer = connect(vec![server.address()], strategy).await;
    let mut probe = newcomer
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the lock is free once the contenders settled");
    probe.release().await.unwrap();
    report(
        &test,
        format_args!(
            "seed {seed}: {} dropped after a delay, {} dropped after some polls, {granted} \
             granted and released (200 in all); occupancy peak {}; settled in {settled:?}; \
             nodes left 0; took {:?}",
            cancels.dropped_after_delay.load(Ordering::SeqCst),
            cancels.dropped_after_polls.load(Ordering::SeqCst),
            occupancy.peak(),
            began.elapsed()
        ),
    );
    assert_eq!(
        cancels.dropped_after_delay.load(Ordering::SeqCst)
            + cancels.dropped_after_polls.load(Ordering::SeqCst)
            + granted,
        200
    );
    drop(providers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_no_nodes_predecessor() {
    cancelled_acquires(ZkStrategy::SequentialPredecessor).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_no_nodes_children() {
    cancelled_acquires(ZkStrategy::WholeQueue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_no_nodes_single_node() {
    cancelled_acquires(ZkStrategy::SingleNode).await;
}

/// A chroot that does not exist yet is made at connect (as Curator makes its namespace),
/// levels and all, and holds the locks: the lock directory is under it on the server, and a
/// second client on the same chroot finds the lock held. A chroot whose parent another
/// identity keeps to itself is refused with an error that names the chroot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_chroot_is_made_and_holds_the_locks() {
    let (server, admin) = standalone().await;
    let chroot = "/apps/billing";
    let rooted = || config(vec![server.address()], ZkStrategy::default()).with_chroot(chroot);
    let first = ZkLockProvider::connect(rooted()).await.unwrap();
    let lock = first.lock("invoices").unwrap();
    let mut held = lock.try_acquire().await.unwrap().expect("a free lock");
    let dir = format!("{chroot}{}", lock_dir("/distlock", "invoices"));
    let nodes = children(&admin, &dir).await.unwrap();
    assert_eq!(
        nodes.len(),
        1,
        "the lock's node under the chroot: {nodes:?}"
    );
    // The chroot stands now: a second session looks once and roots itself.
    let second = ZkLockProvider::connect(rooted()).await.unwrap();
    let other = second.lock("invoices").unwrap();
    assert!(
        other.try_acquire().await.unwrap().is_none(),
        "held through the chroot"
    );
    held.release().await.unwrap();
    let mut taken = other
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the release");
    taken.release().await.unwrap();

    admin
        .create(
            "/kept",
            &[],
            &CreateMode::Persistent.with_acls(Acls::anyone_read()),
        )
        .await
        .unwrap();
    let refused = ZkLockProvider::connect(
        config(vec![server.address()], ZkStrategy::default()).with_chroot("/kept/mine"),
    )
    .await
    .expect_err("a chroot that cannot be made");
    assert!(
        matches!(refused, LockError::PermissionDenied { .. })
            && refused.to_string().contains("/kept/mine"),
        "{refused:?}"
    );
}

/// A password kept apart from the URL (`password_file=`) is the digest the session
/// authenticates with: the held lock's node is readable by that identity and by no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_file_is_the_sessions_digest() {
    let (server, anonymous) = standalone().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    std::fs::write(&file, "right\n").unwrap();
    let url = format!(
        "zk://owner@{}?root=/filed&password_file={}",
        server.address(),
        file.display()
    );
    let provider = ZkLockProvider::connect_url(&url).await.unwrap();
    let name = unique_name("filed");
    let mut held = provider
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("a free lock");
    let lock = lock_dir("/filed", &name);
    let owner = ZkClient::connector()
        .with_auth("digest", b"owner:right")
        .connect(&server.address())
        .await
        .unwrap();
    assert_eq!(
        children(&owner, &lock).await.unwrap().len(),
        1,
        "the owner's view"
    );
    let nodes = children(&anonymous, &lock).await;
    assert!(
        matches!(nodes, Err(zookeeper_client::Error::NoAuth)),
        "another identity listed the lock: {nodes:?}"
    );
    held.release().await.unwrap();
}

/// With credentials and no `acl` given, a lock's nodes are the creator's: another identity
/// (or none) cannot delete a held lock's node, and the holder keeps its lock; the root stays
/// open, so that another identity makes locks of its own under it (but not in the owner's).
/// `acl=open`, given explicitly, still opens the locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_make_the_nodes_the_creators_by_default() {
    let (server, _admin) = standalone().await;
    let owner = |acl: Option<AclPolicy>| {
        let config = config(vec![server.address()], ZkStrategy::default())
            .with_root("/owned")
            .with_auth(DigestAuth::new("owner", "right"));
        match acl {
            Some(acl) => config.with_acl(acl),
            None => config,
        }
    };
    let intruders = [
        ZkClient::connector()
            .with_auth("digest", b"intruder:right")
            .connect(&server.address())
            .await
            .unwrap(),
        admin_client(&server.address()).await,
    ];
    for (acl, refused) in [(None, true), (Some(AclPolicy::Open), false)] {
        let provider = ZkLockProvider::connect(owner(acl)).await.unwrap();
        let name = unique_name("owned");
        let lock = provider.lock(&name).unwrap();
        let mut held = lock.try_acquire().await.unwrap().expect("a free lock");
        let dir = lock_dir("/owned", &name);
        let nodes = children(&intruders[1], &dir).await;
        if refused {
            assert!(
                matches!(nodes, Err(zookeeper_client::Error::NoAuth)),
                "an anonymous client listed the owner's directory: {nodes:?}"
            );
            let owner_client = ZkClient::connector()
                .with_auth("digest", b"owner:right")
                .connect(&server.address())
                .await
                .unwrap();
            let node = format!("{dir}/{}", children(&owner_client, &dir).await.unwrap()[0]);
            for intruder in &intruders {
                let deleted = intruder.delete(&node, None).await;
                assert!(
                    matches!(deleted, Err(zookeeper_client::Error::NoAuth)),
                    "another identity deleted the held node: {deleted:?}"
                );
            }
            sleep(SLACK / 2).await;
            assert!(!held.is_lost(), "the refused deletes took the lock");
            let neighbour = ZkLockProvider::connect(
                config(vec![server.address()], ZkStrategy::default())
                    .with_root("/owned")
                    .with_auth(DigestAuth::new("neighbour", "right")),
            )
            .await
            .unwrap();
            let mut own = neighbour
                .lock(&unique_name("neighbours"))
                .unwrap()
                .try_acquire()
                .await
                .unwrap()
                .expect("another identity's own lock under the shared root");
            own.release().await.unwrap();
            let theirs = neighbour.lock(&name).unwrap().try_acquire().await;
            assert!(
                matches!(theirs, Err(LockError::PermissionDenied { .. })),
                "another identity queued in the owner's lock: {theirs:?}"
            );
            held.release().await.unwrap();
        } else {
            let node = format!("{dir}/{}", nodes.unwrap()[0]);
            intruders[0].delete(&node, None).await.unwrap();
            let lost = timeout(SLACK * 2, held.lost().wait()).await;
            assert!(
                lost.is_ok(),
                "the explicit open ACL let nobody delete the node"
            );
            assert!(
                held.release().await.is_err(),
                "a deleted node released cleanly"
            );
        }
    }
}

/// (e) A root created by a digest user with a creator-only ACL: a client with the wrong
/// password (or none) is refused with an auth error, on a fresh name and on a held one, and
/// creates nothing under the root; the rightful holder is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_refused_and_create_nothing() {
    const TEST: &str = "wrong_credentials";
    let began = Instant::now();
    let (server, _admin) = standalone().await;
    let root = "/secured";
    let owner = ZkClient::connector()
        .with_auth("digest", b"owner:right")
        .connect(&server.address())
        .await
        .expect("the owner's raw client");
    owner
        .create(
            root,
            &[],
            &CreateMode::Persistent.with_acls(Acls::creator_all()),
        )
        .await
        .expect("the secured root");
    let secured = |auth: Option<DigestAuth>| {
        let config = config(vec![server.address()], ZkStrategy::default()).with_root(root);
        match auth {
            Some(auth) => config.with_auth(auth).with_acl(AclPolicy::CreatorAll),
            None => config,
        }
    };
    let rightful = ZkLockProvider::connect(secured(Some(DigestAuth::new("owner", "right"))))
        .await
        .unwrap();
    let mut held = rightful
        .lock("held")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the rightful user locks under the root");
    let intruders = [
        (
            "wrong password",
            secured(Some(DigestAuth::new("owner", "wrong"))),
        ),
        (
            "other user",
            secured(Some(DigestAuth::new("intruder", "right"))),
        ),
        ("no credentials", secured(None)),
    ];
    let mut refusals = Vec::new();
    for (who, config) in intruders {
        let intruder = ZkLockProvider::connect(config).await.unwrap();
        for name in ["fresh", "held"] {
            let lock = intruder.lock(name).unwrap();
            let acquired = timeout(SLACK * 5, lock.acquire(Some(SLACK)))
                .await
                .expect("a refusal within the bound");
            let tried = timeout(SLACK * 5, lock.try_acquire())
                .await
                .expect("a refusal within the bound");
            for error in [acquired.err(), tried.err()] {
                let error = error.unwrap_or_else(|| panic!("{who} locked {name}"));
                assert!(
                    matches!(
                        error,
                        LockError::PermissionDenied { .. } | LockError::Auth { .. }
                    ),
                    "{who} on {name}: expected an auth error, got {error}"
                );
                assert!(
                    !error.is_retryable(),
                    "{who}: an auth error is not retryable"
                );
                refusals.push(format!("{who}/{name}: {}", error_kind(&error)));
            }
        }
    }
    // Nothing under the root but the rightful holder's directory and node.
    let under_root = children(&owner, root).await.unwrap();
    assert_eq!(under_root, ["held"], "nodes under the root");
    let held_dir = lock_dir(root, "held");
    let nodes = children(&owner, &held_dir).await.unwrap();
    assert_eq!(nodes.len(), 1, "nodes of the held lock: {nodes:?}");
    let stat = owner
        .check_stat(&format!("{held_dir}/{}", nodes[0]))
        .await
        .unwrap()
        .expect("the holder's node");
    assert_eq!(stat.ephemeral_owner, rightful.session_id().unwrap());
    assert!(!held.is_lost(), "the intruders hurt the rightful holder");
    held.release().await.unwrap();
    report(
        TEST,
        format_args!(
            "{} refusals ({}); nodes created by intruders 0; took {:?}",
            refusals.len(),
            refusals.join(", "),
            began.elapsed()
        ),
    );
}

/// A root that the provider creates itself, with the creator-only ACL, outlives its lock
/// directories: the server removes emptied lock directories (containers) but never the root
/// or its parents, so the root's ACL keeps other users out after every lock under it has come
/// and gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_root_outlives_its_lock_directories() {
    const TEST: &str = "secured_root";
    let began = Instant::now();
    let mut options = zk_options();
    // The server looks for empty containers every 100 ms instead of every minute.
    options
        .jvm_args
        .push("-Dznode.container.checkIntervalMs=100".to_owned());
    let server = ZkServer::start(options).await.expect("a ZooKeeper server");
    let owner = ZkClient::connector()
        .with_auth("digest", b"owner:right")
        .connect(&server.address())
        .await
        .expect("the owner's raw client");
    let root = "/secured/apps";
    let secured = |auth: DigestAuth| {
        config(vec![server.address()], ZkStrategy::default())
            .with_root(root)
            .with_auth(auth)
            .with_acl(AclPolicy::CreatorAll)
    };
    let rightful = ZkLockProvider::connect(secured(DigestAuth::new("owner", "right")))
        .await
        .unwrap();
    let lock = rightful.lock("job").unwrap();
    let mut guard = lock.try_acquire().await.unwrap().expect("a free lock");
    guard.release().await.unwrap();
    let dir = lock_dir(root, "job");
    // How long the server may take to remove an emptied container.
    let sweep_bound = Duration::from_secs(10);
    let deadline = Instant::now() + sweep_bound;
    while owner.check_stat(&dir).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the emptied lock directory was never removed"
        );
        sleep(Duration::from_millis(50)).await;
    }
    let reaped = began.elapsed();
    // More passes of the server's container sweep: one for each level above the lock
    // directory (the root, then its parent), as a cascade of emptied containers would take.
    // A canary container emptied once the previous pass is seen to be over is removed by
    // a later pass.
    for pass in ["the root", "its parent"] {
        let canary = "/sweep-canary";
        let anyone = Acls::anyone_all();
        owner
            .create(canary, &[], &CreateMode::Container.with_acls(anyone))
            .await
            .expect("a canary container");
        let child = format!("{canary}/child");
        owner
            .create(&child, &[], &CreateMode::Persistent.with_acls(anyone))
            .await
            .expect("the canary's child");
        owner
            .delete(&child, None)
            .await
            .expect("emptying the canary");
        let _removed = wait_until(
            sweep_bound,
            &format!("the sweep pass that would remove {pass} removes the emptied canary"),
            || owner.check_stat(canary),
            |stat| matches!(stat, Ok(None)),
        )
        .await;
    }
    for path in ["/secured", root] {
        assert!(
            owner.check_stat(path).await.unwrap().is_some(),
            "{path} was removed with the last lock directory under it"
        );
    }
    let intruder = ZkLockProvider::connect(secured(DigestAuth::new("owner", "wrong")))
        .await
        .unwrap();
    let refused = intruder.lock("job").unwrap().try_acquire().await;
    assert!(
        matches!(
            refused,
            Err(LockError::PermissionDenied { .. } | LockError::Auth { .. })
        ),
        "an intruder under the emptied root: {refused:?}"
    );
    assert!(
        children(&owner, root).await.unwrap().is_empty(),
        "the intruder created nodes under the root"
    );
    let mut again = lock.try_acquire().await.unwrap().expect("a free lock");
    again.release().await.unwrap();
    report(
        TEST,
        format_args!(
            "lock directory swept {reaped:?} in; root and its parent kept; intruder refused; \
             took {:?}",
            began.elapsed()
        ),
    );
}

fn error_kind(error: &LockError) -> &'static str {
    match error {
        LockError::PermissionDenied { .. } => "PermissionDenied",
        LockError::Auth { .. } => "Auth",
        _ => "other",
    }
}

/// (f) No server at the address: connecting fails with a retryable `Connection` error within
/// the connect timeout (1 s) and some slack — whether the port refuses connections or a
/// listener accepts them and never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_retryable_connection_error() {
    const TEST: &str = "unreachable";
    let connect_timeout = Duration::from_secs(1);
    let bound = Duration::from_secs(3);
    let refused = format!("127.0.0.1:{}", free_port().unwrap());
    // A listener that accepts and then says nothing.
    let silent = lock_testbed::proxy::FaultProxy::start(
        format!("127.0.0.1:{}", free_port().unwrap())
            .parse()
            .unwrap(),
    )
    .unwrap();
    silent.black_hole();
    let mut took = Vec::new();
    for (what, host) in [
        ("refused", refused),
        ("silent", silent.address().to_string()),
    ] {
        let config =
            config(vec![host], ZkStrategy::default()).with_connect_timeout(connect_timeout);
        let began = Instant::now();
        let result = timeout(Duration::from_secs(10), ZkLockProvider::connect(config))
            .await
            .expect("connect returns");
        let elapsed = began.elapsed();
        match result {
            Err(error @ LockError::Connection { .. }) => {
                assert!(
                    error.is_retryable(),
                    "{what}: the connection error is not retryable"
                );
            }
            Err(other) => panic!("{what}: expected a Connection error, got {other}"),
            Ok(provider) => panic!("{what}: connected to nothing: {provider:?}"),
        }
        assert!(elapsed <= bound, "{what}: the error took {elapsed:?}");
        took.push(format!("{what} {elapsed:?}"));
    }
    report(
        TEST,
        format_args!(
            "Connection (retryable) after {}; bound {bound:?}",
            took.join(", ")
        ),
    );
}

/// (g) A server that closes connections during the handshake for a while, as one under load
/// may: connecting tries again until the connect timeout, and gets a session once the
/// server answers. While it never answers, the error is a retryable `Connection` error at
/// the connect timeout, after more than one round. A provider whose session ended reopens
/// one no longer than an acquisition's deadline allows: `try_acquire` makes one round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_retries_closed_handshakes_within_the_connect_timeout() {
    const TEST: &str = "closed_handshakes";
    let connect_timeout = Duration::from_secs(2);
    let server = shared_zk().expect("a ZooKeeper server for the tests");
    let address = server
        .connect_string()
        .parse()
        .expect("a standalone server's address");
    let proxies = Proxies::start(&[address]);
    let proxy = proxies.first();
    let config =
        config(proxies.hosts(), ZkStrategy::default()).with_connect_timeout(connect_timeout);

    // Never answers: a bounded, retryable error after several rounds.
    proxies.cut();
    let began = Instant::now();
    let result = ZkLockProvider::connect(config.clone()).await;
    let failed_after = began.elapsed();
    let failure = match result {
        Err(error @ LockError::Connection { .. }) => {
            assert!(error.is_retryable(), "not retryable: {error}");
            error.to_string()
        }
        Err(other) => panic!("expected a Connection error, got {other}"),
        Ok(provider) => panic!("connected through a cut proxy: {provider:?}"),
    };
    let rounds = proxy.stats().refused;
    assert!(rounds >= 2, "{rounds} round(s) in {failed_after:?}");
    assert!(
        failed_after >= connect_timeout / 2 && failed_after <= connect_timeout + SLACK,
        "the error came after {failed_after:?}, connect timeout {connect_timeout:?}"
    );

    // Answers after a while: a session, within the same call.
    let answer_after = Duration::from_millis(600);
    let began = Instant::now();
    let passing = tokio::spawn({
        let control = proxy.control();
        async move {
            sleep(answer_after).await;
            control.pass();
        }
    });
    let provider = ZkLockProvider::connect(config)
        .await
        .expect("a session once the server answers");
    let connected_after = began.elapsed();
    passing.await.unwrap();
    let refused_then = proxy.stats().refused - rounds;
    assert!(
        refused_then >= 1 && connected_after >= answer_after,
        "connected after {connected_after:?}, {refused_then} closed handshake(s)"
    );
    let name = unique_name("closed-handshakes");
    let mut guard = take_free(&provider, &name).await;

    // The session ends while the server does not answer; an immediate try does not wait
    // out the connect timeout to open the next one.
    let lost = guard.lost();
    proxies.cut();
    timeout(SESSION_TIMEOUT * 2 + SLACK, lost.wait())
        .await
        .expect("the guard lost with its session");
    // The first tries may still meet the old session, ending.
    let until = Instant::now() + SESSION_TIMEOUT + SLACK;
    let (tried, tried_after) = loop {
        let began = Instant::now();
        let tried = provider.lock(&name).unwrap().try_acquire().await;
        let tried_after = began.elapsed();
        match tried {
            Err(LockError::SessionExpired { .. }) if Instant::now() < until => {}
            tried => break (tried, tried_after),
        }
    };
    assert!(
        matches!(&tried, Err(error @ LockError::Connection { message, .. })
            if error.is_retryable() && message.starts_with("cannot reach")),
        "try_acquire with the session over and no server: {tried:?}"
    );
    assert!(
        tried_after < connect_timeout / 2,
        "try_acquire took {tried_after:?} to give up"
    );
    proxies.pass();
    let _ = guard.release().await;
    let admin = admin_client(&server.connect_string()).await;
    let dir = lock_dir(ZkConfig::DEFAULT_ROOT, &name);
    wait_until(
        SESSION_TIMEOUT * 2 + SLACK,
        "the expired session's node to go",
        || children(&admin, &dir),
        |left| left.as_ref().is_ok_and(Vec::is_empty),
    )
    .await
    .expect("the lock directory's children");
    report(
        TEST,
        format_args!(
            "never answering: after {failed_after:?}, {rounds} rounds: {failure}; \
             answering after {answer_after:?}: a session after {connected_after:?}, \
             {refused_then} closed handshake(s); try_acquire with the session over: {tried_after:?}"
        ),
    );
}

/// Releases whose delete reply is lost (the server deleted the node, the client saw its
/// connection drop): the release sends its delete again once the client has connected again,
/// finds its own work done and ends `Ok` at the first call, never `Lost`; the lost signal
/// stays quiet, nothing is left, and another client gets the lock at once. Returns how long
/// the slowest release took.
async fn lost_delete_replies(strategy: ZkStrategy) -> Duration {
    const ROUNDS: usize = 10;
    let (server, admin) = standalone().await;
    let proxies = Proxies::start(&[server.socket_addr()]);
    let proxy = proxies.first();
    let a = connect(proxies.hosts(), strategy).await;
    let b = connect(vec![server.address()], strategy).await;
    let name = unique_name("lost-delete");
    let (dir, _) = Kind::Mutex.dirs(&name);
    let (a_lock, b_lock) = (a.lock(&name).unwrap(), b.lock(&name).unwrap());
    let mut slowest = Duration::ZERO;
    for round in 0..ROUNDS {
        let mut guard = a_lock.try_acquire().await.unwrap().expect("a free lock");
        let swallow = proxy.swallow_next_reply(ReplyKind::ZkDelete);
        let began = Instant::now();
        let released = guard.release().await;
        slowest = slowest.max(began.elapsed());
        let event = timeout(SLACK, swallow.wait())
            .await
            .unwrap_or_else(|_| panic!("round {round}: no delete reply swallowed"));
        assert_eq!(
            event.err,
            Some(0),
            "round {round}: the server's delete failed"
        );
        if let Err(error) = released {
            panic!("round {round}: a release whose reply was lost: {error}");
        }
        assert!(
            !guard.is_lost(),
            "round {round}: the lost signal fired after our own release"
        );
        expect_children(
            &admin,
            &dir,
            0,
            SLACK,
            &format!("round {round}: nodes left"),
        )
        .await;
        let mut next = timeout(SLACK * 2, b_lock.try_acquire())
            .await
            .unwrap_or_else(|_| panic!("round {round}: another client's try hangs"))
            .unwrap()
            .unwrap_or_else(|| panic!("round {round}: the lock is still held"));
        next.release().await.unwrap();
    }
    assert_eq!(
        proxy.stats().swallowed,
        ROUNDS as u64,
        "one reply swallowed per round"
    );
    slowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_delete_reply_is_lost_is_no_loss() {
    for strategy in [ZkStrategy::SequentialPredecessor, ZkStrategy::SingleNode] {
        let slowest = lost_delete_replies(strategy).await;
        report(
            "lost_delete_replies",
            format_args!(
                "{strategy:?}: 10 of 10 released at the first call, the slowest in {slowest:?}"
            ),
        );
    }
}

/// A server that goes silent for longer than the client's read timeout (two fifths of the
/// session) but less than the session, as a loaded server's pause can: the client drops the
/// connection and connects again, the session lives on, and no request of a lock fails for
/// it. An acquire of a new name (its directory made on the way) and a release, each sent
/// into the silence, end `Ok` once it is over; the lost signal stays quiet, nothing is left,
/// and another client gets the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_silent_for_less_than_the_session_fails_no_request() {
    let silence = SESSION_TIMEOUT * 3 / 5;
    let (server, admin) = standalone().await;
    let proxies = Proxies::start(&[server.socket_addr()]);
    let proxy = proxies.first();
    let silent_for = |what: &'static str| async move {
        proxy.black_hole();
        sleep(silence).await;
        proxy.pass();
        what
    };
    let other = connect(vec![server.address()], ZkStrategy::default()).await;
    for strategy in [
        ZkStrategy::SingleNode,
        ZkStrategy::SequentialPredecessor,
        ZkStrategy::WholeQueue,
    ] {
        let provider = connect(proxies.hosts(), strategy).await;
        let name = unique_name("silent");
        let (dir, _) = Kind::Mutex.dirs(&name);
        let lock = provider.lock(&name).unwrap();
        let began = Instant::now();
        let (acquired, _) = tokio::join!(
            timeout(SESSION_TIMEOUT * 3, lock.acquire(Some(SESSION_TIMEOUT * 2))),
            silent_for("the acquire's")
        );
        let acquired_after = began.elapsed();
        let mut guard = acquired
            .unwrap_or_else(|_| panic!("{strategy:?}: an acquire sent into the silence hangs"))
            .unwrap_or_else(|error| {
                panic!("{strategy:?}: an acquire sent into the silence: {error}")
            });
        let began = Instant::now();
        let (released, _) = tokio::join!(
            timeout(SESSION_TIMEOUT * 3, guard.release()),
            silent_for("the release's")
        );
        let released_after = began.elapsed();
        if let Err(error) = released
            .unwrap_or_else(|_| panic!("{strategy:?}: a release sent into the silence hangs"))
        {
            panic!("{strategy:?}: a release sent into the silence: {error}");
        }
        assert!(
            !guard.is_lost(),
            "{strategy:?}: the lost signal fired for a silence shorter than the session"
        );
        expect_children(&admin, &dir, 0, SLACK, &format!("{strategy:?}: nodes left")).await;
        let mut next = timeout(SLACK * 2, other.lock(&name).unwrap().try_acquire())
            .await
            .unwrap_or_else(|_| panic!("{strategy:?}: another client's try hangs"))
            .unwrap()
            .unwrap_or_else(|| panic!("{strategy:?}: the lock is still held"));
        next.release().await.unwrap();
        report(
            "server_silent_for_less_than_the_session",
            format_args!(
                "{strategy:?}: silent for {silence:?}; acquired after {acquired_after:?}, \
                 released after {released_after:?}"
            ),
        );
    }
}

/// Reconnections are counted (`distlock_reconnects_total`): a connection cut for less than
/// the session comes back within it (`connection`), and after a cut past the session
/// timeout the next acquisition opens a new session (`session`). The counters are the
/// process's: other tests running beside this one may add to them, never take away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnections_are_counted() {
    let (server, _admin) = standalone().await;
    let proxies = Proxies::start(&[server.socket_addr()]);
    let provider = connect(proxies.hosts(), ZkStrategy::default()).await;
    let name = unique_name("reconnections");
    let counted = |what: &str| {
        let what = format!("what={what}");
        recorded_total(RECONNECTS, &["backend=zookeeper", &what])
            .expect("the suite's recorder, this binary's only one")
    };
    let (connections, sessions) = (counted("connection"), counted("session"));

    proxies.cut();
    sleep(SESSION_TIMEOUT / 4).await;
    proxies.pass();
    wait_until(
        SESSION_TIMEOUT * 2,
        "the connection counted again",
        || async { counted("connection") },
        |now| *now > connections,
    )
    .await;
    let session = provider.session_id();
    take_free(&provider, &name).await.release().await.unwrap();
    assert_eq!(provider.session_id(), session, "the session went on");

    proxies.cut();
    sleep(SESSION_TIMEOUT * 2).await;
    proxies.pass();
    let guard = timeout(SESSION_TIMEOUT * 3, async {
        loop {
            match provider.lock(&name).unwrap().try_acquire().await {
                Ok(Some(guard)) => return guard,
                _ => sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .expect("a grant on a new session");
    assert_ne!(provider.session_id(), session, "a new session");
    assert!(counted("session") > sessions, "the new session counted");
    drop(guard);
}
