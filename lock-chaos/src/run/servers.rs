//! The servers of a run, as processes or in containers, and the server faults the nemesis
//! injects into them.

use std::net::SocketAddr;
use std::time::Duration;

use distlock::redis::LeaseOptions;
use lock_core::LockName;
use lock_core::memory::MemoryServer;
use lock_testbed::servers::containers;
use lock_testbed::servers::{
    EtcdCluster, EtcdOptions, RedisClusterOptions, RedisClusterSet, RedisOptions,
    RedisSentinelOptions, RedisSentinelSet, RedisServer, ServerError, ServerMode, ZkEnsemble,
    ZkOptions,
};

use super::{Backend, SENTINEL_SERVICE};

/// How long an ensemble may take to elect its first leader.
const ELECTION_BOUND: Duration = Duration::from_secs(30);

/// The servers of a run.
pub(super) enum Servers {
    /// Processes or containers, as the run's mode says.
    Zookeeper(ZkEnsemble),
    Redis(Vec<RedisServer>),
    /// The data servers (members) and their sentinels.
    RedisSentinel(RedisSentinelSet),
    /// Three primaries and their replicas (members).
    RedisCluster(RedisClusterSet),
    Etcd(EtcdCluster),
    /// The memory backend's server, inside the run's own process.
    Memory(MemoryServer),
}

impl Servers {
    /// Starts `backend`'s servers where `mode` says; only the ensembles run in containers
    /// (where a member can be cut off from the others).
    pub(super) async fn start(backend: Backend, mode: ServerMode) -> Result<Self, ServerError> {
        if mode == ServerMode::Containers {
            if !matches!(backend, Backend::Zookeeper | Backend::Etcd) {
                return Err(ServerError::InvalidSetting {
                    variable: "servers".to_owned(),
                    value: format!("containers for {}", backend.as_str()),
                    expected: "containers for zookeeper or etcd only (their members can be \
                               partitioned from each other); processes for the others"
                        .to_owned(),
                });
            }
            containers::check_ready().await?;
        }
        let zk_options = || ZkOptions::default().with_tick_time(Duration::from_millis(500));
        Ok(match (backend, mode) {
            (Backend::Zookeeper, _) => {
                let ensemble = ZkEnsemble::start_in(mode, 3, zk_options()).await?;
                ensemble.wait_for_leader(ELECTION_BOUND).await?;
                Servers::Zookeeper(ensemble)
            }
            (Backend::Etcd, _) => {
                let cluster = EtcdCluster::start_in(mode, 3, EtcdOptions::default()).await?;
                cluster.wait_for_leader(ELECTION_BOUND).await?;
                Servers::Etcd(cluster)
            }
            (Backend::Redis | Backend::Redlock, _) => {
                let mut servers = Vec::new();
                for _ in 0..backend.members() {
                    servers.push(RedisServer::start(durable_redis()).await?);
                }
                Servers::Redis(servers)
            }
            (Backend::RedisSentinel, _) => {
                let options = RedisSentinelOptions::default()
                    .with_service(SENTINEL_SERVICE)
                    .with_server(durable_redis());
                Servers::RedisSentinel(RedisSentinelSet::start(options).await?)
            }
            (Backend::RedisCluster, _) => {
                let options = RedisClusterOptions::default().with_server(durable_redis());
                Servers::RedisCluster(RedisClusterSet::start(options).await?)
            }
            (Backend::Memory, _) => Servers::Memory(MemoryServer::new()),
        })
    }

    /// The members' client addresses (none for the memory backend).
    pub(super) fn addresses(&self) -> Vec<SocketAddr> {
        match self {
            Servers::Zookeeper(ensemble) => ensemble.addresses(),
            Servers::Redis(servers) => servers.iter().map(RedisServer::socket_addr).collect(),
            // The clients ask the sentinels for the primary.
            Servers::RedisSentinel(set) => set
                .sentinel_addresses()
                .into_iter()
                .filter_map(|address| address.parse().ok())
                .collect(),
            // The clients find every node from any of them.
            Servers::RedisCluster(set) => set
                .addresses()
                .into_iter()
                .filter_map(|address| address.parse().ok())
                .collect(),
            Servers::Etcd(cluster) => cluster.addresses(),
            Servers::Memory(_) => Vec::new(),
        }
    }

