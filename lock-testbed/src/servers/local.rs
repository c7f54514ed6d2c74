//! What every server started here has: one process and one temporary directory, and the
//! methods over them ([`LocalServer`]).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::sys::signal::Signal;
use tracing::info;

use super::ServerError;
use super::process::{Instance, Launch, ScratchDir, free_port, loopback, retry_port_clash};
use super::spec::{Command, Peer, ServerSpec, Site, slug};

/// The process and the temporary directory of a server started here (a [`ZkServer`],
/// [`RedisServer`] or [`EtcdServer`]); [`LocalServer`] works on it.
///
/// Dropping it kills the process (`SIGKILL` to its process group), reaps it, and then
/// removes the directory.
///
/// [`ZkServer`]: super::ZkServer
/// [`RedisServer`]: super::RedisServer
/// [`EtcdServer`]: super::EtcdServer
#[derive(Debug)]
pub struct ServerProcess {
    // Declared (so dropped) before `dir`: the process goes before its directory.
    node: Instance,
    dir: ScratchDir,
}

impl ServerProcess {
    /// Starts a server in a fresh temporary directory (named `prefix…`) and waits until it
    /// serves. `prepare` picks the ports and builds the instance for the directory, plus
    /// anything the caller wants back (extra ports, say). When the server finds a port
    /// taken, the start is retried with a new directory and new ports, a bounded number of
    /// times. Returns the process, `prepare`'s extra and how long the start took.
    pub(crate) async fn start<T>(
        server: &str,
        prefix: &str,
        prepare: impl Fn(&Path) -> Result<(Instance, T), ServerError>,
    ) -> Result<(Self, T, Duration), ServerError> {
        let prepare = &prepare;
        retry_port_clash(server, || async move {
            let dir = ScratchDir::new(prefix).map_err(|err| (err, false))?;
            let (mut node, extra) = prepare(dir.path()).map_err(|err| (err, false))?;
            match node.start().await {
                Ok(took) => Ok((Self { node, dir }, extra, took)),
                Err(err) => {
                    let clash = node.port_clash(&err);
                    Err((err, clash))
                }
            }
        })
        .await
    }

    /// Starts a server of the kind `spec` on free loopback ports (see
    /// [`ServerSpec::port_count`]; the client port `client_port` first, if given, until it
    /// turns out taken) in a fresh temporary directory, and waits until it serves; returns
    /// it and its ports, the client port first.
    pub(crate) async fn start_spec<S: ServerSpec>(
        spec: &S,
        client_port: Option<u16>,
    ) -> Result<(Self, Vec<u16>), ServerError> {
        let prefix = format!("lock-{}-", slug::<S>());
        let first_try = std::sync::atomic::AtomicBool::new(true);
        let (process, ports, took) = Self::start(S::NAME, &prefix, |dir| {
            let mut ports = free_ports(spec.port_count())?;
            if let Some(port) = client_port.filter(|_| first_try.swap(false, Ordering::SeqCst)) {
                ports[0] = port;
            }
            let members = [Peer::new("127.0.0.1", ports.clone())];
            Ok((
                spec_instance(spec, S::NAME.to_owned(), dir, 0, &members)?,
                ports,
            ))
        })
        .await?;
        info!(server = S::NAME, ?ports, ?took, dir = %process.dir.path().display(), "started");
        Ok((process, ports))
    }

    /// The client socket address.
    pub(crate) fn node_addr(&self) -> SocketAddr {
        self.node.addr()
    }

    /// Sends `signal` to the server's process group (see [`LocalServer::pause`]).
    pub(crate) fn node_signal(&self, signal: Signal) -> Result<(), ServerError> {
        self.node.signal(signal)
    }

    /// Kills the server's process group and reaps it (see [`LocalServer::kill`]).
    pub(crate) fn node_kill(&mut self) {
        self.node.kill();
    }

    /// Kills the server if running and starts it again (see [`LocalServer::restart`]).
    pub(crate) fn node_restart(
        &mut self,
    ) -> impl Future<Output = Result<(), ServerError>> + Send + '_ {
        self.node.restart()
    }
}

