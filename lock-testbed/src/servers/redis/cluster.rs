//! A Redis Cluster, all child processes: primaries sharing the 16384 slots, each with its
//! replicas, made with `redis-cli --cluster create`; a slot migrated between primaries, or a
//! replica promoted, on demand.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::process::Command;
use tokio::time::Instant;
use tracing::info;

use super::encode_userinfo;
use crate::servers::members::poll;
use crate::servers::probe::redis_query;
use crate::servers::process::require_program;
use crate::servers::{DEFAULT_STARTUP_TIMEOUT, RedisOptions, RedisServer, ServerError};

const CLUSTER: &str = "Redis Cluster";
/// How long one question to a server may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How many keys one `MIGRATE` moves.
const MIGRATE_BATCH: usize = 100;

/// How to run a [`RedisClusterSet`].
///
/// Build it from [`RedisClusterOptions::default`] and the `with_*` methods.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisClusterOptions {
    /// How every node runs (password, ACL user, binary). Replicas log in to their primary
    /// with its password.
    pub server: RedisOptions,
    /// How many primaries share the slots: 3 by default (the fewest `redis-cli` accepts).
    pub primaries: usize,
    /// How many replicas each primary has: 1 by default.
    pub replicas: usize,
    /// How long a node may be silent before the others call it failing
    /// (`cluster-node-timeout`): 1 s by default.
    pub node_timeout: Duration,
    /// The bound on start-up (every node, the slots assigned, every node agreeing) and on a
    /// failover or migration: [`DEFAULT_STARTUP_TIMEOUT`] by default.
    pub startup_timeout: Duration,
}

impl Default for RedisClusterOptions {
    fn default() -> Self {
        RedisClusterOptions {
            server: RedisOptions::default(),
            primaries: 3,
            replicas: 1,
            node_timeout: Duration::from_secs(1),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
        }
    }
}

impl RedisClusterOptions {
    /// Sets how every node runs.
    pub fn with_server(mut self, server: RedisOptions) -> Self {
        self.server = server;
        self
    }

    /// Sets how many replicas each primary has.
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }
}

/// A Redis Cluster on 127.0.0.1.
///
/// The nodes are [`RedisServer`]s (no persistence): the first [`primaries`] were made
/// primaries, the others replicas (which one serves a slot now, [`owner_of`] says). Dropping
/// the set kills every process.
///
/// [`primaries`]: RedisClusterOptions::primaries
/// [`owner_of`]: RedisClusterSet::owner_of
#[derive(Debug)]
pub struct RedisClusterSet {
    nodes: Vec<RedisServer>,
    opts: RedisClusterOptions,
}

