//! A whole chaos run: real servers (`servers`), the fenced register, client processes
//! behind fault proxies of their own, or tasks for the in-process memory backend
//! (`slots`), the nemesis following its plan, and the checker at the end.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use distlock::etcd::EtcdLockProvider;
use distlock::redis::RedisLockProvider;
use distlock::zookeeper::ZkLockProvider;
use distlock::{BackendConfig, LockError};
use lock_testbed::proxy::FaultProxy;
use lock_testbed::servers::{ServerError, ServerMode};
use serde::{Deserialize, Serialize};
use tokio::process::Command;
use tokio::time::Instant;

use crate::checker::{Check, Report, Targets};
use crate::client::{ClientOptions, now_ns};
use crate::history::{Event, parse_lines};
use crate::register::{RegisterServer, RegisterWrite};
use crate::schedule::{Fault, FaultKind, Plan, PlanOptions};
use crate::timeline::Timeline;

mod servers;
mod slots;

use servers::Servers;
use slots::{Body, Slot, TaskClient};

/// The backend a run hits, with its servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Backend {
    /// A three-member ZooKeeper ensemble.
    Zookeeper,
    /// One Redis server.
    Redis,
    /// A Redis primary with two replicas under three sentinels, reached through the
    /// sentinels (`redis+sentinel://`).
    RedisSentinel,
    /// A Redis Cluster of three primaries with a replica each, reached through the
    /// cluster's own redirections (`redis+cluster://`).
    RedisCluster,
    /// Redlock over three Redis servers.
    Redlock,
    /// A three-member etcd cluster.
    Etcd,
    /// The in-memory reference backend: its server and its clients are in the run's own
    /// process, the clients as tasks that are frozen and killed in place.
    Memory,
}

impl Backend {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Zookeeper => "zookeeper",
            Backend::Redis => "redis",
            Backend::RedisSentinel => "redis-sentinel",
            Backend::RedisCluster => "redis-cluster",
            Backend::Redlock => "redlock",
            Backend::Etcd => "etcd",
            Backend::Memory => "memory",
        }
    }

    /// The clients' session timeout or lease. The memory backend has no timeouts: the run
    /// ends a frozen client's session this long into the freeze, as a server would.
    pub fn session(self) -> Duration {
        match self {
            Backend::Zookeeper | Backend::Etcd => Duration::from_secs(4),
            Backend::Redis
            | Backend::RedisSentinel
            | Backend::RedisCluster
            | Backend::Redlock
            | Backend::Memory => Duration::from_secs(2),
        }
    }

    /// The faults it is put through by default with its servers where `mode` says: every
    /// kind its servers allow. Member partitions need an ensemble in containers; the
    /// memory backend, without servers or a network, gets client freezes and kills.
    pub fn faults(self, mode: ServerMode) -> Vec<FaultKind> {
        if self == Backend::Memory {
            return vec![FaultKind::ClientFreeze, FaultKind::ClientKill];
        }
        if matches!(self, Backend::RedisSentinel | Backend::RedisCluster) {
            // The clients reach the data servers at the addresses the sentinels or the
            // cluster announce, not through their proxies: they cannot be cut off.
            return vec![
                FaultKind::ServerPause,
                FaultKind::ServerKill,
                FaultKind::LeaderKill,
                FaultKind::Failover,
                FaultKind::ClientFreeze,
                FaultKind::ClientKill,
            ];
        }
        let mut kinds = vec![
            FaultKind::ServerPause,
            FaultKind::ServerKill,
            FaultKind::ClientFreeze,
            FaultKind::ClientKill,
            FaultKind::Partition,
        ];
        if matches!(self, Backend::Zookeeper | Backend::Etcd) {
            kinds.push(FaultKind::LeaderKill);
            if mode == ServerMode::Containers {
                kinds.push(FaultKind::MemberPartition);
            }
        }
        kinds
    }

    /// What it is held to: a consensus backend (and the memory backend, the contract's
    /// reference) to no overlap beyond its session (the documented lost-signal bound) and
    /// no lost update; Redis and Redlock, whose leases can run out under a paused holder, to
    /// fencing: no stale write accepted. Under Sentinel or on a cluster, whose replication
    /// is asynchronous, a failover can grant a held lock again and roll the fencing counter
    /// back: double grants and token regressions are measured, not judged.
    pub fn targets(self) -> Targets {
        match self {
            Backend::Zookeeper | Backend::Etcd | Backend::Memory => {
                Targets::consensus(self.session())
            }
            Backend::Redis | Backend::Redlock => Targets::lease(),
            Backend::RedisSentinel | Backend::RedisCluster => Targets::best_effort(),
        }
    }

    fn members(self) -> usize {
        match self {
            Backend::Memory => 0,
            Backend::Redis => 1,
            Backend::Zookeeper | Backend::Etcd | Backend::Redlock | Backend::RedisSentinel => 3,
            Backend::RedisCluster => 6,
        }
    }
}

