//! The one error type of the contract.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::lost::LossReason;
use crate::name::{LockName, NameError};

/// A boxed error from a backend's client library, kept as the `source` of a [`LockError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong with a distributed lock.
///
/// Messages name the backend (`"zookeeper"`, `"redis"`, `"memory"`, …) and, where there is
/// one, the lock. [`LockError::is_retryable`] says whether the same call may succeed later
/// without any change on the caller's side.
///
/// Busy is not an error: [`DistributedLock::try_acquire`](crate::DistributedLock::try_acquire)
/// returns `Ok(None)` when another holder has the lock.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// `acquire` waited for the whole timeout without getting the lock. Nothing is held and
    /// no waiter entry is left behind.
    #[error("{backend}: timed out after {waited:?} waiting for lock {name:?}")]
    Timeout {
        /// Backend name.
        backend: &'static str,
        /// The lock's name.
        name: String,
        /// The timeout that ran out.
        waited: Duration,
    },

    /// The lock is no longer held by this guard: it was revoked, its session or lease
    /// expired, or its entry was deleted by someone else. Another holder may have it now,
    /// and nothing of theirs was touched.
    #[error("{backend}: lock {name:?} was lost: {reason}")]
    Lost {
        /// Backend name.
        backend: &'static str,
        /// The lock's name.
        name: String,
        /// Why the backend stopped vouching for the lock.
        reason: LossReason,
    },

    /// The lock name cannot be used; `reason` says why. Nothing was sent to a server.
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name (lossy for display when it is very long).
        name: String,
        /// Why it was rejected.
        reason: NameError,
    },

    /// An argument other than the name is out of range (a timeout, a permit count, …).
    #[error("{backend}: invalid argument: {message}")]
    InvalidArgument {
        /// Backend name.
        backend: &'static str,
        /// What is wrong with which argument.
        message: String,
    },

    /// The server could not be reached or the connection broke. Retryable.
    #[error("{backend}: connection error{}: {message}", lock_suffix(.name))]
    Connection {
        /// Backend name.
        backend: &'static str,
        /// The lock concerned, if the error happened during a lock operation.
        name: Option<String>,
        /// What failed (which address, after how long).
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The server rejected the credentials.
    #[error("{backend}: authentication failed: {message}")]
    Auth {
        /// Backend name.
        backend: &'static str,
        /// The server's or the client's explanation.
        message: String,
    },

    /// The credentials were accepted but do not allow this operation on this lock.
    #[error("{backend}: permission denied{}: {message}", lock_suffix(.name))]
    PermissionDenied {
        /// Backend name.
        backend: &'static str,
        /// The lock concerned, if any.
        name: Option<String>,
        /// What was refused.
        message: String,
    },

    /// The client's session ended (ZooKeeper session expiry, an in-memory client closed)
    /// while the operation was under way. Every guard of that session is lost.
    #[error("{backend}: session expired{}", lock_suffix(.name))]
    SessionExpired {
        /// Backend name.
        backend: &'static str,
        /// The lock concerned, if any.
        name: Option<String>,
    },

    /// Any other failure reported by the server or the client library.
    #[error("{backend}: {message}{}", lock_suffix(.name))]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// The lock concerned, if any.
        name: Option<String>,
        /// What failed.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },

    /// The backend does not offer this operation (see [`Capabilities`](crate::Capabilities)).
    #[error("{backend}: unsupported: {what}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// The operation or feature that is missing.
        what: String,
    },

    /// The configuration or connection URL is invalid; `message` names the bad part.
    #[error("invalid configuration: {message}")]
    Config {
        /// What is wrong, naming the offending part.
        message: String,
    },
}

fn lock_suffix(name: &Option<String>) -> String {
    match name {
        Some(name) => format!(" (lock {name:?})"),
        None => String::new(),
    }
}

