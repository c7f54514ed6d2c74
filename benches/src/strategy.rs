//! The strategies the herd scenario compares, and the clients that run them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockError, LockProvider};
use lock_etcd::{EtcdConfig, EtcdLockProvider, EtcdStrategy};
use lock_postgres::{PostgresConfig, PostgresLockProvider, PostgresStrategy};
use lock_redis::{RedisConfig, RedisLockProvider, RedisStrategy};
use lock_zookeeper::{ZkConfig, ZkLockProvider, ZkStrategy};

use crate::peers::{RecipeProvider, V3LockProvider};

/// The lease of the etcd clients: long enough that keep-alives (every third of it) add
/// next to nothing to a run's server requests.
pub const ETCD_LEASE_TTL: Duration = Duration::from_secs(30);

/// One way of waiting for a lock, on one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// ZooKeeper, one ephemeral node, every waiter watches it (herd).
    ZkSingle,
    /// ZooKeeper sequential nodes, every waiter watches the directory (herd).
    ZkChildren,
    /// ZooKeeper sequential nodes, each waiter watches its predecessor (herd-free).
    ZkPredecessor,
    /// The peer: zookeeper-client's own lock recipe (Curator-compatible, predecessor watch).
    ZkRecipe,
    /// Redis, retry with jittered back-off.
    RedisPolling,
    /// Redis, a release broadcasts and every waiter retries (herd).
    RedisPubSub,
    /// Redis, a release hands the lock to the head of a queue (herd-free).
    RedisQueue,
    /// etcd, one key, every waiter watches it (herd).
    EtcdSingle,
    /// etcd, a key per contender, every waiter watches the whole prefix (herd).
    EtcdPrefix,
    /// etcd, a key per contender, each waiter watches its predecessor (herd-free).
    EtcdPredecessor,
    /// The peer: etcd's own lock service (`v3lock`, `concurrency.Mutex` run by the server).
    EtcdV3Lock,
    /// PostgreSQL, waiters queue on the server's advisory lock (herd-free).
    PgAdvisory,
    /// PostgreSQL, a release notifies and every waiter tries again (herd).
    PgNotify,
    /// PostgreSQL, retry with jittered back-off.
    PgPolling,
}

impl Strategy {
    /// Every strategy, in the order reports list them.
    pub const ALL: [Strategy; 14] = [
        Strategy::ZkSingle,
        Strategy::ZkChildren,
        Strategy::ZkPredecessor,
        Strategy::ZkRecipe,
        Strategy::RedisPolling,
        Strategy::RedisPubSub,
        Strategy::RedisQueue,
        Strategy::EtcdSingle,
        Strategy::EtcdPrefix,
        Strategy::EtcdPredecessor,
        Strategy::EtcdV3Lock,
        Strategy::PgAdvisory,
        Strategy::PgNotify,
        Strategy::PgPolling,
    ];

