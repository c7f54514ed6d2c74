//! ZooKeeper, Redis, etcd and PostgreSQL in containers, through `testcontainers` (feature
//! `testcontainers`).
//!
//! For users with a Docker-compatible engine. Where no engine answers, every start returns
//! [`ServerError::NoContainerEngine`] within a few seconds (the engine is probed with a
//! bounded ping before testcontainers is asked for anything), which tests should
//! report as a skip: see [`ServerError::is_no_container_engine`]. The engine is spoken to
//! through `bollard`, the engine client testcontainers uses.
//!
//! Images: [`DEFAULT_ZK_IMAGE`], [`DEFAULT_REDIS_IMAGE`], [`DEFAULT_ETCD_IMAGE`] and
//! [`DEFAULT_POSTGRES_IMAGE`], overridable by the environment variables [`ZK_IMAGE_ENV`],
//! [`REDIS_IMAGE_ENV`], [`ETCD_IMAGE_ENV`] and [`POSTGRES_IMAGE_ENV`] (`name[:tag]`). The
//! default is one image with Debian's `zookeeper`, `redis-server`, `etcd-server`,
//! `postgresql` and a JRE, built from
//! Debian packages by the repository's `scripts/ensure-docker` (no registry needed). It
//! has no entrypoint: this module gives each container its command line, so an override
//! must lay the servers out as Debian's packages do. An engine that lacks the image and
//! cannot pull it is [`ServerError::MissingImage`], naming the image.

use super::ServerError;
pub use super::kind::{Etcd, ZooKeeper};

/// The environment variable overriding the ZooKeeper image (`name[:tag]`).
pub const ZK_IMAGE_ENV: &str = "LOCK_TEST_ZK_IMAGE";
/// The environment variable overriding the Redis image (`name[:tag]`).
pub const REDIS_IMAGE_ENV: &str = "LOCK_TEST_REDIS_IMAGE";
/// The environment variable overriding the etcd image (`name[:tag]`).
pub const ETCD_IMAGE_ENV: &str = "LOCK_TEST_ETCD_IMAGE";
/// The environment variable overriding the PostgreSQL image (`name[:tag]`).
pub const POSTGRES_IMAGE_ENV: &str = "LOCK_TEST_POSTGRES_IMAGE";
/// The image `scripts/ensure-docker` builds: Debian bookworm's ZooKeeper 3.8, Redis 7,
/// etcd 3.4, PostgreSQL 15 and a JRE, without an entrypoint.
pub const DEFAULT_IMAGE: &str = "distlock-test/servers:bookworm-pg";
/// The default ZooKeeper image: [`DEFAULT_IMAGE`].
pub const DEFAULT_ZK_IMAGE: &str = DEFAULT_IMAGE;
/// The default Redis image: [`DEFAULT_IMAGE`].
pub const DEFAULT_REDIS_IMAGE: &str = DEFAULT_IMAGE;
/// The default etcd image: [`DEFAULT_IMAGE`].
pub const DEFAULT_ETCD_IMAGE: &str = DEFAULT_IMAGE;
/// The default PostgreSQL image: [`DEFAULT_IMAGE`].
pub const DEFAULT_POSTGRES_IMAGE: &str = DEFAULT_IMAGE;

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

/// The kind of a [`RedisContainer`]: Redis, with the default user's password (for its URL).
#[derive(Debug)]
pub struct Redis {
    pub(crate) password: Option<String>,
}

/// The kind of a [`PostgresContainer`]: PostgreSQL, with the superuser's password (for its
/// URL).
#[derive(Debug)]
pub struct Postgres {
    pub(crate) password: Option<String>,
}

/// PostgreSQL in a container (removed when dropped).
pub type PostgresContainer = Container<Postgres>;

/// ZooKeeper in a container (removed when dropped).
pub type ZkContainer = Container<ZooKeeper>;

/// A single-member etcd cluster in a container (removed when dropped).
pub type EtcdContainer = Container<Etcd>;

/// Redis in a container (removed when dropped), without persistence.
pub type RedisContainer = Container<Redis>;

/// The kind of a [`SentinelContainer`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Sentinel;

/// A Redis Sentinel in a container (removed when dropped).
pub type SentinelContainer = Container<Sentinel>;

mod container;
mod engine;
mod network;

pub use container::Container;
pub(crate) use container::{ServerSpec, on_free_port, wait_ready};
pub use engine::{ContainerEngine, check_engine, check_ready};

pub(crate) use network::{ClusterNetwork, host_name};
