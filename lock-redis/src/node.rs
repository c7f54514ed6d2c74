//! One Redis server as the locks see it: a shared, reconnecting connection for short
//! requests, and dedicated connections for the requests that block; with Redis Sentinel,
//! whichever server is the primary.

use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lock_core::LockError;
use lock_core::kit::unpoisoned;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    Client, ConnectionAddr, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisConnectionInfo,
    RedisError, ScriptInvocation, ServerErrorKind, TlsCertificates,
};

pub(crate) mod list_wait;

use crate::config::{RedisCluster, RedisSentinel, RedisServer, config_error};
use crate::connection::{ClusterClients, Multiplexed, Opener, Own, Settings};
use crate::error::{cluster_lock_error, connection, is_connection, lock_error, timed_out_request};
use crate::scripts::millis;
use crate::subscriber::{Source, Subscriber, Subscription};

/// A connection to one server, counting its requests. With Redis Sentinel the server is
/// the primary the sentinels name, found again after a connection error or a write refused
/// by a replica, so that the node follows failovers.
#[derive(Clone)]
pub(crate) struct Node(Arc<Inner>);

struct Inner {
    settings: Settings,
    /// The server requests go to now; replaced when the sentinels name another.
    link: RwLock<Arc<Link>>,
    finder: Option<Finder>,
}

/// One server's connections, or a cluster's.
struct Link {
    client: Opener,
    manager: Multiplexed,
    address: String,
    /// Idle connections for blocking requests, kept for the next waiter.
    idle: Mutex<Vec<Own>>,
    /// The subscription connection the pub/sub waiters share.
    subscriber: Subscriber,
}

/// How the primary is found through the sentinels.
struct Finder {
    sentinel: tokio::sync::Mutex<Sentinel>,
    service: String,
    login: RedisConnectionInfo,
    /// Held by the search in progress.
    searching: tokio::sync::Mutex<()>,
    /// When the last search began: one search at a time, and at most one per
    /// [`SEARCH_PAUSE`], however many requests fail.
    searched: Mutex<Option<Instant>>,
}

/// The shortest pause between two searches for the primary.
const SEARCH_PAUSE: Duration = Duration::from_millis(100);

/// How many idle blocking connections a node keeps.
const MAX_IDLE: usize = 64;

/// A client for `server`: address (TLS or not), database, credentials, trusted authorities.
fn client(server: &RedisServer, settings: &Settings) -> Result<Client, LockError> {
    let redis = login(server);
    let addr = if server.tls {
        // rustls needs a process-wide crypto provider; keep one the application chose.
        let _ = rustls::crypto::ring::default_provider().install_default();
        ConnectionAddr::TcpTls {
            host: server.host.clone(),
            port: server.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(server.host.clone(), server.port)
    };
    let info = addr
        .into_connection_info()
        .map_err(settings.failed())?
        .set_redis_settings(redis);
    let built = match &server.tls_ca {
        Some(path) if server.tls => {
            let root_cert = std::fs::read(path).map_err(|error| {
                let message = format!("cannot read tls_ca {}: {error}", path.display());
                config_error(settings.backend, message)
            })?;
            Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                },
            )
        }
        _ => Client::open(info),
    };
    built.map_err(settings.failed())
}

/// `server`'s database and credentials.
fn login(server: &RedisServer) -> RedisConnectionInfo {
    let mut login = RedisConnectionInfo::default().set_db(server.db);
    if let Some(user) = &server.username {
        login = login.set_username(user);
    }
    if let Some(password) = &server.password {
        login = login.set_password(password);
    }
    login
}

impl Node {
    /// Connects to `server`, giving up after the settings' timeout; with `lazy`, on the
    /// first request instead (Redlock: a server that is down at start must not keep the
    /// others from being used).
    pub(crate) async fn connect(
        server: &RedisServer,
        settings: Settings,
        lazy: bool,
    ) -> Result<Self, LockError> {
        let client = client(server, &settings)?;
        let link = Link::connect(client, server.address(), &settings, lazy).await?;
        Ok(Node::with(link, None, settings))
    }

