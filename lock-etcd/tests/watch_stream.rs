//! A session's one watch stream, on real servers.
//!
//! - Broken while waiters are queued on it — by a compaction, a reset of the client's
//!   connections, a member that dies while it serves the stream, and a member cut off from
//!   the others while it serves it (containers) — every waiter is served, in the order it
//!   queued, none twice, one at a time, and no key is left behind.
//! - A guard granted after a wait notices a foreign delete of its key at once: its watch is
//!   never one the server catches up on its 100 ms loop.
//! - Held keys are watched anew after a stream reset: a deletion while it was down and one
//!   after are both noticed.
//! - A waiter whose key is deleted by someone else fails at once, while the holder holds.
//! - Thousands of held keys deleted at once are all noticed, and the stream serves after.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test code: a failed set-up or check must fail the test; the timings are reported"
)]

mod common;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Proxies, admin_client, contenders};
use etcd_client::Client as EtcdClient;
use lock_conformance::{ClientFaults, Occupancy, observe_until, unique_name};
use lock_core::{DistributedLock, LockError, LockProvider, LossReason};
use lock_etcd::{EtcdConfig, EtcdLockProvider};
use lock_testbed::servers::containers;
use lock_testbed::servers::{EtcdCluster, EtcdOptions, ServerMode, etcd_metric, shared_etcd};
use tokio::time::Instant;

const PREFIX: &str = EtcdConfig::DEFAULT_PREFIX;
const WAITERS: usize = 4;
/// Long enough that a keep-alive that meets the fault is tried again well inside it.
const LEASE_TTL: Duration = Duration::from_secs(10);
/// How long the queued waiters may take to be served once the holder lets go, the fault's
/// repair included.
const SERVED_BOUND: Duration = Duration::from_secs(60);

fn config(endpoints: Vec<String>) -> EtcdConfig {
    EtcdConfig::new(endpoints)
        .with_lease_ttl(LEASE_TTL)
        .with_timeout(Duration::from_secs(2))
}

async fn provider(endpoints: Vec<String>) -> Arc<EtcdLockProvider> {
    Arc::new(EtcdLockProvider::connect(config(endpoints)).await.unwrap())
}

/// Queues [`WAITERS`] contenders for `name` on `waiters` (one session: one watch stream)
/// behind a holder on `holders`, runs `fault`, then lets the holder go. Checks that every
/// waiter is served, in the order it queued, none twice, one at a time, with growing
/// fencing tokens, and that no key is left behind.
async fn served_in_order(
    admin: &EtcdClient,
    holders: &EtcdLockProvider,
    waiters: &Arc<EtcdLockProvider>,
    name: &str,
    fault: impl Future<Output = ()>,
) {
    let mut holder = holders.lock(name).unwrap().acquire(None).await.unwrap();
    let lock: Arc<dyn DistributedLock> = waiters.lock(name).unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let occupancy = Occupancy::new();
    let mut queued = Vec::new();
    for place in 0..WAITERS {
        let (lock, served, occupancy) = (Arc::clone(&lock), Arc::clone(&served), occupancy.clone());
        queued.push(tokio::spawn(async move {
            let mut guard = lock.acquire(Some(SERVED_BOUND)).await?;
            {
                // Inside until it starts to release: the next waiter may be granted as soon
                // as the delete is applied, before its reply reaches this one.
                let _inside = occupancy.enter();
                served
                    .lock()
                    .unwrap()
                    .push((place, guard.fencing_token().0));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            released(guard.release().await, &format!("waiter {place}"))
        }));
        observe_until(
            Duration::from_secs(10),
            "the waiter's key queued",
            || contenders(admin, PREFIX, name),
            |keys| keys.len() == place + 2,
        )
        .await
        .unwrap();
    }
    fault.await;
    let began = Instant::now();
    let first_token = holder.fencing_token().0;
    let release = holder.release().await;
    // A release that failed left the key to the guard: dropped, it goes in the background.
    drop(holder);
    released(release, "the holder").expect("the holder kept its lock");
    for (place, waiter) in queued.into_iter().enumerate() {
        tokio::time::timeout(SERVED_BOUND, waiter)
            .await
            .unwrap_or_else(|_| panic!("waiter {place} not served within {SERVED_BOUND:?}"))
            .unwrap()
            .unwrap_or_else(|error| panic!("waiter {place}: {error}"));
    }
    eprintln!("{name}: {WAITERS} waiters served in {:?}", began.elapsed());
    let served = served.lock().unwrap().clone();
    let order: Vec<usize> = served.iter().map(|(place, _)| *place).collect();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "served out of order or twice: {served:?}"
    );
    let mut last = first_token;
    for &(place, token) in &served {
        assert!(token > last, "waiter {place}'s token {token} after {last}");
        last = token;
    }
    assert_eq!(occupancy.peak(), 1, "two holders at once");
    observe_until(
        Duration::from_secs(10),
        "no key left behind",
        || contenders(admin, PREFIX, name),
        Vec::is_empty,
    )
    .await
    .unwrap();
}

