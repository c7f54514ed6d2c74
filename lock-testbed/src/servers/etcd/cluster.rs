//! An etcd cluster: members as processes on 127.0.0.1 or as containers on a network of
//! their own, and who leads it.

use std::net::SocketAddr;
use std::time::Duration;

use super::EtcdOptions;
use crate::servers::members::{Members, ask_each, poll_until};
use crate::servers::probe::http_get;
use crate::servers::{ServerError, ServerSpec};

/// An etcd cluster of `n` members, each with its own ports and data: child processes on
/// 127.0.0.1, or containers on a network of their own (where a member can be
/// [partitioned](Members::partition)). Members are indexed from 0 (named `n1`, `n2`, ...);
/// the faults on a member are [`Members`]'.
///
/// [`start`](Members::start) and [`start_in`](Members::start_in) wait until every member is
/// healthy (a leader has been elected and every member knows it). Dropping it stops every
/// member and removes their directories or their network.
pub type EtcdCluster = Members<EtcdOptions>;

impl Members<EtcdOptions> {
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

/// The index of the member among `members` (index, client address) that says it leads
/// (`etcd_server_is_leader 1` in its metrics), asking all at once (1 s bound each); `None`
/// while there is no leader.
async fn leader_of(members: Vec<(usize, SocketAddr)>) -> Option<usize> {
    let leads = |addr| async move {
        let metrics = http_get(addr, "/metrics", Duration::from_secs(1)).await;
        metrics.is_ok_and(|metrics| {
            let mut lines = metrics.lines();
            lines.any(|line| line.trim() == "etcd_server_is_leader 1")
        })
    };
    let answers = ask_each(members, leads).await;
    answers
        .into_iter()
        .find_map(|(index, leads)| leads.then_some(index))
}

/// Whether every one of `members` says it is healthy.
async fn all_healthy(members: &[(usize, SocketAddr)]) -> bool {
    for (_, addr) in members {
        if EtcdOptions::default()
            .probe()
            .check(*addr, Duration::from_secs(1))
            .await
            .is_err()
        {
            return false;
        }
    }
    true
}
