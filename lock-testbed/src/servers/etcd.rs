//! etcd 3.4 from the Debian package, as a single-member cluster.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use tracing::info;

use super::probe::Probe;
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
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("etcd"),
            heartbeat_interval: Duration::from_millis(10),
            election_timeout: Duration::from_millis(100),
            extra_args: Vec::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
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
        let (process, peer_port, took) = ServerProcess::start(SERVER, "lock-etcd-", |dir| {
            let client_port = free_port()?;
            let peer_port = free_port()?;
            let client_url = format!("http://127.0.0.1:{client_port}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            let mut args: Vec<OsString> = Vec::new();
            let mut arg = |a: String| args.push(OsString::from(a));
            arg("--name".into());
            arg("n1".into());
            arg("--data-dir".into());
            arg(dir.join("data").display().to_string());
            arg(format!("--listen-client-urls={client_url}"));
            arg(format!("--advertise-client-urls={client_url}"));
            arg(format!("--listen-peer-urls={peer_url}"));
            arg(format!("--initial-advertise-peer-urls={peer_url}"));
            arg(format!("--initial-cluster=n1={peer_url}"));
            arg("--initial-cluster-state=new".into());
            arg(format!(
                "--heartbeat-interval={}",
                opts.heartbeat_interval.as_millis().max(1)
            ));
            arg(format!(
                "--election-timeout={}",
                opts.election_timeout.as_millis().max(1)
            ));
            for extra in &opts.extra_args {
                arg(extra.clone());
            }
            let launch = Launch {
                program: program.clone(),
                args,
                cwd: dir.to_path_buf(),
            };
            let node = Instance::new(
                SERVER,
                launch,
                dir.join("server.log"),
                loopback(client_port),
                Probe::EtcdHealth,
                opts.startup_timeout,
            );
            Ok((node, peer_port))
        })
        .await?;
        let server = Self { process, peer_port };
        info!(
            client_port = server.port(),
            peer_port,
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

/// Either an external etcd (from [`ETCD_ENV`], an endpoint) or an [`EtcdServer`] started
/// here.
pub type EtcdTarget = Target<EtcdServer>;