/// A release's outcome, with a retryable failure taken as done once its guard is dropped:
/// sent to a member cut off from its leader, or while the members elect one, the key is
/// then deleted in the background, and the next waiter waits for that.
fn released(release: Result<(), LockError>, who: &str) -> Result<(), LockError> {
    match release {
        Err(error) if error.is_retryable() => {
            eprintln!("{who}'s release failed, retryably: {error}");
            Ok(())
        }
        released => released,
    }
}

/// The watch streams each member among `endpoints` serves.
async fn watch_streams(endpoints: &[String]) -> Vec<f64> {
    let mut streams = Vec::new();
    for endpoint in endpoints {
        let served = etcd_metric(endpoint, "etcd_debugging_mvcc_watch_stream_total").await;
        streams.push(served.ok().flatten().unwrap_or(0.0));
    }
    streams
}

/// Opens `provider`'s watch stream (a lock taken and released: its guard watches its key)
/// and returns the index of the member among `endpoints` that serves it: the one that
/// serves one more stream than before (a member may serve streams of its own).
async fn serving_member(provider: &EtcdLockProvider, endpoints: &[String]) -> usize {
    let before = watch_streams(endpoints).await;
    let probe = provider.lock(&unique_name("probe")).unwrap();
    let mut held = probe.acquire(None).await.unwrap();
    let serving = observe_until(
        Duration::from_secs(10),
        "one member serving one more watch stream",
        || async {
            let now = watch_streams(endpoints).await;
            let more: Vec<usize> = (0..endpoints.len())
                .filter(|&index| now[index] > before[index])
                .collect();
            more
        },
        |more| more.len() == 1,
    )
    .await
    .unwrap()[0];
    held.release().await.unwrap();
    serving
}

/// An admin client and two providers (two sessions) on the shared server.
async fn two_sessions_on_shared_etcd() -> (EtcdClient, Arc<EtcdLockProvider>, Arc<EtcdLockProvider>)
{
    let endpoint = shared_etcd().unwrap().client_address();
    let admin = admin_client(&endpoint).await;
    let first = provider(vec![endpoint.clone()]).await;
    (admin, first, provider(vec![endpoint]).await)
}

/// The endpoints but the one at `index`.
fn all_but(endpoints: &[String], index: usize) -> Vec<String> {
    let mut others = endpoints.to_vec();
    others.remove(index);
    others
}

