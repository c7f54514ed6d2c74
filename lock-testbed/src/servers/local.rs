//! A server of one kind started here as a child process ([`Server`]): one process and one
//! temporary directory.

use std::net::SocketAddr;
use std::path::Path;

use nix::sys::signal::Signal;
use tracing::info;

use super::ServerError;
use super::member::Member;
use super::process::{Instance, ScratchDir, free_ports, retry_port_clash, spec_instance};
use super::spec::{Peer, ServerSpec, slug};

/// A server of the kind `S` started here as a child process on 127.0.0.1, on free ports,
/// in a temporary directory of its own: a [`ZkServer`](super::ZkServer),
/// [`RedisServer`](super::RedisServer), [`EtcdServer`](super::EtcdServer) or
/// [`PostgresServer`](super::PostgresServer).
///
/// A [`restart`](Self::restart) keeps the ports and the directory.
///
/// Dropping it kills the server (`SIGKILL` to its process group), reaps it and then removes
/// its directory.
#[derive(Debug)]
pub struct Server<S> {
    // Declared (so dropped) before `dir`: the process goes before its directory.
    node: Instance,
    dir: ScratchDir,
    spec: S,
    /// In the order of [`ServerSpec::CONTAINER_PORTS`], the client port first.
    ports: Vec<u16>,
}

impl<S: ServerSpec> Server<S> {
    /// Starts one with `spec` and waits (bounded by its start-up timeout) until it serves.
    ///
    /// Fails promptly with [`ServerError::NotInstalled`] when a program it needs is
    /// missing.
    pub async fn start(spec: S) -> Result<Self, ServerError> {
        Self::start_on(spec, None).await
    }

    /// [`start`](Self::start) for synchronous code (or from inside a runtime, without
    /// blocking it on a nested runtime): runs on a fresh runtime in a scoped thread.
    pub fn start_blocking(spec: S) -> Result<Self, ServerError> {
        super::process::block_on(Self::start(spec)).and_then(|r| r)
    }

    /// [`start`](Self::start), on the client port `client_port` if given (until it turns
    /// out taken: then on a free one). When the server finds a port taken, it is started
    /// again in a new directory on new ports, a bounded number of times.
    pub(crate) async fn start_on(spec: S, client_port: Option<u16>) -> Result<Self, ServerError> {
        let prefix = format!("lock-{}-", slug::<S>());
        let (spec_ref, prefix) = (&spec, prefix.as_str());
        let (node, dir, ports, took) = retry_port_clash(S::NAME, |attempt| async move {
            let no_clash = |err: ServerError| (err, false);
            let dir = ScratchDir::new(prefix).map_err(no_clash)?;
            let mut ports = free_ports(spec_ref.port_count()).map_err(no_clash)?;
            let first = client_port.filter(|_| attempt == 1);
            if let (Some(port), Some(slot)) = (first, ports.first_mut()) {
                *slot = port;
            }
            let members = [Peer::new("127.0.0.1", ports.clone())];
            let mut node = spec_instance(spec_ref, S::NAME.to_owned(), dir.path(), 0, &members)
                .map_err(no_clash)?;
            match node.start().await {
                Ok(took) => Ok((node, dir, ports, took)),
                Err(err) => {
                    let clash = node.port_clash(&err);
                    Err((err, clash))
                }
            }
        })
        .await?;
        info!(server = S::NAME, ?ports, ?took, dir = %dir.path().display(), "started");
        Ok(Self {
            node,
            dir,
            spec,
            ports,
        })
    }

    /// The options it was started with.
    pub fn options(&self) -> &S {
        &self.spec
    }

    /// Its ports, in the order of [`ServerSpec::CONTAINER_PORTS`] (the client port first).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// What its clients are given (see [`ServerSpec::client_address`]).
    pub fn client_address(&self) -> String {
        self.spec.client_address(self.socket_addr())
    }
}

impl<S> Server<S> {
    /// The process, as a [`Member`] of a set or a [`Target`](super::Target).
    pub(crate) fn member(&self) -> &dyn Member {
        &self.node
    }

    /// [`member`](Self::member), mutably.
    pub(crate) fn member_mut(&mut self) -> &mut dyn Member {
        &mut self.node
    }

    /// The client socket address.
    pub fn socket_addr(&self) -> SocketAddr {
        self.node.addr()
    }

    /// The client address, `127.0.0.1:port`.
    pub fn address(&self) -> String {
        self.socket_addr().to_string()
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.socket_addr().port()
    }

    /// The server's pid (also its process-group id), or `None` after
    /// [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// The server's directory (configuration, data and log); removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log file (stdout and stderr of every launch).
    pub fn log_path(&self) -> &Path {
        self.node.log_path()
    }

    /// What a failure message should say of the server: whether its process runs, is
    /// stopped or has exited, and the last lines of its log.
    pub fn condition(&self) -> String {
        self.node.condition()
    }

    /// Freezes the server (`SIGSTOP` to its process group, and to the sessions it started,
    /// such as PostgreSQL's server processes): connections stay open, nothing is answered,
    /// sessions and leases age. Undo with [`resume`](Self::resume).
    ///
    /// Returns once every thread of the server is stopped (bounded by 2 s): the signal
    /// alone takes effect asynchronously, and a busy machine can leave a thread running long
    /// enough to answer one more request.
    pub fn pause(&self) -> Result<(), ServerError> {
        self.node.signal(Signal::SIGSTOP)
    }

    /// Continues a paused server (`SIGCONT`).
    pub fn resume(&self) -> Result<(), ServerError> {
        self.node.signal(Signal::SIGCONT)
    }

    /// Kills the server (`SIGKILL` to the sessions it started, then to its process group)
    /// and reaps it. Its ports and directory are kept for [`restart`](Self::restart).
    /// No-op when already killed.
    pub fn kill(&mut self) {
        self.node.kill();
    }

    /// Kills the server if running, then starts it again on the same ports with the same
    /// directory and waits until it serves, bounded by its options' `startup_timeout`.
    ///
    /// What survives is the server's: ZooKeeper keeps its sessions and znodes, etcd its
    /// data; Redis, which runs without persistence, comes back empty.
    pub async fn restart(&mut self) -> Result<(), ServerError> {
        self.node.restart().await
    }
}
