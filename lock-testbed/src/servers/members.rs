//! A set of servers of one kind that serve together — a ZooKeeper ensemble, an etcd cluster —
//! whose members run as processes or as containers, started from the kind's spec, and the
//! faults a test puts on one member. A kind adds only who leads
//! ([`ZkEnsemble`](super::ZkEnsemble), [`EtcdCluster`](super::EtcdCluster)); everything
//! else is here, the same on either runner.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use super::member::Member;
use super::probe::ask_until;
use super::process::{ScratchDir, free_ports, retry_port_clash, spec_instance};
use super::spec::{Peer, ServerSpec, slug};
use super::{ServerError, ServerMode};

/// The members of an ensemble or a cluster of the server kind `K` (its [`ServerSpec`]),
/// indexed from 0: child processes (with their directories) or containers (on a network
/// of their own, so that a member can be cut off from the others). Who leads is the
/// kind's: [`ZkEnsemble`](super::ZkEnsemble), [`EtcdCluster`](super::EtcdCluster).
///
/// Dropping it stops every member, then removes their network or their directories.
pub struct Members<K> {
    // Declared first: dropped before the network and the directories.
    members: Vec<Box<dyn Member>>,
    #[cfg(feature = "testcontainers")]
    network: Option<super::containers::ClusterNetwork>,
    dir: Option<ScratchDir>,
    kind: PhantomData<fn() -> K>,
}

impl<K> fmt::Debug for Members<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Members")
            .field("members", &self.members)
            .field("network", &self.network())
            .field("dir", &self.dir())
            .finish()
    }
}

impl<S: ServerSpec> Members<S> {
    /// Starts `n` members of the kind `spec` where `mode` says (containers: feature
    /// `testcontainers`), and waits until every one serves, bounded by the spec's start-up
    /// timeout.
    pub async fn start_in(mode: ServerMode, n: usize, spec: S) -> Result<Self, ServerError> {
        if n == 0 {
            return Err(ServerError::Startup {
                server: S::NAME.to_owned(),
                detail: "a set needs at least one member".to_owned(),
                log_tail: String::new(),
            });
        }
        let members = match mode {
            #[cfg(feature = "testcontainers")]
            ServerMode::Containers => Self::start_containers(n, &spec).await?,
            #[cfg(not(feature = "testcontainers"))]
            ServerMode::Containers => return Err(ServerError::without_containers(S::NAME)),
            ServerMode::Processes => {
                retry_port_clash(S::NAME, |_| Self::start_processes(n, &spec)).await?
            }
        };
        info!(n, members = ?members.addresses(), "{} set serves", S::NAME);
        Ok(members)
    }

    /// Starts `n` members as processes (see [`start_in`](Self::start_in)).
    pub async fn start(n: usize, spec: S) -> Result<Self, ServerError> {
        Self::start_in(ServerMode::Processes, n, spec).await
    }

    /// One attempt at `n` member processes, on free ports; on failure also says whether a
    /// member reported a port clash.
    async fn start_processes(n: usize, spec: &S) -> Result<Self, (ServerError, bool)> {
        let no_clash = |err: ServerError| (err, false);
        let prefix = format!("lock-{}-set-", slug::<S>());
        let dir = ScratchDir::new(&prefix).map_err(no_clash)?;
        let peers = (0..n)
            .map(|_| Ok(Peer::new("127.0.0.1", free_ports(spec.port_count())?)))
            .collect::<Result<Vec<_>, ServerError>>()
            .map_err(no_clash)?;
        let mut nodes = Vec::with_capacity(n);
        for index in 0..n {
            let node_dir = dir.path().join(format!("n{}", index + 1));
            std::fs::create_dir_all(&node_dir).map_err(|err| no_clash(err.into()))?;
            let server = format!("{} member {index}", S::NAME);
            let node = spec_instance(spec, server, &node_dir, index, &peers).map_err(no_clash)?;
            nodes.push(node);
        }
        let deadline = Instant::now() + spec.startup_timeout();
        for node in &mut nodes {
            node.spawn().map_err(no_clash)?;
        }
        for index in 0..nodes.len() {
            if let Err(err) = nodes[index].wait_ready(deadline).await {
                let clash = nodes.iter().any(|node| node.port_clash(&err));
                return Err((err, clash));
            }
        }
        Ok(Members {
            members: nodes
                .into_iter()
                .map(|member| Box::new(member) as Box<dyn Member>)
                .collect(),
            #[cfg(feature = "testcontainers")]
            network: None,
            dir: Some(dir),
            kind: PhantomData,
        })
    }