/// A compaction up to the newest revision while waiters watch: nothing they wait for is
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_loses_no_waiter() {
    let (admin, holders, waiters) = two_sessions_on_shared_etcd().await;
    let name = unique_name("compaction");
    served_in_order(&admin, &holders, &waiters, &name, async {
        let mut kv = admin.kv_client();
        for round in 0..10 {
            kv.put(format!("/compaction-noise/{name}"), round.to_string(), None)
                .await
                .unwrap();
        }
        let newest = kv
            .get("/", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        kv.compact(newest, None).await.unwrap();
    })
    .await;
}

/// Every connection of the waiters' client cut (the stream reset) and restored while they
/// wait: the stream is opened again and the waiters look again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_loses_no_waiter() {
    let endpoint = shared_etcd().unwrap().client_address();
    let admin = admin_client(&endpoint).await;
    let proxies = Proxies::start(std::slice::from_ref(&endpoint));
    let (holders, waiters) = (
        provider(vec![endpoint]).await,
        provider(proxies.endpoints()).await,
    );
    let name = unique_name("reset");
    served_in_order(&admin, &holders, &waiters, &name, async {
        proxies.cut_connection().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxies.restore().await.unwrap();
    })
    .await;
}

/// Cluster options as the cluster suite's: etcd's own timing, which a busy machine does not
/// push into elections.
fn cluster_options() -> EtcdOptions {
    let mut options = EtcdOptions::default();
    options.heartbeat_interval = Duration::from_millis(100);
    options.election_timeout = Duration::from_millis(1000);
    options
}

/// The member serving the waiters' stream dies while they wait: the stream is opened on
/// another member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_loses_no_waiter() {
    let mut cluster = EtcdCluster::start(3, cluster_options()).await.unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(20))
        .await
        .unwrap();
    let endpoints = cluster.endpoints();
    let waiters = provider(endpoints.clone()).await;
    let name = unique_name("dead-member");
    let serving = serving_member(&waiters, &endpoints).await;
    let others = all_but(&endpoints, serving);
    let admin = EtcdClient::connect(others.clone(), None).await.unwrap();
    let holders = provider(others).await;
    served_in_order(&admin, &holders, &waiters, &name, async {
        cluster.kill(serving).await.unwrap();
        eprintln!("killed member {serving}, which served the waiters' stream");
        // The holder's release needs a leader (the killed member may have led).
        cluster
            .wait_for_leader(Duration::from_secs(20))
            .await
            .unwrap();
    })
    .await;
}

/// The member serving the waiters' stream is cut off from the others (its clients still
/// reach it) while they wait: it ends the streams of clients that require a leader, and
/// the stream is opened on another member. Containers: a real partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_loses_no_waiter() {
    if let Err(why) = containers::check_ready().await {
        assert!(
            !lock_conformance::runner::strict(),
            "containers are required under STRICT: {why}"
        );
        eprintln!("skip reason: {why}");
        return;
    }
    let cluster = EtcdCluster::start_in(ServerMode::Containers, 3, cluster_options())
        .await
        .unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(30))
        .await
        .unwrap();
    let endpoints = cluster.endpoints();
    let waiters = provider(endpoints.clone()).await;
    let name = unique_name("cut-off-member");
    let serving = serving_member(&waiters, &endpoints).await;
    let others = all_but(&endpoints, serving);
    let admin = EtcdClient::connect(others.clone(), None).await.unwrap();
    let holders = provider(others).await;
    served_in_order(&admin, &holders, &waiters, &name, async {
        cluster.partition(serving).await.unwrap();
        eprintln!("cut member {serving}, which served the waiters' stream, off");
    })
    .await;
    cluster.heal(serving).await.unwrap();
}

