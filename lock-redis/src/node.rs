//! One Redis server as the locks see it: a shared, reconnecting connection for short
//! requests, and dedicated connections for the requests that block.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{LockError, Metrics};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, FromRedisValue, IntoConnectionInfo,
    RedisConnectionInfo, ScriptInvocation, TlsCertificates,
};

use crate::config::RedisServer;
use crate::error::{connection, lock_error, timed_out_request};
use crate::subscriber::{Subscriber, Subscription};

/// A connection to one server, counting its requests.
#[derive(Clone)]
pub(crate) struct Node {
    client: Client,
    manager: ConnectionManager,
    timeout: Duration,
    backend: &'static str,
    address: String,
    metrics: Arc<Metrics>,
    /// Idle connections for blocking requests, kept for the next waiter.
    idle: Arc<Mutex<Vec<MultiplexedConnection>>>,
    /// The subscription connection the pub/sub waiters share.
    subscriber: Arc<Subscriber>,
}

/// How many idle blocking connections a node keeps.
const MAX_IDLE: usize = 64;

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("address", &self.address)
            .finish()
    }
}

/// A client for `server`: address (TLS or not), database, credentials, trusted authorities.
fn client(server: &RedisServer, backend: &'static str) -> Result<Client, LockError> {
    let mut redis = RedisConnectionInfo::default().set_db(server.db);
    if let Some(user) = &server.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &server.password {
        redis = redis.set_password(password);
    }
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
        .map_err(|error| lock_error(backend, error, None))?
        .set_redis_settings(redis);
    let built = match &server.tls_ca {
        Some(path) if server.tls => {
            let root_cert = std::fs::read(path).map_err(|error| {
                LockError::config(format!(
                    "{backend}: cannot read tls_ca {}: {error}",
                    path.display()
                ))
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
    built.map_err(|error| lock_error(backend, error, None))
}

/// The shared connection's settings: every wait bounded by `timeout`.
fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_max_delay(timeout)
}

impl Node {
    /// Connects to `server`, giving up after `timeout`; with `lazy`, on the first request
    /// instead (Redlock: a server that is down at start must not keep the others from being
    /// used).
    pub(crate) async fn connect(
        server: &RedisServer,
        timeout: Duration,
        backend: &'static str,
        metrics: Arc<Metrics>,
        lazy: bool,
    ) -> Result<Self, LockError> {
        let client = client(server, backend)?;
        let config = manager_config(timeout);
        let manager = if lazy {
            ConnectionManager::new_lazy_with_config(client.clone(), config)
                .map_err(|error| lock_error(backend, error, None))?
        } else {
            let connecting = ConnectionManager::new_with_config(client.clone(), config);
            let Ok(connected) = tokio::time::timeout(timeout, connecting).await else {
                let message = format!("no connection to {} within {timeout:?}", server.address());
                return Err(connection(backend, None, message));
            };
            connected.map_err(|error| lock_error(backend, error, None))?
        };
        let subscriber = Subscriber::new(client.clone(), timeout, backend, Arc::clone(&metrics));
        Ok(Node {
            client,
            manager,
            timeout,
            backend,
            address: server.address(),
            metrics,
            idle: Arc::default(),
            subscriber: Arc::new(subscriber),
        })
    }

    /// The server's `host:port`.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// The request timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs a script on the shared connection, within the request timeout.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        invocation: ScriptInvocation<'_>,
        name: &str,
    ) -> Result<T, LockError> {
        self.metrics.record_server_requests(1);
        let mut connection = self.manager.clone();
        self.within(Some(name), invocation.invoke_async(&mut connection))
            .await
    }

    /// Runs `pipeline` on the shared connection, within the request timeout, for read-only
    /// inspection: not counted in the metrics, which are for lock operations.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        pipeline: &redis::Pipeline,
        name: &str,
    ) -> Result<T, LockError> {
        let mut connection = self.manager.clone();
        self.within(Some(name), pipeline.query_async(&mut connection))
            .await
    }

    /// `PING`, within the request timeout.
    pub(crate) async fn ping(&self) -> Result<(), LockError> {
        self.metrics.record_server_requests(1);
        let mut connection = self.manager.clone();
        let ping = redis::cmd("PING");
        self.within(None, ping.query_async::<String>(&mut connection))
            .await?;
        Ok(())
    }

    /// A connection of its own, for a request that blocks on the server (`BLPOP`): an idle
    /// one if there is one, else a new one. Hand it back with [`Node::give_back`] once its
    /// request has completed.
    pub(crate) async fn dedicated(&self, name: &str) -> Result<MultiplexedConnection, LockError> {
        if let Some(idle) = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
        {
            return Ok(idle);
        }
        self.metrics.record_server_requests(1);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(None);
        let connecting = self
            .client
            .get_multiplexed_async_connection_with_config(&config);
        self.within(Some(name), connecting).await
    }

    /// `request` within the request timeout, its errors as lock errors naming `name`.
    async fn within<T>(
        &self,
        name: Option<&str>,
        request: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(answer) => answer.map_err(|error| lock_error(self.backend, error, name)),
            Err(_) => Err(timed_out_request(self.backend, name)),
        }
    }

    /// Keeps a blocking connection whose last request completed (never one whose request
    /// was abandoned: the server may still be blocked on it).
    pub(crate) fn give_back(&self, connection: MultiplexedConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(connection);
        }
    }

    /// A place on `channel`, on the subscription connection shared by this node's waiters.
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        name: &str,
    ) -> Result<Subscription, LockError> {
        self.subscriber.join(channel, name).await
    }
}
