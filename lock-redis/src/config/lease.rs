//! [`LeaseOptions`]: the lease settings `redis://` and `redlock://` share, and their setters.

use std::time::Duration;

use lock_core::url::duration;
use lock_core::{LockError, LockName};
use serde::Deserialize;

use super::{RedisConfig, RedlockConfig, config_error};
use crate::keys::hash_tag;

/// Longest accepted key prefix, in bytes.
const MAX_PREFIX_LEN: usize = 128;
/// Shortest accepted lease: the watchdog renews at ttl/3, which must leave time for a round
/// trip.
const MIN_TTL: Duration = Duration::from_millis(100);
/// Longest accepted lease.
const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Shortest and longest accepted request timeout.
const MIN_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The lease settings of [`RedisConfig`] and [`RedlockConfig`]: the same fields, defaults,
/// bounds and URL parameters (`prefix`, `ttl`, `timeout`) for both. `Deserialize` reads
/// those parameters.
///
/// Both configurations have setters for each field too (`with_key_prefix`, `with_ttl`,
/// `with_timeout`), and `with_lease` for all three.
///
/// ```
/// use std::time::Duration;
/// use lock_redis::{LeaseOptions, RedisConfig, RedisServer, RedlockConfig};
///
/// let lease = LeaseOptions::default().with_ttl(Duration::from_secs(5));
/// let redis = RedisConfig::new(RedisServer::new("cache")).with_lease(lease.clone());
/// let redlock = RedlockConfig::new(["r1", "r2", "r3"].map(RedisServer::new)).with_lease(lease);
/// assert_eq!(redis.lease, redlock.lease);
/// assert_eq!(redis.lease.key_prefix, "lock");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct LeaseOptions {
    /// The first part of every key: the lock called `N` uses keys tagged `{prefix:N}`.
    /// Non-empty, at most 128 bytes, without `{`, `}` or control characters. Default `lock`.
    /// URL: `prefix`.
    #[serde(rename = "prefix")]
    pub key_prefix: String,
    /// The lease: how long a lock outlives its holder's crash. The watchdog renews it at
    /// ttl/3 while the guard lives. From 100 ms to 1 day; default 30 s.
    #[serde(with = "duration")]
    pub ttl: Duration,
    /// How long connecting, or one request, may take before it fails with a retryable
    /// [`LockError::Connection`]; from 10 ms to 10 minutes. Default 5 s.
    #[serde(with = "duration")]
    pub timeout: Duration,
}

impl LeaseOptions {
    /// The default key prefix, `lock`.
    pub const DEFAULT_KEY_PREFIX: &'static str = "lock";
    /// The default lease, 30 s.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
    /// The default request timeout, 5 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// The hash tag `{prefix:name}` that every key of the mutex `name` shares, the name
    /// escaped as in [`LockName::escaped`]: on a Redis Cluster, the slot of this tag is the
    /// lock's slot.
    ///
    /// ```
    /// use lock_core::LockName;
    /// use lock_redis::LeaseOptions;
    ///
    /// let name = LockName::new("jobs/nightly").unwrap();
    /// assert_eq!(LeaseOptions::default().hash_tag(&name), "{lock:jobs%2Fnightly}");
    /// ```
    pub fn hash_tag(&self, name: &LockName) -> String {
        hash_tag(&self.key_prefix, name)
    }

    /// Checks every setting, with errors naming `backend`.
    pub(super) fn validate_for(&self, backend: &str) -> Result<(), LockError> {
        let prefix = &self.key_prefix;
        let problem = if prefix.is_empty() {
            Some("must not be empty")
        } else if prefix.len() > MAX_PREFIX_LEN {
            Some("is longer than 128 bytes")
        } else if prefix.contains(['{', '}']) {
            Some("must not contain '{' or '}' (they would break the key's hash tag)")
        } else if prefix.chars().any(char::is_control) {
            Some("must not contain control characters")
        } else {
            None
        };
        if let Some(problem) = problem {
            let shown: String = prefix.chars().take(40).collect();
            return Err(config_error(backend, format!("prefix {shown:?} {problem}")));
        }
        let ttl = self.ttl;
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            let rule = "it must be at least 100ms (the watchdog renews at ttl/3) and at most 1 day";
            return Err(config_error(backend, format!("ttl is {ttl:?}; {rule}")));
        }
        let timeout = self.timeout;
        if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&timeout) {
            let message = format!("timeout is {timeout:?}; it must be from 10ms to 10 minutes");
            return Err(config_error(backend, message));
        }
        Ok(())
    }
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            key_prefix: Self::DEFAULT_KEY_PREFIX.to_owned(),
            ttl: Self::DEFAULT_TTL,
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }
}

/// The setters of the lease settings: on [`LeaseOptions`], and the same on [`RedisConfig`]
/// and [`RedlockConfig`] for their `lease`.
macro_rules! lease_setters {
    ($($ty:ty $({ $lease:ident })?),*) => {$(
        impl $ty {
            /// Sets the key prefix.
            #[must_use]
            pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
                self$(.$lease)?.key_prefix = prefix.into();
                self
            }

            /// Sets the lease.
            #[must_use]
            pub fn with_ttl(mut self, ttl: Duration) -> Self {
                self$(.$lease)?.ttl = ttl;
                self
            }

            /// Sets the request timeout.
            #[must_use]
            pub fn with_timeout(mut self, timeout: Duration) -> Self {
                self$(.$lease)?.timeout = timeout;
                self
            }
        }
    )*};
}

lease_setters!(LeaseOptions, RedisConfig { lease }, RedlockConfig { lease });
