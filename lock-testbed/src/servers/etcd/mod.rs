//! etcd 3.4 from the Debian package: a single-member cluster, or a cluster of several.

#[cfg(feature = "testcontainers")]
mod container;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tracing::info;

use super::probe::{Probe, http_get};
use super::process::{
    Instance, Launch, ScratchDir, free_port, loopback, require_program, retry_port_clash,
};
use super::target::{Target, TargetServer};
use super::{DEFAULT_STARTUP_TIMEOUT, LocalServer, ServerError, ServerProcess};

const SERVER: &str = "etcd";

/// The environment variable naming an external etcd (an endpoint such as
/// `http://127.0.0.1:2379`) to use instead of starting one.
pub const ETCD_ENV: &str = "LOCK_TEST_ETCD";

/// How to run etcd.
///
/// Build it from [`EtcdOptions::default`] and the `with_*` methods (or by assigning fields).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// The `etcd` executable: `etcd` (looked up in `PATH`) by default.
    pub binary: PathBuf,
    /// `--heartbeat-interval`: 10 ms by default.
    pub heartbeat_interval: Duration,
    /// `--election-timeout`: 100 ms by default.
    pub election_timeout: Duration,
    /// Extra command-line arguments, appended last.
    pub extra_args: Vec<String>,
    /// The bound on start-up and restart: [`DEFAULT_STARTUP_TIMEOUT`] by default.
    pub startup_timeout: Duration,
    /// A certificate and its key (PEM files): the server also serves clients over TLS, on a
    /// port of its own ([`EtcdServer::tls_endpoint`]). Processes only.
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("etcd"),
            heartbeat_interval: Duration::from_millis(10),
            election_timeout: Duration::from_millis(100),
            extra_args: Vec::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            tls: None,
        }
    }
}

impl EtcdOptions {
    /// Sets [`binary`](Self::binary).
    pub fn with_binary(mut self, binary: impl Into<PathBuf>) -> Self {
        self.binary = binary.into();
        self
    }

    /// Adds a command-line argument (see [`extra_args`](Self::extra_args)).
    pub fn with_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Sets [`startup_timeout`](Self::startup_timeout).
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Sets [`tls`](Self::tls): the server's certificate and key.
    pub fn with_tls(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls = Some((cert.into(), key.into()));
        self
    }
}

/// A single-member etcd cluster running as a child process on 127.0.0.1.
///
/// Its client address, pid, directory (data and log) and fault injection come from
/// [`LocalServer`]; a [`restart`](LocalServer::restart) keeps the ports and the data.
///
/// Dropping it kills the server (`SIGKILL` to its process group), reaps it and removes its
/// data directory.
#[derive(Debug)]
pub struct EtcdServer {
    process: ServerProcess,
    peer_port: u16,
    tls_port: Option<u16>,
}

impl EtcdServer {
    /// Starts etcd with [`EtcdOptions::default`]; see [`start_with`](Self::start_with).
    pub async fn start() -> Result<Self, ServerError> {
        Self::start_with(EtcdOptions::default()).await
    }

    /// Starts etcd on free client and peer ports and waits (bounded by
    /// [`EtcdOptions::startup_timeout`]) until `GET /health` says `"health":"true"`.
    ///
    /// Fails promptly with [`ServerError::NotInstalled`] when the binary is missing.
    pub async fn start_with(opts: EtcdOptions) -> Result<Self, ServerError> {
        let program = require_program("etcd", &opts.binary, "etcd-server")?;
        let (process, ports, took) = ServerProcess::start(SERVER, "lock-etcd-", |dir| {
            let member = MemberPorts {
                client: free_port()?,
                peer: free_port()?,
                tls: opts.tls.as_ref().map(|_| free_port()).transpose()?,
            };
            let launch = member_launch(&program, &opts, dir, 0, &[member]);
            let node = Instance::new(
                SERVER,
                launch,
                dir.join("server.log"),
                loopback(member.client),
                Probe::EtcdHealth,
                opts.startup_timeout,
            );
            Ok((node, member))
        })
        .await?;
        let server = Self {
            process,
            peer_port: ports.peer,
            tls_port: ports.tls,
        };
        info!(
            client_port = server.port(),
            peer_port = server.peer_port,
            ?took,
            "etcd started"
        );
        Ok(server)
    }

