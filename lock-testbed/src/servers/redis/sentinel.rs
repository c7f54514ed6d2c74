//! A Redis primary with replicas under Redis Sentinel, all child processes or all
//! containers: what production Redis often is, with failovers on demand.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use super::encode_userinfo;
use crate::servers::members::poll;
use crate::servers::probe::redis_query;
use crate::servers::process::{free_port, require_program};
use crate::servers::spec::{Command, Probe, ServerSpec, Site};
use crate::servers::{
    DEFAULT_STARTUP_TIMEOUT, RedisOptions, RedisTarget, ServerError, ServerMode, Target,
};

const SENTINEL: &str = "Redis Sentinel";
/// How long one question to a server may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// How to run a [`RedisSentinelSet`].
///
/// Build it from [`RedisSentinelOptions::default`] and the `with_*` methods.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisSentinelOptions {
    /// The name the sentinels monitor the primary under: `distlock` by default.
    pub service: String,
    /// How the data servers run (password, ACL user, binary): every one alike. The
    /// sentinels and the replicas log in with its password.
    pub server: RedisOptions,
    /// How many replicas: 2 by default.
    pub replicas: usize,
    /// How many sentinels (the quorum is a majority of them): 3 by default.
    pub sentinels: usize,
    /// How long the primary must be silent before the sentinels call it down: 1 s by
    /// default.
    pub down_after: Duration,
    /// The bound on start-up (every server, and the sentinels knowing each other and the
    /// replicas) and on a failover: [`DEFAULT_STARTUP_TIMEOUT`] by default.
    pub startup_timeout: Duration,
    /// Child processes (the default) or containers. Containers run on the host's network,
    /// on loopback ports as processes do: the sentinels tell clients the data servers'
    /// addresses, which must be the same inside and outside the containers.
    pub servers: ServerMode,
}

impl Default for RedisSentinelOptions {
    fn default() -> Self {
        RedisSentinelOptions {
            service: "distlock".to_owned(),
            server: RedisOptions::default(),
            replicas: 2,
            sentinels: 3,
            down_after: Duration::from_secs(1),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            servers: ServerMode::Processes,
        }
    }
}

impl RedisSentinelOptions {
    /// Sets how the data servers run.
    pub fn with_server(mut self, server: RedisOptions) -> Self {
        self.server = server;
        self
    }

    /// Sets the service name.
    pub fn with_service(mut self, service: impl Into<String>) -> Self {
        self.service = service.into();
        self
    }

    /// Sets where the servers run.
    pub fn with_servers(mut self, servers: ServerMode) -> Self {
        self.servers = servers;
        self
    }

    /// Sets how long the primary must be silent before the sentinels call it down.
    pub fn with_down_after(mut self, down_after: Duration) -> Self {
        self.down_after = down_after;
        self
    }
}

/// A primary, its replicas and the sentinels that watch them, on 127.0.0.1.
///
/// The data servers are [`RedisTarget`]s, processes or containers (no persistence);
/// [`failover`](Self::failover) has the sentinels promote a replica,
/// [`kill_primary`](Self::kill_primary) kills the primary and waits until they have.
/// Dropping the set stops every process and removes every container.
#[derive(Debug)]
pub struct RedisSentinelSet {
    /// The first started as the primary; which one is primary now, the sentinels say.
    data: Vec<RedisTarget>,
    /// Each sentinel with its address.
    sentinels: Vec<(SocketAddr, Target<SentinelSpec>)>,
    opts: RedisSentinelOptions,
}