    /// `n` containers on a new network of their own, each started once all have joined
    /// it, then waited for (each bounded by the spec's start-up timeout).
    #[cfg(feature = "testcontainers")]
    async fn start_containers(n: usize, spec: &S) -> Result<Self, ServerError> {
        use super::containers::{ClusterNetwork, Container, host_name};
        let hosts = slug::<S>();
        let network = ClusterNetwork::create(hosts.clone()).await?;
        let peers: Vec<Peer> = (0..n)
            .map(|index| Peer::new(host_name(&hosts, index), S::CONTAINER_PORTS.to_vec()))
            .collect();
        let mut containers = Vec::with_capacity(n);
        for index in 0..n {
            let container = Container::create_member(spec, &peers, index).await?;
            network.heal(container.id(), index).await?;
            containers.push(container);
        }
        for container in &containers {
            container.wait_ready().await?;
        }
        let members = containers
            .into_iter()
            .map(|container| Box::new(container) as Box<dyn Member>)
            .collect();
        let members = Members {
            members,
            network: Some(network),
            dir: None,
            kind: PhantomData,
        };
        Ok(members)
    }
}

impl<K> Members<K> {
    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True without members (never, once started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn member(&self, index: usize) -> Result<&dyn Member, ServerError> {
        let len = self.members.len();
        match self.members.get(index) {
            Some(member) => Ok(member.as_ref()),
            None => Err(ServerError::NoSuchMember { index, len }),
        }
    }

    fn member_mut(&mut self, index: usize) -> Result<&mut Box<dyn Member>, ServerError> {
        let len = self.members.len();
        self.members
            .get_mut(index)
            .ok_or(ServerError::NoSuchMember { index, len })
    }

    /// Member `index`'s client address, `127.0.0.1:port`.
    pub fn socket_addr(&self, index: usize) -> Result<SocketAddr, ServerError> {
        Ok(self.member(index)?.socket_addr())
    }

    /// Member `index`'s client address as text.
    pub fn address(&self, index: usize) -> Result<String, ServerError> {
        Ok(self.socket_addr(index)?.to_string())
    }

    /// Member `index`'s client port.
    pub fn port(&self, index: usize) -> Result<u16, ServerError> {
        Ok(self.socket_addr(index)?.port())
    }

    /// Every member's client address, in order.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.members.iter().map(|m| m.socket_addr()).collect()
    }

    /// Member `index`'s pid: `Ok(None)` while it is killed, and for a container.
    pub fn pid(&self, index: usize) -> Result<Option<u32>, ServerError> {
        Ok(self.member(index)?.pid())
    }

    /// Member `index`'s container id; `Ok(None)` for a process.
    pub fn container_id(&self, index: usize) -> Result<Option<&str>, ServerError> {
        Ok(self.member(index)?.container_id())
    }

