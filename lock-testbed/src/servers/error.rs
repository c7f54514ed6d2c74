//! The error type of the server helpers.

use std::sync::Arc;
use std::time::Duration;

/// Why a server could not be started, reached or manipulated.
///
/// The type is `Clone` (I/O errors are shared behind an [`Arc`]) so that the process-wide
/// [`shared_zk`](super::shared_zk), [`shared_redis`](super::shared_redis) and
/// [`shared_etcd`](super::shared_etcd) can hand the same start-up failure to every caller.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The server's executable, jar or runtime is not installed.
    #[error("{detail}; install the Debian package `{package}` (scripts/ensure-servers does)")]
    NotInstalled {
        /// The Debian package that provides it, e.g. `zookeeper`.
        package: String,
        /// What exactly is missing, e.g. the path that was looked up.
        detail: String,
    },
    /// The server process was launched but did not become ready.
    #[error("{server} did not start: {detail}\n--- last lines of its log ---\n{log_tail}")]
    Startup {
        /// Which server, e.g. `ZooKeeper`.
        server: String,
        /// What went wrong: it exited, or was not ready in time (with the last probe's answer).
        detail: String,
        /// The last lines of the server's log (stdout and stderr).
        log_tail: String,
    },
    /// An operating-system error (spawning, files, sockets, signals).
    #[error("I/O error: {0}")]
    Io(#[source] Arc<std::io::Error>),
    /// A bounded wait ran out.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long it waited.
        after: Duration,
    },
    /// The server answered something unexpected.
    #[error("unexpected answer from {server}: {detail}")]
    Protocol {
        /// Which server.
        server: String,
        /// The answer, or what was wrong with it.
        detail: String,
    },
    /// The operation needs a server process this handle does not have (an external server
    /// given by an environment variable, for instance).
    #[error("`{operation}` is not supported: {reason}")]
    Unsupported {
        /// The operation, e.g. `pause`.
        operation: String,
        /// Why not.
        reason: String,
    },
    /// The server has been killed (and not restarted), so it cannot be signalled.
    #[error("{server} is not running (it was killed and not restarted)")]
    NotRunning {
        /// Which server.
        server: String,
    },
    /// An ensemble member index out of range.
    #[error("no ensemble member {index}: the ensemble has {len} members (indices start at 0)")]
    NoSuchMember {
        /// The index asked for.
        index: usize,
        /// The ensemble's size.
        len: usize,
    },
    /// An environment variable of the test set-up has a value it does not take.
    #[error("{variable}={value:?} is not understood: expected {expected}")]
    InvalidSetting {
        /// The variable, e.g. `LOCK_TEST_SERVERS`.
        variable: String,
        /// Its value.
        value: String,
        /// What it takes.
        expected: String,
    },
    /// No container engine answers (only with the `testcontainers` feature). Tests should
    /// treat this as a reason to skip, not as a failure.
    #[error("no container engine: {detail}")]
    NoContainerEngine {
        /// Where the engine was looked for and what happened.
        detail: String,
    },
    /// The container engine answers but does not have the image (only with the
    /// `testcontainers` feature). Nothing is pulled: the tests reach loopback addresses
    /// only, so the image is built or pulled beforehand.
    #[error("container image `{image}` is not on the container engine: {hint}")]
    MissingImage {
        /// The image, `name:tag`.
        image: String,
        /// How to get it.
        hint: String,
    },
    /// The container engine answered but the container could not be started or used (only
    /// with the `testcontainers` feature).
    #[error("container error: {detail}")]
    Container {
        /// The engine's or testcontainers' error.
        detail: String,
    },
}

impl ServerError {
    /// True for [`ServerError::NoContainerEngine`]: the environment lacks a container
    /// engine, so a test should be skipped rather than failed.
    pub fn is_no_container_engine(&self) -> bool {
        matches!(self, Self::NoContainerEngine { .. })
    }

    /// True for [`ServerError::MissingImage`]: the engine answers, but lacks the image.
    pub fn is_missing_image(&self) -> bool {
        matches!(self, Self::MissingImage { .. })
    }

    /// Starting `what` in containers, from a build without the `testcontainers` feature.
    #[cfg(not(feature = "testcontainers"))]
    pub(crate) fn without_containers(what: &str) -> Self {
        Self::Unsupported {
            operation: format!("starting {what} in containers"),
            reason: "lock-testbed was built without its `testcontainers` feature".to_owned(),
        }
    }

    pub(crate) fn unsupported_external(operation: &str, what: &str) -> Self {
        Self::Unsupported {
            operation: operation.to_owned(),
            reason: format!("unsupported with an external server ({what})"),
        }
    }
}

impl From<std::io::Error> for ServerError {
    fn from(err: std::io::Error) -> Self {
        Self::Io(Arc::new(err))
    }
}

impl From<nix::errno::Errno> for ServerError {
    fn from(err: nix::errno::Errno) -> Self {
        Self::Io(Arc::new(std::io::Error::from(err)))
    }
}