    /// Connects to the primary that `sentinel`'s sentinels name, logging in as `server`
    /// says: finding the primary and connecting to it each within the settings' timeout.
    pub(crate) async fn connect_sentinel(
        sentinel: &RedisSentinel,
        server: &RedisServer,
        settings: Settings,
    ) -> Result<Self, LockError> {
        let urls = sentinel.urls();
        let sentinels = Sentinel::build(urls.clone()).map_err(settings.failed())?;
        let announcers = urls
            .iter()
            .map(|url| Client::open(url.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(settings.failed())?;
        let finder = Finder {
            sentinel: tokio::sync::Mutex::new(sentinels),
            service: sentinel.service.clone(),
            login: login(server),
            searching: tokio::sync::Mutex::new(()),
            searched: Mutex::new(None),
        };
        let (client, address) = finder.locate(&settings).await?;
        let link = Link::connect(client, address, &settings, false).await?;
        let node = Node::with(link, Some(finder), settings);
        for announcer in announcers {
            let service = sentinel.service.clone();
            tokio::spawn(follow_switches(Arc::downgrade(&node.0), announcer, service));
        }
        Ok(node)
    }

    /// Connects to the Redis Cluster that `cluster`'s nodes belong to, logging in as
    /// `server` says, within the settings' timeout (after a failed connection, as long
    /// again to learn from a node whether the login was refused).
    pub(crate) async fn connect_cluster(
        cluster: &RedisCluster,
        server: &RedisServer,
        settings: Settings,
    ) -> Result<Self, LockError> {
        let clients = ClusterClients::new(cluster, server, settings.timeout);
        let address = cluster.nodes.join(",");
        match Link::cluster(clients, address, &settings).await {
            Ok(link) => Ok(Node::with(link, None, settings)),
            // The cluster client reports a refused login as a failed connection: a node
            // asked directly says which it is.
            Err(error @ LockError::Connection { .. }) => {
                let asking = refusal(cluster, server, &settings);
                let refused = tokio::time::timeout(settings.timeout, asking).await;
                Err(refused.ok().flatten().unwrap_or(error))
            }
            Err(error) => Err(error),
        }
    }

    fn with(link: Link, finder: Option<Finder>, settings: Settings) -> Self {
        Node(Arc::new(Inner {
            settings,
            link: RwLock::new(Arc::new(link)),
            finder,
        }))
    }

    fn link(&self) -> Arc<Link> {
        Arc::clone(&self.0.link.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The server's `host:port` (the current primary's, with Sentinel).
    pub(crate) fn address(&self) -> String {
        self.link().address.clone()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.0.settings.timeout
    }

    /// Runs a script on the shared connection, within the request timeout.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        invocation: ScriptInvocation<'_>,
        name: &str,
    ) -> Result<T, LockError> {
        self.0.settings.metrics.record_server_requests(1);
        let link = self.link();
        let mut connection = link.manager.clone();
        self.within(&link, Some(name), invocation.invoke_async(&mut connection))
            .await
    }

    /// Runs `invocation` (a script that writes) on a connection of its own, then, if its
    /// answer `wrote`, `WAIT`s at most `wait` for `replicas` replicas to acknowledge it and
    /// every write before it on the server: the script's answer, and how many replicas
    /// acknowledged (`None` when it wrote nothing). (`WAIT` counts the writes of its own
    /// connection, and blocks it: hence a connection of its own; on a cluster it goes to
    /// the node that holds `key`, the lock `name`'s.)
    pub(crate) async fn run_acknowledged<T: FromRedisValue>(
        &self,
        invocation: ScriptInvocation<'_>,
        (name, key): (&str, &str),
        (replicas, wait): (u32, Duration),
        wrote: impl FnOnce(&T) -> bool,
    ) -> Result<(T, Option<u32>), LockError> {
        let mut blocking = self.dedicated(name).await?;
        self.0.settings.metrics.record_server_requests(1);
        let link = Arc::clone(&blocking.link);
        let invoking = invocation.invoke_async(&mut blocking.connection);
        let answer = self.within(&link, Some(name), invoking).await?;
        if !wrote(&answer) {
            self.give_back(blocking);
            return Ok((answer, None));
        }
        self.0.settings.metrics.record_server_requests(1);
        let mut waiting = redis::cmd("WAIT");
        waiting.arg(replicas).arg(millis(wait).max(1));
        let asking = blocking.connection.query_at::<u32>(&waiting, key);
        let acknowledged = match tokio::time::timeout(wait + self.timeout(), asking).await {
            Ok(Ok(acknowledged)) => acknowledged,
            Ok(Err(error)) => {
                self.failed_on(&blocking, &error);
                return Err(lock_error(self.0.settings.backend, error, Some(name)));
            }
            Err(_) => {
                self.search_from(&link);
                return Err(timed_out_request(self.0.settings.backend, Some(name)));
            }
        };
        self.give_back(blocking);
        Ok((answer, Some(acknowledged)))
    }

    /// Runs `pipeline` on the shared connection, within the request timeout, for read-only
    /// inspection: not counted in the metrics, which are for lock operations.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        pipeline: &redis::Pipeline,
        name: &str,
    ) -> Result<T, LockError> {
        let link = self.link();
        let mut connection = link.manager.clone();
        self.within(&link, Some(name), pipeline.query_async(&mut connection))
            .await
    }

    /// `PING`, within the request timeout.
    pub(crate) async fn ping(&self) -> Result<(), LockError> {
        self.0.settings.metrics.record_server_requests(1);
        let link = self.link();
        let mut connection = link.manager.clone();
        let ping = redis::cmd("PING");
        self.within(&link, None, ping.query_async::<String>(&mut connection))
            .await?;
        Ok(())
    }

    /// A connection of its own, for a request that blocks on the server (`BLPOP`): an idle
    /// one if there is one, else a new one. Hand it back with [`Node::give_back`] once its
    /// request has completed.
    pub(crate) async fn dedicated(&self, name: &str) -> Result<Blocking, LockError> {
        let link = self.link();
        let idle = unpoisoned(&link.idle).pop();
        if let Some(connection) = idle {
            return Ok(Blocking { connection, link });
        }
        self.0.settings.metrics.record_server_requests(1);
        let connecting = link.client.open(self.timeout());
        let connection = self.within(&link, Some(name), connecting).await?;
        Ok(Blocking { connection, link })
    }

    /// `request` within the request timeout, its errors as lock errors naming `name`. An
    /// error that says the server may no longer be the primary starts a search for it.
    async fn within<T>(
        &self,
        link: &Arc<Link>,
        name: Option<&str>,
        request: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.timeout(), request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                if may_have_moved(&error) {
                    self.search_from(link);
                }
                Err(self.lock_error(error, name))
            }
            Err(_) => {
                self.search_from(link);
                Err(timed_out_request(self.0.settings.backend, name))
            }
        }
    }

    /// `error` as a lock error naming the lock `name`, as this node's server or cluster
    /// means it.
    pub(crate) fn lock_error(&self, error: RedisError, name: Option<&str>) -> LockError {
        match self.link().manager {
            Multiplexed::Cluster(_) => cluster_lock_error(self.0.settings.backend, error, name),
            Multiplexed::Server(_) => lock_error(self.0.settings.backend, error, name),
        }
    }

    /// With Sentinel, looks for the primary in the background, unless `failed` (the link a
    /// request failed on) is no longer current or a search ran less than [`SEARCH_PAUSE`]
    /// ago. Requests meanwhile go to the old server and fail as they would.
    fn search_from(&self, failed: &Arc<Link>) {
        if Arc::ptr_eq(failed, &self.link()) {
            self.search(true, None);
        }
    }

    /// With Sentinel, looks for the primary in the background (`throttled`: unless a
    /// search began less than [`SEARCH_PAUSE`] ago), and moves to it if it is another; at
    /// `announced`, if given (a `+switch-master` announcement), once it confirms that it is
    /// the primary. One search at a time: each checks the current server again first.
    fn search(&self, throttled: bool, announced: Option<(String, u16)>) {
        let Some(finder) = &self.0.finder else {
            return;
        };
        {
            let mut searched = unpoisoned(&finder.searched);
            if throttled && searched.is_some_and(|at| at.elapsed() < SEARCH_PAUSE) {
                return;
            }
            *searched = Some(Instant::now());
        }
        let node = self.clone();
        tokio::spawn(async move {
            let Some(finder) = &node.0.finder else {
                return;
            };
            let _one_at_a_time = finder.searching.lock().await;
            let settings = &node.0.settings;
            let found = match announced {
                Some((host, port)) if format!("{host}:{port}") == node.address() => return,
                Some((host, port)) => finder.at(host, port, settings).await,
                None => match finder.locate(settings).await {
                    Ok((_, address)) if address == node.address() => return,
                    Ok((client, address)) => Link::connect(client, address, settings, false).await,
                    Err(error) => Err(error),
                },
            };
            match found {
                Ok(found) => {
                    tracing::info!(
                        from = %node.address(),
                        to = %found.address,
                        "redis: the sentinels name a new primary"
                    );
                    let old = std::mem::replace(
                        &mut *node.0.link.write().unwrap_or_else(PoisonError::into_inner),
                        Arc::new(found),
                    );
                    // Pub/sub waiters join again, on the new primary.
                    old.subscriber.close();
                }
                // Credentials the new primary refuses will not pass by themselves.
                Err(error @ (LockError::Auth { .. } | LockError::PermissionDenied { .. })) => {
                    tracing::warn!(%error, "redis: the primary the sentinels name refuses this client");
                }
                Err(error) => {
                    tracing::debug!(%error, "redis: no primary found; asking again later")
                }
            }
        });
    }

    /// Whether `blocking` is a connection to the current server.
    pub(crate) fn is_current(&self, blocking: &Blocking) -> bool {
        Arc::ptr_eq(&blocking.link, &self.link())
    }

    /// A blocking request on `blocking` failed with `error`: with Sentinel, a search for
    /// the primary if the error says the server may no longer be it.
    pub(crate) fn failed_on(&self, blocking: &Blocking, error: &RedisError) {
        if may_have_moved(error) {
            self.search_from(&blocking.link);
        }
    }

    /// Keeps a blocking connection whose last request completed (never one whose request
    /// was abandoned: the server may still be blocked on it), if its server is still the
    /// current one.
    pub(crate) fn give_back(&self, blocking: Blocking) {
        if !Arc::ptr_eq(&blocking.link, &self.link()) {
            return;
        }
        let mut idle = unpoisoned(&blocking.link.idle);
        if idle.len() < MAX_IDLE {
            idle.push(blocking.connection);
        }
    }

    /// A place on `channel`, on the subscription connection shared by this node's waiters.
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        name: &str,
    ) -> Result<Subscription, LockError> {
        self.link().subscriber.join(channel, name).await
    }
}

