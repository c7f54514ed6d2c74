//! The Redis backend of distlock: efficiency-grade locks on one Redis server (or on the
//! primary Redis Sentinel names), or Redlock over several.
//!
//! **Redis locks are efficiency-grade.** They keep two workers from doing the same job
//! twice most of the time; they do not guarantee mutual exclusion through a failover, a
//! paused process or a clock jump, and their fencing tokens are best-effort (a failover or a
//! restart without the data can roll the counter back, on one server as under Redlock).
//! Where correctness matters, use the ZooKeeper backend and pass the fencing token to the
//! protected resource.
//!
//! # Providers
//!
//! - [`RedisLockProvider`] on one server: `redis://[user[:password]@]host[:port][/db]?prefix=lock&ttl=30s&strategy=queue&timeout=5s`
//!   (`rediss://` for TLS, with `tls_ca=/path/ca.pem`)
//!   ([`RedisConfig::from_url`]);
//! - the same on the primary that Redis Sentinel names, following its failovers:
//!   `redis+sentinel://[user[:password]@]sentinel1[:26379],sentinel2/SERVICE[/db]?…`
//!   ([`RedisSentinel`]);
//! - the same on a Redis Cluster, each lock on the primary serving its slot:
//!   `redis+cluster://[user[:password]@]node1[:6379],node2?…` ([`RedisCluster`]);
//! - [`RedlockProvider`] over independent servers: `redlock://[user:password@]host1[:port],host2,host3[/db]?ttl=&retry_count=&retry_delay=&drift_factor=&timeout=`
//!   ([`RedlockConfig::from_url`]).
//!
//! ```
//! use std::time::Duration;
//! use lock_redis::{RedisConfig, RedisStrategy, RedlockConfig};
//!
//! let config = RedisConfig::from_url("redis://cache.internal:6380/2?ttl=10s&strategy=pubsub")?;
//! assert_eq!(config.server.db, 2);
//! assert_eq!(config.lease.ttl, Duration::from_secs(10));
//! assert_eq!(config.strategy, RedisStrategy::PubSub);
//!
//! let redlock = RedlockConfig::from_url("redlock://r1,r2,r3")?;
//! assert_eq!(redlock.quorum(), 2);
//! # Ok::<(), lock_core::LockError>(())
//! ```
//!
//! # How a lock works
//!
//! Every key of the lock called `N` carries the hash tag `{prefix:N}`, so that one Lua script
//! touches them all (on Redis Cluster too; a waiter's own list is named inside the scripts,
//! in the same slot): `:owner` (the holder's random 128-bit owner id, with the lease as its
//! expiry), `:fence` (the fencing counter, bumped by the grant in the same script; it stays
//! after the lock is free), `:queue` and `:deadlines` (the queue strategy's waiters),
//! `:released` (the last release's receipt, for a lease's length) and `:w:<owner id>`.
//!
//! - A grant sets the owner key only if it is absent; a release deletes it only if it is
//!   ours (compare-and-delete), a renewal extends it only if it is ours
//!   (compare-and-pexpire). The provider's one renewal timer renews every held key at
//!   ttl/3 while its guard lives.
//! - A guard's [`valid_until`](lock_core::Guard::valid_until) is counted from the sending of
//!   the request that granted or last renewed it, less a drift margin (1% of the ttl and
//!   2 ms). When it passes without a confirmed renewal, or a renewal finds the key gone or
//!   someone else's, the guard's lost signal fires.
//! - Waiting, by [`RedisStrategy`]: `Polling` retries with jittered exponential back-off;
//!   `PubSub` retries on every release broadcast (every waiter wakes: the herd; a
//!   provider's pub/sub waiters share one subscription connection per server, subscribed
//!   to a lock's channel while anyone waits on it, as Redisson's do; on a cluster, sharded
//!   pub/sub on the primary serving the lock's slot); `Queue`
//!   (the default) is FIFO and herd-free: a release hands the lock straight to the first
//!   waiter's own list, which that waiter alone is blocked on. Queue waiters refresh a
//!   server-TIME deadline every ttl/3 (at most 2 s) and are dropped once it passes, so a
//!   crashed waiter does not block the queue; a cancelled waiter leaves the queue, and
//!   passes on a grant that raced its cancel.
//! - A crashed holder's lock is free when its key expires (the ttl); waiters notice within
//!   one refresh period.
//! - [Leader elections](RedisElection) are locks of their own (`{prefix:name.election}`)
//!   on the `Queue` strategy, whatever the provider's, each candidate's value kept beside its
//!   place; efficiency-grade like the locks.
//! - [Read-write locks](RedisRwLock) (`{prefix:name.rwlock}`) and
//!   [semaphores](RedisSemaphore) (`{prefix:name.semaphore}`) are one queue of permits on
//!   the `Queue` design, whatever the provider's strategy (`scripts/permits.lua`): a holder
//!   takes some of a fixed number of permits (a semaphore's permit one of N; a reader one
//!   of more than any count of readers reaches, a writer all of them), listed with its
//!   lease's end in a sorted set. Waiters are admitted first come, first served while they
//!   fit, so a waiting writer holds back the readers behind it; a release pushes a token
//!   onto the list of each waiter it admits and wakes no one else. Every hold has its own
//!   fencing token, lease and watchdog, as a mutex's.
//!
//! # Failover, restarts and tokens
//!
//! Redis replicates asynchronously. When a primary fails over, the replica may not have
//! seen the last grants: the new primary can grant a lock that is still held (two holders
//! until the old holder's next renewal finds the key someone else's and fires its lost
//! signal), and its fencing counter can be lower than tokens already handed out. A restart
//! without persistence loses the keys and the counters alike: holders learn it at their
//! next renewal, and tokens start again from 1. Tokens increase only while the server keeps
//! its data: [`Fencing::BestEffort`](lock_core::Fencing::BestEffort).
//!
//! Under Redis Sentinel ([`RedisSentinel`]) the provider asks the sentinels for the primary,
//! listens to every sentinel's `+switch-master` announcements and moves to the announced
//! primary once it confirms its role, and asks again after a connection error or a
//! refusal by a replica (`READONLY`, `UNBLOCKED`). Meanwhile requests fail with retryable
//! errors. A queued waiter keeps waiting while its place lasts (its liveness less one
//! refresh period, counted from its last refresh) and if the place reached the new primary;
//! a holder keeps its lock through a failover shorter than its lease's validity, if the
//! grant reached the new primary. The window above stays: a failover loses what the
//! promoted replica had not yet received, and leaves the old primary taking writes until
//! the sentinels reconfigure it (grants made there are lost).
//!
//! `wait_replicas=N` ([`RedisConfig::wait_replicas`]) narrows that window: a grant counts
//! only once `N` replicas have acknowledged it (`WAIT`, after a renewal written on a
//! connection of its own), and is otherwise given back with a retryable error; a renewal
//! not acknowledged counts as failed. A failover that promotes an acknowledging replica
//! then keeps the grant and the counter; on a demoted primary that lost its replicas,
//! grants no longer count for clients with `wait_replicas` (clients without it are still
//! granted there). Acknowledged means in the replicas' memory, not on their disks. An ACL
//! user also needs `+wait` for it. Ask for every replica: a replica the sentinels did not
//! promote follows the old primary until they reconfigure it, and acknowledges the grants
//! made there meanwhile. Measured over 120 failovers with two replicas (the README's
//! "Redis under Sentinel"): without `WAIT`, and with `wait_replicas=1`, every forced
//! failover handed tokens out again; with `wait_replicas=2` none did, at a third of the
//! grants per second.
//!
//! Redlock does not depend on one server. Each server keeps its own counter; a grant
//! reports the largest count of its majority and, in a second round, raises those servers'
//! counters to it, so that tokens increase from grant to grant while the servers keep
//! their data (any two majorities share a server), and while every client of the lock
//! takes that second round: a client of an earlier version that does not can report a
//! smaller token. Its safety also rests on bounded clock drift and process pauses shorter
//! than the validity.
//!
//! # An ACL user for the locks
//!
//! The locks need the scripting commands, the commands their scripts call (Redis checks
//! those too; the sorted-set ones are the read-write locks' and semaphores'), `BLPOP`
//! (queue waiters), `SUBSCRIBE` (pub/sub waiters), `PING`, and the keys
//! and channels of their prefix. A user limited to them (the test suite checks this rule
//! with every strategy; add `+select` for a database other than 0):
//!
//! ```text
//! ACL SETUSER locker on >s3cret ~{lock* &{lock* +@scripting +get +set +del +exists +incr
//!     +pexpire +pttl +time +lpop +rpush +lrem +lindex +lpos +llen +blpop +hget +hset +hdel
//!     +zadd +zscore +zrange +zrangebyscore +zrem +zremrangebyscore +publish +subscribe
//!     +unsubscribe +ping
//! ```
//!
//! then `redis://locker:s3cret@host?prefix=lock`. Under Redis Sentinel the user also needs
//! `+role` (the primary confirms its role); on a Redis Cluster `+cluster|slots` (the client
//! learns which primary serves which slot) and `+spublish +ssubscribe +sunsubscribe`
//! (sharded pub/sub), set on every node. A lock outside the user's key pattern
//! fails with [`LockError::PermissionDenied`](lock_core::LockError::PermissionDenied); a
//! wrong password with [`LockError::Auth`](lock_core::LockError::Auth).
//!
//! # TLS
//!
//! `rediss://` (or `tls=true` for `redlock://`) connects with TLS (rustls), trusting the
//! system's certificate authorities, or those of the PEM file `tls_ca=/path/ca.pem`.

mod claim;
mod config;
mod connection;
mod election;
mod error;
mod holders;
mod keys;
mod lock;
mod node;
mod permits;
mod provider;
mod redlock;
mod scripts;
mod session;
mod subscriber;

pub use config::{
    LeaseOptions, RedisCluster, RedisConfig, RedisSentinel, RedisServer, RedisStrategy,
    RedlockConfig,
};
pub use election::RedisElection;
pub use holders::RedisHolders;
pub use lock::RedisLock;
pub use permits::{RedisRwLock, RedisSemaphore};
pub use provider::RedisLockProvider;
pub use redlock::{RedlockLock, RedlockProvider};
