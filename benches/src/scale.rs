//! The scale mode: one provider holds many distinct locks at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{Guard, LockError};

use crate::measure::ScaleMeasurement;
use crate::scenario::{RedisKeys, bench_error, mntr_stat, server_memory};
use crate::strategy::{Backend, Servers, SessionEnd, Strategy};

/// Acquisitions or releases in flight at once.
const IN_FLIGHT: usize = 64;

/// How long after the provider's close every lost signal must have fired.
const LOSS_BOUND: Duration = Duration::from_secs(30);

/// This process's resident memory, in bytes (Linux; 0 elsewhere).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Runs `tasks` with at most [`IN_FLIGHT`] spawned at a time (spawning them all at once
/// would make the benchmark's own task memory the figure).
async fn bounded<T, F>(tasks: Vec<F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut out = Vec::with_capacity(tasks.len());
    let mut running = tokio::task::JoinSet::new();
    for task in tasks {
        if running.len() >= IN_FLIGHT
            && let Some(Ok(value)) = running.join_next().await
        {
            out.push(value);
        }
        running.spawn(task);
    }
    while let Some(joined) = running.join_next().await {
        if let Ok(value) = joined {
            out.push(value);
        }
    }
    out
}

/// A try of each lock, as tasks for [`bounded`].
fn acquisitions(
    handles: &[Arc<dyn lock_core::DistributedLock>],
) -> Vec<impl std::future::Future<Output = Result<Option<Guard>, LockError>> + Send + 'static> {
    handles
        .iter()
        .cloned()
        .map(|lock| async move { lock.try_acquire().await })
        .collect()
}

