//! Distributed locks with pluggable backends, chosen by URL.
//!
//! distlock hands out named locks shared by every process that connects to the same backend:
//! ZooKeeper (the correctness-grade backend, with monotonic fencing tokens), Redis (the
//! efficiency-grade comparison point, also as Redlock) and an in-memory reference backend
//! for tests and single-process programs. Every backend implements the same contract from
//! [`lock_core`], re-exported here: a [`LockProvider`] hands out [`DistributedLock`]s, and
//! a held lock is a [`Guard`] with a [`FencingToken`] and a [`LostSignal`].
//!
//! # Example
//!
//! ```
//! # #[cfg(feature = "memory")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::LockError> {
//! use std::time::Duration;
//!
//! let locks = distlock::connect("memory://").await?;
//! let lock = locks.lock("reports/nightly")?;
//!
//! let mut guard = lock.acquire(Some(Duration::from_secs(5))).await?;
//! // ... do the work, passing guard.fencing_token() to the store it writes to ...
//! assert!(lock.try_acquire().await?.is_none(), "held, and not re-entrant");
//! guard.release().await?;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "memory"))]
//! # fn main() {}
//! ```
//!
//! More, runnable against the in-memory backend or any URL given: the package's examples
//! (`cargo run -p distlock --example worker`; `fenced_store`, `rw_and_semaphore`,
//! `election`, `transfer`, `choose_backend`, `herd`), listed in the README.
//!
//! Busy is not an error: [`DistributedLock::try_acquire`] returns `Ok(None)`, and
//! [`DistributedLock::acquire`] waits (up to its timeout, then [`LockError::Timeout`]).
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `memory` | yes | the in-memory backend (`memory://`) and the `memory` module |
//! | `zookeeper` | no | the ZooKeeper backend (`zk://`, `zookeeper://`, `zks://`) as the `zookeeper` module |
//! | `redis` | no | the Redis backend (`redis://`, `rediss://`, `redis+sentinel://`, `redis+cluster://`, `redlock://`) as the `redis` module |
//! | `etcd` | no | the etcd backend (`etcd://`, `etcds://`) as the `etcd` module; building it needs `protoc` |
//! | `postgres` | no | the PostgreSQL backend (`postgres://`, `postgresql://`) as the `postgres` module |
//! | `cli` | no | the `distlock` command-line tool, with every backend |
//!
//! A URL whose backend is not compiled in fails with a [`LockError::Config`] that names the
//! feature to enable.
//!
//! # Connection URLs
//!
//! ```text
//! scheme://[user[:password]@]host[:port][,host[:port]...][/path][?key=value&...]
//! ```
//!
//! User, password, path and parameter values are percent-decoded; durations are written
//! like `10s`, `500ms` or `1m 30s`; unknown parameters are errors, so typos do not pass
//! silently. Error messages never repeat the password.
//!
//! | scheme | form | parameters, at their defaults |
//! |---|---|---|
//! | `memory` | `memory://` — a new private server; `memory://NAME` — the process-wide server called `NAME`, shared by every `connect` with that name | `namespace=` (empty): locks in different namespaces never meet |
//! | `zk`, `zookeeper`, `zks` | `zk://[user:password@]h1:p1,h2:p2[/chroot]` (port 2181; `zks://` for TLS); credentials add digest auth; a missing chroot is made at connect | `session_timeout=10s` `connect_timeout=5s` `root=/distlock` `strategy=predecessor` (or `single`, `whole-queue`, earlier `children`) `node_format=curator` (or `kazoo`) `acl=auto` (the creator's nodes with credentials, open without; or `open`, or `creator`, which needs credentials) `tls=false` (`zks://` turns it on: TLS to the servers' `secureClientPort`, host names verified) `tls_ca=PATH` (the authorities to trust instead of the system's) `tls_cert=PATH` `tls_key=PATH` (a client certificate and its key, for servers that ask for one) |
//! | `redis`, `rediss` | `redis://[user[:password]@]host[:port][/db]` (port 6379, db 0); `rediss` uses TLS | `prefix=lock` `ttl=30s` `timeout=5s` `tls_ca=PATH` `strategy=queue` (or `polling`, `pubsub`) `wait_replicas=0` `wait_timeout=100ms` |
//! | `redis+sentinel` | `redis+sentinel://[user[:password]@]sentinel1[:port],sentinel2[:port]/SERVICE[/db]` (port 26379): the primary the sentinels name, followed through failovers | those of `redis` but `tls_ca` |
//! | `redis+cluster` | `redis+cluster://[user[:password]@]node1[:port],node2[:port]` (port 6379): a Redis Cluster, each lock on the primary serving its slot, following `MOVED` and `ASK`; no `/db`, no TLS | those of `redis` but `tls_ca` and `wait_replicas` |
//! | `redlock` | `redlock://[user:password@]h1[:p],h2,h3[/db]` — independent servers, quorum N/2+1 | `prefix=lock` `ttl=30s` `timeout=5s` `tls=false` `tls_ca=PATH` `drift_factor=0.01` `retry_count=3` `retry_delay=200ms` |
//! | `etcd`, `etcds` | `etcd://[user:password@]h1:2379,h2:2379[/prefix]` (port 2379); `etcds://` for TLS | `tls_ca=PATH` `prefix=/distlock` (the path sets it too) `lease_ttl=10s` `strategy=predecessor` (or `single`, `whole-queue`, earlier `prefix`) `timeout=5s` |
//! | `postgres`, `postgresql` | libpq's URL, `postgres://[user[:password]@]host[:port][/dbname]`, read by tokio-postgres with its own parameters (`application_name`, `sslmode`, …) | `schema=public` `strategy=advisory` (or `notify`, `polling`) `keepalive=5s` `timeout=5s` `poll_interval=50ms` `sslrootcert=PATH` |
//!
//! `PATH` stands for a file's path: the parameter has no default. Every scheme also takes
//! `password_file=PATH` (the password is the file's first line, kept out of the URL). Each parameter sets a
//! field of the backend's configuration ([`BackendConfig`]'s variants), whose docs give its
//! bounds.
//!
//! # Command line
//!
//! With the `cli` feature the package also builds the `distlock` binary, flock(1) for a
//! cluster: `distlock run --url URL --name NAME -- CMD…` runs a command under the lock
//! (`try` gives up at once, `holders` shows the holder and the queue). See the README.
//!
//! # Not re-entrant
//!
//! Locks are not re-entrant: a second `acquire` of a name that the same provider (even the
//! same task) already holds queues behind the first guard like any other contender, and
//! `try_acquire` returns `Ok(None)`. A task that re-acquires what it holds waits until its
//! timeout.
//!
//! # Redis is efficiency-grade
//!
//! Redis locks keep two workers from doing the same job twice most of the time; they do not
//! guarantee mutual exclusion through a failover or a paused process, and their fencing
//! tokens are best-effort. Use ZooKeeper plus fencing where correctness matters.
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::Arc;

