//! A set of servers of one kind that serve together — a ZooKeeper ensemble, an etcd cluster —
//! whose members run as processes or as containers, and the faults a test puts on one
//! member. A server kind adds how its members start and who leads
//! ([`ZkEnsemble`](super::ZkEnsemble), [`EtcdCluster`](super::EtcdCluster)); everything
//! else is here, the same on either runner.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::sys::signal::Signal;

use super::ServerError;
use super::process::{Instance, ScratchDir};

/// A server started here that a test can fault, whichever runner runs it: a member of a
/// set, or a [`Target`](super::Target)'s container.
#[async_trait]
pub trait Member: Send + Sync + fmt::Debug {
    /// Its client address on `127.0.0.1`.
    fn socket_addr(&self) -> SocketAddr;
    /// Its pid, while it runs as a process.
    fn pid(&self) -> Option<u32> {
        None
    }
    /// Its container's id, for a container.
    fn container_id(&self) -> Option<&str> {
        None
    }
    /// Whether it runs (it may be paused): a process not killed, a container the engine
    /// says runs.
    async fn is_running(&self) -> Result<bool, ServerError>;
    /// Kills it at once (`SIGKILL` to its process group; a container stopped without
    /// grace), keeping its ports and data for [`restart`](Self::restart).
    async fn kill(&mut self) -> Result<(), ServerError>;
    /// Kills it if it runs, starts it again with the same ports and data, and waits until
    /// it serves.
    async fn restart(&mut self) -> Result<(), ServerError>;
    /// Freezes it (`SIGSTOP`, or `docker pause`); returns once it is frozen.
    async fn pause(&self) -> Result<(), ServerError>;
    /// Continues it after [`pause`](Self::pause).
    async fn resume(&self) -> Result<(), ServerError>;
    /// What a failure message should say of it: whether it still runs (or has exited, or
    /// is frozen) and the last lines of its log.
    async fn condition(&self) -> String;
}

#[async_trait]
impl Member for Instance {
    fn socket_addr(&self) -> SocketAddr {
        self.addr()
    }

    fn pid(&self) -> Option<u32> {
        Instance::pid(self)
    }

    async fn is_running(&self) -> Result<bool, ServerError> {
        Ok(Instance::pid(self).is_some())
    }

    async fn kill(&mut self) -> Result<(), ServerError> {
        Instance::kill(self);
        Ok(())
    }

    async fn restart(&mut self) -> Result<(), ServerError> {
        Instance::restart(self).await
    }

    async fn pause(&self) -> Result<(), ServerError> {
        self.signal(Signal::SIGSTOP)
    }

    async fn resume(&self) -> Result<(), ServerError> {
        self.signal(Signal::SIGCONT)
    }

    async fn condition(&self) -> String {
        Instance::condition(self)
    }
}

#[cfg(feature = "testcontainers")]
#[async_trait]
impl<K: Send + Sync + fmt::Debug> Member for super::containers::Container<K> {
    fn socket_addr(&self) -> SocketAddr {
        super::containers::Container::socket_addr(self)
    }

    fn container_id(&self) -> Option<&str> {
        Some(self.id())
    }

    async fn is_running(&self) -> Result<bool, ServerError> {
        super::containers::Container::is_running(self).await
    }

    async fn kill(&mut self) -> Result<(), ServerError> {
        super::containers::Container::kill(self).await
    }

    async fn restart(&mut self) -> Result<(), ServerError> {
        super::containers::Container::restart(self).await
    }

    async fn pause(&self) -> Result<(), ServerError> {
        super::containers::Container::pause(self).await
    }

    async fn resume(&self) -> Result<(), ServerError> {
        super::containers::Container::resume(self).await
    }

    async fn condition(&self) -> String {
        super::containers::Container::condition(self).await
    }
}

/// The members of an ensemble or a cluster of the server kind `K`, indexed from 0: child
/// processes (with their directories) or containers (on a network of their own, so that a
/// member can be cut off from the others). What starts them, and who leads, is the kind's:
/// [`ZkEnsemble`](super::ZkEnsemble), [`EtcdCluster`](super::EtcdCluster).
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

impl<K> Members<K> {
    /// Processes, their directories under `dir`.
    fn processes(members: Vec<Instance>, dir: ScratchDir) -> Self {
        Members {
            members: members
                .into_iter()
                .map(|member| Box::new(member) as Box<dyn Member>)
                .collect(),
            #[cfg(feature = "testcontainers")]
            network: None,
            dir: Some(dir),
            kind: PhantomData,
        }
    }

    /// Spawns every one of `nodes`, the members' processes (their directories under `dir`),
    /// then waits until each serves, all within `timeout`; on failure also says whether a
    /// member reported a port clash (see `retry_port_clash`).
    pub(crate) async fn spawn_all(
        mut nodes: Vec<Instance>,
        dir: ScratchDir,
        timeout: Duration,
    ) -> Result<Self, (ServerError, bool)> {
        let deadline = Instant::now() + timeout;
        for node in &mut nodes {
            node.spawn().map_err(|err| (err, false))?;
        }
        for index in 0..nodes.len() {
            if let Err(err) = nodes[index].wait_ready(deadline).await {
                let clash = nodes.iter().any(|node| node.port_clash(&err));
                return Err((err, clash));
            }
        }
        Ok(Self::processes(nodes, dir))
    }

    /// Waits until every member serves as `probe` tells, each within `timeout`: containers
    /// that [joined](Self::join) the network before any could start.
    #[cfg(feature = "testcontainers")]
    pub(crate) async fn wait_all(
        &self,
        probe: &super::probe::Probe,
        timeout: Duration,
    ) -> Result<(), ServerError> {
        for addr in self.addresses() {
            let member = format!("member at {addr}");
            super::containers::wait_ready(&member, probe, addr, timeout).await?;
        }
        Ok(())
    }

    /// No containers yet, on `network`: see [`join`](Self::join).
    #[cfg(feature = "testcontainers")]
    pub(crate) fn on_network(network: super::containers::ClusterNetwork) -> Self {
        Members {
            members: Vec::new(),
            network: Some(network),
            dir: None,
            kind: PhantomData,
        }
    }

    /// Adds `container` as the next member, on the network.
    #[cfg(feature = "testcontainers")]
    pub(crate) async fn join<C: Send + Sync + fmt::Debug + 'static>(
        &mut self,
        container: super::containers::Container<C>,
    ) -> Result<(), ServerError> {
        let index = self.members.len();
        if let Some(network) = &self.network {
            network.heal(container.id(), index).await?;
        }
        self.members.push(Box::new(container));
        Ok(())
    }

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

/// Refuses a set of no members.
pub(crate) fn refuse_empty(n: usize, what: &str) -> Result<(), ServerError> {
    if n > 0 {
        return Ok(());
    }
    Err(ServerError::Startup {
        server: what.to_owned(),
        detail: "it needs at least one member".to_owned(),
        log_tail: String::new(),
    })
}

/// The error of a set asked for in containers without the `testcontainers` feature.
#[cfg(not(feature = "testcontainers"))]
pub(crate) fn no_containers(what: &str) -> ServerError {
    ServerError::Unsupported {
        operation: format!("starting {what} in containers"),
        reason: "lock-testbed was built without its `testcontainers` feature".to_owned(),
    }
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
    loop {
        if let Some(found) = look().await {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            return Err(ServerError::Timeout {
                what: what.to_owned(),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
