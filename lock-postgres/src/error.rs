//! The backend's name in errors, and how the client's errors become [`LockError`]s.

use lock_core::LockError;
use tokio_postgres::error::SqlState;

/// The backend's name, as in [`LockError`] messages.
pub(crate) const BACKEND: &str = "postgres";

/// `error`, from a request about `what`, as a [`LockError`]: refused credentials and a
/// failed TLS handshake are [`LockError::Auth`], a missing right
/// [`LockError::PermissionDenied`], a broken or closed connection [`LockError::Connection`]
/// (retryable), anything else a backend error,
/// retryable when the server says it may pass (a cancelled statement, a server shutting
/// down, a deadlock, a serialization failure, a lock table full until locks are released);
/// the server's hint, if it gives one, ends the message.
pub(crate) fn from_pg(error: tokio_postgres::Error, what: &str) -> LockError {
    let code = error.code().cloned();
    let message = match error.as_db_error() {
        // The server's hint says what to change ("You might need to increase
        // max_locks_per_transaction." when its lock table is full).
        Some(db) => match db.hint() {
            Some(hint) => format!("{what}: {} ({}); {hint}", db.message(), db.code().code()),
            None => format!("{what}: {} ({})", db.message(), db.code().code()),
        },
        None => format!("{what}: {error}"),
    };
    match code {
        Some(SqlState::INVALID_PASSWORD | SqlState::INVALID_AUTHORIZATION_SPECIFICATION) => {
            LockError::Auth {
                backend: BACKEND,
                message,
            }
        }
        Some(SqlState::INSUFFICIENT_PRIVILEGE) => LockError::PermissionDenied {
            backend: BACKEND,
            name: None,
            message,
        },
        Some(
            SqlState::QUERY_CANCELED
            | SqlState::ADMIN_SHUTDOWN
            | SqlState::CRASH_SHUTDOWN
            | SqlState::CANNOT_CONNECT_NOW
            | SqlState::T_R_DEADLOCK_DETECTED
            | SqlState::T_R_SERIALIZATION_FAILURE
            | SqlState::TOO_MANY_CONNECTIONS
            | SqlState::OUT_OF_MEMORY,
        ) => LockError::other(BACKEND, message)
            .retryable(true)
            .with_source(error),
        Some(_) => LockError::other(BACKEND, message).with_source(error),
        // The server's certificate not trusted, or no TLS where it is required: asking
        // again will not help.
        None if is_tls_failure(&error) => LockError::Auth {
            backend: BACKEND,
            message: match std::error::Error::source(&error) {
                Some(cause) => format!("{message}: {cause}"),
                None => message,
            },
        },
        None => LockError::connection(BACKEND, message).with_source(error),
    }
}

/// Whether `error` is a failed TLS handshake (tokio-postgres keeps its kind private, and
/// names it in the message).
fn is_tls_failure(error: &tokio_postgres::Error) -> bool {
    error
        .to_string()
        .starts_with("error performing TLS handshake")
}

/// The error of a request to the server that had no answer within `timeout`.
pub(crate) fn no_answer(what: &str, timeout: std::time::Duration) -> LockError {
    LockError::connection(BACKEND, format!("{what}: no answer within {timeout:?}"))
}

/// The SQLSTATE of the server's error behind `error`, if it has one.
pub(crate) fn sql_state(error: &LockError) -> Option<SqlState> {
    std::error::Error::source(error)?
        .downcast_ref::<tokio_postgres::Error>()?
        .code()
        .cloned()
}
