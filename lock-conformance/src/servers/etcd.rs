//! etcd 3.4 from the Debian package, as a single-member cluster.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;
use tracing::{info, warn};

use super::probe::Probe;
use super::process::{Instance, Launch, PORT_CLASH_ATTEMPTS, free_port, loopback, require_program};
use super::{DEFAULT_STARTUP_TIMEOUT, ServerError};

const SERVER: &str = "etcd";

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
/// Dropping it kills the server (`SIGKILL` to its process group), reaps it and removes its
/// data directory.
#[derive(Debug)]
pub struct EtcdServer {
    node: Instance,
    peer_port: u16,
    dir: TempDir,
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
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = tempfile::Builder::new().prefix("lock-etcd-").tempdir()?;
            let client_port = free_port()?;
            let peer_port = free_port()?;
            let client_url = format!("http://127.0.0.1:{client_port}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            let mut args: Vec<OsString> = Vec::new();
            let mut arg = |a: String| args.push(OsString::from(a));
            arg("--name".into());
            arg("n1".into());
            arg("--data-dir".into());
            arg(dir.path().join("data").display().to_string());
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
                cwd: dir.path().to_path_buf(),
            };
            let mut node = Instance::new(
                SERVER,
                launch,
                dir.path().join("server.log"),
                loopback(client_port),
                Probe::EtcdHealth,
                opts.startup_timeout,
            );
            match node.start().await {
                Ok(took) => {
                    info!(client_port, peer_port, ?took, "etcd started");
                    return Ok(Self {
                        node,
                        peer_port,
                        dir,
                    });
                }
                Err(err) if attempt < PORT_CLASH_ATTEMPTS && node.port_clash(&err) => {
                    warn!(
                        client_port,
                        peer_port, attempt, "an etcd port was taken; retrying on fresh ports"
                    );
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// [`start_with`](Self::start_with) for synchronous code: runs on a fresh runtime in a
    /// scoped thread.
    pub fn start_blocking(opts: EtcdOptions) -> Result<Self, ServerError> {
        super::process::block_on(Self::start_with(opts)).and_then(|r| r)
    }

    /// The client endpoint, `http://127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.node.addr())
    }

    /// The client socket address.
    pub fn socket_addr(&self) -> SocketAddr {
        self.node.addr()
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.node.addr().port()
    }

    /// The peer port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The server's pid (also its process-group id), or `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// The server's directory (data and log); removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log file (stdout and stderr of every launch).
    pub fn log_path(&self) -> &Path {
        self.node.log_path()
    }

    /// Freezes the server (`SIGSTOP` to its process group).
    pub fn pause(&self) -> Result<(), ServerError> {
        self.node.signal(Signal::SIGSTOP)
    }

    /// Continues a paused server (`SIGCONT`).
    pub fn resume(&self) -> Result<(), ServerError> {
        self.node.signal(Signal::SIGCONT)
    }

    /// Kills the server (`SIGKILL` to its process group) and reaps it. No-op when already
    /// killed.
    pub fn kill(&mut self) {
        self.node.kill();
    }

    /// Kills the server if running and starts it again with the same ports and data,
    /// waiting until it is healthy.
    pub async fn restart(&mut self) -> Result<(), ServerError> {
        let took = self.node.start().await?;
        info!(port = self.port(), ?took, "etcd restarted");
        Ok(())
    }
}
