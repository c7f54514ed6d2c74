//! The herd scenario: N contenders, each its own client, pass one lock around; what each
//! handoff costs in time, wake-ups and server work.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{DeleteOptions, GetOptions, SortOrder, SortTarget, Txn, TxnOp};
use lock_core::{LockError, LockName, LockProvider, MetricsSnapshot};
use lock_etcd::EtcdConfig;
use lock_postgres::PostgresConfig;
use lock_testbed::servers::ZkTarget;
use redis::AsyncCommands;

use crate::measure::Measurement;
use crate::strategy::{Backend, Servers, Strategy};

/// How much earlier than a grant's own request another waiter's must have been made for the
/// grant to count as a FIFO violation: requests from separate connections reach the server
/// in an order that scheduling can shuffle by a few milliseconds.
pub const FIFO_TOLERANCE: Duration = Duration::from_millis(5);

/// The longest the first N grants (the queue forming) may take.
const WARMUP_BOUND: Duration = Duration::from_secs(120);

/// The longest the background clean-ups after a run (of cancelled waiters, of guards
/// dropped while held) may take before what is left counts as left behind.
const CLEANUP_BOUND: Duration = Duration::from_secs(15);

/// How a run goes.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RunOptions {
    /// Grants to measure after the first.
    pub handoffs: u64,
    /// How long each holder keeps the lock.
    pub hold: Duration,
    /// A run stops after this long even if fewer handoffs were made (polling can be slow).
    pub max_time: Duration,
    /// How a holder lets go.
    pub release: Release,
}

impl RunOptions {
    /// `handoffs` handoffs, holding for `hold`, stopping after `max_time` at the latest; each
    /// holder releases and waits for the answer.
    pub fn new(handoffs: u64, hold: Duration, max_time: Duration) -> Self {
        RunOptions {
            handoffs,
            hold,
            max_time,
            release: Release::Await,
        }
    }

    /// The same, the holders letting go as `release` says.
    #[must_use]
    pub fn with_release(self, release: Release) -> Self {
        RunOptions { release, ..self }
    }
}

/// How a holder lets go of the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
#[non_exhaustive]
pub enum Release {
    /// `Guard::release().await`: the holder learns whether it still held the lock (a
    /// round trip to the server) before it asks again.
    #[default]
    Await,
    /// The guard dropped: its release goes out in the background and the holder asks again
    /// at once, as the peers' recipes release (zookeeper-client's lock, etcd's v3lock), which
    /// cannot tell a holder that its lock was lost.
    Drop,
}

pub(crate) fn bench_error(message: impl Into<String>) -> LockError {
    LockError::other("bench", message)
}

/// The `q` quantile of `samples` (sorted in place), in microseconds.
pub fn quantile_us(samples: &mut [Duration], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_unstable();
    let index = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[index.min(samples.len() - 1)].as_secs_f64() * 1e6
}

/// Holds the lock for `hold`. A thread's sleep keeps to tens of microseconds, where tokio's
/// timer rounds up to its 1 ms tick (a 1 ms hold would last nearly 2 ms); only the holder
/// sleeps, so it takes one thread of the blocking pool at a time.
async fn hold_for(hold: Duration) {
    if !hold.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(hold)).await;
    }
}

/// Connects `n` clients, a few at a time.
async fn connect_all(
    strategy: Strategy,
    servers: &Servers,
    n: usize,
) -> Result<Vec<Arc<dyn LockProvider>>, LockError> {
    let mut clients = Vec::with_capacity(n);
    while clients.len() < n {
        let batch = (n - clients.len()).min(16);
        let connecting: Vec<_> = (0..batch)
            .map(|_| {
                tokio::spawn({
                    let servers = servers.clone();
                    async move { strategy.connect(&servers).await }
                })
            })
            .collect();
        for task in connecting {
            clients.push(
                task.await
                    .map_err(|e| bench_error(format!("connecting: {e}")))??,
            );
        }
    }
    Ok(clients)
}

/// What the contenders share during a run.
#[derive(Debug, Default)]
struct Book {
    /// When the last holder started its release.
    released: Option<Instant>,
    handoffs: Vec<Duration>,
    /// How long each measured holder held, from its grant to its release.
    holds: Vec<Duration>,
    grants: Vec<u64>,
    total: u64,
    /// Contender → when it called `acquire`, while it waits.
    waiting: BTreeMap<usize, Instant>,
    fifo_violations: u64,
    first_grant: Option<Instant>,
    last_grant: Option<Instant>,
    /// Counters when the warm-up ended (every contender queued once).
    start: Option<(Vec<MetricsSnapshot>, Option<u64>)>,
    /// Counters when the target was reached, before the waiters are stopped.
    done: Option<(Vec<MetricsSnapshot>, Option<u64>)>,
    /// The run hit `max_time` and its end counters were taken: later grants are not
    /// measured.
    stopped: bool,
}

