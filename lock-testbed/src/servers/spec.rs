//! [`ServerSpec`]: a server kind, written once for both runners.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ServerError;
use super::probe::ask_until;

/// Where one member runs, as its command line must know it: the same spec gives a process
/// (loopback, free ports, a temporary directory) and a container (its own addresses, the
/// container's ports, a directory inside it).
#[derive(Debug)]
#[non_exhaustive]
pub struct Site<'a> {
    /// The member's index in its set: 0 for a server on its own.
    pub index: usize,
    /// The address its sockets bind: `127.0.0.1`, or `0.0.0.0` in a container.
    pub bind: &'a str,
    /// Its directory (configuration, data), which exists; relative files go there.
    pub dir: &'a str,
    /// Every member of its set (this one at `index`) as the others reach it.
    pub members: &'a [Peer],
    /// Whether it runs in a container (the image's programs), not as a local process
    /// (the machine's programs, whose absence the spec reports).
    pub in_container: bool,
}

impl Site<'_> {
    /// This member's ports, in the order of [`ServerSpec::CONTAINER_PORTS`].
    pub fn ports(&self) -> &[u16] {
        self.members
            .get(self.index)
            .map_or(&[][..], |peer| &peer.ports)
    }

    /// This member's port number `nth` (0 is the client port); 0 when it has none.
    pub fn port(&self, nth: usize) -> u16 {
        self.ports().get(nth).copied().unwrap_or(0)
    }

    /// Whether this member has peers: a member of an ensemble or a cluster.
    pub fn in_set(&self) -> bool {
        self.members.len() > 1
    }
}

/// A member as the others reach it: its host and its ports.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Peer {
    /// `127.0.0.1` for a process, its name on the set's network for a container.
    pub host: String,
    /// Its ports, in the order of [`ServerSpec::CONTAINER_PORTS`].
    pub ports: Vec<u16>,
}

impl Peer {
    /// A member on `host` with `ports`.
    pub fn new(host: impl Into<String>, ports: Vec<u16>) -> Self {
        Peer {
            host: host.into(),
            ports,
        }
    }
}

/// What runs a member: its command line and the files it reads, written before its first
/// start (and kept across restarts: a server that rewrites its file keeps what it learned).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Command {
    /// The program (a path, for a process) and its arguments.
    pub argv: Vec<String>,
    /// `(path, text)`: a path relative to the member's directory, or absolute.
    pub files: Vec<(String, String)>,
}

impl Command {
    /// `argv`, without files.
    pub fn new(argv: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Command {
            argv: argv.into_iter().map(Into::into).collect(),
            files: Vec::new(),
        }
    }

    /// Adds the file `path` with `text`.
    pub fn with_file(mut self, path: impl Into<String>, text: impl Into<String>) -> Self {
        self.files.push((path.into(), text.into()));
        self
    }
}

type Check = dyn Fn(SocketAddr, Duration) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
    + Send
    + Sync;

/// How a server is told ready: one bounded attempt at its client address (`Err` says why
/// not yet), tried every `interval`.
#[derive(Clone)]
pub struct Probe {
    interval: Duration,
    check: Arc<Check>,
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probe")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl Probe {
    /// A probe trying `check(address, bound)` every `interval`.
    pub fn new<F>(
        interval: Duration,
        check: impl Fn(SocketAddr, Duration) -> F + Send + Sync + 'static,
    ) -> Self
    where
        F: Future<Output = Result<(), ServerError>> + Send + 'static,
    {
        Probe {
            interval,
            check: Arc::new(move |addr, bound| {
                let attempt = check(addr, bound);
                Box::pin(async move { attempt.await.map_err(|err| err.to_string()) })
            }),
        }
    }

    /// One check, bounded by `timeout`.
    pub(crate) async fn check(&self, addr: SocketAddr, timeout: Duration) -> Result<(), String> {
        (self.check)(addr, timeout).await
    }

    /// Checks `addr` until the server serves, each check bounded by 1 s; once `deadline`
    /// has passed, why not, as the last check said.
    pub(crate) async fn wait(&self, addr: SocketAddr, deadline: Instant) -> Result<(), String> {
        let check = || {
            let bound =
                Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now()));
            self.check(addr, bound)
        };
        ask_until(deadline, self.interval, check).await
    }
}

/// A server kind, written once: what a member of the kind needs (its ports, its command
/// line and configuration files, how to tell that it serves, what its clients are given),
/// which either runner runs: a process on this machine ([`Server`](super::Server),
/// [`Members`](super::Members)) or a container (`containers::Container`, feature
/// `testcontainers`).
///
/// A kind's options are its spec ([`ZkOptions`](super::ZkOptions),
/// [`RedisOptions`](super::RedisOptions), [`EtcdOptions`](super::EtcdOptions),
/// [`PostgresOptions`](super::PostgresOptions)); adding a kind is one more file with its
/// options and this trait's implementation.
pub trait ServerSpec: Clone + fmt::Debug + Send + Sync + 'static {
    /// Its name in messages and logs, e.g. `etcd`.
    const NAME: &'static str;
    /// The environment variable naming an external server that a [`Target`](super::Target)
    /// uses instead of starting one; empty for a kind no external server stands for.
    const ENV: &'static str = "";
    /// The environment variable naming its container image (`name[:tag]`).
    const IMAGE_ENV: &'static str;
    /// Its ports in a container, the client port first; a process gets as many free ports.
    const CONTAINER_PORTS: &'static [u16];

    /// How many ports a process of it takes: as many as [`CONTAINER_PORTS`](Self::CONTAINER_PORTS)
    /// unless the options ask for more (a TLS port, say).
    fn port_count(&self) -> usize {
        Self::CONTAINER_PORTS.len()
    }

    /// The bound on start-up and restart.
    fn startup_timeout(&self) -> Duration;

    /// How to tell that it serves.
    fn probe(&self) -> Probe;

    /// The command line and files of the member at `site`; for a local process, a missing
    /// program is [`ServerError::NotInstalled`].
    fn command(&self, site: &Site<'_>) -> Result<Command, ServerError>;

    /// What its clients are given when it serves at `addr` (a connect string, a URL).
    fn client_address(&self, addr: SocketAddr) -> String;
}

/// `S`'s name as a word for paths and host names: `zookeeper`, `redis-sentinel`.
pub(crate) fn slug<S: ServerSpec>() -> String {
    S::NAME
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c.to_ascii_lowercase(),
            false => '-',
        })
        .collect()
}