impl RedisSentinelSet {
    /// Starts the primary, the replicas and the sentinels, and waits (bounded by
    /// [`RedisSentinelOptions::startup_timeout`]) until every sentinel knows the other
    /// sentinels and the replicas: from then on a failover can happen.
    pub async fn start(opts: RedisSentinelOptions) -> Result<Self, ServerError> {
        let began = Instant::now();
        // A primary waits 5 s by default before it sends a replica its first copy (for
        // more replicas to join the same transfer): each data server may become primary.
        let mut server = opts
            .server
            .clone()
            .with_arg("--repl-diskless-sync-delay")
            .with_arg("0");
        // Each may become a replica of another (the sentinels demote a primary they replaced).
        if let Some(password) = &opts.server.password {
            server = server.with_arg("--masterauth").with_arg(password.clone());
        }
        let start = |server| async move {
            RedisTarget::start_on_port(opts.servers, server, free_port()?).await
        };
        let primary = start(server.clone()).await?;
        let primary_port = address(&primary)?.port();
        let mut data = vec![primary];
        for _ in 0..opts.replicas {
            let replica = server
                .clone()
                .with_arg("--replicaof")
                .with_arg("127.0.0.1")
                .with_arg(primary_port.to_string());
            data.push(start(replica).await?);
        }
        // The sentinels' failover timeout is 2 s: a sentinel starts no failover of a primary
        // within twice that of its last one, so that a primary killed soon after a failover
        // goes without a successor for 4 s at most.
        // Each sentinel is told the others and the replicas up front, rather than left to
        // find them through the primary (hello messages every 2 s, INFO every 10 s): that
        // took the set about 5 s to start. Should a port turn out taken, that sentinel
        // takes another and the others find it the slow way.
        let peers = (0..opts.sentinels)
            .map(|_| Ok((free_port()?, sentinel_id())))
            .collect::<Result<Vec<_>, ServerError>>()?;
        let replicas = data[1..]
            .iter()
            .map(|replica| Ok(address(replica)?.port()))
            .collect::<Result<Vec<u16>, ServerError>>()?;
        let mut sentinels = Vec::with_capacity(opts.sentinels);
        for me in 0..opts.sentinels {
            let spec = SentinelSpec {
                opts: opts.clone(),
                primary_port,
                me,
                peers: peers.clone(),
                replicas: replicas.clone(),
            };
            let port = spec.port();
            let sentinel = Target::start_on_port(opts.servers, spec, port).await?;
            sentinels.push((address(&sentinel)?, sentinel));
        }
        let set = RedisSentinelSet {
            data,
            sentinels,
            opts,
        };
        set.wait_until_known(began + set.opts.startup_timeout)
            .await?;
        info!(took = ?began.elapsed(), sentinels = ?set.sentinel_addresses(), "Redis Sentinel set ready");
        Ok(set)
    }