    /// The name on the command line and in reports, e.g. `zk-predecessor`.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::ZkSingle => "zk-single",
            Strategy::ZkChildren => "zk-children",
            Strategy::ZkPredecessor => "zk-predecessor",
            Strategy::ZkRecipe => "zk-recipe",
            Strategy::RedisPolling => "redis-polling",
            Strategy::RedisPubSub => "redis-pubsub",
            Strategy::RedisQueue => "redis-queue",
            Strategy::EtcdSingle => "etcd-single",
            Strategy::EtcdPrefix => "etcd-prefix",
            Strategy::EtcdPredecessor => "etcd-predecessor",
            Strategy::EtcdV3Lock => "etcd-v3lock",
            Strategy::PgAdvisory => "pg-advisory",
            Strategy::PgNotify => "pg-notify",
            Strategy::PgPolling => "pg-polling",
        }
    }

    /// The backend the strategy runs on.
    pub fn backend(self) -> Backend {
        match self {
            Strategy::ZkSingle
            | Strategy::ZkChildren
            | Strategy::ZkPredecessor
            | Strategy::ZkRecipe => Backend::ZooKeeper,
            Strategy::RedisPolling | Strategy::RedisPubSub | Strategy::RedisQueue => Backend::Redis,
            Strategy::EtcdSingle
            | Strategy::EtcdPrefix
            | Strategy::EtcdPredecessor
            | Strategy::EtcdV3Lock => Backend::Etcd,
            Strategy::PgAdvisory | Strategy::PgNotify | Strategy::PgPolling => Backend::Postgres,
        }
    }

    /// Whether this is a peer's lock rather than distlock's (it keeps no wake-up counts).
    pub fn is_peer(self) -> bool {
        matches!(self, Strategy::ZkRecipe | Strategy::EtcdV3Lock)
    }

    /// Whether a release wakes only the next waiter (reports list these as herd-free).
    pub fn herd_free(self) -> bool {
        matches!(
            self,
            Strategy::ZkPredecessor
                | Strategy::ZkRecipe
                | Strategy::RedisQueue
                | Strategy::EtcdPredecessor
                | Strategy::EtcdV3Lock
                | Strategy::PgAdvisory
        )
    }

    /// Whether a release wakes every waiter (reports list these as herd). Polling is
    /// neither: its waiters wake on their own clock.
    pub fn herd(self) -> bool {
        matches!(
            self,
            Strategy::ZkSingle
                | Strategy::ZkChildren
                | Strategy::RedisPubSub
                | Strategy::EtcdSingle
                | Strategy::EtcdPrefix
                | Strategy::PgNotify
        )
    }

    /// A new client (its own session or connection) running this strategy.
    ///
    /// # Errors
    ///
    /// The backend's connection errors.
    pub async fn connect(self, servers: &Servers) -> Result<Arc<dyn LockProvider>, LockError> {
        self.connect_ending(servers)
            .await
            .map(|(provider, _)| provider)
    }

    /// A new client as [`connect`](Self::connect) makes it, and how to have its server end
    /// its session.
    ///
    /// # Errors
    ///
    /// The backend's connection errors.
    pub async fn connect_ending(
        self,
        servers: &Servers,
    ) -> Result<(Arc<dyn LockProvider>, SessionEnd), LockError> {
        let zk = || {
            servers.zk.clone().ok_or_else(|| LockError::Config {
                message: format!("{self} needs a ZooKeeper server"),
            })
        };
        let redis = || {
            servers.redis.clone().ok_or_else(|| LockError::Config {
                message: format!("{self} needs a Redis server"),
            })
        };
        let zk_strategy = match self {
            Strategy::ZkSingle => Some(ZkStrategy::SingleNode),
            Strategy::ZkChildren => Some(ZkStrategy::WholeQueue),
            Strategy::ZkPredecessor => Some(ZkStrategy::SequentialPredecessor),
            _ => None,
        };
        if let Some(strategy) = zk_strategy {
            let endpoints = zk()?;
            let config = ZkConfig::new(endpoints.split(','))
                .with_strategy(strategy)
                .with_session_timeout(ZK_SESSION_TIMEOUT);
            let provider = ZkLockProvider::connect(config).await?;
            let end =
                provider
                    .client()
                    .map_or(SessionEnd::Unsupported, |client| SessionEnd::ZooKeeper {
                        session: client.session().clone(),
                        endpoints,
                    });
            return Ok((Arc::new(provider), end));
        }
        let redis_strategy = match self {
            Strategy::RedisPolling => Some(RedisStrategy::Polling),
            Strategy::RedisPubSub => Some(RedisStrategy::PubSub),
            Strategy::RedisQueue => Some(RedisStrategy::Queue),
            _ => None,
        };
        if let Some(strategy) = redis_strategy {
            let mut config = RedisConfig::from_url(&redis()?)?;
            config.strategy = strategy;
            config.lease.ttl = Duration::from_secs(10);
            let provider = RedisLockProvider::connect(config).await?;
            return Ok((Arc::new(provider), SessionEnd::Unsupported));
        }
        let etcd = || {
            servers.etcd.clone().ok_or_else(|| LockError::Config {
                message: format!("{self} needs an etcd server"),
            })
        };
        let etcd_strategy = match self {
            Strategy::EtcdSingle => Some(EtcdStrategy::Single),
            Strategy::EtcdPrefix => Some(EtcdStrategy::WholeQueue),
            Strategy::EtcdPredecessor => Some(EtcdStrategy::Predecessor),
            _ => None,
        };
        if let Some(strategy) = etcd_strategy {
            let endpoint = etcd()?;
            let config = EtcdConfig::new([endpoint.clone()])
                .with_strategy(strategy)
                .with_lease_ttl(ETCD_LEASE_TTL);
            let provider = EtcdLockProvider::connect(config).await?;
            let end = provider
                .lease_id()
                .map_or(SessionEnd::Unsupported, |lease| SessionEnd::Etcd {
                    endpoint,
                    lease,
                });
            return Ok((Arc::new(provider), end));
        }
        let postgres_strategy = match self {
            Strategy::PgAdvisory => Some(PostgresStrategy::Advisory),
            Strategy::PgNotify => Some(PostgresStrategy::Notify),
            Strategy::PgPolling => Some(PostgresStrategy::Polling),
            _ => None,
        };
        if let Some(strategy) = postgres_strategy {
            let url = servers.postgres.clone().ok_or_else(|| LockError::Config {
                message: format!("{self} needs a PostgreSQL server"),
            })?;
            let mut config = PostgresConfig::new(url.clone());
            config.strategy = strategy;
            let provider = PostgresLockProvider::connect(config).await?;
            return Ok((Arc::new(provider), SessionEnd::Postgres { url }));
        }
        let peer: Arc<dyn LockProvider> = match self {
            Strategy::EtcdV3Lock => {
                Arc::new(V3LockProvider::connect(&etcd()?, ETCD_LEASE_TTL).await?)
            }
            _ => Arc::new(RecipeProvider::connect(&zk()?).await?),
        };
        Ok((peer, SessionEnd::Unsupported))
    }
}