/// `n` free loopback ports.
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>, ServerError> {
    (0..n).map(|_| free_port()).collect()
}

/// Member `index` of `members` as a process of the kind `spec` in `dir` (which exists),
/// called `server` in messages: its files written, ready to spawn.
pub(crate) fn spec_instance<S: ServerSpec>(
    spec: &S,
    server: String,
    dir: &Path,
    index: usize,
    members: &[Peer],
) -> Result<Instance, ServerError> {
    let dir_text = dir.display().to_string();
    let site = Site {
        index,
        bind: "127.0.0.1",
        dir: &dir_text,
        members,
        in_container: false,
    };
    let Command { argv, files } = spec.command(&site)?;
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, text)?;
    }
    let mut argv = argv.into_iter();
    let launch = Launch {
        program: argv.next().unwrap_or_default().into(),
        args: argv.map(Into::into).collect(),
        cwd: dir.to_path_buf(),
    };
    let addr = loopback(site.port(0));
    let log = dir.join("server.log");
    Ok(Instance::new(
        server,
        launch,
        log,
        addr,
        spec.probe(),
        spec.startup_timeout(),
    ))
}

/// A server started here as a child process on 127.0.0.1: [`ZkServer`], [`RedisServer`] or
/// [`EtcdServer`]. Its address, pid, directory and log, and fault injection (pause, resume,
/// kill, restart), all provided over its [`ServerProcess`].
///
/// [`ZkServer`]: super::ZkServer
/// [`RedisServer`]: super::RedisServer
/// [`EtcdServer`]: super::EtcdServer
pub trait LocalServer {
    /// The server's process and directory.
    fn process(&self) -> &ServerProcess;

    /// The server's process and directory, mutably.
    fn process_mut(&mut self) -> &mut ServerProcess;

    /// The client socket address.
    fn socket_addr(&self) -> SocketAddr {
        self.process().node.addr()
    }

    /// The client address, `127.0.0.1:port`.
    fn address(&self) -> String {
        self.socket_addr().to_string()
    }

    /// The client port.
    fn port(&self) -> u16 {
        self.socket_addr().port()
    }

    /// The server's pid (also its process-group id), or `None` after
    /// [`kill`](Self::kill).
    fn pid(&self) -> Option<u32> {
        self.process().node.pid()
    }

    /// The server's directory (configuration, data and log); removed on drop.
    fn dir(&self) -> &Path {
        self.process().dir.path()
    }

    /// The server's log file (stdout and stderr of every launch).
    fn log_path(&self) -> &Path {
        self.process().node.log_path()
    }

    /// What a failure message should say of the server: whether its process runs, is
    /// stopped or has exited, and the last lines of its log.
    fn condition(&self) -> String {
        self.process().node.condition()
    }

    /// Freezes the server (`SIGSTOP` to its process group): connections stay open, nothing
    /// is answered, sessions and leases age. Undo with [`resume`](Self::resume).
    ///
    /// Returns once every thread of the server is stopped (bounded by 2 s): the signal
    /// alone takes effect asynchronously, and a busy machine can leave a thread running long
    /// enough to answer one more request.
    fn pause(&self) -> Result<(), ServerError> {
        self.process().node.signal(Signal::SIGSTOP)
    }

    /// Continues a paused server (`SIGCONT`).
    fn resume(&self) -> Result<(), ServerError> {
        self.process().node.signal(Signal::SIGCONT)
    }

    /// Kills the server (`SIGKILL` to its process group) and reaps it. Its ports and
    /// directory are kept for [`restart`](Self::restart). No-op when already killed.
    fn kill(&mut self) {
        self.process_mut().node.kill();
    }

    /// Kills the server if running, then starts it again on the same ports with the same
    /// directory and waits until it serves, bounded by its options' `startup_timeout`.
    ///
    /// What survives is the server's: ZooKeeper keeps its sessions and znodes, etcd its
    /// data; Redis, which runs without persistence, comes back empty.
    fn restart(&mut self) -> impl Future<Output = Result<(), ServerError>> + Send {
        self.process_mut().node.restart()
    }
}