impl LockError {
    /// Whether the same call may succeed later without any change by the caller: timeouts,
    /// connection errors, session expiry (a new session may be opened) and backend errors
    /// flagged retryable.
    ///
    /// ```
    /// use lock_core::LockError;
    /// let e = LockError::Connection {
    ///     backend: "zookeeper",
    ///     name: None,
    ///     message: "127.0.0.1:2181 refused the connection".into(),
    ///     source: None,
    /// };
    /// assert!(e.is_retryable());
    /// assert!(!LockError::Config { message: "bad".into() }.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            LockError::Timeout { .. }
            | LockError::Connection { .. }
            | LockError::SessionExpired { .. } => true,
            LockError::Backend { retryable, .. } => *retryable,
            LockError::Lost { .. }
            | LockError::InvalidName { .. }
            | LockError::InvalidArgument { .. }
            | LockError::Auth { .. }
            | LockError::PermissionDenied { .. }
            | LockError::Unsupported { .. }
            | LockError::Config { .. } => false,
        }
    }

    /// The backend that reported the error, when there is one.
    pub fn backend(&self) -> Option<&'static str> {
        match self {
            LockError::Timeout { backend, .. }
            | LockError::Lost { backend, .. }
            | LockError::InvalidArgument { backend, .. }
            | LockError::Connection { backend, .. }
            | LockError::Auth { backend, .. }
            | LockError::PermissionDenied { backend, .. }
            | LockError::SessionExpired { backend, .. }
            | LockError::Backend { backend, .. }
            | LockError::Unsupported { backend, .. } => Some(backend),
            LockError::InvalidName { .. } | LockError::Config { .. } => None,
        }
    }

    /// The name of the lock the error concerns, when there is one.
    pub fn lock_name(&self) -> Option<&str> {
        match self {
            LockError::Timeout { name, .. }
            | LockError::Lost { name, .. }
            | LockError::InvalidName { name, .. } => Some(name),
            LockError::Connection { name, .. }
            | LockError::PermissionDenied { name, .. }
            | LockError::SessionExpired { name, .. }
            | LockError::Backend { name, .. } => name.as_deref(),
            LockError::InvalidArgument { .. }
            | LockError::Auth { .. }
            | LockError::Unsupported { .. }
            | LockError::Config { .. } => None,
        }
    }

    /// A [`LockError::Backend`] ("any other failure") of `backend` saying `message`: not
    /// retryable, no lock, no source, until [`retryable`](Self::retryable),
    /// [`for_lock`](Self::for_lock) and [`with_source`](Self::with_source) say otherwise.
    ///
    /// ```
    /// use lock_core::LockError;
    ///
    /// let io = std::io::Error::other("disk full");
    /// let e = LockError::other("file", "cannot write the lock file")
    ///     .retryable(true)
    ///     .for_lock("jobs")
    ///     .with_source(io);
    /// assert!(e.is_retryable());
    /// assert_eq!(e.lock_name(), Some("jobs"));
    /// assert_eq!(e.to_string(), "file: cannot write the lock file (lock \"jobs\")");
    /// assert!(std::error::Error::source(&e).is_some());
    /// ```
    pub fn other(backend: &'static str, message: impl Into<String>) -> Self {
        LockError::Backend {
            backend,
            name: None,
            message: message.into(),
            retryable: false,
            source: None,
        }
    }

    /// A [`LockError::Connection`] of `backend` saying `message` (which address, after how
    /// long): retryable, no lock, no source until [`for_lock`](Self::for_lock) and
    /// [`with_source`](Self::with_source).
    ///
    /// ```
    /// use lock_core::LockError;
    ///
    /// let e = LockError::connection("redis", "cannot reach 127.0.0.1:6379: refused");
    /// assert!(e.is_retryable());
    /// ```
    pub fn connection(backend: &'static str, message: impl Into<String>) -> Self {
        LockError::Connection {
            backend,
            name: None,
            message: message.into(),
            source: None,
        }
    }

    /// The [`LockError::Lost`] of a guard of `name` whose backend stopped vouching for it.
    ///
    /// ```
    /// use lock_core::{LockError, LossReason};
    ///
    /// let e = LockError::lost("file", "jobs", LossReason::EntryRemoved);
    /// assert!(!e.is_retryable());
    /// assert_eq!(e.lock_name(), Some("jobs"));
    /// ```
    pub fn lost(backend: &'static str, name: impl fmt::Display, reason: LossReason) -> Self {
        LockError::Lost {
            backend,
            name: name.to_string(),
            reason,
        }
    }

    /// A [`LockError::SessionExpired`] of `backend`, naming no lock until
    /// [`for_lock`](Self::for_lock).
    ///
    /// ```
    /// use lock_core::LockError;
    ///
    /// let e = LockError::session_expired("file").for_lock("jobs");
    /// assert!(e.is_retryable());
    /// assert_eq!(e.lock_name(), Some("jobs"));
    /// ```
    pub fn session_expired(backend: &'static str) -> Self {
        LockError::SessionExpired {
            backend,
            name: None,
        }
    }

    /// The same error, naming the lock `name` where its kind names one and it names none
    /// yet; others unchanged.
    #[must_use]
    pub fn for_lock(mut self, lock: impl fmt::Display) -> Self {
        if let LockError::Connection { name, .. }
        | LockError::PermissionDenied { name, .. }
        | LockError::SessionExpired { name, .. }
        | LockError::Backend { name, .. } = &mut self
            && name.is_none()
        {
            *name = Some(lock.to_string());
        }
        self
    }

    /// The same error, with `source` (the client library's error) behind it where its kind
    /// keeps one ([`Connection`](LockError::Connection), [`Backend`](LockError::Backend));
    /// others unchanged.
    #[must_use]
    pub fn with_source(mut self, error: impl Into<BoxError>) -> Self {
        if let LockError::Connection { source, .. } | LockError::Backend { source, .. } = &mut self
        {
            *source = Some(error.into());
        }
        self
    }

    /// The same error, a [`Backend`](LockError::Backend) one flagged as `retryable` or not;
    /// others unchanged (whether they are retryable follows from their kind).
    #[must_use]
    pub fn retryable(mut self, may_pass: bool) -> Self {
        if let LockError::Backend { retryable, .. } = &mut self {
            *retryable = may_pass;
        }
        self
    }

    /// A [`LockError::Config`] with the given message.
    pub fn config(message: impl Into<String>) -> Self {
        LockError::Config {
            message: message.into(),
        }
    }

    /// The [`LockError::Timeout`] of an acquisition of `name` that waited `timeout` (as
    /// passed to [`acquire`](crate::DistributedLock::acquire)) in vain.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{LockError, LockName};
    ///
    /// let name = LockName::new("jobs/nightly")?;
    /// let e = LockError::timed_out("redis", &name, Some(Duration::from_secs(2)));
    /// assert!(e.is_retryable());
    /// assert_eq!(e.lock_name(), Some("jobs/nightly"));
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    pub fn timed_out(backend: &'static str, name: &LockName, timeout: Option<Duration>) -> Self {
        LockError::Timeout {
            backend,
            name: name.to_string(),
            waited: timeout.unwrap_or_default(),
        }
    }
}