/// Runs `strategy` with `n` contenders and measures it.
///
/// # Errors
///
/// A contender's error, or nodes or keys left on the server after the run.
pub async fn run(
    strategy: Strategy,
    n: usize,
    servers: &Servers,
    options: RunOptions,
    floors: Floors,
) -> Result<Measurement, LockError> {
    let clients = connect_all(strategy, servers, n).await?;
    let name = format!("herd-{}-{n}-{}", strategy, uuid::Uuid::new_v4().simple());
    let book = Arc::new(Mutex::new(Book {
        grants: vec![0; n],
        ..Book::default()
    }));
    // The first n grants form the queue (every contender asks at once): they are not
    // measured. The handoffs after them are.
    let warmup = n as u64;
    let target = warmup + options.handoffs;
    let (finished, mut finished_rx) = tokio::sync::watch::channel(false);
    let (warmed_tx, mut warmed_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for (index, client) in clients.iter().enumerate() {
        let lock = client.lock(&name)?;
        let book = Arc::clone(&book);
        let finished = finished.clone();
        let warmed_tx = warmed_tx.clone();
        let clients = clients.clone();
        let servers = servers.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let asked = Instant::now();
                book.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .waiting
                    .insert(index, asked);
                let mut guard = lock.acquire(None).await?;
                let granted = Instant::now();
                let (warmed, reached, measured) = {
                    let mut book = book.lock().unwrap_or_else(PoisonError::into_inner);
                    book.waiting.remove(&index);
                    let released = book.released.take();
                    book.total += 1;
                    // Grants after the target (or after a timed-out run's end counters)
                    // are not measured: the counters do not cover them.
                    let measured = book.total > warmup && book.total <= target && !book.stopped;
                    if measured {
                        let overtaken = book
                            .waiting
                            .values()
                            .any(|since| *since + FIFO_TOLERANCE < asked);
                        if overtaken {
                            book.fifo_violations += 1;
                        }
                        if let Some(released) = released {
                            book.handoffs
                                .push(granted.saturating_duration_since(released));
                        }
                        book.grants[index] += 1;
                        book.last_grant = Some(granted);
                    }
                    if book.total == warmup {
                        book.first_grant = Some(granted);
                    }
                    (
                        book.total == warmup,
                        book.total == target && !book.stopped,
                        measured,
                    )
                };
                if warmed {
                    let metrics = clients.iter().map(|c| c.metrics()).collect();
                    let server = server_requests(strategy.backend(), &servers).await;
                    book.lock().unwrap_or_else(PoisonError::into_inner).start =
                        Some((metrics, server));
                    let _ = warmed_tx.send(true);
                }
                if reached {
                    let metrics = clients.iter().map(|c| c.metrics()).collect();
                    let server = server_requests(strategy.backend(), &servers).await;
                    book.lock().unwrap_or_else(PoisonError::into_inner).done =
                        Some((metrics, server));
                    let _ = finished.send(true);
                }
                hold_for(options.hold).await;
                let released = Instant::now();
                {
                    let mut book = book.lock().unwrap_or_else(PoisonError::into_inner);
                    if measured {
                        book.holds.push(released.saturating_duration_since(granted));
                    }
                    book.released = Some(released);
                }
                match options.release {
                    Release::Await => guard.release().await?,
                    Release::Drop => drop(guard),
                }
                if reached || *finished.borrow() {
                    return Ok::<(), LockError>(());
                }
            }
        }));
    }
    // The queue forms first (however slowly the herd strategies pass the lock round), then
    // the measured part runs for at most `max_time`.
    let _ = tokio::time::timeout(WARMUP_BOUND, warmed_rx.wait_for(|warmed| *warmed)).await;
    let _ = tokio::time::timeout(options.max_time, finished_rx.wait_for(|done| *done)).await;
    // Out of time: the end counters are taken now, before the waiters are stopped (their
    // cancelled acquisitions' clean-up is not part of the handoffs measured), and grants from
    // here on are not measured.
    let timed_out = {
        let mut book = book.lock().unwrap_or_else(PoisonError::into_inner);
        book.stopped = book.total < target;
        book.stopped
    };
    let timed_out_end = if timed_out {
        let metrics: Vec<_> = clients.iter().map(|c| c.metrics()).collect();
        Some((metrics, server_requests(strategy.backend(), servers).await))
    } else {
        // The target was reached: the contender that made the last grant is taking the end
        // counters.
        let _ = tokio::time::timeout(CLEANUP_BOUND, finished_rx.wait_for(|done| *done)).await;
        None
    };
    // Stop everyone still waiting: their acquisitions are cancelled and cleaned up, all at
    // once but where a burst of cancellations breaks the server (see `ends_in_turn`).
    let _ = finished.send(true);
    // Connected before the waiters are stopped: ending in turn looks at their keys.
    let mut check = LeftoverCheck::connect(strategy, servers, &name).await;
    if ends_in_turn(strategy) {
        end_in_turn(&tasks, &book, check.as_mut().ok()).await;
    }
    let mut failure = None;
    for task in &tasks {
        if task.is_finished() {
            continue;
        }
        task.abort();
    }
    for task in tasks {
        if let Ok(Err(error)) = task.await {
            failure = Some(error);
        }
    }
    if let Some(error) = failure {
        return Err(error);
    }
    let book = std::mem::take(&mut *book.lock().unwrap_or_else(PoisonError::into_inner));
    let end = if timed_out {
        timed_out_end
    } else {
        book.done.clone()
    };
    let Some((after, server_after)) = end else {
        return Err(bench_error(format!(
            "{strategy} with {n} contenders: no end counters"
        )));
    };
    let Some((before, server_before)) = book.start.clone() else {
        return Err(bench_error(format!(
            "{strategy} with {n} contenders: the queue did not form within {WARMUP_BOUND:?}"
        )));
    };
    // Nodes or keys left behind are looked for while the clients are still connected: closing
    // a ZooKeeper session removes its ephemeral nodes, a cancelled waiter's among them.
    // Not for the peers: zookeeper-client 0.11.2 leaves the node of a `lock` cancelled while
    // creating it until the session closes (its background delete is given the bare child
    // name, not the path), and etcd 3.4's lock service leaves the key of a cancelled `Lock`
    // until its lease ends.
    let mut check = check?;
    if !strategy.is_peer() {
        check.wait_until_empty(strategy, &name).await?;
    }
    drop(clients);
    // And once more after: what closing the clients left (persistent nodes, keys).
    check.wait_until_empty(strategy, &name).await?;
    let handoffs = book.handoffs.len() as u64;
    let per = |total: u64| {
        if handoffs == 0 {
            0.0
        } else {
            total as f64 / handoffs as f64
        }
    };
    let counted = after
        .iter()
        .zip(&before)
        .map(|(after, before)| after.since(before))
        .fold(MetricsSnapshot::default(), |sum, d| sum.plus(&d));
    let mut samples = book.handoffs;
    let mut measurement = Measurement::new(strategy.as_str(), strategy.backend().as_str(), n);
    measurement.handoffs = handoffs;
    let elapsed = match (book.first_grant, book.last_grant) {
        (Some(first), Some(last)) => last.saturating_duration_since(first),
        _ => Duration::ZERO,
    };
    measurement.elapsed_s = elapsed.as_secs_f64();
    measurement.throughput_per_s = if elapsed.is_zero() {
        0.0
    } else {
        handoffs as f64 / elapsed.as_secs_f64()
    };
    measurement.handoff_p50_us = quantile_us(&mut samples, 0.5);
    measurement.handoff_p99_us = quantile_us(&mut samples, 0.99);
    let per_floor = |floor: f64| {
        if floor > 0.0 {
            measurement.handoff_p50_us / floor
        } else {
            0.0
        }
    };
    measurement.handoff_to_floor = per_floor(floors.chain_p50_us);
    measurement.handoff_to_physical_floor = per_floor(floors.physical_p50_us);
    measurement.floor_p50_us = floors.chain_p50_us;
    measurement.physical_floor_p50_us = floors.physical_p50_us;
    let mut holds = book.holds;
    measurement.hold_p50_us = quantile_us(&mut holds, 0.5);
    if !strategy.is_peer() {
        measurement.wakeups_per_handoff = Some(per(counted.wakeups));
        measurement.futile_wakeups_per_handoff = Some(per(counted.futile_wakeups));
    }
    // The server's own count where it keeps one; otherwise the requests the clients say they
    // sent (PostgreSQL: every statement).
    measurement.server_requests_per_handoff = match (server_before, server_after) {
        (Some(before), Some(after)) => Some(per(after.saturating_sub(before))),
        _ if counted.server_requests > 0 => Some(per(counted.server_requests)),
        _ => None,
    };
    measurement.min_grants = book.grants.iter().copied().min().unwrap_or_default();
    measurement.max_grants = book.grants.iter().copied().max().unwrap_or_default();
    measurement.fifo_violations = book.fifo_violations;
    Ok(measurement)
}

