//! The ZooKeeper backend of distlock: the correctness-grade backend.
//!
//! ZooKeeper locks are built from ephemeral nodes, so a crashed client's locks are freed when
//! its session expires, and every grant carries a monotonic [fencing token](lock_core::FencingToken)
//! (the lock node's creation zxid). Three strategies are offered — the naive
//! [`SingleNode`](ZkStrategy::SingleNode) lock, the herd-prone
//! [`SequentialChildren`](ZkStrategy::SequentialChildren) recipe and the herd-free
//! [`SequentialPredecessor`](ZkStrategy::SequentialPredecessor) recipe (the default) — and
//! node names compatible with Curator or kazoo, so that those clients and distlock exclude
//! each other on one path.
//!
//! # Status
//!
//! This release provides the [configuration](ZkConfig) and its connection-URL syntax:
//!
//! ```text
//! zk://[user:password@]host1:port1,host2:port2[/chroot]?session_timeout=10s&connect_timeout=5s
//!     &strategy=predecessor&root=/distlock&node_format=curator&acl=open
//! ```
//!
//! ```
//! use lock_zookeeper::{ZkConfig, ZkStrategy};
//!
//! let config = ZkConfig::from_url("zk://zk1:2181,zk2:2181/apps?strategy=children")?;
//! assert_eq!(config.hosts, ["zk1:2181", "zk2:2181"]);
//! assert_eq!(config.chroot.as_deref(), Some("/apps"));
//! assert_eq!(config.strategy, ZkStrategy::SequentialChildren);
//! # Ok::<(), lock_core::LockError>(())
//! ```
//!
//! The lock provider itself (sessions, the three strategies, read-write locks and
//! semaphores) is specified in the project's design document (section 3, "ZooKeeper
//! backend") and is not part of this release yet.

mod config;

pub use config::{AclPolicy, DigestAuth, NodeNameFormat, ZkConfig, ZkStrategy};