    /// Pauses member `index` (`pause`), or lets it go on.
    pub(super) async fn pause(&mut self, index: usize, pause: bool) -> Result<(), ServerError> {
        match (self, pause) {
            (Servers::Zookeeper(ensemble), true) => ensemble.pause(index).await,
            (Servers::Zookeeper(ensemble), false) => ensemble.resume(index).await,
            (Servers::Etcd(cluster), true) => cluster.pause(index).await,
            (Servers::Etcd(cluster), false) => cluster.resume(index).await,
            (Servers::Redis(servers), true) => member(servers, index)?.pause(),
            (Servers::Redis(servers), false) => member(servers, index)?.resume(),
            (Servers::RedisSentinel(set), true) => {
                member(set.data_servers_mut(), index)?.pause().await
            }
            (Servers::RedisSentinel(set), false) => {
                member(set.data_servers_mut(), index)?.resume().await
            }
            (Servers::RedisCluster(set), true) => member(set.nodes_mut(), index)?.pause(),
            (Servers::RedisCluster(set), false) => member(set.nodes_mut(), index)?.resume(),
            (Servers::Memory(_), _) => Err(no_members()),
        }
    }

    /// Kills member `index`; [`restart`](Self::restart) starts it again.
    pub(super) async fn kill(&mut self, index: usize) -> Result<(), ServerError> {
        match self {
            Servers::Zookeeper(ensemble) => ensemble.kill(index).await,
            Servers::Etcd(cluster) => cluster.kill(index).await,
            Servers::Redis(servers) => {
                member(servers, index)?.kill();
                Ok(())
            }
            Servers::RedisSentinel(set) => {
                let primary = set.primary().await?;
                let killed = member(set.data_servers_mut(), index)?;
                killed.kill().await?;
                // Killed either way: a failover that does not come is the run's to see.
                if killed.socket_addr() == Some(primary)
                    && let Err(error) = set.wait_for_new_primary(primary).await
                {
                    tracing::warn!(%error, "chaos: no failover after the primary's death");
                }
                Ok(())
            }
            // A primary's replica takes over before this returns.
            Servers::RedisCluster(set) => match set.kill_and_fail_over(index).await {
                // Killed either way: a takeover that does not come is the run's to see.
                Err(error)
                    if set
                        .nodes()
                        .get(index)
                        .is_some_and(|node| node.pid().is_none()) =>
                {
                    tracing::warn!(%error, "chaos: no takeover after a primary's death");
                    Ok(())
                }
                done => done,
            },
            Servers::Memory(_) => Err(no_members()),
        }
    }

    /// Starts member `index` again after [`kill`](Self::kill), and waits until it serves.
    pub(super) async fn restart(&mut self, index: usize) -> Result<(), ServerError> {
        match self {
            Servers::Zookeeper(ensemble) => ensemble.restart(index).await,
            Servers::Etcd(cluster) => cluster.restart(index).await,
            Servers::Redis(servers) => member(servers, index)?.restart().await,
            Servers::RedisSentinel(set) => set.rejoin(index).await,
            Servers::RedisCluster(set) => set.rejoin(index).await,
            Servers::Memory(_) => Err(no_members()),
        }
    }

    /// Waits until every member serves again, under a leader where there is one, as after a
    /// fault that healed: from then on the clients' recovery is theirs to make. An
    /// ensemble's member back from a pause, a restart or a partition may still be electing
    /// or catching up; Redis servers serve once they answer, which their restart waits for.
    pub(super) async fn wait_until_whole(&self) -> Result<(), ServerError> {
        match self {
            Servers::Zookeeper(ensemble) => ensemble.wait_until_whole(ELECTION_BOUND).await,
            Servers::Etcd(cluster) => cluster.wait_for_leader(ELECTION_BOUND).await,
            Servers::Redis(_)
            | Servers::RedisSentinel(_)
            | Servers::RedisCluster(_)
            | Servers::Memory(_) => return Ok(()),
        }
        .map(drop)
    }