/// A guard granted after a wait — its key's create revision long past, other writes since —
/// notices a foreign delete of its key within a few milliseconds, over 100 trials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_delete_is_noticed_at_once() {
    let (admin, first, second) = two_sessions_on_shared_etcd().await;
    let name = unique_name("foreign-delete");
    let (holding, waiting) = (first.lock(&name).unwrap(), second.lock(&name).unwrap());
    let mut noticed = Vec::new();
    for _ in 0..100 {
        let mut holder = holding.acquire(None).await.unwrap();
        let waiter = tokio::spawn({
            let waiting = Arc::clone(&waiting);
            async move { waiting.acquire(Some(Duration::from_secs(10))).await }
        });
        observe_until(
            Duration::from_secs(10),
            "the waiter queued",
            || contenders(&admin, PREFIX, &name),
            |keys| keys.len() == 2,
        )
        .await
        .unwrap();
        holder.release().await.unwrap();
        let granted = waiter.await.unwrap().unwrap();
        let key = contenders(&admin, PREFIX, &name).await;
        let deleting = Instant::now();
        admin
            .kv_client()
            .delete(key[0].as_str(), None)
            .await
            .unwrap();
        let lost = tokio::time::timeout(Duration::from_secs(5), granted.lost().wait()).await;
        assert!(lost.is_ok(), "the foreign delete went unnoticed for 5 s");
        noticed.push(deleting.elapsed());
    }
    noticed.sort();
    let (p50, p99) = (noticed[49], noticed[98]);
    eprintln!("a foreign delete noticed after: p50 {p50:?}, p99 {p99:?}");
    // Caught up by the server's 100 ms loop, a watch would notice half of these after 50 ms.
    assert!(
        p50 < Duration::from_millis(25),
        "p50 {p50:?}, p99 {p99:?}: the guard's watch waits for the server's catch-up loop"
    );
}

/// Held keys keep being watched across a reset of their session's stream (every
/// connection of the holder's client cut and restored): a key deleted by someone else while
/// the stream was down is noticed once it is watched anew (read again), one deleted after
/// as it goes; a key nobody deleted stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_keys_are_watched_across_a_stream_reset() {
    let endpoint = shared_etcd().unwrap().client_address();
    let admin = admin_client(&endpoint).await;
    let proxies = Proxies::start(std::slice::from_ref(&endpoint));
    let (others, holders) = (
        provider(vec![endpoint]).await,
        provider(proxies.endpoints()).await,
    );
    let names: Vec<String> = (0..3).map(|_| unique_name("held-reset")).collect();
    // The first two taken at once, the third after a wait (its watch made while waiting).
    let mut guards = Vec::new();
    for name in &names[..2] {
        guards.push(holders.lock(name).unwrap().acquire(None).await.unwrap());
    }
    let mut other = others.lock(&names[2]).unwrap().acquire(None).await.unwrap();
    let waiting = holders.lock(&names[2]).unwrap();
    let waiter = tokio::spawn(async move { waiting.acquire(Some(Duration::from_secs(30))).await });
    observe_until(
        Duration::from_secs(10),
        "the waiter queued",
        || contenders(&admin, PREFIX, &names[2]),
        |keys| keys.len() == 2,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    other.release().await.unwrap();
    guards.push(waiter.await.unwrap().unwrap());
    // Every held key's watch on the stream before the reset.
    tokio::time::sleep(Duration::from_millis(200)).await;

    proxies.cut_connection().await.unwrap();
    let key = |name: &str| {
        let admin = admin.clone();
        let name = name.to_owned();
        async move { contenders(&admin, PREFIX, &name).await.remove(0) }
    };
    let first = key(&names[0]).await;
    admin.kv_client().delete(first, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxies.restore().await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), guards[0].lost().wait()).await;
    assert_eq!(
        reason.expect("a key deleted while the stream was down went unnoticed for 10 s"),
        Some(LossReason::EntryRemoved)
    );

    for (index, guard) in guards.iter().enumerate().skip(1) {
        let key = key(&names[index]).await;
        // Watched anew by now: nothing else is lost meanwhile.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !guard.lost().is_lost(),
            "lock {index} lost with its key standing"
        );
        admin.kv_client().delete(key, None).await.unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost().wait()).await;
        assert_eq!(
            reason.unwrap_or_else(|_| panic!(
                "lock {index}: a foreign delete after the reset went unnoticed for 5 s"
            )),
            Some(LossReason::EntryRemoved)
        );
    }
    assert!(holders.lease_id().is_some(), "the session goes on");
}