impl RedisClusterSet {
    /// Starts every node, joins them with `redis-cli --cluster create` and waits (bounded
    /// by [`RedisClusterOptions::startup_timeout`]) until every node sees every slot served
    /// and every replica holds its primary's copy.
    ///
    /// Fails promptly with [`ServerError::NotInstalled`] when `redis-server` or
    /// `redis-cli` is missing.
    pub async fn start(opts: RedisClusterOptions) -> Result<Self, ServerError> {
        let began = Instant::now();
        let cli = require_program("redis-cli", Path::new("redis-cli"), "redis-tools")?;
        let millis = opts.node_timeout.as_millis().to_string();
        let mut server = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &millis,
            // A primary's first copy to a replica goes at once, not after 5 s.
            "--repl-diskless-sync-delay",
            "0",
        ]
        .into_iter()
        .fold(opts.server.clone(), RedisOptions::with_arg);
        if let Some(password) = &opts.server.password {
            server = server.with_arg("--masterauth").with_arg(password.clone());
        }
        let mut nodes = Vec::new();
        for _ in 0..opts.primaries * (1 + opts.replicas) {
            nodes.push(RedisServer::start(server.clone()).await?);
        }
        let mut create = Command::new(cli);
        create.arg("--cluster").arg("create");
        create.args(nodes.iter().map(|node| node.socket_addr().to_string()));
        create
            .arg("--cluster-replicas")
            .arg(opts.replicas.to_string())
            .arg("--cluster-yes");
        if let Some(password) = &opts.server.password {
            create.arg("-a").arg(password).arg("--no-auth-warning");
        }
        let created = tokio::time::timeout(opts.startup_timeout, create.output())
            .await
            .map_err(|_| ServerError::Timeout {
                what: "redis-cli --cluster create".to_owned(),
                after: opts.startup_timeout,
            })??;
        if !created.status.success() {
            return Err(protocol(format!(
                "redis-cli --cluster create failed ({}): {}{}",
                created.status,
                String::from_utf8_lossy(&created.stdout),
                String::from_utf8_lossy(&created.stderr)
            )));
        }
        let set = RedisClusterSet { nodes, opts };
        set.wait_until_settled(began + set.opts.startup_timeout)
            .await?;
        info!(took = ?began.elapsed(), nodes = ?set.addresses(), "Redis Cluster ready");
        Ok(set)
    }

    /// Every node's address, `127.0.0.1:port`.
    pub fn addresses(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| node.socket_addr().to_string())
            .collect()
    }

    /// `redis+cluster://[user:password@]n1,n2,…`, logging in as `login` (user, password)
    /// if given.
    pub fn url(&self, login: Option<(&str, &str)>) -> String {
        let userinfo = login.map_or(String::new(), |(user, password)| {
            format!("{}:{}@", encode_userinfo(user), encode_userinfo(password))
        });
        format!("redis+cluster://{userinfo}{}", self.addresses().join(","))
    }

    /// The nodes, primaries first as the set was made.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, mutably (to kill or restart one).
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub async fn slot_of(&self, key: &str) -> Result<u16, ServerError> {
        let answer = self.ask_any(&["CLUSTER", "KEYSLOT", key]).await?;
        answer
            .first()
            .and_then(|slot| slot.parse().ok())
            .ok_or_else(|| protocol(format!("CLUSTER KEYSLOT answered {answer:?}")))
    }

    /// The index in [`nodes`](Self::nodes) of the primary that serves `slot`, as the
    /// first node that answers sees it.
    pub async fn owner_of(&self, slot: u16) -> Result<usize, ServerError> {
        let table = self.table().await?;
        let owner = table
            .iter()
            .find(|entry| entry.primary && entry.serves(slot))
            .ok_or_else(|| protocol(format!("no primary serves slot {slot}")))?;
        self.index_of(owner.address)
    }

    /// Moves `slot` to the primary `to` (an index in [`nodes`](Self::nodes)) the way
    /// `redis-cli --cluster reshard` does: the slot marked importing on `to` and migrating
    /// on its owner, its keys moved in batches (`MIGRATE`), then given to `to` on every
    /// primary. Halfway through the keys it pauses for `halfway` (clients meanwhile meet
    /// `ASK` redirections for the keys moved); with one key or none the pause comes
    /// before the first batch.
    pub async fn migrate_slot(
        &self,
        slot: u16,
        to: usize,
        halfway: Duration,
    ) -> Result<(), ServerError> {
        let from = self.owner_of(slot).await?;
        if from == to {
            return Ok(());
        }
        let (source, target) = (self.member(from)?, self.member(to)?);
        let (source_id, target_id) = (self.id_of(source).await?, self.id_of(target).await?);
        let slot = slot.to_string();
        self.ask(
            target,
            &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id],
        )
        .await?;
        self.ask(
            source,
            &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id],
        )
        .await?;
        let count: usize = self
            .ask(source, &["CLUSTER", "COUNTKEYSINSLOT", &slot])
            .await?
            .first()
            .and_then(|count| count.parse().ok())
            .unwrap_or(0);
        let mut moved = 0;
        let mut paused = false;
        loop {
            if !paused && moved >= count / 2 {
                paused = true;
                tokio::time::sleep(halfway).await;
            }
            let batch = if paused {
                MIGRATE_BATCH
            } else {
                (count / 2 - moved).max(1)
            };
            let keys = self
                .ask(
                    source,
                    &["CLUSTER", "GETKEYSINSLOT", &slot, &batch.to_string()],
                )
                .await?;
            if keys.is_empty() {
                break;
            }
            let target_address = target.socket_addr();
            let (host, port) = (target_address.ip().to_string(), target_address.port());
            let port = port.to_string();
            let timeout = ASK_TIMEOUT.as_millis().to_string();
            let mut migrate = vec!["MIGRATE", &host, &port, "", "0", &timeout];
            if let Some(password) = &self.opts.server.password {
                migrate.extend(["AUTH", password.as_str()]);
            }
            migrate.push("KEYS");
            migrate.extend(keys.iter().map(String::as_str));
            self.ask(source, &migrate).await?;
            moved += keys.len();
        }
        // The target first, so that the slot is never without an owner that knows it.
        for node in [target, source] {
            self.ask(node, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id])
                .await?;
        }
        for (index, node) in self.nodes.iter().enumerate() {
            if index != from && index != to && self.is_primary(node).await? {
                self.ask(node, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id])
                    .await?;
            }
        }
        info!(slot, from, to, keys = moved, "Redis Cluster slot migrated");
        Ok(())
    }

    /// Has replica `index` take over from its primary (`CLUSTER FAILOVER`), and waits until
    /// it serves as a primary, the table [`owner_of`](Self::owner_of) reads says so, and
    /// every node sees every slot served again.
    pub async fn failover(&self, index: usize) -> Result<(), ServerError> {
        let replica = self.member(index)?;
        let address = replica.socket_addr();
        self.ask(replica, &["CLUSTER", "FAILOVER"]).await?;
        let deadline = Instant::now() + self.opts.startup_timeout;
        // The replica knows its new role first; another node learns it by gossip.
        let took_over = || async move {
            let served = |table: Vec<Entry>| {
                let serves = |entry: &Entry| entry.primary && !entry.slots.is_empty();
                table
                    .iter()
                    .any(|entry| entry.address == address && serves(entry))
            };
            match self.is_primary(replica).await.unwrap_or(false)
                && self.table().await.is_ok_and(served)
            {
                true => Ok(()),
                false => Err(String::new()),
            }
        };
        let what = format!("{address} to take over");
        poll(deadline, self.opts.startup_timeout, &what, took_over).await?;
        self.wait_until_settled(deadline).await
    }

    /// Kills node `index` and, if it was a primary, waits until its replica serves its slots
    /// and every running node sees every slot served again (a node is called failing after
    /// [`RedisClusterOptions::node_timeout`]); [`RedisServer::restart`] it through
    /// [`nodes_mut`](Self::nodes_mut) to have it rejoin, as a replica.
    pub async fn kill_and_fail_over(&mut self, index: usize) -> Result<(), ServerError> {
        let address = self.member(index)?.socket_addr();
        let table = self.table().await?;
        let served: Vec<u16> = table
            .iter()
            .filter(|entry| entry.address == address && entry.primary)
            .flat_map(|entry| entry.slots.iter().map(|&(low, _)| low))
            .collect();
        self.nodes[index].kill();
        let deadline = Instant::now() + self.opts.startup_timeout;
        let this = &*self;
        for slot in served {
            let taken_over = || async move {
                match this.owner_of(slot).await {
                    Ok(owner) if owner != index => Ok(()),
                    Ok(_) => Err(String::new()),
                    Err(error) => Err(error.to_string()),
                }
            };
            let what = format!("a replica to take over slot {slot} from {address}");
            poll(deadline, self.opts.startup_timeout, &what, taken_over).await?;
        }
        self.wait_until_settled(deadline).await
    }

    /// The index of a replica of the primary `primary` (an index in [`nodes`](Self::nodes))
    /// that is not failing, as the first node that answers sees it.
    pub async fn replica_of(&self, primary: usize) -> Result<usize, ServerError> {
        let address = self.member(primary)?.socket_addr();
        let table = self.table().await?;
        let id = table
            .iter()
            .find(|entry| entry.address == address)
            .map(|entry| entry.id.as_str())
            .ok_or_else(|| protocol(format!("{address} is not in the cluster's table")))?;
        let replica = table
            .iter()
            .find(|entry| entry.follows.as_deref() == Some(id) && !entry.failing)
            .ok_or_else(|| protocol(format!("{address} has no replica that is not failing")))?;
        self.index_of(replica.address)
    }

    /// Starts node `index` again after a kill (see
    /// [`kill_and_fail_over`](Self::kill_and_fail_over)) with what it knew of the cluster,
    /// and waits until it has rejoined (a primary replaced meanwhile comes back as a replica
    /// of its successor) and the cluster has settled.
    pub async fn rejoin(&mut self, index: usize) -> Result<(), ServerError> {
        let len = self.nodes.len();
        let node = self
            .nodes
            .get_mut(index)
            .ok_or(ServerError::NoSuchMember { index, len })?;
        node.restart().await?;
        self.settled().await
    }

    /// Waits, bounded by [`RedisClusterOptions::startup_timeout`], until every running node
    /// says the cluster is ok with every slot and knows every node, and every replica holds
    /// its primary's copy (after a failover, the old primary is then a replica).
    pub async fn settled(&self) -> Result<(), ServerError> {
        self.wait_until_settled(Instant::now() + self.opts.startup_timeout)
            .await
    }

    /// Waits until every running node says the cluster is ok with every slot and knows
    /// every node, and every replica holds its primary's copy.
    async fn wait_until_settled(&self, deadline: Instant) -> Result<(), ServerError> {
        let total = self.nodes.len().to_string();
        let total = total.as_str();
        let settled = || async move {
            for node in self.nodes.iter().filter(|node| node.pid().is_some()) {
                let info = self.ask(node, &["CLUSTER", "INFO"]).await;
                let info = info.map_err(|error| error.to_string())?.concat();
                let field = |name: &str| {
                    info.lines()
                        .find_map(|line| line.trim().strip_prefix(name))
                        .map(str::to_owned)
                };
                if field("cluster_state:").as_deref() != Some("ok")
                    || field("cluster_slots_ok:").as_deref() != Some("16384")
                    || field("cluster_known_nodes:").as_deref() != Some(total)
                {
                    return Err(format!("{} says {info:?}", node.socket_addr()));
                }
                if let Ok(role) = self.ask(node, &["ROLE"]).await
                    && role.first().is_some_and(|role| role == "slave")
                    && role.get(3).is_none_or(|state| state != "connected")
                {
                    let node = node.socket_addr();
                    return Err(format!("{node} is a replica in state {role:?}"));
                }
            }
            Ok(())
        };
        poll(
            deadline,
            self.opts.startup_timeout,
            "the cluster to settle",
            settled,
        )
        .await
    }

    /// Every node as the first node that answers `CLUSTER NODES` lists it.
    async fn table(&self) -> Result<Vec<Entry>, ServerError> {
        let text = self.ask_any(&["CLUSTER", "NODES"]).await?.concat();
        Ok(text.lines().filter_map(Entry::parse).collect())
    }

    async fn is_primary(&self, node: &RedisServer) -> Result<bool, ServerError> {
        let role = self.ask(node, &["ROLE"]).await?;
        Ok(role.first().is_some_and(|role| role == "master"))
    }

    async fn id_of(&self, node: &RedisServer) -> Result<String, ServerError> {
        let answer = self.ask(node, &["CLUSTER", "MYID"]).await?;
        answer
            .into_iter()
            .next()
            .ok_or_else(|| protocol("CLUSTER MYID answered nothing".to_owned()))
    }

    fn index_of(&self, address: SocketAddr) -> Result<usize, ServerError> {
        self.nodes
            .iter()
            .position(|node| node.socket_addr() == address)
            .ok_or_else(|| protocol(format!("{address} is not a node of the set")))
    }

    fn member(&self, index: usize) -> Result<&RedisServer, ServerError> {
        let len = self.nodes.len();
        self.nodes
            .get(index)
            .ok_or(ServerError::NoSuchMember { index, len })
    }

    async fn ask(&self, node: &RedisServer, args: &[&str]) -> Result<Vec<String>, ServerError> {
        let password = self.opts.server.password.as_deref();
        redis_query(node.socket_addr(), password, args, ASK_TIMEOUT).await
    }

    /// `args` to the first node that answers.
    async fn ask_any(&self, args: &[&str]) -> Result<Vec<String>, ServerError> {
        let mut last = None;
        for node in &self.nodes {
            match self.ask(node, args).await {
                Ok(answer) => return Ok(answer),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or(ServerError::NotRunning {
            server: CLUSTER.to_owned(),
        }))
    }
}