    /// The sentinels' addresses, `127.0.0.1:port`.
    pub fn sentinel_addresses(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(address, _)| address.to_string())
            .collect()
    }

    /// The service name.
    pub fn service(&self) -> &str {
        &self.opts.service
    }

    /// `redis+sentinel://[user:password@]s1,s2,s3/SERVICE`, logging in to the data servers
    /// as `login` (user, password) if given.
    pub fn url(&self, login: Option<(&str, &str)>) -> String {
        let userinfo = login.map_or(String::new(), |(user, password)| {
            format!("{}:{}@", encode_userinfo(user), encode_userinfo(password))
        });
        format!(
            "redis+sentinel://{userinfo}{}/{}",
            self.sentinel_addresses().join(","),
            self.opts.service
        )
    }

    /// The data servers, the first started as the primary.
    pub fn data_servers(&self) -> &[RedisTarget] {
        &self.data
    }

    /// The data servers, mutably (to kill or restart one).
    pub fn data_servers_mut(&mut self) -> &mut [RedisTarget] {
        &mut self.data
    }

    /// The data servers' addresses (`127.0.0.1:port`), in the same order.
    pub fn data_addresses(&self) -> Vec<SocketAddr> {
        self.data
            .iter()
            .filter_map(RedisTarget::socket_addr)
            .collect()
    }

    /// The primary as the first sentinel that answers names it.
    pub async fn primary(&self) -> Result<SocketAddr, ServerError> {
        let mut last = None;
        for (address, _) in &self.sentinels {
            match self.primary_by(*address).await {
                Ok(primary) => return Ok(primary),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or(ServerError::NotRunning {
            server: SENTINEL.to_owned(),
        }))
    }

    /// Has the sentinels promote a replica (`SENTINEL FAILOVER`), and waits until every
    /// sentinel names the new primary and it says it is one. Returns its address.
    pub async fn failover(&self) -> Result<SocketAddr, ServerError> {
        let before = self.primary().await?;
        let sentinel = self.sentinels[0].0;
        let service = self.opts.service.as_str();
        // Refused while the sentinels still settle a previous failover: asked again.
        let ask = ["SENTINEL", "FAILOVER", service];
        let failover = || async move {
            let answer = redis_query(sentinel, None, &ask, ASK_TIMEOUT).await;
            answer.map_err(|error| error.to_string())
        };
        poll(
            self.deadline(),
            self.opts.startup_timeout,
            "a failover",
            failover,
        )
        .await?;
        self.wait_for_new_primary(before).await
    }

    /// Kills the primary, and waits until every sentinel names a new primary and it says
    /// it is one (the old one stays killed; [`rejoin`](Self::rejoin) has it come back as
    /// a replica).
    /// Returns the old primary's index in [`data_servers`](Self::data_servers) and the new
    /// primary's address.
    pub async fn kill_primary(&mut self) -> Result<(usize, SocketAddr), ServerError> {
        let before = self.primary().await?;
        let index = self.index_of(before)?;
        self.member_mut(index)?.kill().await?;
        let after = self.wait_for_new_primary(before).await?;
        Ok((index, after))
    }

    /// Tells every sentinel to call the primary down after `down_after` of silence from now
    /// on ([`RedisSentinelOptions::down_after`] at the start): a set that fails over only
    /// when its primary is killed starts with a long one and shortens it for the kill.
    pub async fn set_down_after(&mut self, down_after: Duration) -> Result<(), ServerError> {
        let millis = down_after.as_millis().to_string();
        let args = [
            "SENTINEL",
            "SET",
            self.opts.service.as_str(),
            "down-after-milliseconds",
            &millis,
        ];
        for (address, _) in &self.sentinels {
            redis_query(*address, None, &args, ASK_TIMEOUT).await?;
        }
        self.opts.down_after = down_after;
        Ok(())
    }

    /// The index in [`data_servers`](Self::data_servers) of the primary the sentinels name.
    pub async fn primary_index(&self) -> Result<usize, ServerError> {
        let primary = self.primary().await?;
        self.index_of(primary)
    }

    /// Starts data server `index` again after a kill and has it replicate the primary the
    /// sentinels name, as the configuration file they rewrite would have it do (a server
    /// started from arguments comes back with its first role); waits until it is a replica.
    pub async fn rejoin(&mut self, index: usize) -> Result<(), ServerError> {
        self.member_mut(index)?.restart().await?;
        let own = self.address_of(index)?;
        let primary = self.primary().await?;
        if primary != own {
            let password = self.opts.server.password.as_deref();
            let (host, port) = (primary.ip().to_string(), primary.port().to_string());
            redis_query(own, password, &["REPLICAOF", &host, &port], ASK_TIMEOUT).await?;
        }
        self.wait_until_replica(index).await
    }

    /// Waits (bounded by [`RedisSentinelOptions::startup_timeout`]) until data server
    /// `index` answers `ROLE` as a replica that holds its primary's copy, unless the
    /// sentinels name it primary. A primary
    /// the sentinels replaced while it ran goes on taking writes until they demote it, about
    /// 8 s after the failover.
    pub async fn wait_until_replica(&self, index: usize) -> Result<(), ServerError> {
        let own = self.address_of(index)?;
        let password = self.opts.server.password.as_deref();
        let replica = || async move {
            // A replica answers `slave, host, port, state, offset`; "connected" once it holds
            // its primary's copy (a server started from its old files must not be promoted
            // before).
            match redis_query(own, password, &["ROLE"], ASK_TIMEOUT).await {
                Ok(role)
                    if role.first().is_some_and(|r| r == "slave")
                        && role.get(3).is_some_and(|s| s == "connected") =>
                {
                    Ok(())
                }
                Ok(_) if self.primary().await.is_ok_and(|primary| primary == own) => Ok(()),
                Ok(role) => Err(format!("ROLE answers {role:?}")),
                Err(error) => Err(error.to_string()),
            }
        };
        let what = format!("{own} to become a replica");
        poll(self.deadline(), self.opts.startup_timeout, &what, replica).await
    }

    /// The end of a wait bounded by [`RedisSentinelOptions::startup_timeout`], from now.
    fn deadline(&self) -> Instant {
        Instant::now() + self.opts.startup_timeout
    }

    fn index_of(&self, address: SocketAddr) -> Result<usize, ServerError> {
        self.data
            .iter()
            .position(|own| own.socket_addr() == Some(address))
            .ok_or_else(|| {
                protocol(format!(
                    "the sentinels name {address} as primary, not one of the set"
                ))
            })
    }

    fn address_of(&self, index: usize) -> Result<SocketAddr, ServerError> {
        let len = self.data.len();
        let member = self
            .data
            .get(index)
            .ok_or(ServerError::NoSuchMember { index, len })?;
        address(member)
    }

    fn member_mut(&mut self, index: usize) -> Result<&mut RedisTarget, ServerError> {
        let len = self.data.len();
        self.data
            .get_mut(index)
            .ok_or(ServerError::NoSuchMember { index, len })
    }

    async fn primary_by(&self, sentinel: SocketAddr) -> Result<SocketAddr, ServerError> {
        let service = self.opts.service.as_str();
        let args = ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", service];
        let answer = redis_query(sentinel, None, &args, ASK_TIMEOUT).await?;
        match answer.as_slice() {
            [host, port] => format!("{host}:{port}")
                .parse()
                .map_err(|_| protocol(format!("{sentinel} names {host}:{port} as primary"))),
            other => Err(protocol(format!("{sentinel} answered {other:?}"))),
        }
    }

    /// Waits (bounded by [`RedisSentinelOptions::startup_timeout`]) until every sentinel
    /// names a primary other than `before` and it answers `ROLE` as a master. Returns its
    /// address.
    pub async fn wait_for_new_primary(
        &self,
        before: SocketAddr,
    ) -> Result<SocketAddr, ServerError> {
        let password = self.opts.server.password.as_deref();
        let new_primary = || async move {
            let mut named = Vec::new();
            let mut last = String::from("no sentinel answered");
            for (address, _) in &self.sentinels {
                match self.primary_by(*address).await {
                    Ok(primary) => named.push(primary),
                    Err(error) => last = error.to_string(),
                }
            }
            let Some(&primary) = named.first().filter(|primary| {
                **primary != before
                    && named.len() == self.sentinels.len()
                    && named.iter().all(|other| other == *primary)
            }) else {
                return Err(match named.is_empty() {
                    true => last,
                    false => format!("the sentinels name {named:?}"),
                });
            };
            match redis_query(primary, password, &["ROLE"], ASK_TIMEOUT).await {
                Ok(role) if role.first().is_some_and(|role| role == "master") => {
                    info!(%before, %primary, "Redis Sentinel failed over");
                    Ok(primary)
                }
                Ok(role) => Err(format!("{primary} answers ROLE with {role:?}")),
                Err(error) => Err(error.to_string()),
            }
        };
        let what = format!("a failover away from {before}");
        poll(
            self.deadline(),
            self.opts.startup_timeout,
            &what,
            new_primary,
        )
        .await
    }

    /// Waits until every replica has synchronised with the primary and every sentinel
    /// knows the other sentinels and every replica.
    async fn wait_until_known(&self, deadline: Instant) -> Result<(), ServerError> {
        let primary = self.address_of(0)?;
        let password = self.opts.server.password.as_deref();
        let bound = self.opts.startup_timeout;
        let replicas = self.opts.replicas;
        let synchronised = || async move {
            let info = redis_query(primary, password, &["INFO", "replication"], ASK_TIMEOUT)
                .await
                .map_err(|error| error.to_string())?
                .concat();
            let online = info.matches("state=online").count();
            match online == replicas {
                true => Ok(()),
                false => Err(format!("{online} are")),
            }
        };
        let what = format!("{replicas} replicas online");
        poll(deadline, bound, &what, synchronised).await?;
        let service = self.opts.service.as_str();
        let wanted = |field: &str| match field {
            "num-other-sentinels" => Some(self.sentinels.len() - 1),
            "num-slaves" => Some(replicas),
            _ => None,
        };
        let known = || async move {
            for (address, _) in &self.sentinels {
                let args = ["SENTINEL", "MASTER", service];
                let answer = redis_query(*address, None, &args, ASK_TIMEOUT)
                    .await
                    .map_err(|error| error.to_string())?;
                for pair in answer.chunks(2) {
                    if let [field, value] = pair
                        && let Some(wanted) = wanted(field)
                        && value.parse::<usize>().ok() != Some(wanted)
                    {
                        return Err(format!("{field} is {value}, not {wanted}"));
                    }
                }
            }
            Ok(())
        };
        let what = "the sentinels to know each other and the replicas";
        poll(deadline, bound, what, known).await
    }
}