/// A waiter whose key someone else deletes fails at once, with a retryable error, while the
/// holder keeps the lock: a wait watches the waiter's own key beside its predecessor's, so
/// the deletion is not left for the look after the holder's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_is_deleted_fails_at_once() {
    let (admin, first, second) = two_sessions_on_shared_etcd().await;
    let name = unique_name("waiter-deleted");
    let mut holder = first.lock(&name).unwrap().acquire(None).await.unwrap();
    let waiting = second.lock(&name).unwrap();
    let waiter = tokio::spawn(async move { waiting.acquire(Some(Duration::from_secs(30))).await });
    let keys = observe_until(
        Duration::from_secs(10),
        "the waiter queued",
        || contenders(&admin, PREFIX, &name),
        |keys| keys.len() == 2,
    )
    .await
    .unwrap();
    // Let the waiter settle into its wait (its watches made) before its key goes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let deleting = Instant::now();
    admin
        .kv_client()
        .delete(keys[1].as_str(), None)
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter did not notice the deletion of its key within 5 s")
        .unwrap();
    let noticed = deleting.elapsed();
    let error = ended.expect_err("the waiter was granted the lock with its key deleted");
    assert!(error.is_retryable(), "{error}");
    assert!(
        noticed < Duration::from_secs(1),
        "the waiter noticed after {noticed:?}"
    );
    assert!(!holder.lost().is_lost(), "the holder lost the lock");
    assert_eq!(contenders(&admin, PREFIX, &name).await, keys[..1].to_vec());
    holder.release().await.unwrap();
    assert!(contenders(&admin, PREFIX, &name).await.is_empty());
}

/// A session whose thousands of held keys are deleted at once by someone else notices every
/// deletion: thousands of events come on its one stream while the guards that saw them
/// cancel their watches on it, and the stream's reader never stops reading to wait for room
/// to send (which stalled the server's side of the stream with it). Keys deleted before
/// their guards' watches began are found gone when read again (many in one transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_deletions_at_once_are_all_noticed() {
    const HELD: usize = 3000;
    /// Tries in flight at once, as a service taking many locks would keep them: the
    /// watches still come in bursts, and a debug build on a busy machine answers each try
    /// well within the request timeout.
    const IN_FLIGHT: usize = 64;
    let endpoint = shared_etcd().unwrap().client_address();
    let admin = admin_client(&endpoint).await;
    let holders =
        EtcdLockProvider::connect(config(vec![endpoint]).with_timeout(Duration::from_secs(10)))
            .await
            .unwrap();
    let base = unique_name("many");
    let mut taking = tokio::task::JoinSet::<Result<Option<lock_core::Guard>, LockError>>::new();
    let mut guards = Vec::with_capacity(HELD);
    for index in 0..HELD {
        if taking.len() >= IN_FLIGHT {
            let taken = taking.join_next().await.unwrap();
            guards.push(taken.unwrap().unwrap().expect("every lock is free"));
        }
        let lock = holders.lock(&format!("{base}-{index}")).unwrap();
        taking.spawn(async move { lock.try_acquire().await });
    }
    while let Some(taken) = taking.join_next().await {
        guards.push(taken.unwrap().unwrap().expect("every lock is free"));
    }
    let deleting = Instant::now();
    let deleted = admin
        .kv_client()
        .delete(
            format!("{PREFIX}/{base}-"),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(deleted.deleted(), HELD as i64, "every holder's key deleted");
    for guard in &guards {
        let left = Duration::from_secs(10).saturating_sub(deleting.elapsed());
        let lost = tokio::time::timeout(left, guard.lost().wait()).await;
        assert!(lost.is_ok(), "a deletion went unnoticed for 10 s");
    }
    eprintln!("{HELD} deletions noticed after {:?}", deleting.elapsed());
    // And the stream still serves: a lock taken now notices a deletion of its key.
    let mut last = holders
        .lock(&format!("{base}-last"))
        .unwrap()
        .acquire(None)
        .await
        .unwrap();
    let key = contenders(&admin, PREFIX, &format!("{base}-last")).await;
    admin
        .kv_client()
        .delete(key[0].as_str(), None)
        .await
        .unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), last.lost().wait()).await;
    assert!(lost.is_ok(), "the stream no longer serves after the burst");
    assert!(
        last.release().await.is_err(),
        "the deleted lock was not held any more"
    );
}