/// Whether a run of `strategy` ends without cancelling its waiters all at once. etcd's lock
/// service runs its waiters' watches on one in-process stream without flow control, which
/// deadlocks on a burst of cancelled `Lock` calls (etcd-io/etcd#13336, #20716): every later
/// `Lock` that must wait would hang for the life of that server.
fn ends_in_turn(strategy: Strategy) -> bool {
    strategy == Strategy::EtcdV3Lock
}

/// The longest a cancelled waiter's key may take to go, at the end of a run that ends in
/// turn, before the next waiter is cancelled all the same.
const CANCEL_BOUND: Duration = Duration::from_secs(2);

/// Ends a run without a burst of cancellations: every waiter takes its turn and leaves (its
/// grant, after the run's end, is not measured). If the queue has not drained within
/// [`CLEANUP_BOUND`], the waiters left are cancelled one at a time, the last to ask first,
/// each once the key of the one before is gone (or after [`CANCEL_BOUND`]); without `check`,
/// after a short pause.
async fn end_in_turn(
    tasks: &[tokio::task::JoinHandle<Result<(), LockError>>],
    book: &Mutex<Book>,
    mut check: Option<&mut LeftoverCheck>,
) {
    let running = || tasks.iter().filter(|task| !task.is_finished()).count();
    let drained = tokio::time::timeout(CLEANUP_BOUND, async {
        while running() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    if drained.is_ok() {
        return;
    }
    // Keys that stayed after their waiter was cancelled (one granted as it was cancelled
    // keeps its key until its lease is revoked).
    let mut stale = 0;
    loop {
        let last = {
            let book = book.lock().unwrap_or_else(PoisonError::into_inner);
            let waiting = book
                .waiting
                .iter()
                .filter(|(index, _)| tasks.get(**index).is_some_and(|t| !t.is_finished()))
                .max_by_key(|(_, since)| **since)
                .map(|(index, _)| *index);
            waiting.or_else(|| tasks.iter().position(|task| !task.is_finished()))
        };
        let Some(task) = last.and_then(|index| tasks.get(index)) else {
            return;
        };
        task.abort();
        let deadline = Instant::now() + CANCEL_BOUND;
        loop {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let left = match check.as_deref_mut() {
                Some(check) => check.entries().await.ok().map(|entries| entries.len()),
                None => None,
            };
            let Some(left) = left else {
                // Nothing to look at: the pause is all the spacing there is.
                tokio::time::sleep(Duration::from_millis(10)).await;
                break;
            };
            if task.is_finished() && left <= running() + stale {
                break;
            }
            if Instant::now() >= deadline {
                stale = left.saturating_sub(running());
                break;
            }
        }
    }
}

/// Requests the server has handled so far: ZooKeeper's `zk_packets_received`, Redis's
/// command calls (`INFO commandstats`), etcd's gRPC messages received (every request, and
/// every message on a watch or keep-alive stream). `None` when the server does not say.
pub async fn server_requests(backend: Backend, servers: &Servers) -> Option<u64> {
    match backend {
        Backend::ZooKeeper => mntr_total(servers, "zk_packets_received").await,
        Backend::Etcd => {
            let metrics = etcd_metrics(servers.etcd.as_deref()?).await?;
            Some(
                metrics
                    .lines()
                    .filter(|line| line.starts_with("grpc_server_msg_received_total{"))
                    .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>() as u64,
            )
        }
        // PostgreSQL's statement counters (pg_stat_database) are flushed to the view every
        // second or so, too late to be read right after a run: its clients count the
        // statements they send instead.
        Backend::Postgres => None,
        // Every server's, a cluster's nodes together.
        Backend::Redis => {
            let mut total = 0;
            for info in redis_info(servers, "commandstats").await? {
                total += info
                    .lines()
                    .filter_map(|line| line.split("calls=").nth(1))
                    .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
                    .sum::<u64>();
            }
            (total > 0).then_some(total)
        }
    }
}

/// The server's own figure of its memory, in bytes, as [`ScaleMeasurement`]'s
/// `server_bytes_per_lock` describes it; `None` when the server does not say.
///
/// [`ScaleMeasurement`]: crate::ScaleMeasurement
pub(crate) async fn server_memory(backend: Backend, servers: &Servers) -> Option<u64> {
    match backend {
        Backend::ZooKeeper => mntr_total(servers, "zk_approximate_data_size").await,
        Backend::Etcd => {
            let metrics = etcd_metrics(servers.etcd.as_deref()?).await?;
            let value = metrics
                .lines()
                .find_map(|line| line.strip_prefix("go_memstats_heap_inuse_bytes "))?;
            Some(value.trim().parse::<f64>().ok()? as u64)
        }
        Backend::Postgres => None,
        Backend::Redis => {
            let mut total = 0;
            for info in redis_info(servers, "memory").await? {
                total += info
                    .lines()
                    .find_map(|line| line.strip_prefix("used_memory:"))?
                    .trim()
                    .parse::<u64>()
                    .ok()?;
            }
            (total > 0).then_some(total)
        }
    }
}

/// A section of `INFO` from every Redis server (a cluster's nodes each).
async fn redis_info(servers: &Servers, section: &str) -> Option<Vec<String>> {
    let mut answers = Vec::new();
    for client in servers.redis_servers().await.ok()? {
        let mut connection = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut connection)
            .await
            .ok()?;
        answers.push(info);
    }
    Some(answers)
}

/// etcd's `/metrics` page from `endpoint` (`http://host:port`), read within a second.
async fn etcd_metrics(endpoint: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let asking = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        Some(answer)
    };
    tokio::time::timeout(Duration::from_secs(1), asking)
        .await
        .ok()
        .flatten()
}