    /// The processes' directory (one directory per member), removed on drop; `None` for
    /// containers.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(ScratchDir::path)
    }

    /// The containers' own network; `None` for processes.
    pub fn network(&self) -> Option<&str> {
        #[cfg(feature = "testcontainers")]
        if let Some(network) = &self.network {
            return Some(network.name());
        }
        None
    }

    /// Whether member `index` runs (not killed; a paused member runs).
    pub async fn is_running(&self, index: usize) -> Result<bool, ServerError> {
        self.member(index)?.is_running().await
    }

    /// What a failure message should say of every member: whether it runs (or has
    /// exited, or is frozen) and the last lines of its log, a paragraph each.
    pub async fn condition(&self) -> String {
        let mut paragraphs = Vec::with_capacity(self.members.len());
        for (index, member) in self.members.iter().enumerate() {
            paragraphs.push(format!("member {index}: {}", member.condition().await));
        }
        paragraphs.join("\n\n")
    }

    /// Kills member `index` at once (`SIGKILL` to its process group; a container is
    /// stopped without grace). Its ports and data are kept for [`restart`](Self::restart).
    pub async fn kill(&mut self, index: usize) -> Result<(), ServerError> {
        self.member_mut(index)?.kill().await
    }

    /// Kills member `index` if it runs, starts it again with the same ports and data, and
    /// waits (bounded by the start-up timeout) until it serves again: it has rejoined.
    pub async fn restart(&mut self, index: usize) -> Result<(), ServerError> {
        self.member_mut(index)?.restart().await
    }

    /// Freezes member `index` (`SIGSTOP`, or `docker pause`); returns once it is frozen.
    pub async fn pause(&self, index: usize) -> Result<(), ServerError> {
        self.member(index)?.pause().await
    }

    /// Continues member `index` after [`pause`](Self::pause).
    pub async fn resume(&self, index: usize) -> Result<(), ServerError> {
        self.member(index)?.resume().await
    }

    /// Cuts member `index` off from the others while its clients stay connected to it
    /// (containers only: `docker network disconnect` from the members' network).
    pub async fn partition(&self, index: usize) -> Result<(), ServerError> {
        #[cfg(feature = "testcontainers")]
        if let Some((network, id)) = self.networked(index)? {
            return network.partition(id, index).await;
        }
        self.member(index)?;
        Err(no_network("partition"))
    }

    /// Connects member `index` to the others again after [`partition`](Self::partition).
    pub async fn heal(&self, index: usize) -> Result<(), ServerError> {
        #[cfg(feature = "testcontainers")]
        if let Some((network, id)) = self.networked(index)? {
            return network.heal(id, index).await;
        }
        self.member(index)?;
        Err(no_network("heal"))
    }

    /// The members' network and member `index`'s container on it, for containers.
    #[cfg(feature = "testcontainers")]
    fn networked(
        &self,
        index: usize,
    ) -> Result<Option<(&super::containers::ClusterNetwork, &str)>, ServerError> {
        let id = self.member(index)?.container_id();
        Ok(self.network.as_ref().zip(id))
    }

    /// The index and client address of every member that runs.
    pub(crate) async fn running(&self) -> Vec<(usize, SocketAddr)> {
        let mut running = Vec::with_capacity(self.members.len());
        for (index, member) in self.members.iter().enumerate() {
            if member.is_running().await.unwrap_or(false) {
                running.push((index, member.socket_addr()));
            }
        }
        running
    }

    /// The index and client address of every member, running or not.
    pub(crate) fn indexed(&self) -> Vec<(usize, SocketAddr)> {
        self.addresses().into_iter().enumerate().collect()
    }
}

/// What `ask` answers for each of `members` (index, client address), asking all at once.
pub(crate) async fn ask_each<T, F>(
    members: Vec<(usize, SocketAddr)>,
    ask: impl Fn(SocketAddr) -> F,
) -> Vec<(usize, T)>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let mut asking = tokio::task::JoinSet::new();
    for (index, addr) in members {
        let answer = ask(addr);
        asking.spawn(async move { (index, answer.await) });
    }
    asking.join_all().await
}

fn no_network(operation: &str) -> ServerError {
    ServerError::Unsupported {
        operation: operation.to_owned(),
        reason: "members run as processes on one host, with no network between them to cut"
            .to_owned(),
    }
}

/// `look`'s answer once it has one, asking every 100 ms; [`ServerError::Timeout`], waiting
/// for `what`, after `timeout`.
pub(crate) async fn poll_until<T, F: Future<Output = Option<T>>>(
    timeout: Duration,
    what: &str,
    mut look: impl FnMut() -> F,
) -> Result<T, ServerError> {
    let deadline = Instant::now() + timeout;
    let look = || {
        let answer = look();
        async move { answer.await.ok_or_else(String::new) }
    };
    poll(deadline, timeout, what, look).await
}

/// `look`'s answer once it gives one, asking every 100 ms; once `deadline` has passed,
/// [`ServerError::Timeout`] waiting for `what` (with why not, as `look` last said), after
/// `bound`.
pub(crate) async fn poll<T, F: Future<Output = Result<T, String>>>(
    deadline: Instant,
    bound: Duration,
    what: &str,
    look: impl FnMut() -> F,
) -> Result<T, ServerError> {
    let interval = Duration::from_millis(100);
    ask_until(deadline, interval, look).await.map_err(|why| {
        let what = match why.is_empty() {
            true => what.to_owned(),
            false => format!("{what} ({why})"),
        };
        ServerError::Timeout { what, after: bound }
    })
}
