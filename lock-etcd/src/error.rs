//! How etcd's errors become [`LockError`]s.

use etcd_client::Error as EtcdError;
use lock_core::LockError;
use tonic::Code;

/// The backend's name in errors and logs.
pub(crate) const BACKEND: &str = "etcd";

/// The error for `error`, met while working on the lock `name` (if any).
pub(crate) fn lock_error(error: EtcdError, name: Option<&str>) -> LockError {
    let name = name.map(str::to_owned);
    let message = error.to_string();
    let backend_error = |name, message, retryable, error| LockError::Backend {
        backend: BACKEND,
        name,
        message,
        retryable,
        source: Some(Box::new(error) as _),
    };
    match &error {
        EtcdError::GRpcStatus(status) => match status.code() {
            Code::Unauthenticated => LockError::Auth {
                backend: BACKEND,
                message,
            },
            // etcd's answer to a wrong user or password.
            Code::InvalidArgument if status.message().contains("authentication failed") => {
                LockError::Auth {
                    backend: BACKEND,
                    message,
                }
            }
            Code::PermissionDenied => LockError::PermissionDenied {
                backend: BACKEND,
                name,
                message,
            },
            // "requested lease not found": the session is over.
            Code::NotFound if status.message().contains("lease not found") => {
                LockError::SessionExpired {
                    backend: BACKEND,
                    name,
                }
            }
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                connection(name, message, Some(error))
            }
            // "etcdserver: too many requests" and leader changes are worth another try.
            Code::ResourceExhausted | Code::Unknown => backend_error(name, message, true, error),
            _ => backend_error(name, message, false, error),
        },
        EtcdError::TransportError(_) | EtcdError::IoError(_) | EtcdError::WatchError(_) => {
            connection(name, message, Some(error))
        }
        // The client's words when a keep-alive stream opens on a lease that is gone; its
        // other keep-alive errors are a broken stream.
        EtcdError::LeaseKeepAliveError(why) if why.contains("lease not found") => {
            LockError::SessionExpired {
                backend: BACKEND,
                name,
            }
        }
        EtcdError::LeaseKeepAliveError(_) => connection(name, message, Some(error)),
        _ => backend_error(name, message, false, error),
    }
}

/// A retryable connection error.
pub(crate) fn connection(
    name: Option<String>,
    message: impl Into<String>,
    source: Option<EtcdError>,
) -> LockError {
    LockError::Connection {
        backend: BACKEND,
        name,
        message: message.into(),
        source: source.map(|error| Box::new(error) as _),
    }
}

/// A request that got no answer within `timeout`.
pub(crate) fn timed_out(name: Option<&str>, timeout: std::time::Duration) -> LockError {
    connection(
        name.map(str::to_owned),
        format!("no answer within {timeout:?}"),
        None,
    )
}
