//! etcd 3.4 from the Debian package: a single-member cluster, or a cluster of several.

mod cluster;
#[cfg(feature = "testcontainers")]
mod container;

pub use cluster::EtcdCluster;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::info;

use super::probe::{Probe, http_get};
use super::process::{Instance, Launch, free_port, loopback, require_program};
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
    ) -> Result<(String, Box<dyn super::Member>), ServerError> {
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

/// Where one etcd member keeps its data and listens, and the cluster it starts in: the
/// same for a process and a container.
pub(crate) struct MemberLayout<'a> {
    /// `n1`, `n2`, ...
    pub(crate) name: &'a str,
    pub(crate) data_dir: &'a str,
    /// Where it serves clients, and where it tells them it does.
    pub(crate) listen_client: &'a str,
    pub(crate) advertise_client: &'a str,
    /// Where it serves its peers, and where it tells them it does.
    pub(crate) listen_peer: &'a str,
    pub(crate) advertise_peer: &'a str,
    /// Every member's name and peer URL.
    pub(crate) cluster: &'a [(String, String)],
}

/// etcd's arguments for the member `layout` describes, then the timing, `tls` (a
/// certificate and its key) and extra arguments of `opts`.
pub(crate) fn member_args(
    opts: &EtcdOptions,
    layout: &MemberLayout<'_>,
    tls: Option<&(PathBuf, PathBuf)>,
) -> Vec<String> {
    let initial_cluster = layout
        .cluster
        .iter()
        .map(|(name, peer)| format!("{name}={peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut args = vec![
        format!("--name={}", layout.name),
        format!("--data-dir={}", layout.data_dir),
        format!("--listen-client-urls={}", layout.listen_client),
        format!("--advertise-client-urls={}", layout.advertise_client),
        format!("--listen-peer-urls={}", layout.listen_peer),
        format!("--initial-advertise-peer-urls={}", layout.advertise_peer),
        format!("--initial-cluster={initial_cluster}"),
        "--initial-cluster-state=new".to_owned(),
        // As ZooKeeper's `forceSync=no`: a test member's data need not survive the machine,
        // only the member (a killed member keeps what reached the OS).
        "--unsafe-no-fsync".to_owned(),
        format!(
            "--heartbeat-interval={}",
            opts.heartbeat_interval.as_millis().max(1)
        ),
        format!(
            "--election-timeout={}",
            opts.election_timeout.as_millis().max(1)
        ),
    ];
    if let Some((cert, key)) = tls {
        args.push(format!("--cert-file={}", cert.display()));
        args.push(format!("--key-file={}", key.display()));
    }
    args.extend(opts.extra_args.iter().cloned());
    args
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
    let cluster: Vec<(String, String)> = members
        .iter()
        .enumerate()
        .map(|(i, ports)| (format!("n{}", i + 1), peer_url(ports)))
        .collect();
    let me = members[index];
    let mut client_url = format!("http://127.0.0.1:{}", me.client);
    if let Some(port) = me.tls {
        client_url.push_str(&format!(",https://127.0.0.1:{port}"));
    }
    let layout = MemberLayout {
        name: &cluster[index].0,
        data_dir: &dir.join("data").display().to_string(),
        listen_client: &client_url,
        advertise_client: &client_url,
        listen_peer: &peer_url(&me),
        advertise_peer: &peer_url(&me),
        cluster: &cluster,
    };
    Launch {
        program: program.to_path_buf(),
        args: member_args(opts, &layout, opts.tls.as_ref())
            .into_iter()
            .map(OsString::from)
            .collect(),
        cwd: dir.to_path_buf(),
    }
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

/// Either an external etcd (from [`ETCD_ENV`], an endpoint) or an [`EtcdServer`] started
/// here.
pub type EtcdTarget = Target<EtcdServer>;
