//! Real servers (ZooKeeper, Redis, etcd, PostgreSQL, PgBouncer) for tests, run as child
//! processes or in containers.
//!
//! Every server gets free loopback ports, its own temporary directory (removed when the
//! handle is dropped), its own process group, and a log file whose last lines are quoted
//! when start-up fails. Start-up waits, bounded (30 s by default), until the server really
//! serves: its kind's [`Probe`]. Dropping a handle kills the whole process group with
//! `SIGKILL` and reaps it.
//!
//! A server also dies with the process that started it, even when that process never runs
//! its destructors (`std::process::exit`, an abort, `SIGKILL`): a tiny watchdog (`/bin/sh`,
//! in its own process group) blocks reading a pipe whose only writer is the test process,
//! and kills the server's process group when the pipe ends; another removes the directory.
//! This is what makes the process-wide [`shared_zk`], [`shared_redis`], [`shared_etcd`] and
//! [`shared_postgres`] servers safe: Rust never drops statics.
//!
//! Layout: each server kind is a module of its own ([`zookeeper`](ZkServer),
//! [`redis`](RedisServer), [`etcd`](EtcdServer), [`postgres`](PostgresServer)) whose
//! options are its [`ServerSpec`] (ports, command line and files, readiness probe, what
//! clients are given), with what only it has (who leads an ensemble, a Sentinel set, a
//! Redis Cluster). The runners know no server kind: [`Server`] runs a spec as a process,
//! `containers::Container` in a container, [`Members`] runs a set on either, and
//! [`Target`] is any of them or an external server.
//!
//! [`SERVERS_ENV`] (`LOCK_TEST_SERVERS=containers`) makes every [`Target::start`] (the
//! shared servers too) start a container instead of a process: see [`ServerMode`]. Each
//! kind's variable ([`ServerSpec::ENV`]: [`ZK_ENV`], [`REDIS_ENV`], [`ETCD_ENV`],
//! [`POSTGRES_ENV`]) points [`Target::from_env_or_start`] and the shared servers at an
//! external server instead; fault injection then returns [`ServerError::Unsupported`].
//!
//! All traffic stays on `127.0.0.1`. Nothing here prints; logs go through `tracing`.

mod error;
mod etcd;
mod local;
mod member;
mod members;
mod mode;
mod postgres;
mod probe;
mod process;
mod redis;
mod spec;
mod target;
mod zookeeper;

#[cfg(feature = "testcontainers")]
pub mod containers;

use std::sync::OnceLock;
use std::time::Duration;

pub use error::ServerError;
pub use etcd::{ETCD_ENV, EtcdCluster, EtcdOptions, EtcdServer, EtcdTarget, etcd_metric};
pub use local::Server;
pub use member::Member;
pub use members::Members;
pub use mode::{SERVERS_ENV, ServerMode};
pub use postgres::{
    POSTGRES_ENV, POSTGRES_SUPERUSER, PgBouncer, PgBouncerSpec, PoolMode, PostgresOptions,
    PostgresServer, PostgresTarget,
};
pub use process::free_port;
pub use redis::{
    REDIS_ENV, RedisClusterOptions, RedisClusterSet, RedisOptions, RedisSentinelOptions,
    RedisSentinelSet, RedisServer, RedisTarget,
};
pub use spec::{Command, Peer, Probe, ServerSpec, Site};
pub use target::Target;
pub use zookeeper::{ZK_ENV, ZkEnsemble, ZkOptions, ZkServer, ZkTarget, ZkTls};

/// The default bound on a server's start-up (and restart): 30 seconds.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The tick time of the [`shared_zk`] server: 500 ms, so that session timeouts down to
/// 1 s are accepted and a dead client's ephemeral nodes vanish quickly.
pub const SHARED_ZK_TICK_TIME: Duration = Duration::from_millis(500);

static SHARED_ZK: OnceLock<Result<ZkTarget, ServerError>> = OnceLock::new();
static SHARED_REDIS: OnceLock<Result<RedisTarget, ServerError>> = OnceLock::new();
static SHARED_ETCD: OnceLock<Result<EtcdTarget, ServerError>> = OnceLock::new();
static SHARED_POSTGRES: OnceLock<Result<PostgresTarget, ServerError>> = OnceLock::new();

/// One ZooKeeper per test binary: the external server named by [`ZK_ENV`] if set,
/// otherwise a standalone server (tick time [`SHARED_ZK_TICK_TIME`]) started on first use.
///
/// The server lives in a process-wide static and is not tied to any tokio runtime, so
/// every `#[tokio::test]` of the binary can use it. It is killed when the test binary
/// exits, however it exits. The first call blocks (the calling thread only) until the
/// server serves; a start-up failure is remembered and returned to every later caller.
///
/// Tests that need faults (pause, kill, restart) must start their own [`ZkServer`]: the
/// shared server only offers `&` access, and pausing it would disturb other tests.
pub fn shared_zk() -> Result<&'static ZkTarget, ServerError> {
    shared(&SHARED_ZK, || {
        ZkOptions::default().with_tick_time(SHARED_ZK_TICK_TIME)
    })
}

/// One Redis per test binary: the external server named by [`REDIS_ENV`] if set,
/// otherwise a plain Redis (no password) started on first use.
///
/// Same lifetime rules as [`shared_zk`]: process-wide, runtime-independent, killed when
/// the test binary exits, start-up failure remembered.
pub fn shared_redis() -> Result<&'static RedisTarget, ServerError> {
    shared(&SHARED_REDIS, RedisOptions::default)
}

/// One etcd per test binary: the external server named by [`ETCD_ENV`] if set, otherwise a
/// single-member cluster started on first use.
///
/// Same lifetime rules as [`shared_zk`]: process-wide, runtime-independent, killed when
/// the test binary exits, start-up failure remembered.
pub fn shared_etcd() -> Result<&'static EtcdTarget, ServerError> {
    shared(&SHARED_ETCD, EtcdOptions::default)
}

/// One PostgreSQL per test binary: the external server named by [`POSTGRES_ENV`] if set,
/// otherwise a fresh cluster (every role trusted) started on first use.
///
/// Same lifetime rules as [`shared_zk`]: process-wide, runtime-independent, killed when
/// the test binary exits, start-up failure remembered.
pub fn shared_postgres() -> Result<&'static PostgresTarget, ServerError> {
    shared(&SHARED_POSTGRES, PostgresOptions::default)
}

/// The target in `cell`, made on first use by [`Target::from_env_or_start`] with `opts()`
/// (blocking the calling thread only); a failure is kept and handed to every caller.
fn shared<S: ServerSpec>(
    cell: &'static OnceLock<Result<Target<S>, ServerError>>,
    opts: impl FnOnce() -> S,
) -> Result<&'static Target<S>, ServerError> {
    cell.get_or_init(|| process::block_on(Target::from_env_or_start(opts())).and_then(|r| r))
        .as_ref()
        .map_err(Clone::clone)
}