/// Why the first node of `cluster` that answers refuses `server`'s login, if it does.
async fn refusal(
    cluster: &RedisCluster,
    server: &RedisServer,
    settings: &Settings,
) -> Option<LockError> {
    let clients = cluster.urls().into_iter().filter_map(|url| {
        let info = url.as_str().into_connection_info().ok()?;
        Client::open(info.set_redis_settings(login(server))).ok()
    });
    for client in clients {
        let connecting = client.get_multiplexed_async_connection();
        match tokio::time::timeout(settings.timeout, connecting).await {
            Ok(Err(error)) => {
                let refused = lock_error(settings.backend, error, None);
                if matches!(
                    refused,
                    LockError::Auth { .. } | LockError::PermissionDenied { .. }
                ) {
                    return Some(refused);
                }
            }
            Ok(Ok(_)) => return None,
            Err(_) => {}
        }
    }
    None
}

/// Whether `error` says the server may no longer be the primary: it cannot be reached, or
/// it is a replica now (it refuses writes, or ended a blocked request on its demotion).
fn may_have_moved(error: &RedisError) -> bool {
    is_connection(error)
        || matches!(
            error.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
        || error.code() == Some("UNBLOCKED")
}

/// A connection for blocking requests, from [`Node::dedicated`].
pub(crate) struct Blocking {
    pub(crate) connection: Own,
    link: Arc<Link>,
}

impl Link {
    /// The connections to the server `client` reaches at `address`.
    async fn connect(
        client: Client,
        address: String,
        settings: &Settings,
        lazy: bool,
    ) -> Result<Self, LockError> {
        let (timeout, failed) = (settings.timeout, settings.failed());
        // The shared connection: every wait bounded by `timeout`.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(timeout);
        let manager = if lazy {
            ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(failed)?
        } else {
            let connecting = ConnectionManager::new_with_config(client.clone(), config);
            let Ok(connected) = tokio::time::timeout(timeout, connecting).await else {
                let message = format!("no connection to {address} within {timeout:?}");
                return Err(connection(settings.backend, None, message));
            };
            connected.map_err(failed)?
        };
        let subscriber = Subscriber::new(Source::Server(client.clone()), settings.clone());
        Ok(Link {
            client: Opener::Server(Box::new(client)),
            manager: Multiplexed::Server(manager),
            address,
            idle: Mutex::default(),
            subscriber,
        })
    }

    /// The connections to the cluster `clients` reach, named `address`: short requests
    /// (bounded by the settings' timeout) on one connection, blocking ones (no response
    /// timeout) on connections of their own, the pub/sub waiters' on one subscriber.
    async fn cluster(
        clients: ClusterClients,
        address: String,
        settings: &Settings,
    ) -> Result<Self, LockError> {
        let (timeout, failed) = (settings.timeout, settings.failed());
        let shared = clients.client(false).map_err(failed)?;
        let blocking = clients.client(true).map_err(failed)?;
        let Ok(connected) = tokio::time::timeout(timeout, shared.get_async_connection()).await
        else {
            let message = format!("no connection to the cluster at {address} within {timeout:?}");
            return Err(connection(settings.backend, None, message));
        };
        Ok(Link {
            client: Opener::Cluster(Box::new(blocking)),
            manager: Multiplexed::Cluster(connected.map_err(failed)?),
            address,
            idle: Mutex::default(),
            subscriber: Subscriber::new(Source::Cluster(clients), settings.clone()),
        })
    }
}

impl Finder {
    /// Asks the sentinels for the primary, confirmed by its `ROLE`, within the settings'
    /// timeout: a client for it, and its address.
    async fn locate(&self, settings: &Settings) -> Result<(Client, String), LockError> {
        let (timeout, backend) = (settings.timeout, settings.backend);
        let (service, login) = (&self.service, self.login.clone());
        let login = SentinelNodeConnectionInfo::default().set_redis_connection_info(login);
        let searching = async {
            let mut sentinel = self.sentinel.lock().await;
            sentinel.async_master_for(service, Some(&login)).await
        };
        let Ok(found) = tokio::time::timeout(timeout, searching).await else {
            let message = format!("no sentinel named a primary for {service:?} within {timeout:?}");
            return Err(connection(backend, None, message));
        };
        let client = found.map_err(|error| match error.kind() {
            // Flagged down by the sentinels (a failover under way): it passes.
            ErrorKind::MasterNameNotFoundBySentinel => {
                let message = format!("no sentinel names a live primary for {service:?}: {error}");
                connection(backend, None, message)
            }
            _ => lock_error(backend, error, None),
        })?;
        let address = client.get_connection_info().addr().to_string();
        Ok((client, address))
    }

    /// The connections to the server at `host:port` (announced by a sentinel), once it
    /// answers `ROLE` as the primary: connecting and the `ROLE` query each within the
    /// settings' timeout.
    async fn at(&self, host: String, port: u16, settings: &Settings) -> Result<Link, LockError> {
        let address = format!("{host}:{port}");
        let info = ConnectionAddr::Tcp(host, port)
            .into_connection_info()
            .map_err(settings.failed())?
            .set_redis_settings(self.login.clone());
        let client = Client::open(info).map_err(settings.failed())?;
        let link = Link::connect(client, address, settings, false).await?;
        let mut manager = link.manager.clone();
        let role = redis::cmd("ROLE");
        let asking = role.query_async::<redis::Value>(&mut manager);
        let master = redis::Value::BulkString(b"master".to_vec());
        match tokio::time::timeout(settings.timeout, asking).await {
            Ok(Ok(redis::Value::Array(role))) if role.first() == Some(&master) => Ok(link),
            Ok(Err(error)) => Err(lock_error(settings.backend, error, None)),
            _ => {
                let message = format!("{} does not say it is the primary", link.address);
                Err(connection(settings.backend, None, message))
            }
        }
    }
}

/// Listens to one sentinel's `+switch-master` announcements (subscribing again when its
/// connection closes) and has `node` move to the announced primary at once when its
/// service fails over: so that a client does not go on writing to a demoted primary that
/// the sentinels have not yet told to follow the new one. Each sentinel has a listener: the
/// first to learn of the failover tells. Ends with the node.
async fn follow_switches(node: Weak<Inner>, sentinel: Client, service: String) {
    const PAUSE: Duration = Duration::from_millis(500);
    loop {
        let Some(timeout) = node.upgrade().map(|inner| inner.settings.timeout) else {
            return;
        };
        let subscribing = async {
            let mut pubsub = sentinel.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let mut pubsub = match tokio::time::timeout(timeout, subscribing).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(error)) => {
                tracing::debug!(%error, "redis: no announcements from a sentinel; trying again");
                tokio::time::sleep(PAUSE).await;
                continue;
            }
            Err(_) => continue,
        };
        let mut announcements = pubsub.on_message();
        let mut checks = tokio::time::interval(Duration::from_secs(1));
        loop {
            let announcement = tokio::select! {
                announcement = announcements.next() => announcement,
                // Checks now and then whether the node is still there.
                _ = checks.tick() => {
                    if node.strong_count() == 0 {
                        return;
                    }
                    continue;
                }
            };
            let Some(announcement) = announcement else {
                break;
            };
            // "<service> <old ip> <old port> <new ip> <new port>"
            let payload: String = announcement.get_payload().unwrap_or_default();
            let words: Vec<&str> = payload.split(' ').collect();
            let [announced, _, _, host, port] = words[..] else {
                continue;
            };
            if announced != service {
                continue;
            }
            let Some(inner) = node.upgrade() else {
                return;
            };
            tracing::debug!(%payload, "redis: the sentinels announce a failover");
            let to = port.parse().ok().map(|port| (host.to_owned(), port));
            Node(inner).search(false, to);
        }
        tokio::time::sleep(PAUSE).await;
    }
}