/// One line of `CLUSTER NODES`: `id ip:port@cport flags primary ping pong epoch link slots…`.
#[derive(Debug)]
struct Entry {
    id: String,
    address: SocketAddr,
    /// The id of the primary it replicates, for a replica.
    follows: Option<String>,
    /// Called failing (`fail`), or suspected (`fail?`).
    failing: bool,
    primary: bool,
    /// Served slot ranges, inclusive (migration markers such as `[5->-id]` left out).
    slots: Vec<(u16, u16)>,
}

impl Entry {
    fn parse(line: &str) -> Option<Entry> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let address = fields.get(1)?.split('@').next()?.parse().ok()?;
        let follows = fields
            .get(3)
            .filter(|primary| **primary != "-")
            .map(|primary| (*primary).to_owned());
        let flags = fields.get(2)?;
        let failing = flags
            .split(',')
            .any(|flag| flag == "fail" || flag == "fail?");
        let primary = flags.split(',').any(|flag| flag == "master")
            && !flags.split(',').any(|flag| flag == "fail");
        let slots = fields
            .get(8..)
            .unwrap_or_default()
            .iter()
            .filter(|range| !range.starts_with('['))
            .filter_map(|range| match range.split_once('-') {
                Some((low, high)) => Some((low.parse().ok()?, high.parse().ok()?)),
                None => range.parse().ok().map(|slot| (slot, slot)),
            })
            .collect();
        Some(Entry {
            id: (*fields.first()?).to_owned(),
            address,
            follows,
            failing,
            primary,
            slots,
        })
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|&(low, high)| (low..=high).contains(&slot))
    }
}

fn protocol(detail: String) -> ServerError {
    ServerError::Protocol {
        server: CLUSTER.to_owned(),
        detail,
    }
}
