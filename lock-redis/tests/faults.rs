//! Fault tests of the single-server Redis lock provider, each against a server of its own
//! (TTL 2 s, clients logged in as the ACL user limited to `{lock*` keys): a holder cut off
//! past its lease, cancels racing grants, a server restart under a held lock, the ACL user's
//! limits, and who wakes up on a release (herd evidence). Every test checks invariants — an
//! occupancy counter, the keys left on the server, who owns them, when grants happen — not
//! just return values, and prints what it measured
//! (`cargo test -p lock-redis --test faults -- --nocapture`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test code: a failed set-up or check must fail the test; the figures are printed"
)]

mod common;

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    TTL, admin, config, expect_renewals, keys_of, start_server, tag, valid_until, wait_until,
};
use lock_conformance::{Occupancy, unique_name};
use lock_core::{Guard, LockError, LockProvider, LossReason, MetricsSnapshot};
use lock_redis::{RedisLockProvider, RedisStrategy};
use lock_testbed::proxy::FaultProxy;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

/// Slack for one operation or one reaction on a loaded two-core machine.
const SLACK: Duration = Duration::from_secs(1);
/// How often the watchdog renews (ttl/3), and a queue or pub/sub waiter refreshes.
const PERIOD: Duration = Duration::from_millis(TTL.as_millis() as u64 / 3);

fn report(test: &str, line: impl Display) {
    eprintln!("faults::{test}: {line}");
}

async fn connect(port: u16, strategy: RedisStrategy) -> RedisLockProvider {
    RedisLockProvider::connect(config(port, strategy))
        .await
        .expect("a provider")
}

fn owner_key(name: &str) -> String {
    format!("{}:owner", tag(name))
}

fn fence_key(name: &str) -> String {
    format!("{}:fence", tag(name))
}

fn queue_key(name: &str) -> String {
    format!("{}:queue", tag(name))
}

fn channel(name: &str) -> String {
    format!("{}:released", tag(name))
}

/// Subscribers of the lock's release channel.
async fn subscribers(admin: &mut ConnectionManager, name: &str) -> usize {
    let (_, count): (String, usize) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel(name))
        .query_async(admin)
        .await
        .unwrap();
    count
}

/// How many waiters the lock's server-side state shows: the queue's length (queue
/// strategy) or the release channel's subscribers (pub/sub).
async fn waiting(admin: &mut ConnectionManager, name: &str, strategy: RedisStrategy) -> usize {
    match strategy {
        RedisStrategy::PubSub => subscribers(admin, name).await,
        _ => admin.llen(queue_key(name)).await.unwrap(),
    }
}

