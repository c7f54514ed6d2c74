//! [`Target`]: a server started here (a process or a container), or an external one named
//! by an environment variable.

use std::net::SocketAddr;

use tracing::info;

#[cfg(feature = "testcontainers")]
use super::Member;
use super::{LocalServer, ServerError, ServerMode, ServerSpec};

/// A server process started here that a [`Target`] can stand for: the handle of a
/// [`ServerSpec`] run as a local process ([`ZkServer`](super::ZkServer),
/// [`RedisServer`](super::RedisServer), [`EtcdServer`](super::EtcdServer),
/// [`PostgresServer`](super::PostgresServer)).
pub trait TargetServer: LocalServer + Send + Sized {
    /// The environment variable naming an external server: [`ZK_ENV`](super::ZK_ENV),
    /// [`REDIS_ENV`](super::REDIS_ENV), [`ETCD_ENV`](super::ETCD_ENV) or
    /// [`POSTGRES_ENV`](super::POSTGRES_ENV).
    const ENV: &'static str;

    /// Its kind, and how to start one.
    type Options: ServerSpec;

    /// Starts one with `opts` and waits until it serves (the type's own `start`).
    fn start_local(opts: Self::Options) -> impl Future<Output = Result<Self, ServerError>> + Send;

    /// The options it was started with.
    fn options(&self) -> &Self::Options;

    /// What clients are given to reach it: ZooKeeper's connect string, Redis's URL, etcd's
    /// endpoint, PostgreSQL's URL.
    fn client_address(&self) -> String {
        self.options().client_address(self.socket_addr())
    }
}

/// Either an external server (named by [`TargetServer::ENV`]) or one started here,
/// as a process or in a container (see [`ServerMode`]): see [`ZkTarget`](super::ZkTarget),
/// [`RedisTarget`](super::RedisTarget) and [`EtcdTarget`](super::EtcdTarget).
///
/// Fault injection (pause, resume, kill, restart) needs a server started here: a process
/// is signalled, a container is paused, stopped and started through the engine. With an
/// external server it returns [`ServerError::Unsupported`].
#[derive(Debug)]
pub struct Target<S> {
    inner: Inner<S>,
}

#[derive(Debug)]
enum Inner<S> {
    External {
        address: String,
    },
    Local(Box<S>),
    #[cfg(feature = "testcontainers")]
    Container {
        address: String,
        container: Box<dyn Member>,
    },
}

impl<S: TargetServer> Target<S> {
    /// Uses the address in [`TargetServer::ENV`] when it is set and not empty
    /// (leading and trailing white space removed); otherwise [`start`](Self::start)s a
    /// server with `opts`.
    pub async fn from_env_or_start(opts: S::Options) -> Result<Self, ServerError> {
        match std::env::var(S::ENV) {
            Ok(address) if !address.trim().is_empty() => {
                info!("using the external {} from {}", S::Options::NAME, S::ENV);
                Ok(Self::external(address.trim()))
            }
            _ => Self::start(opts).await,
        }
    }

    /// Starts a server with `opts` where [`ServerMode::from_env`] says: a process, or a
    /// container. The error of an unknown mode, or of the container mode without the
    /// `testcontainers` feature, says so.
    pub async fn start(opts: S::Options) -> Result<Self, ServerError> {
        match ServerMode::from_env()? {
            ServerMode::Processes => Ok(Self::from(S::start_local(opts).await?)),
            ServerMode::Containers => Self::start_container(opts).await,
        }
    }

    /// Starts a server with `opts` in a container, and waits until it serves.
    #[cfg(feature = "testcontainers")]
    pub async fn start_container(opts: S::Options) -> Result<Self, ServerError> {
        let container = super::containers::Container::start(&opts).await?;
        Ok(Self::in_container(
            container.client_address(),
            Box::new(container),
        ))
    }

    /// The server in `container`, which clients reach at `address`.
    #[cfg(feature = "testcontainers")]
    pub(crate) fn in_container(address: String, container: Box<dyn Member>) -> Self {
        Self {
            inner: Inner::Container { address, container },
        }
    }

    /// Starts a server with `opts` in a container: without the `testcontainers` feature,
    /// [`ServerError::Unsupported`].
    #[cfg(not(feature = "testcontainers"))]
    pub async fn start_container(opts: S::Options) -> Result<Self, ServerError> {
        drop(opts);
        Err(ServerError::Unsupported {
            operation: format!("starting {} in a container", S::Options::NAME),
            reason: "lock-testbed was built without its `testcontainers` feature".to_owned(),
        })
    }

