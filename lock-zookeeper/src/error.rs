//! ZooKeeper client errors as lock errors.

use lock_core::LockError;
use zookeeper_client::Error as ZkError;

pub(crate) const BACKEND: &str = "zookeeper";

/// Maps a client error, naming the lock when there is one.
pub(crate) fn lock_error(error: ZkError, name: Option<&str>) -> LockError {
    let name = name.map(str::to_owned);
    match error {
        ZkError::ConnectionLoss | ZkError::Timeout | ZkError::NoHosts | ZkError::Custom(_) => {
            LockError::Connection {
                backend: BACKEND,
                name,
                message: error.to_string(),
                source: Some(Box::new(error)),
            }
        }
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::SessionMoved => {
            LockError::SessionExpired {
                backend: BACKEND,
                name,
            }
        }
        ZkError::AuthFailed => LockError::Auth {
            backend: BACKEND,
            message: error.to_string(),
        },
        ZkError::NoAuth => LockError::PermissionDenied {
            backend: BACKEND,
            name,
            message: "the node's ACL does not allow this client (wrong or missing credentials)"
                .to_owned(),
        },
        other => LockError::Backend {
            backend: BACKEND,
            name,
            message: other.to_string(),
            retryable: matches!(other, ZkError::Throttled),
            source: Some(Box::new(other)),
        },
    }
}

/// Whether a request may or may not have reached the server: its outcome is unknown.
///
/// The client fails the requests in flight with `Custom` when their connection fails
/// otherwise than by a clean close: no answer within its read timeout (a server that lost
/// its quorum, or a silent network) or a socket error. The session may well survive it.
/// (With TLS, `Custom` may also carry a failed handshake while connecting, which no retry
/// mends: the connect loop tries until its timeout, then says why the handshake failed.)
pub(crate) fn outcome_unknown(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_)
    )
}

/// Whether the session is over: nothing more can be done with this client.
pub(crate) fn session_over(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::SessionExpired
            | ZkError::ClientClosed
            | ZkError::SessionMoved
            | ZkError::AuthFailed
    )
}