    /// Cuts member `index` off from the other members (its clients still reach it), or
    /// connects it again: only an ensemble in containers can be partitioned.
    pub(super) async fn partition(&mut self, index: usize, cut: bool) -> Result<(), ServerError> {
        match (self, cut) {
            (Servers::Zookeeper(ensemble), true) if ensemble.network().is_some() => {
                ensemble.partition(index).await
            }
            (Servers::Zookeeper(ensemble), false) if ensemble.network().is_some() => {
                ensemble.heal(index).await
            }
            (Servers::Etcd(cluster), true) if cluster.network().is_some() => {
                cluster.partition(index).await
            }
            (Servers::Etcd(cluster), false) if cluster.network().is_some() => {
                cluster.heal(index).await
            }
            _ => Err(ServerError::InvalidSetting {
                variable: "faults".to_owned(),
                value: "member-partition".to_owned(),
                expected: "an ensemble in containers (--servers containers)".to_owned(),
            }),
        }
    }

    /// The member that leads the ensemble now, if any: on a cluster, the primary serving the
    /// lock called `name`.
    pub(super) async fn leader(&self, name: &str) -> Option<usize> {
        match self {
            Servers::RedisCluster(set) => {
                let slot = set.slot_of(&cluster_tag(name)?).await.ok()?;
                set.owner_of(slot).await.ok()
            }
            Servers::Zookeeper(ensemble) => ensemble.leader().await,
            Servers::Etcd(cluster) => cluster.leader().await,
            Servers::RedisSentinel(set) => set.primary_index().await.ok(),
            Servers::Redis(_) | Servers::Memory(_) => None,
        }
    }

    /// Has the sentinels promote a replica while the primary runs, or on a cluster the
    /// replica of the primary serving the lock called `name` take over (`CLUSTER FAILOVER`,
    /// which waits for the replica to catch up); returns the old primary's index.
    pub(super) async fn failover(&self, name: &str) -> Result<usize, ServerError> {
        match self {
            Servers::RedisSentinel(set) => {
                let old = set.primary_index().await?;
                set.failover().await?;
                Ok(old)
            }
            Servers::RedisCluster(set) => {
                let Some(old) = self.leader(name).await else {
                    return Err(ServerError::NotRunning {
                        server: format!("the primary serving {name}"),
                    });
                };
                set.failover(set.replica_of(old).await?).await?;
                Ok(old)
            }
            _ => Err(no_failover()),
        }
    }

    /// Waits until member `index`, a primary replaced by a failover, is a replica again.
    pub(super) async fn wait_until_replica(&self, index: usize) -> Result<(), ServerError> {
        match self {
            Servers::RedisSentinel(set) => set.wait_until_replica(index).await,
            // A cluster's old primary follows its successor once every node agrees.
            Servers::RedisCluster(set) => set.settled().await,
            _ => Err(no_failover()),
        }
    }
}

fn member<S>(servers: &mut [S], index: usize) -> Result<&mut S, ServerError> {
    let len = servers.len();
    servers
        .get_mut(index)
        .ok_or(ServerError::NoSuchMember { index, len })
}

/// Durable, as production runs a lock server: every write is on disk before its reply, so
/// that a killed server comes back with its keys and its fencing counter.
fn durable_redis() -> RedisOptions {
    ["--appendonly", "yes", "--appendfsync", "always"]
        .into_iter()
        .fold(RedisOptions::default(), RedisOptions::with_arg)
}

/// The hash tag of the lock called `name`'s keys under the default prefix (the run's URL
/// sets none), which decides its slot on a cluster.
fn cluster_tag(name: &str) -> Option<String> {
    Some(LeaseOptions::default().hash_tag(&LockName::new(name).ok()?))
}

fn no_failover() -> ServerError {
    ServerError::InvalidSetting {
        variable: "faults".to_owned(),
        value: "failover".to_owned(),
        expected: "Redis under Sentinel or a Redis Cluster (--backend redis-sentinel or \
                   redis-cluster)"
            .to_owned(),
    }
}

fn no_members() -> ServerError {
    ServerError::NoSuchMember { index: 0, len: 0 }
}
