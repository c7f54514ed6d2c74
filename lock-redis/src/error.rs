//! Redis client errors as lock errors.

use lock_core::LockError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

pub(crate) const BACKEND: &str = "redis";

/// Maps a client error, naming the lock when there is one.
pub(crate) fn lock_error(
    backend: &'static str,
    error: RedisError,
    name: Option<&str>,
) -> LockError {
    let name = name.map(str::to_owned);
    let code = error.code().unwrap_or_default().to_owned();
    if error.kind() == ErrorKind::AuthenticationFailed
        || matches!(code.as_str(), "WRONGPASS" | "NOAUTH")
    {
        return LockError::Auth {
            backend,
            message: error.to_string(),
        };
    }
    if error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) || code == "NOPERM" {
        return LockError::PermissionDenied {
            backend,
            name,
            message: error.to_string(),
        };
    }
    if is_connection(&error) {
        return LockError::Connection {
            backend,
            name,
            message: error.to_string(),
            source: Some(Box::new(error)),
        };
    }
    // UNBLOCKED: a blocked request ended by the server (a primary demoted to a replica).
    let retryable = matches!(code.as_str(), "BUSY" | "UNBLOCKED")
        || matches!(
            error.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        );
    LockError::Backend {
        backend,
        name,
        message: error.to_string(),
        retryable,
        source: Some(Box::new(error)),
    }
}

/// Whether the request failed on the way: it may or may not have reached the server.
pub(crate) fn is_connection(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        // A cluster node that cannot be reached (one that died, until its replica serves).
        || error.kind() == ErrorKind::ClusterConnectionNotFound
}

/// A [`LockError::Connection`] (retryable) without a source, naming the lock if any.
pub(crate) fn connection(
    backend: &'static str,
    name: Option<&str>,
    message: impl Into<String>,
) -> LockError {
    LockError::Connection {
        backend,
        name: name.map(str::to_owned),
        message: message.into(),
        source: None,
    }
}

/// The error of a request that got no answer within the configured timeout.
pub(crate) fn timed_out_request(backend: &'static str, name: Option<&str>) -> LockError {
    let message = "the server did not answer within the request timeout";
    connection(backend, name, message)
}

/// [`lock_error`] for a request to a Redis Cluster: a slot that moved (a failover, a
/// migration) once the cluster connection's own redirections are spent, and a script that
/// met a key of a slot being migrated, are retryable there (the next try finds the slot);
/// from a single server they mean a misconfiguration, and are not.
pub(crate) fn cluster_lock_error(
    backend: &'static str,
    error: RedisError,
    name: Option<&str>,
) -> LockError {
    let moving = matches!(
        error.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    ) || error.to_string().contains("non local key");
    let mut error = lock_error(backend, error, name);
    if let LockError::Backend { retryable, .. } = &mut error {
        *retryable |= moving;
    }
    error
}