    /// [`start_with`](Self::start_with) for synchronous code: runs on a fresh runtime in a
    /// scoped thread.
    pub fn start_blocking(opts: EtcdOptions) -> Result<Self, ServerError> {
        super::process::block_on(Self::start_with(opts)).and_then(|r| r)
    }

    /// The client endpoint, `http://127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.socket_addr())
    }

    /// The peer port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// With [`EtcdOptions::tls`], the TLS client endpoint, `https://127.0.0.1:port`.
    pub fn tls_endpoint(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("https://127.0.0.1:{port}"))
    }
}

impl LocalServer for EtcdServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

impl TargetServer for EtcdServer {
    const NAME: &'static str = SERVER;
    const ENV: &'static str = ETCD_ENV;
    type Options = EtcdOptions;

    fn start_local(opts: EtcdOptions) -> impl Future<Output = Result<Self, ServerError>> + Send {
        Self::start_with(opts)
    }

    fn client_address(&self) -> String {
        self.endpoint()
    }

    #[cfg(feature = "testcontainers")]
    async fn start_container(
        opts: EtcdOptions,
    ) -> Result<(String, Box<dyn super::containers::ServerContainer>), ServerError> {
        let container = super::containers::EtcdContainer::start(&opts).await?;
        Ok((container.endpoint(), Box::new(container)))
    }
}

/// A member's ports.
#[derive(Debug, Clone, Copy)]
struct MemberPorts {
    client: u16,
    peer: u16,
    /// Clients over TLS, with [`EtcdOptions::tls`].
    tls: Option<u16>,
}