/// The session timeout of the ZooKeeper clients the benchmark makes.
const ZK_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a ZooKeeper session is taken over before its end counts as refused.
const ZK_TAKEOVER_TRIES: u32 = 8;

/// How long a takeover of a ZooKeeper session may take.
const ZK_TAKEOVER_WAIT: Duration = Duration::from_secs(5);

/// The pause between takeovers of a ZooKeeper session: time for the close to go out.
const ZK_TAKEOVER_PAUSE: Duration = Duration::from_millis(50);

/// How the server is made to end a client's session, where it keeps one: what the scale
/// mode does to see every lost signal fire.
#[derive(Debug)]
#[non_exhaustive]
pub enum SessionEnd {
    /// ZooKeeper: the session taken over on a connection of our own (the server drops the
    /// client's), then closed.
    ZooKeeper {
        /// The client's session.
        session: zookeeper_client::SessionInfo,
        /// The servers, `host:port,…`.
        endpoints: String,
    },
    /// etcd: the session's lease revoked.
    Etcd {
        /// A member.
        endpoint: String,
        /// The session's lease.
        lease: i64,
    },
    /// PostgreSQL: the server processes of the client's connections (application name
    /// `distlock`) terminated.
    Postgres {
        /// The server.
        url: String,
    },
    /// No session on the server to end: Redis's leases, the peers' recipes.
    Unsupported,
}

impl SessionEnd {
    /// Has the server end the session; `false` when there is none to end.
    ///
    /// # Errors
    ///
    /// Connection errors, and a server that refuses.
    pub async fn end(&self) -> Result<bool, LockError> {
        let failed = |what: &str, error: &dyn fmt::Display| {
            LockError::other("herd", format!("ending the session: {what}: {error}"))
        };
        match self {
            SessionEnd::ZooKeeper { session, endpoints } => {
                // The server drops the client's connection for ours, and the client
                // reconnects at once and may take the session back: before our handshake
                // ends, or before the close that our handle's drop sends went out, which
                // then goes nowhere. So taken over and closed until a takeover finds the
                // session expired.
                for _ in 0..ZK_TAKEOVER_TRIES {
                    let connecting = zookeeper_client::Client::connector()
                        .with_session(session.clone())
                        .with_session_timeout(ZK_SESSION_TIMEOUT)
                        .connect(endpoints);
                    match tokio::time::timeout(ZK_TAKEOVER_WAIT, connecting).await {
                        Ok(Err(zookeeper_client::Error::SessionExpired)) => return Ok(true),
                        // The last handle's drop sends the session's close.
                        Ok(Ok(taken)) => drop(taken),
                        Ok(Err(_)) | Err(_) => {}
                    }
                    tokio::time::sleep(ZK_TAKEOVER_PAUSE).await;
                }
                return Err(failed(
                    "closing the ZooKeeper session",
                    &format!("still open after {ZK_TAKEOVER_TRIES} takeovers"),
                ));
            }
            SessionEnd::Etcd { endpoint, lease } => {
                let client = etcd_client::Client::connect([endpoint], None)
                    .await
                    .map_err(|e| failed("connecting to etcd", &e))?;
                client
                    .lease_client()
                    .revoke(*lease)
                    .await
                    .map_err(|e| failed("revoking the lease", &e))?;
            }
            SessionEnd::Postgres { url } => {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| failed("connecting to PostgreSQL", &e))?;
                tokio::spawn(connection);
                client
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE application_name = 'distlock' AND pid <> pg_backend_pid()",
                        &[],
                    )
                    .await
                    .map_err(|e| failed("terminating the connections", &e))?;
            }
            SessionEnd::Unsupported => return Ok(false),
        }
        Ok(true)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|strategy| strategy.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<_> = Strategy::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown strategy {s:?}; known: {}", known.join(", "))
            })
    }
}