/// One figure of ZooKeeper's `mntr` answer (from the first server), where it gives it.
pub(crate) async fn mntr_stat(servers: &Servers, key: &str) -> Option<u64> {
    member_stat(servers.zk.as_deref()?, key).await
}

/// One figure of `mntr` summed over every server of the connect string (an ensemble's
/// members each count what their own clients sent).
async fn mntr_total(servers: &Servers, key: &str) -> Option<u64> {
    let mut total = 0;
    for member in servers.zk.as_deref()?.split(',') {
        total += member_stat(member, key).await?;
    }
    Some(total)
}

async fn member_stat(connect: &str, key: &str) -> Option<u64> {
    let mntr = ZkTarget::external(connect).four_letter("mntr").await.ok()?;
    mntr.lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|value| value.trim().parse().ok())
}

/// A connection to each Redis server (every node of a cluster), to look for what locks
/// leave behind.
pub(crate) struct RedisKeys {
    connections: Vec<redis::aio::MultiplexedConnection>,
}

impl RedisKeys {
    /// Connected to every server; `None` without Redis.
    pub(crate) async fn connect(servers: &Servers) -> Result<Option<Self>, LockError> {
        let failed = |e: redis::RedisError| bench_error(format!("checking leftovers: {e}"));
        let mut connections = Vec::new();
        for client in servers.redis_servers().await? {
            connections.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(failed)?,
            );
        }
        Ok((!connections.is_empty()).then_some(RedisKeys { connections }))
    }

    /// The keys matching `pattern` on every server, but the fencing counters and the
    /// receipts of the last releases (which are meant to stay).
    pub(crate) async fn left(&mut self, pattern: &str) -> Result<Vec<String>, LockError> {
        let mut left = Vec::new();
        for connection in &mut self.connections {
            let keys: Vec<String> = connection
                .keys(pattern)
                .await
                .map_err(|e| bench_error(format!("checking leftovers: {e}")))?;
            left.extend(
                keys.into_iter()
                    .filter(|key| !key.ends_with(":fence") && !key.ends_with(":released")),
            );
        }
        Ok(left)
    }
}

/// A connection of its own to the server, looking for the nodes or keys one lock left
/// behind.
enum LeftoverCheck {
    /// The children of the lock's directory.
    ZooKeeper {
        client: zookeeper_client::Client,
        dir: String,
    },
    /// The lock's keys, but for the fencing counter and the release channel's marker.
    Redis { keys: RedisKeys, pattern: String },
    /// The keys under the lock's directory.
    Etcd {
        client: Box<etcd_client::Client>,
        dir: String,
    },
    /// The advisory locks of the lock's key, held or awaited.
    Postgres {
        client: tokio_postgres::Client,
        key: String,
    },
    /// No server to ask.
    Nothing,
}

