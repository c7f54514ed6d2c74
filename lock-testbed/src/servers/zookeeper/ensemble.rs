//! A ZooKeeper ensemble: members as processes on 127.0.0.1 or as containers on a network
//! of their own, and who leads it.

use std::net::SocketAddr;
use std::time::Duration;

use tracing::debug;

use super::{FOUR_LETTER_TIMEOUT, ZkOptions};
use crate::servers::ServerError;
use crate::servers::members::{Members, ask_each, poll_until};
use crate::servers::probe::four_letter;

/// A ZooKeeper ensemble of `n` members, each with its own ports, data and `myid`: child
/// processes on 127.0.0.1, or containers on a network of their own (where a member can be
/// [partitioned](Members::partition)). Members are indexed from 0 (`myid` is index + 1);
/// the faults on a member are [`Members`]'.
///
/// [`start`](Members::start) and [`start_in`](Members::start_in) wait until every member
/// serves (a leader has been elected and all followers have joined). Dropping it stops
/// every member and removes their directories or their network.
///
/// ```no_run
/// use lock_testbed::servers::{ServerMode, ZkEnsemble, ZkOptions};
///
/// # async fn demo() -> Result<(), lock_testbed::servers::ServerError> {
/// let ensemble = ZkEnsemble::start_in(ServerMode::Containers, 3, ZkOptions::default()).await?;
/// let leader = ensemble.wait_for_leader(std::time::Duration::from_secs(30)).await?;
/// ensemble.partition(leader).await?; // the leader loses its followers
/// ensemble.heal(leader).await?;
/// # Ok(()) }
/// ```
pub type ZkEnsemble = Members<ZkOptions>;

impl Members<ZkOptions> {
    /// All members: `127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn connect_string(&self) -> String {
        let addresses = self.addresses().into_iter().map(|a| a.to_string());
        addresses.collect::<Vec<_>>().join(",")
    }

    /// Sends a four-letter word to member `index` (bounded by 5 s).
    pub async fn four_letter(&self, index: usize, word: &str) -> Result<String, ServerError> {
        four_letter(&self.address(index)?, word, FOUR_LETTER_TIMEOUT).await
    }

    /// Member `index`'s role from `srvr`'s `Mode:` line (`leader`, `follower`, ...), or
    /// `Ok(None)` when it does not answer within 1 s or is not serving (electing, cut off
    /// from a quorum, killed, paused).
    pub async fn mode(&self, index: usize) -> Result<Option<String>, ServerError> {
        Ok(mode_of(&self.address(index)?, Duration::from_secs(1)).await)
    }

    /// The index of the member that reports `Mode: leader`, asking every member at once
    /// (1 s bound each); `None` while there is no leader.
    pub async fn leader(&self) -> Option<usize> {
        leader_among(&modes_of(self.indexed()).await)
    }

    /// Polls [`leader`](Self::leader) until a leader is reported; [`ServerError::Timeout`]
    /// after `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, ServerError> {
        poll_until(timeout, "a ZooKeeper ensemble leader", || self.leader()).await
    }

    /// Waits until every member runs and serves under a leader (none electing or cut off),
    /// as after a fault has healed; returns the leader, or [`ServerError::Timeout`] after
    /// `timeout`.
    pub async fn wait_until_whole(&self, timeout: Duration) -> Result<usize, ServerError> {
        let whole = || async {
            let modes = modes_of(self.indexed()).await;
            let serving = modes.iter().all(|(_, mode)| mode.is_some());
            serving.then(|| leader_among(&modes))?
        };
        poll_until(
            timeout,
            "every ZooKeeper member serving under a leader",
            whole,
        )
        .await
    }
}

/// Every member's `srvr` mode, asking all at once (1 s bound each).
async fn modes_of(members: Vec<(usize, SocketAddr)>) -> Vec<(usize, Option<String>)> {
    let modes = ask_each(members, |addr| async move {
        mode_of(&addr.to_string(), Duration::from_secs(1)).await
    })
    .await;
    debug!(?modes, "ensemble members' modes");
    modes
}

fn leader_among(modes: &[(usize, Option<String>)]) -> Option<usize> {
    modes
        .iter()
        .find(|(_, mode)| mode.as_deref() == Some("leader"))
        .map(|(i, _)| *i)
}

/// `srvr`'s `Mode:` value, or `None` when there is no answer or no mode.
pub(crate) async fn mode_of(addr: &str, timeout: Duration) -> Option<String> {
    let answer = four_letter(addr, "srvr", timeout).await.ok()?;
    answer
        .lines()
        .find_map(|l| l.strip_prefix("Mode:"))
        .map(|m| m.trim().to_owned())
}
