//! [`Member`]: a server started here that a test can fault, whichever runner runs it.

use std::fmt;
use std::net::SocketAddr;

use async_trait::async_trait;
use nix::sys::signal::Signal;

use super::ServerError;
use super::process::Instance;

/// A server started here that a test can fault, whichever runner runs it: a member of a
/// set, or a [`Target`](super::Target)'s container.
#[async_trait]
pub trait Member: Send + Sync + fmt::Debug {
    /// Its client address on `127.0.0.1`.
    fn socket_addr(&self) -> SocketAddr;
    /// Its pid, while it runs as a process.
    fn pid(&self) -> Option<u32> {
        None
    }
    /// Its container's id, for a container.
    fn container_id(&self) -> Option<&str> {
        None
    }
    /// Whether it runs (it may be paused): a process not killed, a container the engine
    /// says runs.
    async fn is_running(&self) -> Result<bool, ServerError>;
    /// Kills it at once (`SIGKILL` to its process group; a container stopped without
    /// grace), keeping its ports and data for [`restart`](Self::restart).
    async fn kill(&mut self) -> Result<(), ServerError>;
    /// Kills it if it runs, starts it again with the same ports and data, and waits until
    /// it serves.
    async fn restart(&mut self) -> Result<(), ServerError>;
    /// Freezes it (`SIGSTOP`, or `docker pause`); returns once it is frozen.
    async fn pause(&self) -> Result<(), ServerError>;
    /// Continues it after [`pause`](Self::pause).
    async fn resume(&self) -> Result<(), ServerError>;
    /// What a failure message should say of it: whether it still runs (or has exited, or
    /// is frozen) and the last lines of its log.
    async fn condition(&self) -> String;
}

#[async_trait]
impl Member for Instance {
    fn socket_addr(&self) -> SocketAddr {
        self.addr()
    }

    fn pid(&self) -> Option<u32> {
        Instance::pid(self)
    }

    async fn is_running(&self) -> Result<bool, ServerError> {
        Ok(Instance::pid(self).is_some())
    }

    async fn kill(&mut self) -> Result<(), ServerError> {
        Instance::kill(self);
        Ok(())
    }

    async fn restart(&mut self) -> Result<(), ServerError> {
        Instance::restart(self).await
    }

    async fn pause(&self) -> Result<(), ServerError> {
        self.signal(Signal::SIGSTOP)
    }

    async fn resume(&self) -> Result<(), ServerError> {
        self.signal(Signal::SIGCONT)
    }

    async fn condition(&self) -> String {
        Instance::condition(self)
    }
}