/// Connections blocked in a command on the server (a queue waiter's `BLPOP`), from
/// `INFO clients`.
async fn blocked_clients(admin: &mut ConnectionManager) -> usize {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(admin)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("blocked_clients:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("blocked_clients in INFO clients")
}

/// Waits until `waiting` shows `count` waiters; panics after `bound`.
async fn expect_waiting(
    admin: &mut ConnectionManager,
    name: &str,
    strategy: RedisStrategy,
    count: usize,
    bound: Duration,
    what: &str,
) -> Duration {
    let began = Instant::now();
    loop {
        let now = waiting(admin, name, strategy).await;
        if now == count {
            return began.elapsed();
        }
        assert!(
            began.elapsed() < bound,
            "{what}: {now} waiters after {bound:?}, expected {count}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the lock's keys are exactly `expected` (sorted); returns how long it took.
/// Panics after `bound`.
async fn expect_keys(
    admin: &mut ConnectionManager,
    name: &str,
    expected: &[String],
    bound: Duration,
    what: &str,
) -> Duration {
    let began = Instant::now();
    loop {
        let keys = keys_of(admin, name).await;
        if keys == expected {
            return began.elapsed();
        }
        assert!(
            began.elapsed() < bound,
            "{what}: keys after {bound:?}: {keys:?}, expected {expected:?}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until only the fencing counter is left.
async fn expect_only_fence(
    admin: &mut ConnectionManager,
    name: &str,
    bound: Duration,
    what: &str,
) -> Duration {
    expect_keys(admin, name, &[fence_key(name)], bound, what).await
}

/// Releases `guard`, retrying retryable errors for at most `bound`; returns the final
/// result and the retryable errors met on the way.
async fn release_until_final(
    guard: &mut Guard,
    bound: Duration,
) -> (Result<(), LockError>, Vec<String>) {
    let deadline = Instant::now() + bound;
    let mut retried = Vec::new();
    loop {
        match guard.release().await {
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                retried.push(error.to_string());
                sleep(Duration::from_millis(100)).await;
            }
            other => return (other, retried),
        }
    }
}

/// When the guard's lost signal fires, and why.
fn watch_loss(guard: &Guard) -> JoinHandle<(Option<LossReason>, Instant)> {
    let lost = guard.lost();
    tokio::spawn(async move {
        let reason = lost.wait().await;
        (reason, Instant::now())
    })
}

/// (1) A holder behind a proxy is cut off past its lease: its guard's lost signal fires once
/// its validity (ttl less drift, from its last renewal) has passed, and no later than about
/// a ttl after the cut; a client asking during the cut gets the lock only after the holder's
/// validity ended, and within a bound; once the network is back the stale guard's release
/// returns `Lost` and leaves the new holder alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_cut_past_the_ttl_loses_the_lock() {
    const TEST: &str = "holder_cut_past_the_ttl";
    let began = Instant::now();
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let proxy = FaultProxy::start(server.socket_addr()).expect("a fault proxy");
    let strategy = RedisStrategy::Queue;
    let a = connect(proxy.address().port(), strategy).await;
    let b = connect(server.port(), strategy).await;
    let c = connect(server.port(), strategy).await;
    let name = unique_name("cut");

    let mut stale = a
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the lock is free");
    // The watchdog renews at ttl/3: two renewals within two ttls.
    expect_renewals(&stale, 2, TTL * 2).await;
    // Cut at a random point of the renewal cycle (placement, not a proof of anything).
    let offset = Duration::from_millis(fastrand::u64(0..PERIOD.as_millis() as u64));
    sleep(offset).await;
    let lost_at = watch_loss(&stale);

    let cut = Instant::now();
    proxy.cut();
    let valid_at_cut = valid_until(&stale);
    let b_lock = b.lock(&name).unwrap();
    let contender = tokio::spawn({
        let lost = stale.lost();
        async move {
            let result = b_lock.acquire(Some(Duration::from_secs(10))).await;
            (result, Instant::now(), lost.is_lost())
        }
    });

    let (reason, lost_at) = timeout(TTL * 3, lost_at)
        .await
        .expect("the holder's lost signal fires")
        .unwrap();
    let lost_after = lost_at - cut;
    // The validity the guard ended with (a renewal in flight at the cut may have moved it).
    let valid_end = valid_until(&stale);
    assert_eq!(
        reason,
        Some(LossReason::LeaseExpired),
        "a cut holder's loss is its lease running out"
    );
    assert!(
        valid_end >= valid_at_cut,
        "the validity moved back after the cut"
    );
    assert!(
        lost_at >= valid_end,
        "the lost signal fired {:?} before the guard's own validity ended",
        valid_end - lost_at
    );
    // The last renewal was sent at most a period before the cut: the validity left at the
    // cut is at least ttl − drift − period (≈ 1.3 s), less scheduling delays.
    assert!(
        lost_after >= TTL / 2,
        "lost only {lost_after:?} after the cut: earlier than the validity allows"
    );
    assert!(
        lost_after <= TTL * 2,
        "lost {lost_after:?} after the cut, past twice the ttl"
    );

    let (granted, granted_at, holder_lost) = timeout(Duration::from_secs(15), contender)
        .await
        .expect("B's acquire returns")
        .unwrap();
    let mut fresh = granted.expect("B gets the lock once A's lease ran out");
    let granted_after = granted_at - cut;
    assert!(
        granted_at > valid_end,
        "B was granted {:?} before A's guard stopped vouching for the lock",
        valid_end - granted_at
    );
    // The key expires at most a ttl after the cut; a queued waiter looks at least once a
    // refresh period.
    assert!(
        granted_after <= TTL + PERIOD + SLACK,
        "B granted only {granted_after:?} after the cut"
    );
    assert!(
        fresh.fencing_token() > stale.fencing_token(),
        "B's token {:?} is not above A's {:?}",
        fresh.fencing_token(),
        stale.fencing_token()
    );

    proxy.pass();
    let (release, retried) = release_until_final(&mut stale, SLACK * 5).await;
    assert!(
        matches!(release, Err(LockError::Lost { .. })),
        "the stale release returned {release:?}"
    );
    // B still holds: its guard is not lost, the owner key is there with B's grant as the
    // counter's last value, and a third client is refused.
    assert!(!fresh.is_lost(), "the stale release hurt the new holder");
    let owner_exists: bool = admin.exists(owner_key(&name)).await.unwrap();
    assert!(owner_exists, "the owner key is gone while B holds");
    let counter: u64 = admin.get(fence_key(&name)).await.unwrap();
    assert_eq!(
        counter,
        fresh.fencing_token().0,
        "a grant after B's (the counter moved past B's token)"
    );
    assert!(
        c.lock(&name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a third client got the lock B holds"
    );
    fresh.release().await.expect("B's release");
    expect_only_fence(&mut admin, &name, SLACK, "after B's release").await;

    // A's provider works again after the partition.
    let deadline = Instant::now() + SLACK * 5;
    let mut again = loop {
        match a.lock(&name).unwrap().try_acquire().await {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("the lock is held after B's release"),
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("A's acquire after the partition: {error}"),
        }
    };
    again.release().await.unwrap();
    expect_only_fence(&mut admin, &name, SLACK, "keys left").await;
    report(
        TEST,
        format_args!(
            "cut {offset:?} after a renewal, validity left {:?}; lost ({reason:?}) {lost_after:?} after the cut, \
             {:?} after the validity ended; B granted {granted_after:?} after the cut, {:?} \
             after A's validity (A lost by then: {holder_lost}); stale release Lost after \
             retryable errors {retried:?}; keys left: fence only; took {:?}",
            valid_at_cut.saturating_duration_since(cut),
            lost_at - valid_end,
            granted_at - valid_end,
            began.elapsed()
        ),
    );
}

/// What happened to the waiters of [`cancel_races`].
#[derive(Debug, Default)]
struct Cancels {
    /// Ran to a grant and released.
    served: usize,
    /// Aborted before they were granted (as far as the task knew).
    aborted_waiting: usize,
    /// Aborted while holding: the dropped guard releases in the background.
    aborted_holding: usize,
}

/// (2) A holder and ten waiters, each in a provider of its own; thirty rounds of: release
/// the holder while aborting about half the waiters at random moments (0–30 ms after the
/// release starts), so that cancels race the handoffs and broadcasts. The waiters not
/// aborted are all served, back to back; after each round a client gets the lock within a
/// bound (no grant stranded on an aborted waiter), the lock's keys are back to the owner
/// and the counter, exclusion holds throughout and tokens rise with the grants.
async fn cancel_races(strategy: RedisStrategy) {
    const WAITERS: usize = 10;
    const ROUNDS: usize = 30;
    /// No gap in the lock's use longer than this: a grant stranded on an aborted waiter
    /// keeps everyone out until its key expires, a whole ttl.
    const STRAND: Duration = Duration::from_millis(600);
    let test = format!("cancel_racing_grants_{strategy:?}").to_lowercase();
    let began = Instant::now();
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let name = unique_name("cancel-race");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let mut rng = fastrand::Rng::with_seed(seed);
    let occupancy = Occupancy::new();
    let grants: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let prober = connect(server.port(), strategy).await;
    let prober_lock = prober.lock(&name).unwrap();
    let mut providers = Vec::new();
    for _ in 0..WAITERS {
        providers.push(connect(server.port(), strategy).await);
    }
    let mut holder = prober_lock
        .try_acquire()
        .await
        .unwrap()
        .expect("the lock is free");
    let mut cancels = Cancels::default();
    let mut seen_grants = 1;
    let mut max_gap = Duration::ZERO;
    let mut max_probe = Duration::ZERO;
    let mut max_serve = Duration::ZERO;
    let mut max_clean = Duration::ZERO;
    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        for provider in &providers {
            let lock = provider.lock(&name).unwrap();
            let occupancy = occupancy.clone();
            let grants = Arc::clone(&grants);
            let granted = Arc::new(AtomicBool::new(false));
            let hold = Duration::from_millis(rng.u64(0..=3));
            let task = tokio::spawn({
                let granted = Arc::clone(&granted);
                async move {
                    let mut guard = lock.acquire(Some(Duration::from_secs(20))).await?;
                    let at = Instant::now();
                    granted.store(true, Ordering::SeqCst);
                    grants.lock().unwrap().push((at, guard.fencing_token().0));
                    {
                        let _inside = occupancy.enter();
                        assert!(!guard.is_lost(), "a fresh grant is lost");
                        sleep(hold).await;
                        assert!(!guard.is_lost(), "a holder lost its lock");
                    }
                    guard.release().await?;
                    Ok::<_, LockError>(())
                }
            });
            tasks.push((task, granted));
        }
        expect_waiting(
            &mut admin,
            &name,
            strategy,
            WAITERS,
            SLACK * 5,
            &format!("round {round}: waiters"),
        )
        .await;
        assert!(
            tasks.iter().all(|(task, _)| !task.is_finished()),
            "round {round}: a waiter finished while the lock was held"
        );

        // Release while aborting some of the waiters at jittered moments.
        let mut aborts: Vec<(usize, Duration)> = Vec::new();
        for index in 0..WAITERS {
            if rng.bool() {
                aborts.push((index, Duration::from_millis(rng.u64(0..=30))));
            }
        }
        let handles: Vec<_> = tasks.iter().map(|(task, _)| task.abort_handle()).collect();
        let released = Instant::now();
        let releasing = holder.release();
        let aborting = async {
            let mut schedule = aborts.clone();
            schedule.sort_by_key(|&(_, delay)| delay);
            for (index, delay) in schedule {
                tokio::time::sleep_until(released + delay).await;
                handles[index].abort();
            }
        };
        let (release, ()) = tokio::join!(releasing, aborting);
        release.unwrap_or_else(|error| panic!("round {round}: the holder's release: {error}"));

        for (index, (task, granted)) in tasks.into_iter().enumerate() {
            let aborted = aborts.iter().any(|&(aborted, _)| aborted == index);
            match timeout(Duration::from_secs(30), task)
                .await
                .unwrap_or_else(|_| panic!("round {round}: waiter {index} hangs"))
            {
                Ok(Ok(())) => cancels.served += 1,
                Ok(Err(error)) => panic!("round {round}: waiter {index}: {error}"),
                Err(error) if error.is_cancelled() && aborted => {
                    if granted.load(Ordering::SeqCst) {
                        cancels.aborted_holding += 1;
                    } else {
                        cancels.aborted_waiting += 1;
                    }
                }
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(error) => panic!("round {round}: waiter {index}: {error}"),
            }
        }
        let served = released.elapsed();
        max_serve = max_serve.max(served);

        // Never stuck: a client gets the lock at once.
        let asked = Instant::now();
        holder = timeout(STRAND * 3, prober_lock.acquire(Some(STRAND * 2)))
            .await
            .unwrap_or_else(|_| panic!("round {round}: the prober's acquire hangs"))
            .unwrap_or_else(|error| panic!("round {round}: the prober's acquire: {error}"));
        let probe = asked.elapsed();
        max_probe = max_probe.max(probe);
        grants
            .lock()
            .unwrap()
            .push((Instant::now(), holder.fencing_token().0));
        assert!(
            probe <= STRAND,
            "round {round}: the lock was free only {probe:?} after the waiters settled"
        );
        // No gap in the lock's use: each grant of the round came soon after the one before.
        let round_grants: Vec<(Instant, u64)> = {
            let mut all = grants.lock().unwrap();
            let mut round_grants = std::mem::take(&mut *all);
            round_grants.sort_by_key(|&(at, _)| at);
            round_grants
        };
        seen_grants += round_grants.len();
        let mut previous = released;
        for &(at, _) in &round_grants {
            let gap = at - previous;
            max_gap = max_gap.max(gap);
            assert!(
                gap <= STRAND,
                "round {round}: no grant for {gap:?} while waiters were queued; grants {:?}",
                round_grants
                    .iter()
                    .map(|&(at, token)| (at - released, token))
                    .collect::<Vec<_>>()
            );
            previous = at;
        }
        assert!(
            round_grants.windows(2).all(|pair| pair[0].1 < pair[1].1),
            "round {round}: tokens do not rise with the grants: {round_grants:?}"
        );
        // The aborted waiters' clean-ups are done: only the prober's owner key and the
        // counter are left, and nobody listens on the channel.
        let clean = expect_keys(
            &mut admin,
            &name,
            &[fence_key(&name), owner_key(&name)],
            SLACK * 2,
            &format!("round {round}: keys while the prober holds"),
        )
        .await;
        expect_waiting(
            &mut admin,
            &name,
            RedisStrategy::PubSub,
            0,
            SLACK * 2,
            &format!("round {round}: subscribers left"),
        )
        .await;
        max_clean = max_clean.max(clean);
        assert_eq!(
            occupancy.current(),
            0,
            "round {round}: someone still inside"
        );
    }
    let issued: usize = admin.get(fence_key(&name)).await.unwrap();
    // Grants the server made that no caller saw: made to a waiter whose abort raced them,
    // and passed on by its clean-up.
    let passed_on = issued - seen_grants;
    holder.release().await.unwrap();
    expect_only_fence(&mut admin, &name, SLACK, "keys left").await;
    assert!(
        occupancy.peak() <= 1,
        "{} holders at once",
        occupancy.peak()
    );
    assert_eq!(
        cancels.served + cancels.aborted_waiting + cancels.aborted_holding,
        WAITERS * ROUNDS
    );
    assert!(cancels.served > 0, "no waiter was served");
    assert!(
        cancels.aborted_waiting > 0,
        "no abort landed on a waiting acquire"
    );
    report(
        &test,
        format_args!(
            "seed {seed}: {cancels:?} over {ROUNDS} rounds of {WAITERS}; {issued} tokens \
             issued, {passed_on} of them to aborted waiters and passed on; occupancy peak {}; \
             longest gap between grants {max_gap:?}; round served in at most {max_serve:?}; \
             prober granted within {max_probe:?}; clean-ups done within {max_clean:?} \
             after; keys left: fence only; took {:?}",
            occupancy.peak(),
            began.elapsed()
        ),
    );
    drop(providers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_grants_never_strand_the_lock_queue() {
    cancel_races(RedisStrategy::Queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_grants_never_strand_the_lock_pubsub() {
    cancel_races(RedisStrategy::PubSub).await;
}

/// (3) The server restarts (without persistence: every key is gone) while a lock is held:
/// the holder's next renewal finds no key, or its lease runs out, and its lost signal fires
/// within about a ttl of the restart; a new client gets the lock; the old guard's release
/// returns `Lost` and leaves the new holder alone.
/// A holder and a waiter that both die with their connections cut (crashed processes, or a
/// network gone from under them) leave nothing but the fencing counter once the lease and
/// the waiter's liveness have run out: the queue expires with its last live waiter instead
/// of waiting for the next user of the lock to clean it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_all_die_leave_no_queue_behind() {
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let proxy = FaultProxy::start(server.socket_addr()).expect("a fault proxy");
    let a = connect(proxy.address().port(), RedisStrategy::Queue).await;
    let b = connect(proxy.address().port(), RedisStrategy::Queue).await;
    let name = unique_name("dead-queue");
    let held = a
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the lock is free");
    let b_lock = b.lock(&name).unwrap();
    let waiting = tokio::spawn(async move { b_lock.acquire(Some(Duration::from_secs(60))).await });
    expect_waiting(
        &mut admin,
        &name,
        RedisStrategy::Queue,
        1,
        SLACK,
        "B queues",
    )
    .await;
    proxy.cut();
    waiting.abort();
    let _ = waiting.await;
    drop((held, a, b));
    let took = expect_only_fence(
        &mut admin,
        &name,
        TTL * 10 + SLACK * 5,
        "after the holder and the waiter died",
    )
    .await;
    report(
        "dead_queue",
        format_args!("only the fencing counter left {took:?} after both died (ttl {TTL:?})"),
    );
}

/// An observer whose connection is cut for less than a lease, while the leadership
/// changes, rides it out: its watch does not end with the cut's errors, and it follows to
/// the new leader once Redis answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_rides_out_a_short_cut() {
    let server = start_server().await;
    let proxy = FaultProxy::start(server.socket_addr()).expect("a fault proxy");
    let observer = connect(proxy.address().port(), RedisStrategy::Queue).await;
    let candidates = connect(server.port(), RedisStrategy::Queue).await;
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

    proxy.cut();
    let cut = Instant::now();
    first.resign().await.unwrap();
    let mut next = election
        .campaign(b"next", Some(Duration::ZERO))
        .await
        .unwrap();
    // Several of the observer's polls (every 100 ms) fall in the cut.
    sleep(TTL * 2 / 5).await;
    proxy.pass();
    let followed = timeout(
        TTL + SLACK,
        watch.wait_for(|leader| leader.is_some_and(|leader| leader.value == b"next")),
    )
    .await
    .expect("the observer follows to the new leader after the cut")
    .unwrap_or_else(|error| panic!("the observation ended with the cut: {error}"));
    assert_eq!(followed.map(|leader| leader.term), Some(next.term()));
    report(
        "observer_short_cut",
        format_args!(
            "the observer followed to the new leader {:?} after a cut of {:?}",
            cut.elapsed(),
            TTL * 2 / 5
        ),
    );
    next.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_while_held_fires_lost() {
    const TEST: &str = "restart_while_held";
    let began = Instant::now();
    let mut server = start_server().await;
    let strategy = RedisStrategy::Queue;
    let a = connect(server.port(), strategy).await;
    let name = unique_name("restart");
    let mut stale = a
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the lock is free");
    expect_renewals(&stale, 1, TTL * 2).await;
    let lost_at = watch_loss(&stale);

    let killed = Instant::now();
    server.restart().await.expect("the server restarts");
    let restart_took = killed.elapsed();
    let (reason, lost_at) = timeout(TTL * 3, lost_at)
        .await
        .expect("the holder's lost signal fires")
        .unwrap();
    let lost_after = lost_at - killed;
    assert!(
        matches!(
            reason,
            Some(LossReason::EntryRemoved | LossReason::LeaseExpired)
        ),
        "lost for {reason:?}"
    );
    // Whatever the restart took, the guard vouches for no more than its validity: a ttl
    // from its last renewal, which came before the restart.
    assert!(
        lost_after <= TTL + SLACK / 2,
        "lost {lost_after:?} after the restart began"
    );

    let mut admin = admin(&server).await;
    assert!(
        keys_of(&mut admin, &name).await.is_empty(),
        "keys survived the restart"
    );
    let b = connect(server.port(), strategy).await;
    let asked = Instant::now();
    let mut fresh = timeout(SLACK * 3, b.lock(&name).unwrap().acquire(Some(SLACK * 2)))
        .await
        .expect("the new client's acquire returns")
        .expect("the new client gets the lock");
    let granted_after = asked.elapsed();
    assert!(
        granted_after <= SLACK,
        "the new client waited {granted_after:?} for a lock nobody holds"
    );

    let (release, retried) = release_until_final(&mut stale, SLACK * 5).await;
    assert!(
        matches!(release, Err(LockError::Lost { .. })),
        "the stale release returned {release:?}"
    );
    assert!(!fresh.is_lost(), "the stale release hurt the new holder");
    let owner_exists: bool = admin.exists(owner_key(&name)).await.unwrap();
    assert!(
        owner_exists,
        "the owner key is gone while the new client holds"
    );
    fresh.release().await.expect("the new holder's release");
    expect_only_fence(&mut admin, &name, SLACK, "keys left").await;
    report(
        TEST,
        format_args!(
            "restart took {restart_took:?}; lost ({reason:?}) {lost_after:?} after it began; \
             new client granted in {granted_after:?} with token {} (A had {}: the counter \
             went with the data); stale release Lost after retryable errors {retried:?}; \
             keys left: fence only; took {:?}",
            fresh.fencing_token().0,
            stale.fencing_token().0,
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

/// (4) The ACL user may use the `{lock*` keys only: with the default prefix it locks and
/// releases under every strategy; with the prefix `other` every acquire fails promptly with
/// `PermissionDenied` (not a hang, not a panic, not retryable); a wrong password fails the
/// connect with `Auth`. Nothing is left on the server but the lock's counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_limited_to_lock_keys() {
    const TEST: &str = "acl_user_limited";
    let began = Instant::now();
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let name = unique_name("acl");
    let mut refusals = Vec::new();
    let mut slowest = Duration::ZERO;
    for strategy in [
        RedisStrategy::Polling,
        RedisStrategy::PubSub,
        RedisStrategy::Queue,
    ] {
        let allowed = connect(server.port(), strategy).await;
        let mut guard = allowed
            .lock(&name)
            .unwrap()
            .acquire(Some(SLACK))
            .await
            .unwrap_or_else(|error| panic!("{strategy:?}: the ACL user's acquire: {error}"));
        assert!(!guard.is_lost());
        guard.release().await.unwrap();

        let other =
            RedisLockProvider::connect(config(server.port(), strategy).with_key_prefix("other"))
                .await
                .expect("the ACL user connects whatever the prefix");
        let lock = other.lock(&name).unwrap();
        for call in ["acquire(None)", "acquire(1s)", "try_acquire"] {
            let asked = Instant::now();
            let result = timeout(SLACK * 5, async {
                match call {
                    "acquire(None)" => lock.acquire(None).await.map(Some),
                    "acquire(1s)" => lock.acquire(Some(SLACK)).await.map(Some),
                    _ => lock.try_acquire().await,
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{strategy:?}: {call} under `other` hangs"));
            let took = asked.elapsed();
            slowest = slowest.max(took);
            let error = match result {
                Err(error) => error,
                Ok(guard) => panic!("{strategy:?}: {call} under `other` returned {guard:?}"),
            };
            assert!(
                matches!(error, LockError::PermissionDenied { .. }),
                "{strategy:?}: {call} under `other`: expected PermissionDenied, got {error}"
            );
            assert!(!error.is_retryable(), "a refusal is not retryable");
            assert!(
                took <= SLACK,
                "{strategy:?}: {call} took {took:?} to be refused"
            );
            refusals.push(format!("{strategy:?}/{call}: {}", error_kind(&error)));
        }
    }

    let mut wrong = config(server.port(), RedisStrategy::Queue);
    wrong.server.password = Some("wrong".into());
    let asked = Instant::now();
    let connected = timeout(SLACK * 5, RedisLockProvider::connect(wrong))
        .await
        .expect("connect with a wrong password returns");
    let auth_took = asked.elapsed();
    match connected {
        Err(error @ LockError::Auth { .. }) => {
            assert!(!error.is_retryable(), "an auth error is not retryable");
        }
        Err(other) => panic!("a wrong password: expected Auth, got {other}"),
        Ok(provider) => panic!("a wrong password connected: {provider:?}"),
    }

    expect_only_fence(&mut admin, &name, SLACK, "keys of the lock").await;
    let elsewhere: Vec<String> = admin.keys("{other*").await.unwrap();
    assert!(elsewhere.is_empty(), "keys under `other`: {elsewhere:?}");
    let mut all: Vec<String> = admin.keys("*").await.unwrap();
    // The receipt of the last release expires a lease's length after it.
    all.retain(|key| !key.ends_with(":released"));
    assert_eq!(all, [fence_key(&name)], "keys on the server");
    report(
        TEST,
        format_args!(
            "the ACL user locked and released under `lock` with every strategy; {} refusals \
             under `other` ({}), the slowest in {slowest:?}; wrong password: Auth in \
             {auth_took:?}; keys on the server: the counter only; took {:?}",
            refusals.len(),
            refusals.join(", "),
            began.elapsed()
        ),
    );
}

/// Where the waiters of [`herd`] are once a release has been dealt with.
#[derive(Debug)]
struct AfterRelease {
    /// Waiters whose wake-up has not yet ended in a grant or in vain.
    under_way: usize,
    /// Waiters that neither got the lock nor tried again in vain.
    unheard: usize,
    /// Waiters the server shows (queue length, or subscribers).
    waiting: usize,
    /// Connections blocked on the server (queue waiters in `BLPOP`).
    blocked: usize,
}

/// What one strategy's waiters did on one release.
#[derive(Debug)]
struct Herd {
    /// The waiters' metrics from just before the release to after the grant settled.
    delta: MetricsSnapshot,
    /// From the release to the (single) grant.
    handoff: Duration,
}

/// One holder and twenty waiters, each in a provider of its own: the waiters' wake-ups on
/// one release; then the rest are served one by one and nothing is left.
async fn herd(strategy: RedisStrategy) -> Herd {
    const WAITERS: usize = 20;
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let name = unique_name("herd");
    let holder = connect(server.port(), strategy).await;
    let mut held = holder
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("the lock is free");
    let occupancy = Occupancy::new();
    let granted = Arc::new(AtomicUsize::new(0));
    let (serve_rest, serving) = watch::channel(false);
    let mut providers = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let provider = connect(server.port(), strategy).await;
        let lock = provider.lock(&name).unwrap();
        providers.push(provider);
        let (occupancy, granted, mut serving) =
            (occupancy.clone(), Arc::clone(&granted), serving.clone());
        tasks.push(tokio::spawn(async move {
            let mut guard = lock.acquire(Some(Duration::from_secs(60))).await?;
            granted.fetch_add(1, Ordering::SeqCst);
            {
                let _inside = occupancy.enter();
                // The first one holds until the figures are taken.
                let _ = serving.wait_for(|serve| *serve).await;
                assert!(!guard.is_lost(), "a holder lost its lock");
            }
            guard.release().await
        }));
    }
    expect_waiting(
        &mut admin,
        &name,
        strategy,
        WAITERS,
        Duration::from_secs(10),
        &format!("{strategy:?}: waiters"),
    )
    .await;
    // Every waiter settles into its wait. Queue: blocked on its own list. Pub/sub: past the
    // try after subscribing, which is the first request it makes once its subscription is
    // in (and a later one, its refresh, comes after it).
    let subscribed: Vec<MetricsSnapshot> = providers.iter().map(LockProvider::metrics).collect();
    let (providers_ref, subscribed) = (&providers, &subscribed);
    wait_until(
        SLACK * 5,
        &format!("{strategy:?}: the waiters settle in their wait"),
        || {
            let mut admin = admin.clone();
            async move {
                match strategy {
                    RedisStrategy::PubSub => providers_ref
                        .iter()
                        .zip(subscribed)
                        .filter(|(provider, at)| provider.metrics().since(at).server_requests > 0)
                        .count(),
                    _ => blocked_clients(&mut admin).await,
                }
            }
        },
        |settled| *settled == WAITERS,
    )
    .await;
    assert_eq!(
        granted.load(Ordering::SeqCst),
        0,
        "a waiter got a held lock"
    );
    let before: Vec<MetricsSnapshot> = providers.iter().map(LockProvider::metrics).collect();

    let released = Instant::now();
    held.release().await.unwrap();
    let handoff = loop {
        if granted.load(Ordering::SeqCst) > 0 {
            break released.elapsed();
        }
        assert!(
            released.elapsed() < SLACK * 5,
            "{strategy:?}: no waiter granted after the release"
        );
        sleep(Duration::from_millis(1)).await;
    };
    // Let the wake-ups in vain run their course: none is under way any more, and every
    // waiter but the one granted is back in its wait (queue: still queued and blocked on
    // its list; pub/sub: subscribed, having heard the release and tried in vain).
    let (before_ref, name_ref) = (&before, name.as_str());
    wait_until(
        SLACK * 5,
        &format!("{strategy:?}: the wake-ups on the release run their course"),
        || {
            let mut admin = admin.clone();
            async move {
                let deltas: Vec<MetricsSnapshot> = providers_ref
                    .iter()
                    .zip(before_ref)
                    .map(|(provider, before)| provider.metrics().since(before))
                    .collect();
                AfterRelease {
                    under_way: deltas
                        .iter()
                        .filter(|d| d.wakeups > d.futile_wakeups + d.grants)
                        .count(),
                    unheard: deltas
                        .iter()
                        .filter(|d| d.grants == 0 && d.futile_wakeups == 0)
                        .count(),
                    waiting: waiting(&mut admin, name_ref, strategy).await,
                    blocked: blocked_clients(&mut admin).await,
                }
            }
        },
        |after| {
            after.under_way == 0
                && after.waiting == WAITERS - 1
                && match strategy {
                    RedisStrategy::PubSub => after.unheard == 0,
                    _ => after.blocked == WAITERS - 1,
                }
        },
    )
    .await;
    assert_eq!(
        granted.load(Ordering::SeqCst),
        1,
        "{strategy:?}: one release, more than one grant"
    );
    let delta = providers
        .iter()
        .zip(&before)
        .map(|(provider, before)| provider.metrics().since(before))
        .fold(MetricsSnapshot::default(), |sum, one| sum.plus(&one));
    assert_eq!(delta.grants, 1, "{strategy:?}: grants counted: {delta:?}");

    // Serve the rest.
    serve_rest.send_replace(true);
    for task in tasks {
        timeout(Duration::from_secs(30), task)
            .await
            .expect("a waiter served within 30 s")
            .unwrap()
            .expect("a waiter's acquire and release");
    }
    assert_eq!(granted.load(Ordering::SeqCst), WAITERS);
    assert_eq!(occupancy.peak(), 1, "{strategy:?}: two holders at once");
    expect_only_fence(&mut admin, &name, SLACK, "keys left").await;
    expect_waiting(
        &mut admin,
        &name,
        RedisStrategy::PubSub,
        0,
        SLACK,
        "subscribers left",
    )
    .await;
    drop(providers);
    Herd { delta, handoff }
}

/// (5) Herd evidence: on one release, the queue strategy wakes exactly the waiter it hands
/// the lock to; pub/sub wakes (nearly) all twenty, and all but one of them in vain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herd_evidence_queue_vs_pubsub() {
    const TEST: &str = "herd_evidence";
    let began = Instant::now();
    let queue = herd(RedisStrategy::Queue).await;
    report(
        TEST,
        format_args!(
            "queue: 20 waiters, one release: {} wake-up(s), {} in vain, {} requests; grant \
             {:?} after the release",
            queue.delta.wakeups,
            queue.delta.futile_wakeups,
            queue.delta.server_requests,
            queue.handoff
        ),
    );
    let pubsub = herd(RedisStrategy::PubSub).await;
    report(
        TEST,
        format_args!(
            "pubsub: 20 waiters, one release: {} wake-ups, {} in vain, {} requests; grant \
             {:?} after the release; took {:?}",
            pubsub.delta.wakeups,
            pubsub.delta.futile_wakeups,
            pubsub.delta.server_requests,
            pubsub.handoff,
            began.elapsed()
        ),
    );
    assert_eq!(
        queue.delta.wakeups, 1,
        "queue: wake-ups on one release: {:?}",
        queue.delta
    );
    assert_eq!(
        queue.delta.futile_wakeups, 0,
        "queue: wake-ups in vain: {:?}",
        queue.delta
    );
    assert!(
        pubsub.delta.wakeups >= 18,
        "pubsub: only {} wake-ups on one release: {:?}",
        pubsub.delta.wakeups,
        pubsub.delta
    );
    assert!(
        pubsub.delta.futile_wakeups >= 17,
        "pubsub: only {} wake-ups in vain: {:?}",
        pubsub.delta.futile_wakeups,
        pubsub.delta
    );
}

/// A release whose reply is lost (the server deleted the key, the client saw its connection
/// drop) and that is sent again learns from the release receipt that it succeeded: `Ok`,
/// never `Lost`, and the lost signal stays quiet through the watchdog's next renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_is_lost_is_no_loss() {
    use lock_testbed::proxy::ReplyKind;

    let server = start_server().await;
    let mut admin = admin(&server).await;
    let proxy = FaultProxy::start(server.socket_addr()).unwrap();
    let provider = connect(proxy.address().port(), RedisStrategy::Queue).await;
    let name = unique_name("lost-release");
    let lock = provider.lock(&name).unwrap();
    for round in 0..5 {
        let mut guard = lock.try_acquire().await.unwrap().expect("a free lock");
        let swallowed = proxy.swallow_next_reply(ReplyKind::AnyNextReply);
        let first = guard.release().await;
        timeout(SLACK, swallowed.wait())
            .await
            .unwrap_or_else(|_| panic!("round {round}: no reply swallowed"));
        let retried = match first {
            Ok(()) => 0,
            Err(error) => {
                assert!(error.is_retryable(), "round {round}: {error}");
                let (result, retried) = release_until_final(&mut guard, SLACK * 3).await;
                result.unwrap_or_else(|error| panic!("round {round}: the retry said {error}"));
                retried.len() + 1
            }
        };
        // Two renewal periods: a watchdog still running would have found the key gone.
        sleep(PERIOD * 2).await;
        assert!(
            !guard.is_lost(),
            "round {round}: the lost signal fired after our own release"
        );
        expect_only_fence(&mut admin, &name, SLACK, "after the release").await;
        report(
            "a_release_whose_reply_is_lost_is_no_loss",
            format_args!("round {round}: released after {retried} failed attempt(s)"),
        );
    }
}

/// The ACL rule the crate docs give for a user limited to the locks is enough for every
/// strategy: grant, wait, hand-off, broadcast, renew, release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rule_is_enough() {
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let mut command = redis::cmd("ACL");
    command.arg("SETUSER").arg("documented");
    for rule in common::DOCUMENTED_ACL_RULE.split_whitespace() {
        command.arg(rule);
    }
    let () = command.query_async(&mut admin).await.unwrap();
    for strategy in [
        RedisStrategy::Polling,
        RedisStrategy::PubSub,
        RedisStrategy::Queue,
    ] {
        let mut config = config(server.port(), strategy);
        config.server.username = Some("documented".into());
        config.server.password = Some("s3cret".into());
        let (a, b) = (
            RedisLockProvider::connect(config.clone()).await.unwrap(),
            RedisLockProvider::connect(config).await.unwrap(),
        );
        let name = unique_name("acl-doc");
        let mut held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
        let waiter = b.lock(&name).unwrap();
        let waiting = tokio::spawn(async move { waiter.acquire(Some(SLACK * 5)).await });
        if strategy != RedisStrategy::Polling {
            let what = format!("{strategy}: the waiter");
            expect_waiting(&mut admin, &name, strategy, 1, SLACK * 2, &what).await;
        }
        // Two confirmed renewals; a queue waiter refreshes its place meanwhile.
        expect_renewals(&held, 2, TTL * 2).await;
        assert!(!held.is_lost(), "{strategy}: the holder's renewals failed");
        assert!(
            !waiting.is_finished(),
            "{strategy}: the waiter got a held lock"
        );
        held.release().await.unwrap();
        let mut next = timeout(SLACK * 5, waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap_or_else(|error| panic!("{strategy}: the waiter: {error}"));
        next.release().await.unwrap();
        expect_only_fence(&mut admin, &name, SLACK, "after the documented user").await;
    }
    // The read-write lock and the semaphore: a writer held with a reader waiting, a renewal,
    // the hand-off; a permit taken and given back.
    let mut config = config(server.port(), RedisStrategy::Queue);
    config.server.username = Some("documented".into());
    config.server.password = Some("s3cret".into());
    let provider = RedisLockProvider::connect(config).await.unwrap();
    let name = unique_name("acl-doc-rw");
    let rw = provider.rw_lock(&name).unwrap();
    let mut writing = rw
        .try_write()
        .await
        .unwrap()
        .expect("a free read-write lock");
    let reader = Arc::clone(&rw);
    let reading = tokio::spawn(async move { reader.read(Some(SLACK * 5)).await });
    expect_renewals(&writing, 1, TTL * 2).await;
    assert!(!writing.is_lost(), "the writer's renewal failed");
    writing.release().await.unwrap();
    let mut read = timeout(SLACK * 5, reading).await.unwrap().unwrap().unwrap();
    read.release().await.unwrap();
    let semaphore = provider.semaphore(&name, 2).unwrap();
    let mut permit = semaphore
        .try_acquire()
        .await
        .unwrap()
        .expect("a free permit");
    permit.release().await.unwrap();
}

/// With a 30 s lease: a provider dropped before its guard frees the lock at once, not when
/// the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_dropped_before_its_guard_frees_the_lock() {
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let long = |strategy| config(server.port(), strategy).with_ttl(Duration::from_secs(30));
    let holder = RedisLockProvider::connect(long(RedisStrategy::Queue))
        .await
        .unwrap();
    let name = unique_name("provider-first");
    let guard = holder
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    drop(holder);
    drop(guard);
    let other = RedisLockProvider::connect(long(RedisStrategy::Queue))
        .await
        .unwrap();
    let asked = Instant::now();
    let mut next = other
        .lock(&name)
        .unwrap()
        .acquire(Some(SLACK * 3))
        .await
        .expect("the lock freed by the provider's end");
    report(
        "a_provider_dropped_before_its_guard_frees_the_lock",
        format_args!("granted {:?} after the drop (lease 30 s)", asked.elapsed()),
    );
    next.release().await.unwrap();
    expect_only_fence(&mut admin, &name, SLACK, "after the release").await;
}

/// With a 30 s lease: a queued waiter that falls silent (its network black-holed, so it can
/// neither refresh nor clean up) is handed the lock on release; the hand-off's short claim
/// runs out and the next waiter gets the lock long before the 30 s lease would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_to_a_silent_waiter_holds_the_lock_only_for_its_claim() {
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let long = |port| config(port, RedisStrategy::Queue).with_ttl(Duration::from_secs(30));
    let holder = RedisLockProvider::connect(long(server.port()))
        .await
        .unwrap();
    let name = unique_name("silent-waiter");
    let mut held = holder
        .lock(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let proxy = FaultProxy::start(server.socket_addr()).unwrap();
    let silent = RedisLockProvider::connect(long(proxy.address().port()))
        .await
        .unwrap();
    let silent_lock = silent.lock(&name).unwrap();
    let silent_wait = tokio::spawn(async move { silent_lock.acquire(None).await });
    let queue = queue_key(&name);
    let deadline = Instant::now() + SLACK * 3;
    while admin.llen::<_, u64>(&queue).await.unwrap() < 1 {
        assert!(Instant::now() < deadline, "the silent waiter never queued");
        sleep(Duration::from_millis(10)).await;
    }
    proxy.black_hole();
    let next = RedisLockProvider::connect(long(server.port()))
        .await
        .unwrap();
    let next_lock = next.lock(&name).unwrap();
    let next_wait =
        tokio::spawn(async move { next_lock.acquire(Some(Duration::from_secs(25))).await });
    while admin.llen::<_, u64>(&queue).await.unwrap() < 2 {
        assert!(Instant::now() < deadline, "the next waiter never queued");
        sleep(Duration::from_millis(10)).await;
    }
    let released = Instant::now();
    held.release().await.unwrap();
    let mut guard = timeout(Duration::from_secs(20), next_wait)
        .await
        .expect("the next waiter was served within 20 s")
        .unwrap()
        .expect("the next waiter's grant");
    let took = released.elapsed();
    report(
        "a_hand_off_to_a_silent_waiter_holds_the_lock_only_for_its_claim",
        format_args!("the next waiter got the lock {took:?} after the release (lease 30 s)"),
    );
    assert!(
        took < Duration::from_secs(12),
        "the silent waiter's hand-off held the lock for {took:?}"
    );
    guard.release().await.unwrap();
    silent_wait.abort();
    drop(silent);
    proxy.pass();
}

/// The server's client connections.
async fn client_count(admin: &mut ConnectionManager) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(admin)
        .await
        .unwrap();
    list.lines().count()
}

/// Waits until the server has `count` client connections; panics after `bound`.
async fn expect_clients(admin: &mut ConnectionManager, count: usize, bound: Duration, what: &str) {
    let began = Instant::now();
    loop {
        let now = client_count(admin).await;
        if now == count {
            return;
        }
        assert!(
            began.elapsed() < bound,
            "{what}: {now} client connections after {bound:?}, expected {count}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// Pub/sub waiters of one provider share one subscription connection: one subscriber per
/// release channel however many wait on it. When that connection is killed, they join
/// again on a new one and are served on the release messages, never on their refresh naps;
/// afterwards nothing stays subscribed, and dropping the provider closes its connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_waiters_share_one_subscription_and_survive_its_loss() {
    const PER_NAME: usize = 5;
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let names = [unique_name("shared-a"), unique_name("shared-b")];
    let holder = connect(server.port(), RedisStrategy::PubSub).await;
    let mut held = Vec::new();
    for name in &names {
        let lock = holder.lock(name).unwrap();
        held.push(lock.try_acquire().await.unwrap().expect("a free lock"));
    }
    let clients_before = client_count(&mut admin).await;

    let waiters = connect(server.port(), RedisStrategy::PubSub).await;
    let mut tasks = Vec::new();
    let mut occupancies = Vec::new();
    for name in &names {
        let occupancy = Occupancy::new();
        for _ in 0..PER_NAME {
            let (lock, occupancy) = (waiters.lock(name).unwrap(), occupancy.clone());
            tasks.push(tokio::spawn(async move {
                let mut guard = lock.acquire(Some(Duration::from_secs(30))).await?;
                {
                    let _inside = occupancy.enter();
                    sleep(Duration::from_millis(2)).await;
                }
                guard.release().await
            }));
        }
        occupancies.push(occupancy);
    }
    for name in &names {
        let what = format!("{PER_NAME} waiters on {name}: subscribers");
        expect_waiting(&mut admin, name, RedisStrategy::PubSub, 1, SLACK * 5, &what).await;
    }
    // The provider's shared connection and its subscription connection, no more.
    expect_clients(&mut admin, clients_before + 2, SLACK, "waiting").await;

    let killed: usize = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, 1, "one subscription connection for all the waiters");
    for name in &names {
        let what = format!("{name}: subscribers after the kill");
        expect_waiting(&mut admin, name, RedisStrategy::PubSub, 1, SLACK, &what).await;
    }

    let released = Instant::now();
    for mut guard in held {
        guard.release().await.unwrap();
    }
    for task in tasks {
        timeout(SLACK * 10, task)
            .await
            .expect("a waiter served")
            .unwrap()
            .expect("a waiter's acquire and release");
    }
    let served = released.elapsed();
    report(
        "pubsub_shared",
        format_args!("{} waiters on two names served in {served:?}", 2 * PER_NAME),
    );
    // A waiter that missed a release would have slept a refresh period before trying again.
    assert!(
        served < PERIOD,
        "{PER_NAME} handoffs per name took {served:?}: a waiter waited for its refresh nap"
    );
    for (name, occupancy) in names.iter().zip(&occupancies) {
        assert_eq!(occupancy.peak(), 1, "{name}: two holders at once");
        let what = format!("{name}: subscribers left");
        expect_waiting(&mut admin, name, RedisStrategy::PubSub, 0, SLACK, &what).await;
        expect_only_fence(&mut admin, name, SLACK, "keys left").await;
    }
    drop(waiters);
    expect_clients(&mut admin, clients_before, SLACK, "after the provider").await;
}