/// What a run does.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunOptions {
    /// The backend.
    pub backend: Backend,
    /// How long the clients run.
    pub duration: Duration,
    /// How many clients (processes; tasks for the memory backend).
    pub clients: u32,
    /// The nemesis's seed.
    pub seed: u64,
    /// The faults to draw from (empty: the backend's own list).
    pub faults: Vec<FaultKind>,
    /// How long a client holds the lock after its write.
    pub hold: Duration,
    /// Where the servers run: processes, or containers (an ensemble whose members can be
    /// cut off from each other).
    pub servers: ServerMode,
    /// The `chaos` executable, run as `chaos client …` for each client.
    pub executable: PathBuf,
    /// For Redis: how many replicas must acknowledge a grant or renewal (`wait_replicas`,
    /// with a `wait_timeout` of 100 ms); `None` for none.
    pub wait_replicas: Option<u32>,
    /// Where histories and the report go.
    pub out: PathBuf,
}

impl RunOptions {
    /// A run of `backend` for `duration` with `clients` clients and the nemesis seeded with
    /// `seed`, every fault the backend allows, holds of 5 ms; clients are `executable client`.
    pub fn new(
        backend: Backend,
        duration: Duration,
        clients: u32,
        seed: u64,
        executable: impl Into<PathBuf>,
        out: impl Into<PathBuf>,
    ) -> Self {
        RunOptions {
            backend,
            duration,
            clients,
            seed,
            faults: Vec::new(),
            hold: Duration::from_millis(5),
            servers: ServerMode::Processes,
            executable: executable.into(),
            wait_replicas: None,
            out: out.into(),
        }
    }

    /// Sets [`faults`](Self::faults).
    #[must_use]
    pub fn with_faults(mut self, faults: Vec<FaultKind>) -> Self {
        self.faults = faults;
        self
    }

    /// Sets [`hold`](Self::hold).
    #[must_use]
    pub fn with_hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    /// Sets [`servers`](Self::servers).
    #[must_use]
    pub fn with_servers(mut self, servers: ServerMode) -> Self {
        self.servers = servers;
        self
    }

    /// Sets [`wait_replicas`](Self::wait_replicas).
    #[must_use]
    pub fn with_wait_replicas(mut self, replicas: Option<u32>) -> Self {
        self.wait_replicas = replicas;
        self
    }

    /// The clients' URL of the backend on `hosts` (their proxies, or the servers).
    fn url(&self, hosts: &[SocketAddr]) -> String {
        let mut url = url(self.backend, hosts);
        if let Some(replicas) = self.wait_replicas {
            url.push_str(&format!("&wait_replicas={replicas}&wait_timeout=100ms"));
        }
        url
    }
}

/// What a run found.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Outcome {
    /// The backend.
    pub backend: Backend,
    /// The seed.
    pub seed: u64,
    /// When the run began and ended, on the clients' clock (the faults' times count from
    /// the beginning).
    pub began_ns: u64,
    /// See [`began_ns`](Self::began_ns).
    pub ended_ns: u64,
    /// How many client slots the run had.
    #[serde(default)]
    pub clients: u32,
    /// The faults as injected, with their actual times.
    pub faults: Vec<Fault>,
    /// The checker's report.
    pub report: Report,
    /// What the report breaks of the backend's targets.
    pub violations: Vec<String>,
}