mod backend;

// The README's Rust snippets, compiled and run as this crate's doc tests (they connect to
// `memory://`).
#[cfg(all(doctest, feature = "memory"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeSnippets;

pub use backend::BackendConfig;
#[cfg(feature = "memory")]
pub use backend::MemoryConfig;

// The contract, for applications.
/// Several locks taken all or none.
pub use lock_core::multi;
/// What operators watch: acquisitions, waits, holds and losses as metrics and spans.
pub use lock_core::observe;
/// Who holds a lock and who waits: [`DistributedLock::queue`]'s answer.
pub use lock_core::queue;
pub use lock_core::{
    Capabilities, Deadline, DistributedLock, DistributedRwLock, DistributedSemaphore, Election,
    Fencing, FencingToken, Guard, LeaderInfo, LeaderWatch, Leadership, LockError, LockName,
    LockProvider, LossReason, LostSignal, MAX_LEADER_VALUE_LEN, MAX_NAME_LEN, MetricsSnapshot,
    NameError, WaitKind,
};
// The backend SPI, for applications that wrap or implement a provider.
pub use lock_core::{BoxError, GuardBackend, LostNotifier, Metrics, lost_signal};

/// The in-memory reference backend: a [`MemoryServer`](memory::MemoryServer) and its
/// [`MemoryLockProvider`](memory::MemoryLockProvider) clients, with test hooks.
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub use lock_core::memory;

/// The ZooKeeper backend: its configuration, [`ZkConfig`](lock_zookeeper::ZkConfig).
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use lock_zookeeper as zookeeper;

/// The Redis backend: its configurations, [`RedisConfig`](lock_redis::RedisConfig) and
/// [`RedlockConfig`](lock_redis::RedlockConfig).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use lock_redis as redis;

/// The etcd backend: its configuration, [`EtcdConfig`](lock_etcd::EtcdConfig).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use lock_etcd as etcd;

/// The PostgreSQL backend: its configuration,
/// [`PostgresConfig`](lock_postgres::PostgresConfig).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use lock_postgres as postgres;

/// Connects to the backend named by `url` and returns its lock provider.
///
/// The same as [`BackendConfig::from_url`] followed by [`BackendConfig::connect`]; see the
/// [crate docs](crate#connection-urls) for the URL forms.
///
/// ```
/// # #[cfg(feature = "memory")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// // Two clients of the process-wide server "jobs" contend for the same locks.
/// let a = distlock::connect("memory://jobs").await?;
/// let b = distlock::connect("memory://jobs").await?;
/// let guard = a.lock("import")?.try_acquire().await?;
/// assert!(guard.is_some());
/// assert!(b.lock("import")?.try_acquire().await?.is_none());
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "memory"))]
/// # fn main() {}
/// ```
///
/// # Errors
///
/// [`LockError::Config`] for a malformed or invalid URL, an unknown scheme, or a scheme
/// whose feature is not enabled; connection and authentication errors from the backend.
pub async fn connect(url: &str) -> Result<Arc<dyn LockProvider>, LockError> {
    BackendConfig::from_url(url)?.connect().await
}
