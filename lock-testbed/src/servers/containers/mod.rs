//! ZooKeeper, Redis, etcd and PostgreSQL in containers, through `testcontainers` (feature
//! `testcontainers`).
//!
//! For users with a Docker-compatible engine. Where no engine answers, every start returns
//! [`ServerError::NoContainerEngine`] within a few seconds (the engine is probed with a
//! bounded ping before testcontainers is asked for anything), which tests should
//! report as a skip: see [`ServerError::is_no_container_engine`]. The engine is spoken to
//! through `bollard`, the engine client testcontainers uses.
//!
//! Image: [`DEFAULT_IMAGE`] for every kind, overridable per kind by the variable its spec
//! names ([`ServerSpec::IMAGE_ENV`](super::ServerSpec::IMAGE_ENV): `LOCK_TEST_ZK_IMAGE`,
//! `LOCK_TEST_REDIS_IMAGE`, `LOCK_TEST_ETCD_IMAGE`, `LOCK_TEST_POSTGRES_IMAGE`;
//! `name[:tag]`). It holds Debian's `zookeeper`, `redis-server`, `etcd-server`,
//! `postgresql` and a JRE, built from Debian packages by the repository's
//! `scripts/ensure-docker` (no registry needed). It has no entrypoint: each container gets
//! its kind's command line, so an override must lay the servers out as Debian's packages
//! do. An engine that lacks the image and cannot pull it is [`ServerError::MissingImage`],
//! naming the image.

use super::{EtcdOptions, PostgresOptions, RedisOptions, ServerError, ZkOptions};

/// The image `scripts/ensure-docker` builds: Debian bookworm's ZooKeeper 3.8, Redis 7,
/// etcd 3.4, PostgreSQL 15 and a JRE, without an entrypoint.
pub const DEFAULT_IMAGE: &str = "distlock-test/servers:bookworm-pg";

pub(crate) fn container_error(err: impl std::fmt::Display) -> ServerError {
    ServerError::Container {
        detail: err.to_string(),
    }
}

/// The label on every container and network this module makes, for finding what a run left
/// behind: `docker ps -a --filter label=distlock-test`. Its value is [`RUN_ENV`] when set,
/// otherwise the test process's pid.
pub const LABEL: &str = "distlock-test";

/// The environment variable naming the test run, the value of [`LABEL`]: a script running
/// several test binaries finds what they all left with `label=distlock-test=<run>`, and
/// leaves alone what another run on the same engine made.
pub const RUN_ENV: &str = "LOCK_TEST_RUN";

/// The value of [`LABEL`] for what this process makes.
fn label_value() -> String {
    std::env::var(RUN_ENV)
        .ok()
        .filter(|run| !run.trim().is_empty())
        .unwrap_or_else(|| std::process::id().to_string())
}

/// ZooKeeper in a container (removed when dropped).
pub type ZkContainer = Container<ZkOptions>;

/// A single-member etcd cluster in a container (removed when dropped).
pub type EtcdContainer = Container<EtcdOptions>;

/// Redis in a container (removed when dropped), without persistence.
pub type RedisContainer = Container<RedisOptions>;

/// PostgreSQL in a container (removed when dropped).
pub type PostgresContainer = Container<PostgresOptions>;

mod container;
mod engine;
mod network;

pub use container::Container;
pub use engine::{ContainerEngine, check_engine, check_ready};

pub(crate) use network::{ClusterNetwork, host_name};