/// The command line of member `index` (named `n{index + 1}`) of the cluster `members`, its
/// data in `dir/data`.
fn member_launch(
    program: &Path,
    opts: &EtcdOptions,
    dir: &Path,
    index: usize,
    members: &[MemberPorts],
) -> Launch {
    let peer_url = |ports: &MemberPorts| format!("http://127.0.0.1:{}", ports.peer);
    let initial_cluster = members
        .iter()
        .enumerate()
        .map(|(i, ports)| format!("n{}={}", i + 1, peer_url(ports)))
        .collect::<Vec<_>>()
        .join(",");
    let me = members[index];
    let mut client_url = format!("http://127.0.0.1:{}", me.client);
    if let Some(port) = me.tls {
        client_url.push_str(&format!(",https://127.0.0.1:{port}"));
    }
    let mut args: Vec<OsString> = [
        "--name".to_owned(),
        format!("n{}", index + 1),
        "--data-dir".to_owned(),
        dir.join("data").display().to_string(),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={}", peer_url(&me)),
        format!("--initial-advertise-peer-urls={}", peer_url(&me)),
        format!("--initial-cluster={initial_cluster}"),
        "--initial-cluster-state=new".to_owned(),
        format!(
            "--heartbeat-interval={}",
            opts.heartbeat_interval.as_millis().max(1)
        ),
        format!(
            "--election-timeout={}",
            opts.election_timeout.as_millis().max(1)
        ),
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    if let Some((cert, key)) = &opts.tls {
        args.push(format!("--cert-file={}", cert.display()).into());
        args.push(format!("--key-file={}", key.display()).into());
    }
    args.extend(opts.extra_args.iter().map(OsString::from));
    Launch {
        program: program.to_path_buf(),
        args,
        cwd: dir.to_path_buf(),
    }
}

/// An etcd cluster of `n` members on 127.0.0.1, each a child process with its own client
/// and peer ports and data directory. Members are indexed from 0 (named `n1`, `n2`, ...).
///
/// Dropping it kills every member and removes their directories.
#[derive(Debug)]
pub struct EtcdCluster {
    nodes: Vec<Instance>,
    dir: ScratchDir,
}

impl EtcdCluster {
    /// Starts `n` members (3 is the usual size) and waits until every one is healthy (a
    /// leader has been elected and every member knows it), bounded by
    /// [`EtcdOptions::startup_timeout`] for the whole cluster.
    pub async fn start(n: usize, opts: EtcdOptions) -> Result<Self, ServerError> {
        if n == 0 {
            return Err(ServerError::Startup {
                server: "etcd cluster".to_owned(),
                detail: "a cluster needs at least one member".to_owned(),
                log_tail: String::new(),
            });
        }
        let program = require_program("etcd", &opts.binary, "etcd-server")?;
        retry_port_clash("etcd cluster", || Self::try_start(n, &opts, &program)).await
    }

    /// One attempt; on failure also says whether a member reported a port clash.
    async fn try_start(
        n: usize,
        opts: &EtcdOptions,
        program: &Path,
    ) -> Result<Self, (ServerError, bool)> {
        let no_clash = |err: ServerError| (err, false);
        let dir = ScratchDir::new("lock-etcd-cluster-").map_err(no_clash)?;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(MemberPorts {
                client: free_port().map_err(no_clash)?,
                peer: free_port().map_err(no_clash)?,
                tls: None,
            });
        }
        let mut nodes = Vec::with_capacity(n);
        for (index, member) in members.iter().enumerate() {
            let node_dir = dir.path().join(format!("n{}", index + 1));
            std::fs::create_dir_all(&node_dir).map_err(|e| no_clash(e.into()))?;
            let launch = member_launch(program, opts, &node_dir, index, &members);
            nodes.push(Instance::new(
                format!("etcd cluster member {index}"),
                launch,
                node_dir.join("server.log"),
                loopback(member.client),
                Probe::EtcdHealth,
                opts.startup_timeout,
            ));
        }
        let began = Instant::now();
        let mut cluster = Self { nodes, dir };
        for node in &mut cluster.nodes {
            node.spawn().map_err(no_clash)?;
        }
        let deadline = began + opts.startup_timeout;
        for index in 0..cluster.nodes.len() {
            if let Err(err) = cluster.nodes[index].wait_ready(deadline).await {
                let clash = cluster.nodes.iter().any(|node| node.port_clash(&err));
                return Err((err, clash));
            }
        }
        info!(n, took = ?began.elapsed(), endpoints = ?cluster.endpoints(), "etcd cluster started");
        Ok(cluster)
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True for a cluster without members (never, once started).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn node(&self, index: usize) -> Result<&Instance, ServerError> {
        self.nodes.get(index).ok_or(ServerError::NoSuchMember {
            index,
            len: self.nodes.len(),
        })
    }

    fn node_mut(&mut self, index: usize) -> Result<&mut Instance, ServerError> {
        let len = self.nodes.len();
        self.nodes
            .get_mut(index)
            .ok_or(ServerError::NoSuchMember { index, len })
    }

    /// Every member's client endpoint, `http://127.0.0.1:port`.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| format!("http://{}", node.addr()))
            .collect()
    }

    /// Member `index`'s pid, `Ok(None)` while it is killed.
    pub fn pid(&self, index: usize) -> Result<Option<u32>, ServerError> {
        Ok(self.node(index)?.pid())
    }

    /// The cluster's directory (one `nN` directory per member); removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The index of the member that says it leads (`etcd_server_is_leader 1` in its
    /// metrics), asking every running member at once (1 s bound each); `None` while there
    /// is no leader.
    pub async fn leader(&self) -> Option<usize> {
        leader_of(self.running_members()).await
    }

    /// Polls [`leader`](Self::leader) until a leader is reported and every running member
    /// is healthy; [`ServerError::Timeout`] after `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, ServerError> {
        wait_for_leader_of(timeout, || self.running_members()).await
    }

    /// The index and client address of every member not killed.
    fn running_members(&self) -> Vec<(usize, SocketAddr)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.pid().is_some())
            .map(|(index, node)| (index, node.addr()))
            .collect()
    }

    /// Kills member `index` (`SIGKILL` to its process group) and reaps it; its ports and
    /// data are kept for [`restart`](Self::restart).
    pub fn kill(&mut self, index: usize) -> Result<(), ServerError> {
        self.node_mut(index)?.kill();
        Ok(())
    }

    /// Kills member `index` if running, starts it again with the same ports and data, and
    /// waits (bounded by [`EtcdOptions::startup_timeout`]) until it is healthy again, i.e.
    /// has rejoined the cluster.
    pub async fn restart(&mut self, index: usize) -> Result<(), ServerError> {
        self.node_mut(index)?.restart().await
    }

    /// Freezes member `index` (`SIGSTOP`); returns once its threads are stopped.
    pub fn pause(&self, index: usize) -> Result<(), ServerError> {
        self.node(index)?.signal(Signal::SIGSTOP)
    }

    /// Continues member `index` (`SIGCONT`).
    pub fn resume(&self, index: usize) -> Result<(), ServerError> {
        self.node(index)?.signal(Signal::SIGCONT)
    }
}