impl LeftoverCheck {
    /// Connects once, for every look that follows.
    async fn connect(strategy: Strategy, servers: &Servers, name: &str) -> Result<Self, LockError> {
        let escaped = LockName::new(name)?.escaped();
        let failed = |e: &dyn std::fmt::Display| bench_error(format!("checking leftovers: {e}"));
        match strategy.backend() {
            Backend::ZooKeeper => {
                let Some(zk) = servers.zk.as_deref() else {
                    return Ok(LeftoverCheck::Nothing);
                };
                let root = if strategy == Strategy::ZkRecipe {
                    "/distlock-recipe"
                } else {
                    "/distlock"
                };
                let client = zookeeper_client::Client::connect(zk)
                    .await
                    .map_err(|e| failed(&e))?;
                Ok(LeftoverCheck::ZooKeeper {
                    client,
                    dir: format!("{root}/{escaped}"),
                })
            }
            Backend::Redis => match RedisKeys::connect(servers).await? {
                Some(keys) => Ok(LeftoverCheck::Redis {
                    keys,
                    pattern: format!("{{lock:{escaped}}}*"),
                }),
                None => Ok(LeftoverCheck::Nothing),
            },
            Backend::Etcd => {
                let Some(endpoint) = servers.etcd.as_deref() else {
                    return Ok(LeftoverCheck::Nothing);
                };
                let client = etcd_client::Client::connect([endpoint], None)
                    .await
                    .map_err(|e| failed(&e))?;
                let prefix = match strategy {
                    Strategy::EtcdV3Lock => "/distlock-v3lock",
                    _ => EtcdConfig::DEFAULT_PREFIX,
                };
                Ok(LeftoverCheck::Etcd {
                    client: Box::new(client),
                    dir: format!("{prefix}/{escaped}/"),
                })
            }
            Backend::Postgres => {
                let Some(url) = servers.postgres.as_deref() else {
                    return Ok(LeftoverCheck::Nothing);
                };
                Ok(LeftoverCheck::Postgres {
                    client: pg_connect(url).await?,
                    key: format!("{}/{name}", PostgresConfig::DEFAULT_SCHEMA),
                })
            }
        }
    }

    /// The entries on the server now.
    async fn entries(&mut self) -> Result<Vec<String>, LockError> {
        let failed = |e: &dyn std::fmt::Display| bench_error(format!("checking leftovers: {e}"));
        match self {
            LeftoverCheck::ZooKeeper { client, dir } => match client.list_children(dir).await {
                Ok(children) => Ok(children),
                Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
                Err(e) => Err(failed(&e)),
            },
            LeftoverCheck::Redis { keys, pattern } => keys.left(pattern).await,
            LeftoverCheck::Etcd { client, dir } => {
                let options = GetOptions::new().with_prefix().with_keys_only();
                let found = client
                    .kv_client()
                    .get(dir.as_str(), Some(options))
                    .await
                    .map_err(|e| failed(&e))?;
                Ok(found
                    .kvs()
                    .iter()
                    .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                    .collect())
            }
            LeftoverCheck::Postgres { client, key } => {
                let holders = pg_advisory_holders(client, Some(key)).await?;
                Ok(holders.iter().map(|pid| format!("pid {pid}")).collect())
            }
            LeftoverCheck::Nothing => Ok(Vec::new()),
        }
    }

