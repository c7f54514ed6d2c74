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
//! [`servers`] starts ZooKeeper (standalone or an ensemble), Redis (alone, under Sentinel,
//! or as a cluster), etcd (one member or a cluster), PostgreSQL and PgBouncer from the
//! machine's Debian packages, as child processes or, with the `testcontainers` feature, in
//! containers ([`LOCK_TEST_SERVERS`](servers::SERVERS_ENV)); each on free loopback ports,
//! gone with its handle or with the test process however it ends. Faults (pause, resume,
//! kill, restart, and a partition for set members in containers) are the same on either.
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
//! at any time. This is how a harness ends a client's session behind its back, or makes
//! "the server did it but the client never heard".
//!
//! # Certificates
//!
//! [`certs`] makes a certificate authority, and server (for `127.0.0.1`) and client
//! certificates it signs, for the TLS tests.
//!
//! Everything stays on `127.0.0.1`. Nothing here prints; logs go through `tracing`.

pub mod certs;
pub mod proxy;
pub mod servers;