/// The backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// ZooKeeper.
    ZooKeeper,
    /// Redis.
    Redis,
    /// etcd.
    Etcd,
    /// PostgreSQL.
    Postgres,
}

impl Backend {
    /// `zookeeper`, `redis`, `etcd` or `postgres`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::ZooKeeper => "zookeeper",
            Backend::Redis => "redis",
            Backend::Etcd => "etcd",
            Backend::Postgres => "postgres",
        }
    }
}

/// Where the servers are: a ZooKeeper connect string, a Redis URL, an etcd endpoint and a
/// PostgreSQL URL.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Servers {
    /// `host:port[,host:port…]`.
    pub zk: Option<String>,
    /// `redis://host:port`, or a Redis Cluster's `redis+cluster://n1,n2,…`.
    pub redis: Option<String>,
    /// `http://host:port`.
    pub etcd: Option<String>,
    /// `postgres://user@host:port/db`.
    pub postgres: Option<String>,
}

impl Servers {
    /// The servers at `zk` (a connect string) and `redis` (a URL), no etcd, no PostgreSQL.
    pub fn new(zk: Option<String>, redis: Option<String>) -> Self {
        Servers {
            zk,
            redis,
            etcd: None,
            postgres: None,
        }
    }

    /// The same, with PostgreSQL at `url`.
    pub fn with_postgres(mut self, url: Option<String>) -> Self {
        self.postgres = url;
        self
    }

    /// The same, with etcd at `endpoint`.
    pub fn with_etcd(mut self, endpoint: Option<String>) -> Self {
        self.etcd = endpoint;
        self
    }

    /// A client of each Redis server: the one server, the primary the sentinels of a
    /// `redis+sentinel://` URL name, or every node a cluster's URL names (with the URL's
    /// login); none without Redis.
    ///
    /// # Errors
    ///
    /// A URL that does not parse; sentinels that name no primary.
    pub async fn redis_servers(&self) -> Result<Vec<redis::Client>, LockError> {
        use redis::IntoConnectionInfo;
        let Some(url) = self.redis.as_deref() else {
            return Ok(Vec::new());
        };
        let failed = |e: redis::RedisError| LockError::config(format!("{url}: {e}"));
        let config = RedisConfig::from_url(url)?;
        let mut login = redis::RedisConnectionInfo::default().set_db(config.server.db);
        if let Some(user) = &config.server.username {
            login = login.set_username(user);
        }
        if let Some(password) = &config.server.password {
            login = login.set_password(password);
        }
        if let Some(sentinel) = &config.sentinel {
            let sentinels = sentinel.sentinels.iter().map(|at| format!("redis://{at}"));
            let mut sentinels =
                redis::sentinel::Sentinel::build(sentinels.collect::<Vec<_>>()).map_err(failed)?;
            let node = redis::sentinel::SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(login);
            let primary = sentinels.async_master_for(&sentinel.service, Some(&node));
            return Ok(vec![primary.await.map_err(failed)?]);
        }
        let Some(cluster) = &config.cluster else {
            return Ok(vec![redis::Client::open(url).map_err(failed)?]);
        };
        cluster
            .urls()
            .into_iter()
            .map(|node| {
                let info = node.into_connection_info().map_err(failed)?;
                redis::Client::open(info.set_redis_settings(login.clone())).map_err(failed)
            })
            .collect()
    }
}
