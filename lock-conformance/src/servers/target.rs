//! [`Target`]: a server started here, or an external one named by an environment variable.

use tracing::info;

use super::{LocalServer, ServerError};

/// A kind of server that a [`Target`] can stand for: one that can be started here, or
/// reached at an address given by an environment variable.
pub trait TargetServer: LocalServer + Send + Sized {
    /// The server's name in logs, e.g. `ZooKeeper`.
    const NAME: &'static str;

    /// The environment variable naming an external server: [`ZK_ENV`](super::ZK_ENV) or
    /// [`REDIS_ENV`](super::REDIS_ENV).
    const ENV: &'static str;

    /// How to start one: [`ZkOptions`](super::ZkOptions) or
    /// [`RedisOptions`](super::RedisOptions).
    type Options: Send;

    /// Starts one with `opts` and waits until it serves (the type's own `start`).
    fn start_local(opts: Self::Options) -> impl Future<Output = Result<Self, ServerError>> + Send;

    /// What clients are given to reach it: ZooKeeper's connect string, Redis's URL.
    fn client_address(&self) -> String;
}

/// Either an external server (named by [`S::ENV`](TargetServer::ENV)) or one started here:
/// see [`ZkTarget`](super::ZkTarget) and [`RedisTarget`](super::RedisTarget).
///
/// Fault injection (pause, resume, kill, restart) needs a server started here; with an
/// external one it returns [`ServerError::Unsupported`].
#[derive(Debug)]
pub struct Target<S> {
    inner: Inner<S>,
}

#[derive(Debug)]
enum Inner<S> {
    External { address: String },
    Local(Box<S>),
}

impl<S: TargetServer> Target<S> {
    /// Uses the address in [`S::ENV`](TargetServer::ENV) when it is set and not empty
    /// (leading and trailing white space removed); otherwise starts a server with `opts`.
    pub async fn from_env_or_start(opts: S::Options) -> Result<Self, ServerError> {
        match std::env::var(S::ENV) {
            Ok(address) if !address.trim().is_empty() => {
                info!("using the external {} from {}", S::NAME, S::ENV);
                Ok(Self::external(address.trim()))
            }
            _ => Ok(Self::from(S::start_local(opts).await?)),
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
    /// [`client_address`](TargetServer::client_address).
    pub fn client_address(&self) -> String {
        match &self.inner {
            Inner::External { address } => address.clone(),
            Inner::Local(server) => server.client_address(),
        }
    }

    /// True for an external server.
    pub fn is_external(&self) -> bool {
        matches!(self.inner, Inner::External { .. })
    }

    /// The started server, `None` for an external one.
    pub fn server(&self) -> Option<&S> {
        match &self.inner {
            Inner::External { .. } => None,
            Inner::Local(server) => Some(server),
        }
    }

    /// The started server, mutably; `None` for an external one.
    pub fn server_mut(&mut self) -> Option<&mut S> {
        match &mut self.inner {
            Inner::External { .. } => None,
            Inner::Local(server) => Some(server),
        }
    }

    fn local(&self, operation: &str) -> Result<&S, ServerError> {
        self.server()
            .ok_or_else(|| ServerError::unsupported_external(operation, S::ENV))
    }

    fn local_mut(&mut self, operation: &str) -> Result<&mut S, ServerError> {
        self.server_mut()
            .ok_or_else(|| ServerError::unsupported_external(operation, S::ENV))
    }

    /// [`LocalServer::pause`]; unsupported with an external server.
    pub fn pause(&self) -> Result<(), ServerError> {
        self.local("pause")?.pause()
    }

    /// [`LocalServer::resume`]; unsupported with an external server.
    pub fn resume(&self) -> Result<(), ServerError> {
        self.local("resume")?.resume()
    }

    /// [`LocalServer::kill`]; unsupported with an external server.
    pub fn kill(&mut self) -> Result<(), ServerError> {
        self.local_mut("kill")?.kill();
        Ok(())
    }

    /// [`LocalServer::restart`]; unsupported with an external server.
    pub async fn restart(&mut self) -> Result<(), ServerError> {
        self.local_mut("restart")?.restart().await
    }
}

impl<S> From<S> for Target<S> {
    fn from(server: S) -> Self {
        Self {
            inner: Inner::Local(Box::new(server)),
        }
    }
}
