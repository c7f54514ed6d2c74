//! An etcd cluster: members as processes on 127.0.0.1 or as containers on a network of
//! their own, and who leads it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tracing::info;

use super::{EtcdOptions, MemberPorts, member_launch};
use crate::servers::members::{Members, poll_until, refuse_empty};
use crate::servers::probe::{Probe, http_get};
use crate::servers::process::{
    Instance, ScratchDir, free_port, loopback, require_program, retry_port_clash,
};
use crate::servers::{Etcd, ServerError, ServerMode};

/// An etcd cluster of `n` members, each with its own ports and data: child processes on
/// 127.0.0.1, or containers on a network of their own (where a member can be
/// [partitioned](Members::partition)). Members are indexed from 0 (named `n1`, `n2`, ...);
/// the faults on a member are [`Members`]'.
///
/// Dropping it stops every member and removes their directories or their network.
pub type EtcdCluster = Members<Etcd>;

impl Members<Etcd> {
    /// Starts `n` members (3 is the usual size) as processes and waits until every one is
    /// healthy (a leader has been elected and every member knows it), bounded by
    /// [`EtcdOptions::startup_timeout`] for the whole cluster.
    pub async fn start(n: usize, opts: EtcdOptions) -> Result<Self, ServerError> {
        Self::start_in(ServerMode::Processes, n, opts).await
    }

    /// [`start`](Self::start)s the members where `mode` says (containers: feature
    /// `testcontainers`).
    pub async fn start_in(
        mode: ServerMode,
        n: usize,
        opts: EtcdOptions,
    ) -> Result<Self, ServerError> {
        refuse_empty(n, "etcd cluster")?;
        let members = match mode {
            #[cfg(not(feature = "testcontainers"))]
            ServerMode::Containers => {
                return Err(crate::servers::members::no_containers("an etcd cluster"));
            }
            #[cfg(feature = "testcontainers")]
            ServerMode::Containers => super::container::start_cluster(n, &opts).await?,
            _ => {
                let program = require_program("etcd", &opts.binary, "etcd-server")?;
                retry_port_clash("etcd cluster", || start_processes(n, &opts, &program)).await?
            }
        };
        info!(n, endpoints = ?members.endpoints(), "etcd cluster serves");
        Ok(members)
    }

    /// Every member's client endpoint, `http://127.0.0.1:port`.
    pub fn endpoints(&self) -> Vec<String> {
        let addresses = self.addresses().into_iter();
        addresses.map(|addr| format!("http://{addr}")).collect()
    }

    /// The index of the member that says it leads (`etcd_server_is_leader 1` in its
    /// metrics), asking every member at once (1 s bound each); `None` while there is no
    /// leader.
    pub async fn leader(&self) -> Option<usize> {
        leader_of(self.indexed()).await
    }

    /// Polls [`leader`](Self::leader) until a leader is reported and every running member
    /// is healthy; [`ServerError::Timeout`] after `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, ServerError> {
        let settled = || async {
            let running = self.running().await;
            let leader = leader_of(running.clone()).await?;
            all_healthy(&running).await.then_some(leader)
        };
        poll_until(timeout, "an etcd cluster leader", settled).await
    }
}

/// One attempt at `n` member processes; on failure also says whether a member reported a
/// port clash.
async fn start_processes(
    n: usize,
    opts: &EtcdOptions,
    program: &Path,
) -> Result<Members<Etcd>, (ServerError, bool)> {
    let no_clash = |err: ServerError| (err, false);
    let dir = ScratchDir::new("lock-etcd-cluster-").map_err(no_clash)?;
    let mut ports = Vec::with_capacity(n);
    for _ in 0..n {
        ports.push(MemberPorts {
            client: free_port().map_err(no_clash)?,
            peer: free_port().map_err(no_clash)?,
            tls: None,
        });
    }
    let mut nodes = Vec::with_capacity(n);
    for (index, member) in ports.iter().enumerate() {
        let node_dir = dir.path().join(format!("n{}", index + 1));
        std::fs::create_dir_all(&node_dir).map_err(|e| no_clash(e.into()))?;
        nodes.push(Instance::new(
            format!("etcd cluster member {index}"),
            member_launch(program, opts, &node_dir, index, &ports),
            node_dir.join("server.log"),
            loopback(member.client),
            Probe::EtcdHealth,
            opts.startup_timeout,
        ));
    }
    Members::spawn_all(nodes, dir, opts.startup_timeout).await
}

/// The index of the member among `members` (index, client address) that says it leads
/// (`etcd_server_is_leader 1` in its metrics), asking all at once (1 s bound each); `None`
/// while there is no leader.
async fn leader_of(members: Vec<(usize, SocketAddr)>) -> Option<usize> {
    let mut asking = tokio::task::JoinSet::new();
    for (index, addr) in members {
        asking.spawn(async move {
            let metrics = http_get(addr, "/metrics", Duration::from_secs(1)).await;
            let leads = metrics.is_ok_and(|metrics| {
                metrics
                    .lines()
                    .any(|line| line.trim() == "etcd_server_is_leader 1")
            });
            (index, leads)
        });
    }
    let mut leader = None;
    while let Some(answer) = asking.join_next().await {
        if let Ok((index, true)) = answer {
            leader = Some(index);
        }
    }
    leader
}

/// Whether every one of `members` says it is healthy.
async fn all_healthy(members: &[(usize, SocketAddr)]) -> bool {
    for (_, addr) in members {
        if Probe::EtcdHealth
            .check(*addr, Duration::from_secs(1))
            .await
            .is_err()
        {
            return false;
        }
    }
    true
}
