//! Clusters of servers in containers on a network of their own — a ZooKeeper ensemble, an
//! etcd cluster — where a member can really be cut off from the others.
//!
//! Each member is a container on two networks: the engine's default bridge, through which
//! its client port is published on `127.0.0.1`, and the cluster's own network, which
//! carries the members' traffic among themselves (they find each other there by the names
//! `zk1`, `zk2`, ... or `etcd1`, `etcd2`, ...). [`ContainerCluster::partition`] disconnects a
//! member from the cluster's network only: it loses its peers while its clients stay
//! connected to it, as in a real partition between server racks.
//! [`heal`](ContainerCluster::heal) connects it again.

use std::collections::HashMap;

use testcontainers::bollard::Docker;
use testcontainers::bollard::models::{
    EndpointSettings, NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest,
};
use tracing::info;

use super::{Container, Etcd, LABEL, ZooKeeper};
use super::{container_error, label_value};
use crate::servers::ServerError;
use crate::servers::process::Watchdog;

/// The watchdog script: wait until the test process is gone (its end of the pipe on our
/// stdin closes), then remove the network, retrying while the members' own watchdogs are
/// still removing them. `$1` is the network's name.
const NETWORK_WATCHDOG_SCRIPT: &str = "read -r _ignored; n=0; \
    until docker network rm \"$1\" >/dev/null 2>&1; do \
    n=$((n+1)); [ $n -ge 50 ] && exit 1; sleep 0.2; done; exit 0";

/// A cluster of server containers on a network of its own (see the module docs). Members
/// are indexed from 0; member `i`'s name on the network is its kind's prefix and `i + 1`.
///
/// Dropping it removes the members, then the network; a watchdog does the same when the
/// test process ends without dropping it.
///
/// ```no_run
/// use lock_testbed::servers::ZkOptions;
/// use lock_testbed::servers::containers::ZkContainerEnsemble;
///
/// # async fn demo() -> Result<(), lock_testbed::servers::ServerError> {
/// let ensemble = ZkContainerEnsemble::start(3, ZkOptions::default()).await?;
/// let leader = ensemble.wait_for_leader(std::time::Duration::from_secs(30)).await?;
/// ensemble.partition(leader).await?; // the leader loses its followers
/// ensemble.heal(leader).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ContainerCluster<K> {
    // Declared first: removed before the network.
    pub(crate) members: Vec<Container<K>>,
    network: String,
    docker: Docker,
    network_watchdog: Option<Watchdog>,
    /// The members' names on the network: this and their number from 1.
    hosts: &'static str,
}

/// A ZooKeeper ensemble in containers: members `zk1`, `zk2`, ... (`myid` is index + 1).
pub type ZkContainerEnsemble = ContainerCluster<ZooKeeper>;

/// An etcd cluster in containers: members `etcd1`, `etcd2`, ... (named `n1`, `n2`, ...).
pub type EtcdContainerCluster = ContainerCluster<Etcd>;

/// Member `index`'s name on a cluster's network whose hosts are `hosts1`, `hosts2`, ...
pub(crate) fn host_name(hosts: &str, index: usize) -> String {
    format!("{hosts}{}", index + 1)
}

impl<K> ContainerCluster<K> {
    /// An empty cluster on a new network.
    pub(crate) async fn on_new_network(n: usize, hosts: &'static str) -> Result<Self, ServerError> {
        let docker = Docker::connect_with_defaults().map_err(container_error)?;
        let network = format!(
            "distlock-test-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        let mut cluster = Self {
            members: Vec::with_capacity(n),
            network_watchdog: None,
            docker,
            network,
            hosts,
        };
        cluster.create_network().await?;
        Ok(cluster)
    }

    /// Adds `member` to the cluster and to its network.
    pub(crate) async fn join(&mut self, member: Container<K>) -> Result<(), ServerError> {
        self.members.push(member);
        self.heal(self.members.len() - 1).await
    }

    /// Waits until every member serves.
    pub(crate) async fn wait_ready(&self) -> Result<(), ServerError> {
        for member in &self.members {
            member.wait_ready().await?;
        }
        Ok(())
    }

    async fn create_network(&mut self) -> Result<(), ServerError> {
        let request = NetworkCreateRequest {
            name: self.network.clone(),
            driver: Some("bridge".to_owned()),
            labels: Some(HashMap::from([(LABEL.to_owned(), label_value())])),
            ..Default::default()
        };
        self.docker
            .create_network(request)
            .await
            .map_err(container_error)?;
        self.network_watchdog = Some(Watchdog::spawn(
            NETWORK_WATCHDOG_SCRIPT,
            "network",
            &self.network,
        ));
        Ok(())
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True for an ensemble without members (never, once started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The ensemble network's name.
    pub fn network(&self) -> &str {
        &self.network
    }

    /// Member `index`.
    pub fn member(&self, index: usize) -> Result<&Container<K>, ServerError> {
        self.members.get(index).ok_or(ServerError::NoSuchMember {
            index,
            len: self.members.len(),
        })
    }

    /// Every member's index and client address.
    pub(crate) fn all_members(&self) -> Vec<(usize, std::net::SocketAddr)> {
        self.members
            .iter()
            .enumerate()
            .map(|(i, member)| (i, member.socket_addr()))
            .collect()
    }

    /// Cuts member `index` off from the others (`docker network disconnect` from the
    /// ensemble's network). Its clients stay connected to it, through the published port.
    pub async fn partition(&self, index: usize) -> Result<(), ServerError> {
        let request = NetworkDisconnectRequest {
            container: self.member(index)?.id().to_owned(),
            force: Some(true),
        };
        self.docker
            .disconnect_network(&self.network, request)
            .await
            .map_err(container_error)?;
        info!(member = index, network = %self.network, "ensemble member partitioned");
        Ok(())
    }

    /// Connects member `index` to the ensemble's network again (`docker network connect`,
    /// with its name there).
    pub async fn heal(&self, index: usize) -> Result<(), ServerError> {
        let request = NetworkConnectRequest {
            container: self.member(index)?.id().to_owned(),
            endpoint_config: Some(EndpointSettings {
                aliases: Some(vec![host_name(self.hosts, index)]),
                ..Default::default()
            }),
        };
        self.docker
            .connect_network(&self.network, request)
            .await
            .map_err(container_error)?;
        info!(member = index, network = %self.network, "ensemble member connected");
        Ok(())
    }

    /// Whether member `index` runs (not killed).
    pub async fn is_running(&self, index: usize) -> Result<bool, ServerError> {
        self.member(index)?.is_running().await
    }

    /// Kills member `index` at once; the container is kept for [`restart`](Self::restart).
    pub async fn kill(&self, index: usize) -> Result<(), ServerError> {
        self.member(index)?.kill().await
    }

    /// Kills member `index` if running, starts it again (same port, same data), and waits
    /// until it serves again, i.e. has rejoined the ensemble.
    pub async fn restart(&self, index: usize) -> Result<(), ServerError> {
        self.member(index)?.restart().await
    }

    /// Freezes member `index` (`docker pause`).
    pub async fn pause(&self, index: usize) -> Result<(), ServerError> {
        self.member(index)?.pause().await
    }

    /// Continues member `index` after [`pause`](Self::pause).
    pub async fn resume(&self, index: usize) -> Result<(), ServerError> {
        self.member(index)?.resume().await
    }
}

impl<K> Drop for ContainerCluster<K> {
    fn drop(&mut self) {
        // The members first: a network cannot be removed while containers use it. Then the
        // watchdog removes the network (with bounded retries) and is waited for.
        self.members.clear();
        self.network_watchdog.take();
    }
}
