//! The Redis backend of distlock: efficiency-grade locks on one Redis server, or Redlock over
//! several.
//!
//! **Redis locks are efficiency-grade.** They keep two workers from doing the same job
//! twice most of the time; they do not guarantee mutual exclusion through a failover, a
//! paused process or a clock jump, and their fencing tokens are best-effort (a failover can
//! roll the counter back; under Redlock they are not monotonic at all). Where correctness
//! matters, use the ZooKeeper backend and pass the fencing token to the protected resource.
//!
//! # Status
//!
//! This release provides the configuration and its connection-URL syntax:
//!
//! - [`RedisConfig`] for one server — `redis://[user[:password]@]host[:port][/db]?prefix=lock&ttl=30s&strategy=queue`,
//!   or `rediss://` for TLS;
//! - [`RedlockConfig`] for Redlock over independent servers —
//!   `redlock://[user:password@]host1[:port],host2,host3[/db]?prefix=&ttl=&retry_count=&retry_delay=&drift_factor=&tls=true`.
//!
//! ```
//! use std::time::Duration;
//! use lock_redis::{RedisConfig, RedisStrategy, RedlockConfig};
//!
//! let config = RedisConfig::from_url("rediss://cache.internal:6380/2?ttl=10s&strategy=pubsub")?;
//! assert!(config.server.tls);
//! assert_eq!(config.server.db, 2);
//! assert_eq!(config.ttl, Duration::from_secs(10));
//! assert_eq!(config.strategy, RedisStrategy::PubSub);
//!
//! let redlock = RedlockConfig::from_url("redlock://r1,r2,r3")?;
//! assert_eq!(redlock.quorum(), 2);
//! # Ok::<(), lock_core::LockError>(())
//! ```
//!
//! The lock providers themselves (the grant/release/extend scripts, the watchdog, the three
//! waiting strategies and Redlock) are specified in the project's design document (section
//! 4, "Redis backend") and are not part of this release yet.

mod config;
mod error;
mod guard;
mod keys;
mod lock;
mod node;
mod provider;
mod redlock;
mod scripts;

pub use config::{RedisConfig, RedisServer, RedisStrategy, RedlockConfig};
pub use lock::RedisLock;
pub use provider::RedisLockProvider;
pub use redlock::{RedlockLock, RedlockProvider};
