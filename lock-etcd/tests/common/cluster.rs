//! A three-member etcd cluster shared by a test binary (processes, or containers under
//! `LOCK_TEST_SERVERS=containers`), and the server faults on it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lock_conformance::{FaultError, FaultResult};
use lock_testbed::servers::{EtcdCluster, EtcdOptions, ServerError, ServerMode};

/// How long a cluster may take to elect a leader after a fault.
const ELECTION_BOUND: Duration = Duration::from_secs(20);

/// The members of a [`SharedCluster`]: processes, or containers as `LOCK_TEST_SERVERS`
/// says.
pub(crate) type Members = EtcdCluster;

async fn start_members(n: usize) -> Result<Members, ServerError> {
    // etcd's own defaults: the test servers' 10 ms heartbeats would make a member that
    // a busy machine starves for 100 ms call an election, with no fault injected.
    let mut opts = EtcdOptions::default();
    opts.heartbeat_interval = Duration::from_millis(100);
    opts.election_timeout = Duration::from_millis(1000);
    EtcdCluster::start_in(ServerMode::from_env()?, n, opts).await
}

/// A cluster that lives as long as the test binary, its cases taking turns.
///
/// Its members are started and acted on by a runtime of its own, which lives as long as
/// they do: each test has a runtime of its own that ends with the test, and nothing the
/// cluster's operations leave running may depend on one of those. Processes are killed
/// when the test binary exits, however it exits.
pub(crate) struct SharedCluster {
    pub(crate) endpoints: Vec<String>,
    members: tokio::sync::Mutex<Members>,
    pub(crate) turn: Arc<tokio::sync::Mutex<()>>,
    runtime: tokio::runtime::Runtime,
}

type MembersFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl SharedCluster {
    /// Starts a cluster of `n` members, blocking the calling thread only.
    pub(crate) fn start_blocking(n: usize) -> Result<Self, ServerError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("shared-etcd-cluster")
            .enable_all()
            .build()
            .map_err(ServerError::from)?;
        let started = std::thread::scope(|scope| {
            scope
                .spawn(|| runtime.block_on(start_members(n)))
                .join()
                .unwrap_or_else(|_| {
                    Err(ServerError::Startup {
                        server: "etcd cluster".to_owned(),
                        detail: "the thread starting it panicked".to_owned(),
                        log_tail: String::new(),
                    })
                })
        });
        let members = match started {
            Ok(members) => members,
            Err(error) => {
                // Dropping a runtime blocks, which a test's runtime thread must not do.
                runtime.shutdown_background();
                return Err(error);
            }
        };
        Ok(SharedCluster {
            endpoints: members.endpoints(),
            members: tokio::sync::Mutex::new(members),
            turn: Arc::new(tokio::sync::Mutex::new(())),
            runtime,
        })
    }

    /// Runs `operation` on the members, on the cluster's own runtime.
    pub(crate) async fn on_members<T, F>(&'static self, operation: F) -> FaultResult<T>
    where
        T: Send + 'static,
        F: for<'a> FnOnce(&'a mut Members) -> MembersFuture<'a, Result<T, ServerError>>
            + Send
            + 'static,
    {
        self.runtime
            .spawn(async move {
                let mut members = self.members.lock().await;
                operation(&mut members).await
            })
            .await
            .map_err(|e| FaultError::Failed(format!("an operation on the cluster: {e}")))?
            .map_err(|e| FaultError::Failed(e.to_string()))
    }

    /// Restarts any member a case before left killed (one that failed half-way), and
    /// waits for a leader.
    pub(crate) async fn recover(&'static self) -> FaultResult {
        self.on_members(|members| {
            Box::pin(async move {
                for index in 0..members.len() {
                    members.resume(index).await.ok();
                    if !members.is_running(index).await? {
                        members.restart(index).await?;
                    }
                }
                members.wait_for_leader(ELECTION_BOUND).await.map(drop)
            })
        })
        .await
    }

    /// Freezes every member for `duration`, then lets them go on and waits for a leader.
    pub(crate) async fn pause(&'static self, duration: Duration) -> FaultResult {
        self.on_members(move |members| {
            Box::pin(async move {
                for index in 0..members.len() {
                    members.pause(index).await?;
                }
                tokio::time::sleep(duration).await;
                for index in 0..members.len() {
                    members.resume(index).await?;
                }
                members.wait_for_leader(ELECTION_BOUND).await.map(drop)
            })
        })
        .await
    }

    /// Kills the leader, waits for a new one, then restarts the killed member and waits
    /// until it has rejoined, so that later cases keep three members.
    pub(crate) async fn kill_leader(&'static self) -> FaultResult {
        self.on_members(|members| {
            Box::pin(async move {
                let leader = members.wait_for_leader(ELECTION_BOUND).await?;
                members.kill(leader).await?;
                let new_leader = members.wait_for_leader(ELECTION_BOUND).await?;
                tracing::info!(leader, new_leader, "etcd cluster: a new leader");
                members.restart(leader).await?;
                members.wait_for_leader(ELECTION_BOUND).await.map(drop)
            })
        })
        .await
    }

    /// A rolling restart: the followers, then the leader, each killed, started again and
    /// waited for until it is healthy; the cluster keeps a quorum throughout except for one
    /// leader election.
    pub(crate) async fn restart(&'static self) -> FaultResult {
        self.on_members(|members| {
            Box::pin(async move {
                let leader = members.wait_for_leader(ELECTION_BOUND).await?;
                let order: Vec<usize> = (0..members.len())
                    .filter(|&index| index != leader)
                    .chain(std::iter::once(leader))
                    .collect();
                for index in order {
                    members.restart(index).await?;
                    members.wait_for_leader(ELECTION_BOUND).await?;
                }
                Ok(())
            })
        })
        .await
    }
}