/// One provider of `strategy` takes `locks` distinct locks, holds them all, then releases
/// them all; measures the rates and the client's and the server's memory per held lock,
/// and checks that nothing is left on the server. Then the lost signals: every lock held
/// again and the provider closed, and every lock held by a fresh provider whose session
/// the server ends (where it keeps one).
///
/// # Errors
///
/// A grant that failed or was refused, or entries left behind.
pub async fn run(
    strategy: Strategy,
    locks: usize,
    servers: &Servers,
) -> Result<ScaleMeasurement, LockError> {
    let provider = strategy.connect(servers).await?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let names: Vec<String> = (0..locks).map(|i| format!("scale-{run}-{i}")).collect();
    let handles = names
        .iter()
        .map(|name| provider.lock(name))
        .collect::<Result<Vec<_>, _>>()?;
    let ephemerals_before = ephemerals(strategy, servers).await;
    // One round first, so that the memory the acquisitions in flight take (and the
    // allocator keeps) is in the baseline: what is measured is what holding costs.
    let rss_fresh = resident_bytes();
    let mut first_round = Vec::with_capacity(locks);
    for result in bounded(acquisitions(&handles)).await {
        first_round.extend(result?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_first_round = resident_bytes();
    for mut guard in first_round {
        guard.release().await?;
    }
    let rss_before = resident_bytes();
    let server_before = server_memory(strategy.backend(), servers).await;
    let started = Instant::now();
    let guards = take_all(&handles, locks).await?;
    let acquire_time = started.elapsed();
    // Let the guards' background tasks settle before measuring memory.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_held = resident_bytes();
    let server_held = server_memory(strategy.backend(), servers).await;
    let started = Instant::now();
    let releasing = guards
        .into_iter()
        .map(|mut guard| async move { guard.release().await })
        .collect();
    for result in bounded(releasing).await {
        result?;
    }
    let release_time = started.elapsed();
    // Looked for while the provider is still connected: closing a ZooKeeper session removes
    // its ephemeral nodes, whether released or left behind.
    let mut check = LeftoverCheck::connect(strategy, servers, &run, ephemerals_before).await?;
    let left_connected = check.count(servers).await?;
    // The session's end: every lock held again, the provider closed, and every lost signal
    // must fire.
    let held = take_all(&handles, locks).await?;
    drop(handles);
    let all_lost = all_lost_after(provider, held).await?;
    let server_end = ended_by_server(strategy, servers, &names, locks).await?;
    // And once more after: what closing the provider, and the server's end of a session,
    // left.
    let leftovers = left_connected.max(check.count(servers).await?);
    let rate = |time: Duration| locks as f64 / time.as_secs_f64().max(1e-9);
    Ok(ScaleMeasurement {
        strategy: strategy.as_str().to_owned(),
        locks,
        acquire_per_s: rate(acquire_time),
        release_per_s: rate(release_time),
        rss_bytes_per_lock: rss_held.saturating_sub(rss_before) as f64 / locks as f64,
        rss_bytes_per_lock_first_round: rss_first_round.saturating_sub(rss_fresh) as f64
            / locks as f64,
        server_bytes_per_lock: server_before
            .zip(server_held)
            .map(|(before, held)| (held as f64 - before as f64) / locks as f64),
        leftovers,
        all_lost_ms: all_lost.as_secs_f64() * 1e3,
        server_end_lost_ms: server_end.map(|end| end.all_lost.as_secs_f64() * 1e3),
        server_end_ms: server_end.map(|end| end.server.as_secs_f64() * 1e3),
        server_end_requests: server_end.map(|end| end.requests),
    })
}

/// Takes every lock of `handles`, all free: the `locks` guards.
async fn take_all(
    handles: &[Arc<dyn lock_core::DistributedLock>],
    locks: usize,
) -> Result<Vec<Guard>, LockError> {
    let mut guards: Vec<Guard> = Vec::with_capacity(locks);
    for result in bounded(acquisitions(handles)).await {
        match result? {
            Some(guard) => guards.push(guard),
            None => return Err(bench_error("a fresh lock was refused")),
        }
    }
    if guards.len() != locks {
        return Err(bench_error(format!(
            "{} of {locks} acquisitions finished",
            guards.len()
        )));
    }
    Ok(guards)
}

/// Closes `provider` (its last handle) while `held` are held, and measures how long until
/// the last of their lost signals fired.
///
/// # Errors
///
/// Signals that did not fire within [`LOSS_BOUND`] of the close.
async fn all_lost_after(
    provider: Arc<dyn lock_core::LockProvider>,
    held: Vec<Guard>,
) -> Result<Duration, LockError> {
    let closed = Instant::now();
    drop(provider);
    all_lost_since(&held, closed, "the close").await
}

/// A fresh client of `strategy` takes the locks of `names`, then its server ends its
/// session ([`SessionEnd`]): how long until the last lost signal fired, how long the
/// server took to end it, and how many requests the client sent meanwhile (one question
/// per lock would be a herd). `None` where the server keeps no session to end.
///
/// # Errors
///
/// As [`all_lost_after`], and the session's end refused.
async fn ended_by_server(
    strategy: Strategy,
    servers: &Servers,
    names: &[String],
    locks: usize,
) -> Result<Option<ServerEnd>, LockError> {
    let (provider, end) = strategy.connect_ending(servers).await?;
    if matches!(end, SessionEnd::Unsupported) {
        return Ok(None);
    }
    let handles = names
        .iter()
        .map(|name| provider.lock(name))
        .collect::<Result<Vec<_>, _>>()?;
    let held = take_all(&handles, locks).await?;
    let before = provider.metrics().server_requests;
    let ended = Instant::now();
    end.end().await?;
    let server = ended.elapsed();
    let all_lost = all_lost_since(&held, ended, "the server's end of the session").await?;
    let requests = provider.metrics().server_requests.saturating_sub(before);
    Ok(Some(ServerEnd {
        all_lost,
        server,
        requests,
    }))
}

/// What [`ended_by_server`] measured.
#[derive(Clone, Copy)]
struct ServerEnd {
    /// From the request that ends the session until the last lost signal fired.
    all_lost: Duration,
    /// From that request until the server said the session was over.
    server: Duration,
    /// The client's requests meanwhile.
    requests: u64,
}

/// Waits for the lost signal of every guard of `held`, for at most [`LOSS_BOUND`] after
/// `since`: the time from `since` until the last fired.
///
/// # Errors
///
/// Signals that did not fire within that bound.
async fn all_lost_since(held: &[Guard], since: Instant, what: &str) -> Result<Duration, LockError> {
    let mut silent = 0;
    for guard in held {
        let left = LOSS_BOUND.saturating_sub(since.elapsed());
        if tokio::time::timeout(left, guard.lost().wait())
            .await
            .is_err()
        {
            silent += 1;
        }
    }
    let all_lost = since.elapsed();
    if silent > 0 {
        return Err(bench_error(format!(
            "{silent} of {} lost signals did not fire within {LOSS_BOUND:?} of {what}",
            held.len()
        )));
    }
    Ok(all_lost)
}

/// ZooKeeper's count of ephemeral nodes (`mntr`), where the server tells it.
async fn ephemerals(strategy: Strategy, servers: &Servers) -> Option<u64> {
    if strategy.backend() != Backend::ZooKeeper {
        return None;
    }
    mntr_stat(servers, "zk_ephemerals_count").await
}

/// Looks for entries of the run's locks still on the server, on one connection of its own.
enum LeftoverCheck {
    /// ZooKeeper's count of ephemeral nodes against the one before the run.
    ZooKeeper { ephemerals_before: Option<u64> },
    /// The run's keys, but for the fencing counters and the release channels' markers.
    Redis { keys: RedisKeys, pattern: String },
    /// The run's keys.
    Etcd {
        client: Box<etcd_client::Client>,
        prefix: String,
    },
    /// Every advisory lock on the server (the run's server is the benchmark's own).
    Postgres { client: tokio_postgres::Client },
    /// No server to ask.
    Nothing,
}

impl LeftoverCheck {
    async fn connect(
        strategy: Strategy,
        servers: &Servers,
        run: &str,
        ephemerals_before: Option<u64>,
    ) -> Result<Self, LockError> {
        match strategy.backend() {
            Backend::ZooKeeper => Ok(LeftoverCheck::ZooKeeper { ephemerals_before }),
            Backend::Redis => match RedisKeys::connect(servers).await? {
                Some(keys) => Ok(LeftoverCheck::Redis {
                    keys,
                    pattern: format!("{{lock:scale-{run}-*"),
                }),
                None => Ok(LeftoverCheck::Nothing),
            },
            Backend::Etcd => {
                let Some(endpoint) = servers.etcd.as_deref() else {
                    return Ok(LeftoverCheck::Nothing);
                };
                let client = etcd_client::Client::connect([endpoint], None)
                    .await
                    .map_err(|e| bench_error(e.to_string()))?;
                Ok(LeftoverCheck::Etcd {
                    client: Box::new(client),
                    prefix: format!("{}/scale-{run}-", lock_etcd::EtcdConfig::DEFAULT_PREFIX),
                })
            }
            Backend::Postgres => match servers.postgres.as_deref() {
                Some(url) => Ok(LeftoverCheck::Postgres {
                    client: crate::scenario::pg_connect(url).await?,
                }),
                None => Ok(LeftoverCheck::Nothing),
            },
        }
    }

    /// Entries still on the server, waiting a little for background clean-up.
    async fn count(&mut self, servers: &Servers) -> Result<u64, LockError> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = match self {
                LeftoverCheck::ZooKeeper { ephemerals_before } => {
                    match (
                        *ephemerals_before,
                        mntr_stat(servers, "zk_ephemerals_count").await,
                    ) {
                        (Some(before), Some(now)) => now.saturating_sub(before),
                        _ => 0,
                    }
                }
                // The server may be busy with the clean-up of a closed provider's locks,
                // and a look at its keys time out: asked again until the deadline.
                LeftoverCheck::Redis { keys, pattern } => match keys.left(pattern).await {
                    Ok(left) => left.len() as u64,
                    Err(error) if Instant::now() >= deadline => return Err(error),
                    Err(_) => u64::MAX,
                },
                LeftoverCheck::Etcd { client, prefix } => {
                    let options = etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only();
                    let found = client
                        .kv_client()
                        .get(prefix.as_str(), Some(options))
                        .await
                        .map_err(|e| bench_error(e.to_string()))?;
                    u64::try_from(found.count()).unwrap_or_default()
                }
                LeftoverCheck::Postgres { client } => {
                    crate::scenario::pg_advisory_holders(client, None)
                        .await?
                        .len() as u64
                }
                LeftoverCheck::Nothing => 0,
            };
            if left == 0 || Instant::now() >= deadline {
                return Ok(left);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