impl Outcome {
    /// A table of the report's figures, and the violations.
    pub fn summary(&self) -> String {
        let r = &self.report;
        let rows = [
            ("backend", self.backend.as_str().to_owned()),
            ("seed", self.seed.to_string()),
            ("operations", r.operations.to_string()),
            ("grants", r.grants.to_string()),
            ("faults injected", r.faults.to_string()),
            ("writes accepted", r.writes_accepted.to_string()),
            ("stale writes rejected", r.writes_rejected.to_string()),
            ("stale writes accepted", r.stale_writes_accepted.to_string()),
            ("tokens granted twice", r.tokens_granted_twice.to_string()),
            ("token regressions", r.token_regressions.to_string()),
            ("register faults", r.register_faults.to_string()),
            ("final value", r.final_value.to_string()),
            ("lost updates", r.lost_updates.to_string()),
            ("duplicated updates", r.duplicated_updates.to_string()),
            ("overlaps", r.overlaps.to_string()),
            (
                "longest overlap",
                match r.longest_overlap {
                    Some(o) => format!(
                        "{:.1} ms (clients {} then {}, {:.0} ms into the run)",
                        r.longest_overlap_ms, o.earlier, o.later, o.at_ms
                    ),
                    None => "none".to_owned(),
                },
            ),
            (
                "stalls after faults",
                format!(
                    "{} (longest recovery {:.0} ms)",
                    r.stalls, r.longest_recovery_ms
                ),
            ),
            (
                "clients without progress",
                format!("{:?}", r.clients_without_progress),
            ),
            ("residue", r.residue.to_string()),
        ];
        let mut text: String = rows
            .iter()
            .map(|(what, value)| format!("{what:<26} {value}\n"))
            .collect();
        if self.violations.is_empty() {
            text.push_str("verdict                    every target held\n");
        } else {
            for violation in &self.violations {
                text.push_str(&format!("violation                  {violation}\n"));
            }
        }
        text
    }
}

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A server would not start or obey.
    #[error("servers: {0}")]
    Server(#[from] ServerError),
    /// A file, a proxy or a client process failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The plan could not be drawn.
    #[error("plan: {0}")]
    Plan(#[from] crate::schedule::PlanError),
    /// A fault the backend's servers cannot be put through: a leader kill without an
    /// ensemble, a member partition without containers, any but client freezes and kills on
    /// the memory backend.
    #[error("{backend} cannot be put through {fault} here; it can be through: {allowed}")]
    UnsupportedFault {
        /// The backend, and where its servers run.
        backend: String,
        /// The fault asked for.
        fault: &'static str,
        /// The faults it can be put through, comma-separated.
        allowed: String,
    },
    /// The backend refused the residue check.
    #[error("residue check: {0}")]
    Lock(#[from] LockError),
    /// A history file is not made of events.
    #[error("history {file}: line {line}: {error}")]
    History {
        /// The file.
        file: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        error: serde_json::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// How soon after a fault heals the lock must serve someone again: the session or lease
/// (a dead holder's entry lasts that long), an election, a restart, with room for a
/// loaded machine.
fn progress_bound(backend: Backend) -> Duration {
    backend.session() * 3
}

/// The name the sentinels of a [`Backend::RedisSentinel`] run know the primary by.
const SENTINEL_SERVICE: &str = "distlock";

/// The URL of `backend` on `hosts`; a memory backend's clients get their providers from the
/// run's server instead.
fn url(backend: Backend, hosts: &[SocketAddr]) -> String {
    let hosts: Vec<String> = hosts.iter().map(ToString::to_string).collect();
    let hosts = hosts.join(",");
    let session = humantime::format_duration(backend.session());
    match backend {
        Backend::Zookeeper => {
            format!("zk://{hosts}?session_timeout={session}&strategy=predecessor")
        }
        Backend::Redis => format!("redis://{hosts}?ttl={session}&strategy=queue&timeout=1s"),
        Backend::RedisSentinel => format!(
            "redis+sentinel://{hosts}/{SENTINEL_SERVICE}?ttl={session}&strategy=queue&timeout=1s"
        ),
        Backend::RedisCluster => {
            format!("redis+cluster://{hosts}?ttl={session}&strategy=queue&timeout=1s")
        }
        Backend::Redlock => format!("redlock://{hosts}?ttl={session}&timeout=500ms"),
        Backend::Etcd => {
            format!("etcd://{hosts}?lease_ttl={session}&strategy=predecessor&timeout=1s")
        }
        Backend::Memory => "memory://".to_owned(),
    }
}

/// Nodes or keys of the lock `name` left on the servers.
async fn residue(servers: &Servers, backend: Backend, name: &str) -> Result<usize, LockError> {
    if let Servers::Memory(server) = servers {
        let (holders, waiters) = server.provider().entries(name)?;
        return Ok(holders + waiters);
    }
    let hosts = servers.addresses();
    let per_server: Vec<String> = match backend {
        Backend::Redlock => hosts
            .iter()
            .map(|host| url(Backend::Redis, &[*host]))
            .collect(),
        _ => vec![url(backend, &hosts)],
    };
    let mut left = 0;
    for url in per_server {
        left += match BackendConfig::from_url(&url)? {
            BackendConfig::ZooKeeper(config) => ZkLockProvider::connect(config)
                .await?
                .contenders(name)
                .await?
                .len(),
            BackendConfig::Redis(config) => {
                let holders = RedisLockProvider::connect(config)
                    .await?
                    .holders(name)
                    .await?;
                usize::from(holders.owner.is_some()) + holders.queue.len()
            }
            BackendConfig::Etcd(config) => EtcdLockProvider::connect(config)
                .await?
                .contenders(name)
                .await?
                .len(),
            other => {
                return Err(LockError::Unsupported {
                    backend: other.backend(),
                    what: "a chaos run".into(),
                });
            }
        };
    }
    Ok(left)
}

/// Everything a run drives.
struct Run<'o> {
    options: &'o RunOptions,
    servers: Servers,
    register: RegisterServer,
    slots: Vec<Slot>,
    name: String,
}

impl Run<'_> {
    fn spawn_client(&mut self, index: usize) -> Result<(), RunError> {
        let slot = &mut self.slots[index];
        slot.generation += 1;
        let hosts: Vec<SocketAddr> = slot.proxies.iter().map(|proxy| proxy.address()).collect();
        let out = &self.options.out;
        let history = out.join(format!("client-{index}-{}.jsonl", slot.generation));
        let client = u32::try_from(index).unwrap_or(u32::MAX);
        if let Servers::Memory(server) = &self.servers {
            let options = ClientOptions::new(
                client,
                url(Backend::Memory, &[]),
                &self.name,
                self.register.address(),
                history,
            )
            .with_hold(self.options.hold);
            slot.client = Some(Body::Task(TaskClient::spawn(options, server.provider())));
            return Ok(());
        }
        let log =
            std::fs::File::create(out.join(format!("client-{index}-{}.log", slot.generation)))
                .map_err(io("a client log"))?;
        let child = Command::new(&self.options.executable)
            .arg("client")
            .args(["--client", &client.to_string()])
            .args(["--url", &self.options.url(&hosts)])
            .args(["--name", &self.name])
            .args(["--register", &self.register.address().to_string()])
            .args(["--hold-ms", &self.options.hold.as_millis().to_string()])
            .arg("--history")
            .arg(&history)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(io("a client process"))?;
        slot.client = Some(Body::Process(child));
        Ok(())
    }

    /// Injects `fault`; returns the fault as injected (a leader kill names the member it
    /// killed), or `None` when it could not be (no leader, a server not running).
    async fn inject(&mut self, fault: &Fault) -> Option<Fault> {
        let target = fault.target as usize;
        let mut injected = *fault;
        let done = match fault.kind {
            FaultKind::ServerPause => self.servers.pause(target, true).await,
            FaultKind::ServerKill => self.servers.kill(target).await,
            FaultKind::LeaderKill => {
                let leader = self.servers.leader(&self.name).await?;
                injected.target = u32::try_from(leader).ok()?;
                self.servers.kill(leader).await
            }
            FaultKind::MemberPartition => self.servers.partition(target, true).await,
            FaultKind::Failover => self.servers.failover(&self.name).await.map(|old| {
                injected.target = u32::try_from(old).unwrap_or(u32::MAX);
            }),
            FaultKind::ClientFreeze => {
                self.slots[target].freeze(true, self.options.backend.session());
                Ok(())
            }
            FaultKind::ClientKill => {
                self.slots[target].kill().await;
                Ok(())
            }
            FaultKind::Partition => {
                self.slots[target].cut(true);
                Ok(())
            }
        };
        match done {
            Ok(()) => Some(injected),
            Err(error) => {
                tracing::warn!(?fault, %error, "chaos: fault not injected");
                None
            }
        }
    }

    /// Heals `fault` as injected, and after a server fault waits until the servers are whole
    /// again (an ensemble may elect or catch up for seconds after its member is back): a
    /// fault ends when the servers could serve, and the clients' recovery is timed from
    /// there. A server that will not come back is tried again (its restart is bounded); one
    /// that never does is reported and the run goes on.
    async fn heal(&mut self, fault: &Fault) -> Result<(), RunError> {
        let target = fault.target as usize;
        match fault.kind {
            FaultKind::ServerPause => self.servers.pause(target, false).await?,
            FaultKind::ServerKill | FaultKind::LeaderKill => {
                for attempt in 1..=3 {
                    match self.servers.restart(target).await {
                        Ok(()) => break,
                        Err(error) => {
                            tracing::warn!(?fault, %error, attempt, "chaos: a restart failed");
                        }
                    }
                }
            }
            FaultKind::MemberPartition => {
                for attempt in 1..=3 {
                    match self.servers.partition(target, false).await {
                        Ok(()) => break,
                        Err(error) => {
                            tracing::warn!(?fault, %error, attempt, "chaos: a heal failed");
                        }
                    }
                }
            }
            FaultKind::Failover => {
                if let Err(error) = self.servers.wait_until_replica(target).await {
                    tracing::warn!(?fault, %error, "chaos: the old primary was not demoted");
                }
            }
            FaultKind::ClientFreeze => {
                self.slots[target].freeze(false, self.options.backend.session());
            }
            FaultKind::ClientKill => self.spawn_client(target)?,
            FaultKind::Partition => self.slots[target].cut(false),
        }
        if matches!(
            fault.kind,
            FaultKind::ServerPause
                | FaultKind::ServerKill
                | FaultKind::LeaderKill
                | FaultKind::MemberPartition
        ) && let Err(error) = self.servers.wait_until_whole().await
        {
            tracing::warn!(?fault, %error, "chaos: the servers are not whole again");
        }
        Ok(())
    }
}

/// Runs a whole chaos run and writes the histories, `register.json`, `report.json` and
/// `timeline.svg` into `options.out`.
///
/// # Errors
///
/// As [`RunError`]: the run could not be made. What the run found, good or bad, is the
/// [`Outcome`].
pub async fn run(options: &RunOptions) -> Result<Outcome, RunError> {
    let backend = options.backend;
    let allowed = backend.faults(options.servers);
    if let Some(fault) = options.faults.iter().find(|kind| !allowed.contains(kind)) {
        let names: Vec<&str> = allowed.iter().map(|kind| kind.as_str()).collect();
        return Err(RunError::UnsupportedFault {
            backend: match options.servers {
                ServerMode::Containers => format!("{} in containers", backend.as_str()),
                _ => backend.as_str().to_owned(),
            },
            fault: fault.as_str(),
            allowed: names.join(", "),
        });
    }
    prepare(&options.out)?;
    let servers = Servers::start(backend, options.servers).await?;
    let upstream = servers.addresses();
    let mut slots = Vec::new();
    for _ in 0..options.clients {
        let proxies = upstream
            .iter()
            .map(|&address| FaultProxy::start(address))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io("a fault proxy"))?;
        slots.push(Slot::new(proxies));
    }
    let register = RegisterServer::start().await.map_err(io("the register"))?;
    let mut run = Run {
        options,
        servers,
        register,
        slots,
        name: format!("chaos-{}", options.seed),
    };
    let kinds = if options.faults.is_empty() {
        allowed
    } else {
        options.faults.clone()
    };
    let mut plan_options = PlanOptions::new(
        options.seed,
        options.duration,
        kinds,
        options.clients,
        u32::try_from(backend.members()).unwrap_or(0),
    );
    plan_options.freeze_at_least = backend.session() + Duration::from_secs(1);
    // Past failure detection: ZooKeeper's syncLimit (5 ticks of 500 ms), etcd's election
    // timeout (100 ms on the test servers).
    plan_options.member_partition_at_least = Duration::from_secs(3);
    if matches!(backend, Backend::RedisSentinel | Backend::RedisCluster) {
        // The sentinels fail a primary over at most once in twice their failover timeout
        // (2 s): a primary killed sooner would stay without a successor. A cluster's
        // replica waits for its data to settle the same way.
        plan_options.quiet = (Duration::from_secs(2), Duration::from_secs(3));
    }
    let plan = Plan::draw(&plan_options)?;

    let began_ns = now_ns();
    let began = Instant::now();
    for index in 0..run.slots.len() {
        run.spawn_client(index)?;
    }
    // The plan's times are targets: a restart that takes longer pushes the next fault back
    // rather than eating its quiet time, and a fault that no longer fits before the settle
    // time is left out. The clients run on for the progress bound after the last heal.
    let quiet = plan_options.quiet.0;
    let last_start = began + options.duration.saturating_sub(plan_options.settle);
    let mut injected = Vec::new();
    let mut healed = began;
    for fault in &plan.faults {
        let due = (began + Duration::from_millis(fault.start_ms)).max(healed + quiet);
        let length = Duration::from_millis(fault.duration_ms);
        if due + length > last_start {
            break;
        }
        tokio::time::sleep_until(due).await;
        let start_ns = now_ns();
        let Some(fault) = run.inject(fault).await else {
            continue;
        };
        tokio::time::sleep_until(due + length).await;
        run.heal(&fault).await?;
        healed = Instant::now();
        let end_ns = now_ns();
        injected.push(Fault {
            start_ms: (start_ns - began_ns) / 1_000_000,
            duration_ms: (end_ns - start_ns).div_ceil(1_000_000),
            ..fault
        });
        tracing::info!(?fault, "chaos: fault healed");
    }
    tokio::time::sleep_until((began + options.duration).max(healed + progress_bound(backend)))
        .await;

    // The clients finish their turn and leave; the ones that do not are killed.
    run.slots.iter().for_each(Slot::ask_to_leave);
    let leave_by = Instant::now() + backend.session() * 2;
    for slot in &mut run.slots {
        slot.wait_until_left(leave_by).await;
    }
    let ended_ns = now_ns();

    // What killed clients left behind goes with their sessions or leases.
    let settle = Instant::now() + backend.session() * 2 + Duration::from_secs(5);
    let left = loop {
        match residue(&run.servers, backend, &run.name).await {
            Ok(0) => break 0,
            Ok(left) if Instant::now() >= settle => break left,
            Err(error) if Instant::now() >= settle => return Err(error.into()),
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, "chaos: residue check failed; asking again"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    let events = read_histories(&options.out)?;
    let register = run.register.snapshot();
    let register_log = serde_json::to_string(register.log()).unwrap_or_default();
    std::fs::write(options.out.join("register.json"), register_log).map_err(io("register.json"))?;
    let mut outcome = Outcome {
        backend,
        seed: options.seed,
        began_ns,
        ended_ns,
        clients: options.clients,
        faults: injected,
        report: Report::default(),
        violations: Vec::new(),
    };
    outcome.report.final_value = register.value();
    outcome.report.residue = left;
    finish(&mut outcome, &options.out, &events, register.log())?;
    let json = serde_json::to_string_pretty(&outcome).unwrap_or_default();
    std::fs::write(options.out.join("report.json"), json).map_err(io("report.json"))?;
    Ok(outcome)
}

/// Checks the history into `outcome` (whose final value and residue are already known) and
/// draws `timeline.svg` into `dir`.
fn finish(
    outcome: &mut Outcome,
    dir: &Path,
    events: &[Event],
    writes: &[RegisterWrite],
) -> Result<(), RunError> {
    let check = Check {
        events,
        writes,
        final_value: outcome.report.final_value,
        faults: &outcome.faults,
        began_ns: outcome.began_ns,
        ended_ns: outcome.ended_ns,
        progress_bound: progress_bound(outcome.backend),
        clients: outcome.clients,
        residue: outcome.report.residue,
    };
    let report = check.run();
    let clients = events
        .iter()
        .map(|event| event.client + 1)
        .max()
        .unwrap_or(0);
    let title = format!(
        "{}, seed {}: {} faults, {} grants",
        outcome.backend.as_str(),
        outcome.seed,
        report.faults,
        report.grants
    );
    let svg = Timeline {
        title: &title,
        events,
        beliefs: &check.beliefs(),
        faults: &outcome.faults,
        began_ns: outcome.began_ns,
        ended_ns: outcome.ended_ns,
        clients,
    }
    .svg()
    .map_err(|error| RunError::Io {
        what: "timeline.svg".into(),
        source: std::io::Error::other(error),
    })?;
    std::fs::write(dir.join("timeline.svg"), svg).map_err(io("timeline.svg"))?;
    outcome.violations = report.violations(&outcome.backend.targets());
    outcome.report = report;
    Ok(())
}

/// Checks a finished run's directory again, from its histories, `register.json` and
/// `report.json`: the checker's verdict without the run (and `timeline.svg` drawn again).
///
/// # Errors
///
/// When a file is missing or not what the run writes.
pub fn check_again(dir: &Path) -> Result<Outcome, RunError> {
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).map_err(io(file.to_owned()));
    let json = |file: &str, error: serde_json::Error| RunError::History {
        file: dir.join(file),
        line: error.line(),
        error,
    };
    let mut outcome: Outcome =
        serde_json::from_str(&read("report.json")?).map_err(|e| json("report.json", e))?;
    let writes: Vec<RegisterWrite> =
        serde_json::from_str(&read("register.json")?).map_err(|e| json("register.json", e))?;
    let events = read_histories(dir)?;
    finish(&mut outcome, dir, &events, &writes)?;
    Ok(outcome)
}

/// Makes `dir`, or empties it of an earlier run's files, whose histories would mix with
/// this run's.
fn prepare(dir: &Path) -> Result<(), RunError> {
    std::fs::create_dir_all(dir).map_err(io("the output directory"))?;
    for entry in std::fs::read_dir(dir).map_err(io("the output directory"))? {
        let path = entry.map_err(io("the output directory"))?.path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("");
        let ours = name.starts_with("client-")
            || ["report.json", "register.json", "timeline.svg"].contains(&name);
        if ours {
            std::fs::remove_file(&path).map_err(io("an earlier run's file"))?;
        }
    }
    Ok(())
}

/// Every client's events, from the `client-*.jsonl` files in `dir`.
fn read_histories(dir: &Path) -> Result<Vec<Event>, RunError> {
    let mut events = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("the output directory"))? {
        let path = entry.map_err(io("the output directory"))?.path();
        if path.extension().is_none_or(|ext| ext != "jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(io("a history"))?;
        // A client killed in the middle of a line leaves a partial last line.
        let whole = text.rfind('\n').map_or("", |end| &text[..=end]);
        events.extend(
            parse_lines(whole).map_err(|(line, error)| RunError::History {
                file: path.clone(),
                line,
                error,
            })?,
        );
    }
    Ok(events)
}