    /// Waits, for [`CLEANUP_BOUND`] at most, until the lock has no entries on the server;
    /// fails with what is left after that.
    async fn wait_until_empty(&mut self, strategy: Strategy, name: &str) -> Result<(), LockError> {
        let deadline = Instant::now() + CLEANUP_BOUND;
        loop {
            let left = self.entries().await?;
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(bench_error(format!(
                    "{strategy}: {} entries left behind for {name}: {left:?}",
                    left.len()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The floors a run is compared with, measured next to it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct Floors {
    /// Median of the chain of raw client operations a handoff needs, without lock logic
    /// (ZooKeeper: delete → the watch event → a list of an equally full directory; etcd:
    /// delete → the watch event → a look at an equally full directory, its own key and the
    /// one before it; Redis: as `physical_p50_us`), in microseconds.
    pub chain_p50_us: f64,
    /// Median of what must happen between a release and the next grant, on warmed
    /// connections (ZooKeeper and etcd: delete → the watch event on that node; Redis: a
    /// script that pushes onto a list → the blocked pop of another connection returns), in
    /// microseconds.
    pub physical_p50_us: f64,
}

/// Runs the floors' operations (see [`floors`]) on `backend` for `duration`, unmeasured.
///
/// A server started a moment ago answers slower than one that has served a while (above all
/// ZooKeeper, whose JVM compiles its request paths as they run hot: a thousand lock cycles
/// take a third less time once it has), so without this the first strategy measured on a
/// fresh server would pay for the warm-up that the next ones profit from.
///
/// # Errors
///
/// Connection errors.
pub async fn warm_up(
    backend: Backend,
    servers: &Servers,
    duration: Duration,
) -> Result<(), LockError> {
    let until = Instant::now() + duration;
    while Instant::now() < until {
        floors(backend, servers, 100, 10, Duration::ZERO).await?;
    }
    Ok(())
}

/// The floors of a backend (see [`Floors`]), each over `rounds` rounds after a few
/// unmeasured ones, with as many nodes in the ZooKeeper directory as `contenders` would
/// make. Each round starts after a pause of `hold`, as a release comes after a hold: on an
/// idle machine (a VM above all) a pause costs the wake-up of the cores, which a handoff
/// after a hold pays too.
///
/// # Errors
///
/// Connection errors.
pub async fn floors(
    backend: Backend,
    servers: &Servers,
    rounds: usize,
    contenders: usize,
    hold: Duration,
) -> Result<Floors, LockError> {
    // A few unmeasured rounds first: the first requests of a fresh connection are slow.
    let warmup = (rounds / 5).max(2);
    let rounds = Rounds {
        measured: rounds,
        warmup,
        hold,
    };
    match backend {
        Backend::ZooKeeper => zk_floors(servers, rounds, contenders).await,
        Backend::Etcd => etcd_floors(servers, rounds, contenders).await,
        Backend::Postgres => pg_floors(servers, rounds).await,
        Backend::Redis => {
            let physical = redis_floor(servers, rounds).await?;
            Ok(Floors {
                chain_p50_us: physical,
                physical_p50_us: physical,
            })
        }
    }
}

/// [`floors`] measured while `writers` more clients of the server write to keys of their
/// own, each a write after the other's answer (etcd: a put then a delete; ZooKeeper: a
/// create then a delete), as the requests of a run load it: at hold 0 a releaser's next
/// acquisition writes while its successor is being woken. Other backends: [`floors`].
///
/// # Errors
///
/// Connection errors.
pub async fn floors_under_writes(
    backend: Backend,
    servers: &Servers,
    rounds: usize,
    contenders: usize,
    hold: Duration,
    writers: usize,
) -> Result<Floors, LockError> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::with_capacity(writers);
    for writer in 0..writers {
        let (servers, stop) = (servers.clone(), Arc::clone(&stop));
        load.push(tokio::spawn(async move {
            write_until(backend, &servers, writer, &stop).await
        }));
    }
    let measured = floors(backend, servers, rounds, contenders, hold).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for writer in load {
        writer
            .await
            .map_err(|e| bench_error(format!("floor writer: {e}")))??;
    }
    measured
}

/// One client writing to a key of its own until `stop`.
async fn write_until(
    backend: Backend,
    servers: &Servers,
    writer: usize,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), LockError> {
    let running = || !stop.load(std::sync::atomic::Ordering::Relaxed);
    let key = format!(
        "/distlock-floor-writer-{}-{writer}",
        uuid::Uuid::new_v4().simple()
    );
    match (backend, servers.etcd.as_deref(), servers.zk.as_deref()) {
        (Backend::Etcd, Some(endpoint), _) => {
            let client = etcd_client::Client::connect([endpoint], None)
                .await
                .map_err(|e| floor_error(&e))?;
            let mut kv = client.kv_client();
            while running() {
                kv.put(key.as_str(), "", None)
                    .await
                    .map_err(|e| floor_error(&e))?;
                kv.delete(key.as_str(), None)
                    .await
                    .map_err(|e| floor_error(&e))?;
            }
        }
        (Backend::ZooKeeper, _, Some(zk)) => {
            let client = zookeeper_client::Client::connect(zk)
                .await
                .map_err(|e| floor_error(&e))?;
            let ephemeral = zookeeper_client::CreateMode::Ephemeral
                .with_acls(zookeeper_client::Acls::anyone_all());
            while running() {
                client
                    .create(&key, &[], &ephemeral)
                    .await
                    .map_err(|e| floor_error(&e))?;
                client
                    .delete(&key, None)
                    .await
                    .map_err(|e| floor_error(&e))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// How a floor is measured: rounds measured, unmeasured rounds before them, and the pause
/// before each.
#[derive(Debug, Clone, Copy)]
struct Rounds {
    measured: usize,
    warmup: usize,
    hold: Duration,
}

fn floor_error(error: &dyn std::fmt::Display) -> LockError {
    bench_error(format!("floor: {error}"))
}

/// ZooKeeper: a node deleted by one session, watched by another: delete → event, and
/// delete → event → list of the directory.
async fn zk_floors(
    servers: &Servers,
    rounds: Rounds,
    contenders: usize,
) -> Result<Floors, LockError> {
    let zk = servers
        .zk
        .as_deref()
        .ok_or_else(|| bench_error("no ZooKeeper server"))?;
    let connect = || async {
        zookeeper_client::Client::connect(zk)
            .await
            .map_err(|e| floor_error(&e))
    };
    let (a, b) = (connect().await?, connect().await?);
    let dir = format!("/distlock-floor-{}", uuid::Uuid::new_v4().simple());
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let ephemeral =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    a.create(&dir, &[], &persistent)
        .await
        .map_err(|e| floor_error(&e))?;
    let node = format!("{dir}/n");
    let mut physical = Vec::with_capacity(rounds.measured);
    let mut chain = Vec::with_capacity(rounds.measured);
    let measured = async {
        // The other waiters' nodes, which a list of the lock directory returns too.
        for filler in 1..contenders {
            a.create(&format!("{dir}/f{filler:010}"), &[], &ephemeral)
                .await
                .map_err(|e| floor_error(&e))?;
        }
        for round in 0..rounds.measured + rounds.warmup {
            a.create(&node, &[], &ephemeral)
                .await
                .map_err(|e| floor_error(&e))?;
            // On an ensemble the watcher's member may not have applied the create yet.
            b.sync(&node).await.map_err(|e| floor_error(&e))?;
            let (_, _, watcher) = b
                .get_and_watch_data(&node)
                .await
                .map_err(|e| floor_error(&e))?;
            hold_for(rounds.hold).await;
            let started = Instant::now();
            a.delete(&node, None).await.map_err(|e| floor_error(&e))?;
            watcher.changed().await;
            let event = started.elapsed();
            b.list_children(&dir).await.map_err(|e| floor_error(&e))?;
            if round >= rounds.warmup {
                physical.push(event);
                chain.push(started.elapsed());
            }
        }
        Ok::<(), LockError>(())
    }
    .await;
    // The persistent directory goes whatever happened (its children first).
    let _ = a.delete(&node, None).await;
    for filler in 1..contenders {
        let _ = a.delete(&format!("{dir}/f{filler:010}"), None).await;
    }
    let _ = a.delete(&dir, None).await;
    measured?;
    Ok(Floors {
        chain_p50_us: quantile_us(&mut chain, 0.5),
        physical_p50_us: quantile_us(&mut physical, 0.5),
    })
}

/// etcd: a key deleted by one client, watched by another from the store's present (a write
/// applied while the watch is made can still leave it behind the store, rarely: that round
/// then waits for etcd's 100 ms catch-up, which the median does not see):
/// delete → event, and delete → event → a look (own key and the key before it, in one
/// transaction) at the directory.
async fn etcd_floors(
    servers: &Servers,
    rounds: Rounds,
    contenders: usize,
) -> Result<Floors, LockError> {
    let endpoint = servers
        .etcd
        .as_deref()
        .ok_or_else(|| bench_error("no etcd server"))?;
    let connect = || async {
        etcd_client::Client::connect([endpoint], None)
            .await
            .map_err(|e| floor_error(&e))
    };
    let (a, b) = (connect().await?, connect().await?);
    let (mut writer, mut reader, mut watches) = (a.kv_client(), b.kv_client(), b.watch_client());
    let dir = format!("/distlock-floor-{}/", uuid::Uuid::new_v4().simple());
    let mut physical = Vec::with_capacity(rounds.measured);
    let mut chain = Vec::with_capacity(rounds.measured);
    let measured = async {
        // The other waiters' keys, which the look's range runs over too.
        for filler in 1..contenders {
            writer
                .put(format!("{dir}f{filler:010}"), "", None)
                .await
                .map_err(|e| floor_error(&e))?;
        }
        let node = format!("{dir}n");
        for round in 0..rounds.measured + rounds.warmup {
            let put = writer
                .put(node.as_str(), "", None)
                .await
                .map_err(|e| floor_error(&e))?;
            let revision = put.header().map_or(0, |header| header.revision());
            // From the store's present (no start revision), as the lock's own watches are
            // opened: a watch from `revision + 1` that another client's write overtook would
            // wait for etcd's 100 ms catch-up loop.
            let (_watcher, mut stream) = watches
                .watch(node.as_str(), None)
                .await
                .map_err(|e| floor_error(&e))?;
            hold_for(rounds.hold).await;
            let started = Instant::now();
            writer
                .delete(node.as_str(), None)
                .await
                .map_err(|e| floor_error(&e))?;
            loop {
                let answer = stream.message().await.map_err(|e| floor_error(&e))?;
                match answer {
                    Some(answer) if !answer.events().is_empty() => break,
                    Some(_) => {}
                    None => return Err(bench_error("floor: the watch ended")),
                }
            }
            let event = started.elapsed();
            let before = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(revision)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1)
                .with_keys_only();
            let look = Txn::new().and_then([
                TxnOp::get(node.as_str(), Some(GetOptions::new().with_keys_only())),
                TxnOp::get(dir.as_str(), Some(before)),
            ]);
            reader.txn(look).await.map_err(|e| floor_error(&e))?;
            if round >= rounds.warmup {
                physical.push(event);
                chain.push(started.elapsed());
            }
        }
        Ok::<(), LockError>(())
    }
    .await;
    let _ = writer
        .delete(dir.as_str(), Some(DeleteOptions::new().with_prefix()))
        .await;
    measured?;
    Ok(Floors {
        chain_p50_us: quantile_us(&mut chain, 0.5),
        physical_p50_us: quantile_us(&mut physical, 0.5),
    })
}

/// A connection to the PostgreSQL at `url`, its driver in a task of its own.
///
/// # Errors
///
/// Connection errors.
pub async fn pg_connect(url: &str) -> Result<tokio_postgres::Client, LockError> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| bench_error(format!("connecting to PostgreSQL: {e}")))?;
    tokio::spawn(connection);
    Ok(client)
}

/// The server processes that hold or await an advisory lock: of the distlock mutex whose
/// key text is `key` (`{schema}/{name}`), or of any key.
///
/// # Errors
///
/// Connection errors.
pub async fn pg_advisory_holders(
    client: &tokio_postgres::Client,
    key: Option<&str>,
) -> Result<Vec<i32>, LockError> {
    let rows = client
        .query(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND ($1::text IS NULL OR \
             (objsubid = 1 AND classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid \
             AND objid = (hashtextextended($1, 0) & 4294967295)::oid))",
            &[&key],
        )
        .await
        .map_err(|e| bench_error(format!("reading pg_locks: {e}")))?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// PostgreSQL: one connection holds an advisory lock, another waits for it in the server's
/// queue: unlock → the waiter's statement returns (physical), and the same with the
/// waiter's statement raising a counter row as it is granted, as distlock's does (chain).
/// Statements are sent as distlock sends them: unnamed, one round trip each.
async fn pg_floors(servers: &Servers, rounds: Rounds) -> Result<Floors, LockError> {
    use tokio_postgres::types::Type;
    let url = servers
        .postgres
        .as_deref()
        .ok_or_else(|| bench_error("no PostgreSQL server"))?;
    let (holder, waiter, watcher) = (
        pg_connect(url).await?,
        Arc::new(pg_connect(url).await?),
        pg_connect(url).await?,
    );
    let failed = |e: tokio_postgres::Error| floor_error(&e);
    let waiter_pid: i32 = waiter
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .map_err(failed)?
        .get(0);
    waiter
        .batch_execute(
            "CREATE TEMP TABLE distlock_floor (name text PRIMARY KEY, token bigint NOT NULL)",
        )
        .await
        .map_err(failed)?;
    let key: i64 = fastrand::i64(..);
    let physical_statement = "SELECT pg_advisory_lock($1)";
    let chain_statement = "INSERT INTO distlock_floor AS f (name, token) SELECT 'n', 1 FROM \
                           (SELECT pg_advisory_lock($1)) AS granted ON CONFLICT (name) DO \
                           UPDATE SET token = f.token + 1 RETURNING token";
    let mut medians = Vec::new();
    for statement in [physical_statement, chain_statement] {
        let mut samples = Vec::with_capacity(rounds.measured);
        for round in 0..rounds.measured + rounds.warmup {
            holder
                .query_typed("SELECT pg_advisory_lock($1)", &[(&key, Type::INT8)])
                .await
                .map_err(failed)?;
            let waiting = tokio::spawn({
                let waiter = Arc::clone(&waiter);
                async move {
                    let answer = waiter.query_typed(statement, &[(&key, Type::INT8)]).await;
                    answer.map(|_| Instant::now())
                }
            });
            // The round starts once the waiter is queued on the server.
            let queued = Instant::now() + Duration::from_secs(5);
            loop {
                let row = watcher
                    .query_one(
                        "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted",
                        &[&waiter_pid],
                    )
                    .await
                    .map_err(failed)?;
                if row.get::<_, i64>(0) > 0 {
                    break;
                }
                if Instant::now() > queued {
                    return Err(bench_error("floor: the waiter did not queue"));
                }
                tokio::task::yield_now().await;
            }
            hold_for(rounds.hold).await;
            let started = Instant::now();
            holder
                .query_typed("SELECT pg_advisory_unlock($1)", &[(&key, Type::INT8)])
                .await
                .map_err(failed)?;
            let granted = waiting
                .await
                .map_err(|e| bench_error(format!("floor: {e}")))?
                .map_err(failed)?;
            if round >= rounds.warmup {
                samples.push(granted.saturating_duration_since(started));
            }
            waiter
                .query_typed("SELECT pg_advisory_unlock($1)", &[(&key, Type::INT8)])
                .await
                .map_err(failed)?;
        }
        medians.push(quantile_us(&mut samples, 0.5));
    }
    Ok(Floors {
        physical_p50_us: medians[0],
        chain_p50_us: medians[1],
    })
}

/// Redis: one connection blocked in `BLPOP` on a list, in a task that lives through every
/// round (warm); another runs a script that pushes onto the list, as a release hands the
/// lock on. Each round starts once the server shows the popper blocked. On a cluster, both
/// are connected to the primary serving the list's slot.
async fn redis_floor(servers: &Servers, rounds: Rounds) -> Result<f64, LockError> {
    let list = format!("distlock-floor-{}", uuid::Uuid::new_v4().simple());
    let mut serving = None;
    for client in servers.redis_servers().await? {
        let mut pusher = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| floor_error(&e))?;
        // Another primary answers MOVED.
        let asked: redis::RedisResult<bool> = pusher.exists(&list).await;
        if asked.is_ok() {
            serving = Some((client, pusher));
            break;
        }
    }
    let (client, mut pusher) =
        serving.ok_or_else(|| bench_error("floor: no Redis server serves the floor's list"))?;
    let mut popper = client
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .map_err(|e| floor_error(&e))?;
    let popper_id: u64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut popper)
        .await
        .map_err(|e| floor_error(&e))?;
    let push = redis::Script::new("return redis.call('RPUSH', KEYS[1], ARGV[1])");
    let (popped_tx, mut popped) = tokio::sync::mpsc::unbounded_channel();
    let popping = tokio::spawn({
        let list = list.clone();
        async move {
            loop {
                let answer: Result<Option<(String, String)>, _> = popper.blpop(&list, 10.0).await;
                if !matches!(answer, Ok(Some(_))) || popped_tx.send(Instant::now()).is_err() {
                    return;
                }
            }
        }
    });
    let mut samples = Vec::with_capacity(rounds.measured);
    let measured = async {
        for round in 0..rounds.measured + rounds.warmup {
            // The popper is blocked on the server: the round measures the push's path only.
            let blocked = Instant::now() + Duration::from_secs(5);
            loop {
                let listed: String = redis::cmd("CLIENT")
                    .arg("LIST")
                    .arg("ID")
                    .arg(popper_id)
                    .query_async(&mut pusher)
                    .await
                    .map_err(|e| floor_error(&e))?;
                if listed.split_whitespace().any(|field| {
                    field
                        .strip_prefix("flags=")
                        .is_some_and(|f| f.contains('b'))
                }) {
                    break;
                }
                if Instant::now() > blocked {
                    return Err(bench_error("floor: the popper did not block"));
                }
                tokio::task::yield_now().await;
            }
            hold_for(rounds.hold).await;
            let started = Instant::now();
            let _: u64 = push
                .key(&list)
                .arg("x")
                .invoke_async(&mut pusher)
                .await
                .map_err(|e| floor_error(&e))?;
            let Some(at) = popped.recv().await else {
                return Err(bench_error("floor: the popper stopped"));
            };
            if round >= rounds.warmup {
                samples.push(at.saturating_duration_since(started));
            }
        }
        Ok(())
    }
    .await;
    popping.abort();
    let _: Result<u64, _> = pusher.del(&list).await;
    measured?;
    Ok(quantile_us(&mut samples, 0.5))
}