/// An error kept in an [`Arc`] where one report goes to many readers (an election's
/// observers), handed to each as a [`LockError`] of its own: the same variant and fields,
/// with the original's source chain behind [`SharedSource`].
pub(crate) fn copy_of(shared: &Arc<LockError>) -> LockError {
    let source = || -> Option<BoxError> {
        shared
            .source()
            .map(|_| Box::new(SharedSource(Arc::clone(shared))) as BoxError)
    };
    match &**shared {
        LockError::Timeout {
            backend,
            name,
            waited,
        } => LockError::Timeout {
            backend,
            name: name.clone(),
            waited: *waited,
        },
        LockError::Lost {
            backend,
            name,
            reason,
        } => LockError::Lost {
            backend,
            name: name.clone(),
            reason: reason.clone(),
        },
        LockError::InvalidName { name, reason } => LockError::InvalidName {
            name: name.clone(),
            reason: reason.clone(),
        },
        LockError::InvalidArgument { backend, message } => LockError::InvalidArgument {
            backend,
            message: message.clone(),
        },
        LockError::Connection {
            backend,
            name,
            message,
            ..
        } => LockError::Connection {
            backend,
            name: name.clone(),
            message: message.clone(),
            source: source(),
        },
        LockError::Auth { backend, message } => LockError::Auth {
            backend,
            message: message.clone(),
        },
        LockError::PermissionDenied {
            backend,
            name,
            message,
        } => LockError::PermissionDenied {
            backend,
            name: name.clone(),
            message: message.clone(),
        },
        LockError::SessionExpired { backend, name } => LockError::SessionExpired {
            backend,
            name: name.clone(),
        },
        LockError::Backend {
            backend,
            name,
            message,
            retryable,
            ..
        } => LockError::Backend {
            backend,
            name: name.clone(),
            message: message.clone(),
            retryable: *retryable,
            source: source(),
        },
        LockError::Unsupported { backend, what } => LockError::Unsupported {
            backend,
            what: what.clone(),
        },
        LockError::Config { message } => LockError::Config {
            message: message.clone(),
        },
    }
}

/// The source of a shared error's copy: the original's source, still owned by the original.
#[derive(Debug)]
struct SharedSource(Arc<LockError>);

impl fmt::Display for SharedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.source() {
            Some(source) => fmt::Display::fmt(source, f),
            None => Ok(()),
        }
    }
}

impl Error for SharedSource {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source().and_then(Error::source)
    }
}
