//! The connections of a [`Node`](crate::node::Node): to one server, or to a Redis Cluster,
//! where each request goes to the primary that serves its keys' slot (the cluster
//! connection follows `MOVED` and `ASK` redirections itself).

use std::sync::Arc;
use std::time::Duration;

use lock_core::{LockError, Metrics};

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Client, Cmd, FromRedisValue, Pipeline, ProtocolVersion, PushInfo,
    RedisError, RedisFuture, Value,
};
use tokio::sync::mpsc;

use crate::config::{RedisCluster, RedisServer};
use crate::error::lock_error;

/// What builds a cluster's clients: its nodes, the login and the request timeout.
#[derive(Clone)]
pub(crate) struct ClusterClients {
    urls: Vec<String>,
    username: Option<String>,
    password: Option<String>,
    timeout: Duration,
}

impl ClusterClients {
    /// The clients of `cluster`'s nodes with `server`'s login; `timeout` bounds each
    /// connection attempt.
    pub(crate) fn new(cluster: &RedisCluster, server: &RedisServer, timeout: Duration) -> Self {
        ClusterClients {
            urls: cluster.urls(),
            username: server.username.clone(),
            password: server.password.clone(),
            timeout,
        }
    }

    fn builder(&self) -> ClusterClientBuilder {
        let mut builder = ClusterClient::builder(self.urls.clone())
            .connection_timeout(self.timeout)
            // A request redirected (MOVED, ASK, TRYAGAIN while a slot moves) is sent again a
            // few times, quickly.
            .retries(5)
            .min_retry_wait(10)
            .max_retry_wait(200);
        if let Some(user) = &self.username {
            builder = builder.username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.password(password);
        }
        builder
    }

    /// A client for short requests (each bounded by the timeout), or with `blocking` for
    /// requests that wait for as long as they asked.
    pub(crate) fn client(&self, blocking: bool) -> redis::RedisResult<ClusterClient> {
        let builder = self.builder();
        if blocking {
            builder.build()
        } else {
            builder.response_timeout(self.timeout).build()
        }
    }

    /// A client for sharded pub/sub (RESP3): what its connections hear (messages, their
    /// subscriptions' confirmations and ends, disconnections) goes to `pushes`.
    pub(crate) fn subscriber(
        &self,
        pushes: mpsc::UnboundedSender<PushInfo>,
    ) -> redis::RedisResult<ClusterClient> {
        self.builder()
            .response_timeout(self.timeout)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(pushes)
            .build()
    }
}

/// A connection to one server (`S`), or to a cluster.
#[derive(Clone)]
pub(crate) enum Connection<S> {
    /// To one server.
    Server(S),
    /// To a cluster (one connection per node inside).
    Cluster(ClusterConnection),
}

/// The connection short requests share: one server's reconnects.
pub(crate) type Multiplexed = Connection<ConnectionManager>;

/// A connection of its own, for requests that block (`BLPOP`, `WAIT`).
pub(crate) type Own = Connection<MultiplexedConnection>;

/// What opens [`Own`] connections.
#[derive(Clone)]
pub(crate) enum Opener {
    /// One server's client.
    Server(Box<Client>),
    /// A cluster's client, with no response timeout (a blocking request waits for as long
    /// as it asked).
    Cluster(Box<ClusterClient>),
}

impl Opener {
    /// A new connection of its own; the connection attempt bounded by `timeout`, its
    /// requests not.
    pub(crate) async fn open(&self, timeout: Duration) -> redis::RedisResult<Own> {
        match self {
            Opener::Server(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None);
                let connecting = client.get_multiplexed_async_connection_with_config(&config);
                connecting.await.map(Own::Server)
            }
            Opener::Cluster(client) => client.get_async_connection().await.map(Own::Cluster),
        }
    }
}

impl Own {
    /// `command` on the server that holds `key` (on one server, simply sent): for a
    /// keyless command such as `WAIT`, which must reach the node the keys' writes went to.
    pub(crate) async fn query_at<T: FromRedisValue>(
        &mut self,
        command: &Cmd,
        key: &str,
    ) -> redis::RedisResult<T> {
        match self {
            Own::Server(connection) => command.query_async(connection).await,
            Own::Cluster(connection) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let value = connection.route_command(command.clone(), routing).await?;
                T::from_redis_value(value).map_err(Into::into)
            }
        }
    }
}

impl<S: ConnectionLike> ConnectionLike for Connection<S> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Server(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Server(server) => server.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(cluster) => cluster.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Server(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

/// What a node's connections, and its subscriber's, are made with: the request timeout,
/// the backend that errors name, and the metrics that count the requests.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) timeout: Duration,
    pub(crate) backend: &'static str,
    pub(crate) metrics: Arc<Metrics>,
}

impl Settings {
    /// What turns a client error met while connecting into a lock error.
    pub(crate) fn failed(&self) -> impl Fn(RedisError) -> LockError + Copy + use<> {
        let backend = self.backend;
        move |error| lock_error(backend, error, None)
    }
}