    /// An external server at `address` (a connect string, a URL); fault injection is
    /// unsupported.
    pub fn external(address: impl Into<String>) -> Self {
        Self {
            inner: Inner::External {
                address: address.into(),
            },
        }
    }

    /// What clients are given: the external address, or the started server's
    /// [`client_address`](TargetServer::client_address).
    pub fn client_address(&self) -> String {
        match &self.inner {
            Inner::External { address } => address.clone(),
            Inner::Local(server) => server.client_address(),
            #[cfg(feature = "testcontainers")]
            Inner::Container { address, .. } => address.clone(),
        }
    }

    /// True for an external server.
    pub fn is_external(&self) -> bool {
        matches!(self.inner, Inner::External { .. })
    }

    /// True for a server in a container.
    pub fn is_container(&self) -> bool {
        !matches!(self.inner, Inner::External { .. } | Inner::Local(_))
    }

    /// The container's id, for a server in a container.
    pub fn container_id(&self) -> Option<&str> {
        match &self.inner {
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => container.container_id(),
            _ => None,
        }
    }

    /// The loopback address of a server started here (a process's port, a container's
    /// published port); `None` for an external server.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match &self.inner {
            Inner::External { .. } => None,
            Inner::Local(server) => Some(server.socket_addr()),
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => Some(container.socket_addr()),
        }
    }

    /// The server process started here; `None` for an external server or a container.
    pub fn server(&self) -> Option<&S> {
        match &self.inner {
            Inner::Local(server) => Some(server),
            _ => None,
        }
    }

    /// The server process started here, mutably; `None` for an external server or a
    /// container.
    pub fn server_mut(&mut self) -> Option<&mut S> {
        match &mut self.inner {
            Inner::Local(server) => Some(server),
            _ => None,
        }
    }

    /// Freezes the server: `SIGSTOP` to a process, `docker pause` to a container;
    /// unsupported with an external server.
    pub async fn pause(&self) -> Result<(), ServerError> {
        match &self.inner {
            Inner::External { .. } => Err(ServerError::unsupported_external("pause", S::ENV)),
            Inner::Local(server) => server.pause(),
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => container.pause().await,
        }
    }

    /// Lets a paused server go on; unsupported with an external server.
    pub async fn resume(&self) -> Result<(), ServerError> {
        match &self.inner {
            Inner::External { .. } => Err(ServerError::unsupported_external("resume", S::ENV)),
            Inner::Local(server) => server.resume(),
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => container.resume().await,
        }
    }

    /// Whether a server started here runs (it may be paused): a process not killed, a
    /// container the engine says runs; unsupported with an external server.
    pub async fn is_running(&self) -> Result<bool, ServerError> {
        match &self.inner {
            Inner::External { .. } => Err(ServerError::unsupported_external("is_running", S::ENV)),
            Inner::Local(server) => Ok(server.pid().is_some()),
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => container.is_running().await,
        }
    }

    /// What a failure message should say of the server: whether it still runs (or has
    /// exited, or is frozen) and the last lines of its log; for an external server, only
    /// its address.
    pub async fn condition(&self) -> String {
        match &self.inner {
            Inner::External { address } => format!("{} at {address} is external", S::Options::NAME),
            Inner::Local(server) => server.condition(),
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => container.condition().await,
        }
    }

    /// Kills the server (`SIGKILL` to a process; a container is stopped without grace),
    /// keeping what [`restart`](Self::restart) needs;
    /// unsupported with an external server.
    pub async fn kill(&mut self) -> Result<(), ServerError> {
        match &mut self.inner {
            Inner::External { .. } => Err(ServerError::unsupported_external("kill", S::ENV)),
            Inner::Local(server) => {
                server.kill();
                Ok(())
            }
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => container.kill().await,
        }
    }

    /// Kills the server if it runs, starts it again on the same port and waits until it
    /// serves; unsupported with an external server.
    pub async fn restart(&mut self) -> Result<(), ServerError> {
        match &mut self.inner {
            Inner::External { .. } => Err(ServerError::unsupported_external("restart", S::ENV)),
            Inner::Local(server) => server.restart().await,
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => container.restart().await,
        }
    }
}

impl<S> From<S> for Target<S> {
    fn from(server: S) -> Self {
        Self {
            inner: Inner::Local(Box::new(server)),
        }
    }
}
