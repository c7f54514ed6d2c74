//! A ZooKeeper ensemble in containers on a network of its own, where a member can really be
//! cut off from the others.
//!
//! Each member is a container on two networks: the engine's default bridge, through which
//! its client port is published on `127.0.0.1`, and the ensemble's own network, which
//! carries the quorum and election traffic (members find each other there by the names
//! `zk1`, `zk2`, ...). [`ZkContainerEnsemble::partition`] disconnects a member from the
//! ensemble's network only: it loses its peers while its clients stay connected to it, as
//! in a real partition between server racks. [`heal`](ZkContainerEnsemble::heal) connects
//! it again.

use std::collections::HashMap;
use std::time::Duration;

use testcontainers::bollard::Docker;
use testcontainers::bollard::models::{
    EndpointSettings, NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest,
};
use tracing::info;

use super::{LABEL, Watchdog, ZkContainer, container_error, label_value};
use crate::servers::zookeeper::{leader_of, mode_of, wait_for_leader_of};
use crate::servers::{ServerError, ZkOptions};

const QUORUM_PORT: u16 = 2888;
const ELECTION_PORT: u16 = 3888;

/// The watchdog script: wait until the test process is gone (its end of the pipe on our
/// stdin closes), then remove the network, retrying while the members' own watchdogs are
/// still removing them. `$1` is the network's name.
const NETWORK_WATCHDOG_SCRIPT: &str = "read -r _ignored; n=0; \
    until docker network rm \"$1\" >/dev/null 2>&1; do \
    n=$((n+1)); [ $n -ge 50 ] && exit 1; sleep 0.2; done; exit 0";

/// A ZooKeeper ensemble of containers on a network of its own (see the module docs).
/// Members are indexed from 0 (`myid` is index + 1, network name `zk{myid}`).
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
pub struct ZkContainerEnsemble {
    // Declared first: removed before the network.
    members: Vec<ZkContainer>,
    network: String,
    docker: Docker,
    network_watchdog: Option<Watchdog>,
}

/// Member `index`'s name on the ensemble's network.
fn host_name(index: usize) -> String {
    format!("zk{}", index + 1)
}

impl ZkContainerEnsemble {
    /// Starts `n` members (3 is the usual size) on a new network and waits until every one
    /// serves (a leader is elected and every follower has joined), each bounded by
    /// [`ZkOptions::startup_timeout`]. `opts.config` gets `quorumListenOnAllIPs=true`: a
    /// member's address on the ensemble's network may change when it is healed.
    pub async fn start(n: usize, opts: ZkOptions) -> Result<Self, ServerError> {
        if n == 0 {
            return Err(ServerError::Startup {
                server: "ZooKeeper ensemble (containers)".to_owned(),
                detail: "an ensemble needs at least one member".to_owned(),
                log_tail: String::new(),
            });
        }
        let docker = Docker::connect_with_defaults().map_err(container_error)?;
        let network = format!(
            "distlock-test-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        let mut ensemble = Self {
            members: Vec::with_capacity(n),
            network_watchdog: None,
            docker,
            network: network.clone(),
        };
        ensemble.create_network().await?;
        let servers: Vec<String> = (0..n)
            .map(|i| format!("{}:{QUORUM_PORT}:{ELECTION_PORT}", host_name(i)))
            .collect();
        let opts = opts.with_config("quorumListenOnAllIPs", "true");
        for index in 0..n {
            let member = ZkContainer::create_member(&opts, &servers, index).await?;
            ensemble.members.push(member);
            ensemble.heal(index).await?;
        }
        for member in &ensemble.members {
            member.wait_ready().await?;
        }
        info!(%network, members = n, "ZooKeeper ensemble (containers) serves");
        Ok(ensemble)
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
    pub fn member(&self, index: usize) -> Result<&ZkContainer, ServerError> {
        self.members.get(index).ok_or(ServerError::NoSuchMember {
            index,
            len: self.members.len(),
        })
    }

    /// Member `index`'s client address (`127.0.0.1:port`).
    pub fn address(&self, index: usize) -> Result<String, ServerError> {
        Ok(self.member(index)?.connect_string())
    }

    /// All members: `127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(ZkContainer::connect_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Sends a four-letter word to member `index` (bounded by 5 s).
    pub async fn four_letter(&self, index: usize, word: &str) -> Result<String, ServerError> {
        self.member(index)?.four_letter(word).await
    }

    /// Member `index`'s role from `srvr`'s `Mode:` line (`leader`, `follower`, ...), or
    /// `Ok(None)` when it does not answer within 1 s or is not serving (electing, cut off
    /// from a quorum, killed, paused).
    pub async fn mode(&self, index: usize) -> Result<Option<String>, ServerError> {
        let address = self.address(index)?;
        Ok(mode_of(&address, Duration::from_secs(1)).await)
    }

    /// The index of the member that reports `Mode: leader`; `None` while there is none.
    pub async fn leader(&self) -> Option<usize> {
        leader_of(self.all_members()).await
    }

    /// Polls [`leader`](Self::leader) until a leader is reported; [`ServerError::Timeout`]
    /// after `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, ServerError> {
        wait_for_leader_of(timeout, || self.all_members()).await
    }

    fn all_members(&self) -> Vec<(usize, String)> {
        self.members
            .iter()
            .enumerate()
            .map(|(i, member)| (i, member.connect_string()))
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
                aliases: Some(vec![host_name(index)]),
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

impl Drop for ZkContainerEnsemble {
    fn drop(&mut self) {
        // The members first: a network cannot be removed while containers use it. Then the
        // watchdog removes the network (with bounded retries) and is waited for.
        self.members.clear();
        self.network_watchdog.take();
    }
}
