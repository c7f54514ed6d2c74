//! [`Target`]: a server started here (a process or a container), or an external one named
//! by an environment variable.

use std::net::SocketAddr;

use tracing::info;

use super::member::Member;
use super::{Server, ServerError, ServerMode, ServerSpec};

/// Either an external server of the kind `S` (named by [`ServerSpec::ENV`]) or one started
/// here, as a process or in a container (see [`ServerMode`]): see
/// [`ZkTarget`](super::ZkTarget), [`RedisTarget`](super::RedisTarget),
/// [`EtcdTarget`](super::EtcdTarget) and [`PostgresTarget`](super::PostgresTarget).
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
    Local(Box<Server<S>>),
    #[cfg(feature = "testcontainers")]
    Container {
        address: String,
        container: Box<dyn Member>,
    },
}

impl<S: ServerSpec> Target<S> {
    /// Uses the address in [`ServerSpec::ENV`] when it is set and not empty
    /// (leading and trailing white space removed); otherwise [`start`](Self::start)s a
    /// server with `opts`.
    pub async fn from_env_or_start(opts: S) -> Result<Self, ServerError> {
        match std::env::var(S::ENV) {
            Ok(address) if !address.trim().is_empty() => {
                info!("using the external {} from {}", S::NAME, S::ENV);
                Ok(Self::external(address.trim()))
            }
            _ => Self::start(opts).await,
        }
    }

    /// Starts a server with `opts` where [`ServerMode::from_env`] says: a process, or a
    /// container. The error of an unknown mode, or of the container mode without the
    /// `testcontainers` feature, says so.
    pub async fn start(opts: S) -> Result<Self, ServerError> {
        Self::start_in(ServerMode::from_env()?, opts).await
    }

    /// Starts a server with `opts` where `mode` says (containers: feature
    /// `testcontainers`), its client port published on a free loopback port, and waits
    /// until it serves.
    pub async fn start_in(mode: ServerMode, opts: S) -> Result<Self, ServerError> {
        match mode {
            ServerMode::Processes => Ok(Self::from(Server::start(opts).await?)),
            #[cfg(feature = "testcontainers")]
            ServerMode::Containers => Ok(Self::container(
                super::containers::Container::start(&opts).await?,
            )),
            #[cfg(not(feature = "testcontainers"))]
            ServerMode::Containers => Err(ServerError::without_containers(S::NAME)),
        }
    }

    /// Starts a server with `spec` where `mode` says, serving on `127.0.0.1:port` (a
    /// container on the host's network), or on another free port should that one turn out
    /// taken, and waits until it serves: for servers that tell clients each other's
    /// addresses, which must be the same inside and outside the containers.
    pub(crate) async fn start_on_port(
        mode: ServerMode,
        spec: S,
        port: u16,
    ) -> Result<Self, ServerError> {
        match mode {
            ServerMode::Processes => Ok(Self::from(Server::start_on(spec, Some(port)).await?)),
            #[cfg(feature = "testcontainers")]
            ServerMode::Containers => Ok(Self::container(
                super::containers::Container::start_on_host(&spec, port).await?,
            )),
            #[cfg(not(feature = "testcontainers"))]
            ServerMode::Containers => Err(ServerError::without_containers(S::NAME)),
        }
    }

    /// The server in `container`.
    #[cfg(feature = "testcontainers")]
    fn container(container: super::containers::Container<S>) -> Self {
        Self {
            inner: Inner::Container {
                address: container.client_address(),
                container: Box::new(container),
            },
        }
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
    /// [`client_address`](Server::client_address).
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
        self.started("container_id").ok()?.container_id()
    }

    /// The loopback address of a server started here (a process's port, a container's
    /// published port); `None` for an external server.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        Some(self.started("socket_addr").ok()?.socket_addr())
    }

    /// The server process started here; `None` for an external server or a container.
    pub fn server(&self) -> Option<&Server<S>> {
        match &self.inner {
            Inner::Local(server) => Some(server),
            _ => None,
        }
    }

    /// The server started here, for `operation`: unsupported with an external server.
    fn started(&self, operation: &str) -> Result<&dyn Member, ServerError> {
        match &self.inner {
            Inner::External { .. } => Err(ServerError::unsupported_external(operation, S::ENV)),
            Inner::Local(server) => Ok(server.member()),
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => Ok(container.as_ref()),
        }
    }

    /// [`started`](Self::started), mutably.
    fn started_mut(&mut self, operation: &str) -> Result<&mut dyn Member, ServerError> {
        match &mut self.inner {
            Inner::External { .. } => Err(ServerError::unsupported_external(operation, S::ENV)),
            Inner::Local(server) => Ok(server.member_mut()),
            #[cfg(feature = "testcontainers")]
            Inner::Container { container, .. } => Ok(container.as_mut()),
        }
    }

    /// Freezes the server: `SIGSTOP` to a process, `docker pause` to a container;
    /// unsupported with an external server.
    pub async fn pause(&self) -> Result<(), ServerError> {
        self.started("pause")?.pause().await
    }

    /// Lets a paused server go on; unsupported with an external server.
    pub async fn resume(&self) -> Result<(), ServerError> {
        self.started("resume")?.resume().await
    }

    /// Whether a server started here runs (it may be paused): a process not killed, a
    /// container the engine says runs; unsupported with an external server.
    pub async fn is_running(&self) -> Result<bool, ServerError> {
        self.started("is_running")?.is_running().await
    }

    /// What a failure message should say of the server: whether it still runs (or has
    /// exited, or is frozen) and the last lines of its log; for an external server, only
    /// its address.
    pub async fn condition(&self) -> String {
        match self.started("condition") {
            Ok(server) => server.condition().await,
            Err(_) => format!("{} at {} is external", S::NAME, self.client_address()),
        }
    }

    /// Kills the server (`SIGKILL` to a process; a container is stopped without grace),
    /// keeping what [`restart`](Self::restart) needs;
    /// unsupported with an external server.
    pub async fn kill(&mut self) -> Result<(), ServerError> {
        self.started_mut("kill")?.kill().await
    }

    /// Kills the server if it runs, starts it again on the same port and waits until it
    /// serves; unsupported with an external server.
    pub async fn restart(&mut self) -> Result<(), ServerError> {
        self.started_mut("restart")?.restart().await
    }
}

impl<S> From<Server<S>> for Target<S> {
    fn from(server: Server<S>) -> Self {
        Self {
            inner: Inner::Local(Box::new(server)),
        }
    }
}
