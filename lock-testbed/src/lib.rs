//! Test infrastructure for distlock and its backends: real servers to test against, and
//! faults on the wire between a client and its server.
//!
//! This crate runs nothing on its own and asserts nothing about locks: the conformance
//! cases live in `lock-conformance`, which does not depend on this crate. A backend's tests
//! use both, the cases for *what* to check and this crate for *what to check it against*;
//! a backend whose servers come from elsewhere needs only `lock-conformance`.
//!
//! # Servers
//!
//! [`servers`] starts ZooKeeper (standalone or an ensemble), Redis (with or without a
//! password or an ACL user) and etcd from the machine's Debian packages, each on free
//! loopback ports with its own temporary directory, and waits until it serves. A server
//! dies, and its directory goes, with its handle and, thanks to watchdogs, with the test
//! process however that process ends. Fault injection (pause, resume, kill, restart) signals the server's
//! process group.
//!
//! Where they run is chosen by [`LOCK_TEST_SERVERS`](servers::SERVERS_ENV):
//!
//! - `processes` (the default, or unset): child processes of the test.
//! - `containers`: containers of one image (built by the repository's
//!   `scripts/ensure-docker`), through `testcontainers`. This needs the crate's
//!   `testcontainers` feature and a Docker-compatible engine; the same faults then go
//!   through the engine (a paused, killed and restarted container).
//!
//! A test that starts its servers with [`servers::Target::start`] (for instance
//! [`servers::RedisTarget::start`]), or uses the process-wide [`servers::shared_zk`],
//! [`servers::shared_redis`] and [`servers::shared_etcd`], follows that setting without a
//! change. `LOCK_TEST_ZK`, `LOCK_TEST_REDIS` and `LOCK_TEST_ETCD` point those at external
//! servers instead. A ZooKeeper ensemble ([`servers::ZkEnsemble`]) or an etcd cluster
//! ([`servers::EtcdCluster`]) runs as processes or, with the `testcontainers` feature, as
//! containers on a network of their own whose members can be partitioned and healed; the
//! faults on a member are [`servers::Members`]', the same on either runner.
//!
//! ```no_run
//! use lock_testbed::servers::{RedisOptions, RedisTarget, shared_zk};
//!
//! # async fn demo() -> Result<(), lock_testbed::servers::ServerError> {
//! let zk = shared_zk()?; // one ZooKeeper for the whole test binary
//! let _connect = zk.connect_string();
//!
//! let redis = RedisTarget::start(RedisOptions::default()).await?; // a process or a container
//! redis.pause().await?; // SIGSTOP, or `docker pause`
//! redis.resume().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # The fault proxy
//!
//! [`proxy::FaultProxy`] listens on a free loopback port in front of one server; a client
//! connects to the proxy instead, and the test cuts the connections, black-holes them,
//! delays them, or drops exactly one reply (a ZooKeeper create or delete, a PostgreSQL
//! statement, or the next reply of any request/response protocol such as Redis), switching
//! at any time. This is
//! how a harness ends a client's session behind its back, or makes "the server did it but
//! the client never heard".
//!
//! # Certificates
//!
//! [`certs`] makes a certificate authority and a server certificate for `127.0.0.1` with
//! the `openssl` command, for the TLS tests.
//!
//! Everything stays on `127.0.0.1`. Nothing here prints; logs go through `tracing`.

pub mod certs;
pub mod proxy;
pub mod servers;