/// The address of a server of the set (every one is started here, so it has one).
fn address<S: ServerSpec>(server: &Target<S>) -> Result<SocketAddr, ServerError> {
    server.socket_addr().ok_or_else(|| ServerError::NotRunning {
        server: S::NAME.to_owned(),
    })
}

fn protocol(detail: String) -> ServerError {
    ServerError::Protocol {
        server: SENTINEL.to_owned(),
        detail,
    }
}

/// A random sentinel run id: 40 hex digits.
fn sentinel_id() -> String {
    (0..40)
        .map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'))
        .collect()
}

/// One sentinel of a set, monitoring the primary at `primary_port`, told up front its own
/// place among `peers` (port and run id each) and the replicas' ports; from a configuration
/// file, which a sentinel rewrites as it learns.
#[derive(Debug, Clone)]
pub(crate) struct SentinelSpec {
    opts: RedisSentinelOptions,
    primary_port: u16,
    me: usize,
    peers: Vec<(u16, String)>,
    replicas: Vec<u16>,
}

impl ServerSpec for SentinelSpec {
    const NAME: &'static str = SENTINEL;
    const IMAGE_ENV: &'static str = RedisOptions::IMAGE_ENV;
    const CONTAINER_PORTS: &'static [u16] = &[26379];

    fn startup_timeout(&self) -> Duration {
        self.opts.startup_timeout
    }