/// The index of the member among `members` (index, client address) that says it leads
/// (`etcd_server_is_leader 1` in its metrics), asking all at once (1 s bound each); `None`
/// while there is no leader.
pub(crate) async fn leader_of(members: Vec<(usize, SocketAddr)>) -> Option<usize> {
    let mut asking = tokio::task::JoinSet::new();
    for (index, addr) in members {
        asking.spawn(async move {
            let metrics = http_get(addr, "/metrics", Duration::from_secs(1)).await;
            let leads = metrics.is_ok_and(|metrics| {
                metrics
                    .lines()
                    .any(|line| line.trim() == "etcd_server_is_leader 1")
            });
            (index, leads)
        });
    }
    let mut leader = None;
    while let Some(answer) = asking.join_next().await {
        if let Ok((index, true)) = answer {
            leader = Some(index);
        }
    }
    leader
}

/// The value of the metric `name` (a line `name value`, no labels) that the etcd member
/// at `endpoint` (`http://host:port` or `host:port`) reports, within 1 s; `None` when it
/// does not report it. For instance `etcd_debugging_mvcc_watch_stream_total`, the watch
/// streams it serves.
pub async fn etcd_metric(endpoint: &str, name: &str) -> Result<Option<f64>, ServerError> {
    let address = endpoint.trim_start_matches("http://");
    let addr: SocketAddr = address.parse().map_err(|_| ServerError::Unsupported {
        operation: format!("reading the metrics of {endpoint}"),
        reason: "the endpoint is not a socket address".to_owned(),
    })?;
    let metrics = http_get(addr, "/metrics", Duration::from_secs(1)).await?;
    Ok(metrics.lines().find_map(|line| {
        let (metric, value) = line.trim().split_once(' ')?;
        (metric == name)
            .then(|| value.trim().parse().ok())
            .flatten()
    }))
}

/// Polls [`leader_of`] until a leader is reported and every one of `members` is healthy;
/// [`ServerError::Timeout`] after `timeout`.
pub(crate) async fn wait_for_leader_of(
    timeout: Duration,
    members: impl Fn() -> Vec<(usize, SocketAddr)>,
) -> Result<usize, ServerError> {
    let deadline = Instant::now() + timeout;
    loop {
        let running = members();
        if let Some(leader) = leader_of(running.clone()).await
            && all_healthy(&running).await
        {
            return Ok(leader);
        }
        if Instant::now() >= deadline {
            return Err(ServerError::Timeout {
                what: "an etcd cluster leader".to_owned(),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether every one of `members` says it is healthy.
async fn all_healthy(members: &[(usize, SocketAddr)]) -> bool {
    for (_, addr) in members {
        if Probe::EtcdHealth
            .check(*addr, Duration::from_secs(1))
            .await
            .is_err()
        {
            return false;
        }
    }
    true
}

/// Either an external etcd (from [`ETCD_ENV`], an endpoint) or an [`EtcdServer`] started
/// here.
pub type EtcdTarget = Target<EtcdServer>;