    fn probe(&self) -> Probe {
        RedisOptions::default().probe()
    }

    fn command(&self, site: &Site<'_>) -> Result<Command, ServerError> {
        let program = match site.in_container {
            true => PathBuf::from("redis-server"),
            false => require_program("Redis", &self.opts.server.binary, "redis-server")?,
        };
        let argv = [
            program.display().to_string(),
            "sentinel.conf".to_owned(),
            "--sentinel".to_owned(),
        ];
        Ok(Command::new(argv).with_file("sentinel.conf", self.config(site.port(0), site.dir)))
    }

    fn client_address(&self, addr: SocketAddr) -> String {
        addr.to_string()
    }
}

impl SentinelSpec {
    /// The configuration of the sentinel on `port`, keeping its files in `dir`.
    fn config(&self, port: u16, dir: &str) -> String {
        let opts = &self.opts;
        let quorum = opts.sentinels / 2 + 1;
        let service = &opts.service;
        let id = self.peers.get(self.me).map_or("", |(_, id)| id.as_str());
        let mut config = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nsentinel myid {id}\n\
             sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n\
             sentinel down-after-milliseconds {service} {down}\n\
             sentinel failover-timeout {service} 2000\n",
            primary_port = self.primary_port,
            down = opts.down_after.as_millis(),
        );
        if let Some(password) = &opts.server.password {
            config.push_str(&format!("sentinel auth-pass {service} {password}\n"));
        }
        for replica in &self.replicas {
            config.push_str(&format!(
                "sentinel known-replica {service} 127.0.0.1 {replica}\n"
            ));
        }
        for (index, (peer, peer_id)) in self.peers.iter().enumerate() {
            if index != self.me {
                config.push_str(&format!(
                    "sentinel known-sentinel {service} 127.0.0.1 {peer} {peer_id}\n"
                ));
            }
        }
        config
    }

    /// The port the other sentinels are told this one serves on.
    fn port(&self) -> u16 {
        self.peers.get(self.me).map_or(0, |(port, _)| *port)
    }
}
