//! ZooKeeper, Redis and etcd in containers, through `testcontainers` (feature
//! `testcontainers`).
//!
//! For users with a Docker-compatible engine. Where no engine answers, every start returns
//! [`ServerError::NoContainerEngine`] within a few seconds (the engine is probed with a
//! bounded ping before testcontainers is asked for anything), which tests should
//! report as a skip: see [`ServerError::is_no_container_engine`]. The engine is spoken to
//! through `bollard`, the engine client testcontainers uses.
//!
//! Images: [`DEFAULT_ZK_IMAGE`], [`DEFAULT_REDIS_IMAGE`] and [`DEFAULT_ETCD_IMAGE`],
//! overridable by the environment variables [`ZK_IMAGE_ENV`], [`REDIS_IMAGE_ENV`] and
//! [`ETCD_IMAGE_ENV`] (`name[:tag]`). The default is one
//! image with Debian's `zookeeper`, `redis-server`, `etcd-server` and a JRE, built from
//! Debian packages by the repository's `scripts/ensure-docker` (no registry needed). It
//! has no entrypoint: this module gives each container its command line, so an override
//! must lay the servers out as Debian's packages do. An engine that lacks the image and
//! cannot pull it is [`ServerError::MissingImage`], naming the image.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use testcontainers::bollard::errors::Error as BollardError;
use testcontainers::bollard::models::{HostConfig, PortBinding};
use testcontainers::bollard::{API_DEFAULT_VERSION, Docker};
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ContainerRequest, GenericImage, ImageExt};
use tracing::{debug, info, warn};

use super::probe::{Probe, four_letter};
use super::process::{Watchdog, free_port};
use super::redis::redis_url;
use super::zookeeper::{MAIN_CLASS, zoo_cfg};
use super::{EtcdOptions, RedisOptions, ServerError, ZkOptions};

/// The environment variable overriding the ZooKeeper image (`name[:tag]`).
pub const ZK_IMAGE_ENV: &str = "LOCK_TEST_ZK_IMAGE";
/// The environment variable overriding the Redis image (`name[:tag]`).
pub const REDIS_IMAGE_ENV: &str = "LOCK_TEST_REDIS_IMAGE";
/// The environment variable overriding the etcd image (`name[:tag]`).
pub const ETCD_IMAGE_ENV: &str = "LOCK_TEST_ETCD_IMAGE";
/// The image `scripts/ensure-docker` builds: Debian bookworm's ZooKeeper 3.8, Redis 7,
/// etcd 3.4 and a JRE, without an entrypoint.
pub const DEFAULT_IMAGE: &str = "distlock-test/servers:bookworm";
/// The default ZooKeeper image: [`DEFAULT_IMAGE`].
pub const DEFAULT_ZK_IMAGE: &str = DEFAULT_IMAGE;
/// The default Redis image: [`DEFAULT_IMAGE`].
pub const DEFAULT_REDIS_IMAGE: &str = DEFAULT_IMAGE;
/// The default etcd image: [`DEFAULT_IMAGE`].
pub const DEFAULT_ETCD_IMAGE: &str = DEFAULT_IMAGE;

/// ZooKeeper's class path in an image laid out as Debian's packages.
const CONTAINER_ZK_CLASSPATH: &str =
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";

/// The bound on asking the engine whether it is there.
const ENGINE_PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// The bound on creating and starting the container.
const CREATE_TIMEOUT: Duration = Duration::from_secs(300);

/// Where a container engine is expected: `DOCKER_HOST`, or the usual socket paths.
///
/// ```no_run
/// use lock_testbed::servers::containers::ContainerEngine;
///
/// # async fn demo() -> Result<(), lock_testbed::servers::ServerError> {
/// let engine = ContainerEngine::from_env()?;
/// engine.check().await?; // NoContainerEngine when nothing answers
/// let present = engine.has_image("redis", "7").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ContainerEngine {
    address: EngineAddress,
}

#[derive(Debug, Clone)]
enum EngineAddress {
    Unix(PathBuf),
    Tcp(String),
    /// A scheme this module cannot probe (e.g. `ssh://`): left to testcontainers.
    Other(String),
}

impl ContainerEngine {
    /// The engine `DOCKER_HOST` names, or the first Docker socket that exists;
    /// [`ServerError::NoContainerEngine`] when there is neither.
    pub fn from_env() -> Result<Self, ServerError> {
        if let Ok(host) = std::env::var("DOCKER_HOST")
            && !host.trim().is_empty()
        {
            return Ok(Self::at(&host));
        }
        let mut candidates = vec![PathBuf::from("/var/run/docker.sock")];
        if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
            candidates.push(PathBuf::from(runtime).join(".docker/run/docker.sock"));
        }
        if let Some(home) = std::env::var_os("HOME") {
            let home = PathBuf::from(home);
            candidates.push(home.join(".docker/run/docker.sock"));
            candidates.push(home.join(".docker/desktop/docker.sock"));
        }
        match candidates.iter().find(|p| p.exists()) {
            Some(path) => Ok(Self {
                address: EngineAddress::Unix(path.clone()),
            }),
            None => Err(ServerError::NoContainerEngine {
                detail: format!(
                    "DOCKER_HOST is not set and no Docker socket exists (looked for {})",
                    candidates
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    /// The engine at `docker_host`, written as `DOCKER_HOST` would be (`unix:///path`,
    /// `tcp://host:port`).
    pub fn at(docker_host: &str) -> Self {
        let host = docker_host.trim();
        let address = if let Some(path) = host.strip_prefix("unix://") {
            EngineAddress::Unix(PathBuf::from(path))
        } else if let Some(addr) = host.strip_prefix("tcp://") {
            EngineAddress::Tcp(addr.trim_end_matches('/').to_owned())
        } else {
            EngineAddress::Other(host.to_owned())
        };
        Self { address }
    }

    /// A client of the engine whose requests are bounded by [`ENGINE_PROBE_TIMEOUT`]; `None`
    /// for an address this module cannot speak to, which is left to testcontainers.
    fn client(&self) -> Result<Option<Docker>, ServerError> {
        let timeout = ENGINE_PROBE_TIMEOUT.as_secs();
        let client = match &self.address {
            EngineAddress::Unix(socket) => {
                Docker::connect_with_unix(&socket.to_string_lossy(), timeout, API_DEFAULT_VERSION)
            }
            EngineAddress::Tcp(addr) => {
                let url = format!("tcp://{addr}");
                Docker::connect_with_http(&url, timeout, API_DEFAULT_VERSION)
            }
            EngineAddress::Other(host) => {
                debug!(%host, "cannot probe this DOCKER_HOST scheme; leaving it to testcontainers");
                return Ok(None);
            }
        };
        client
            .map(Some)
            .map_err(|error| self.no_engine(format!("cannot be spoken to: {error}")))
    }

    fn no_engine(&self, why: String) -> ServerError {
        ServerError::NoContainerEngine {
            detail: format!("{:?} {why}", self.address),
        }
    }

    /// Checks, within a few seconds, that the engine answers a ping;
    /// [`ServerError::NoContainerEngine`] (with where it looked) otherwise.
    pub async fn check(&self) -> Result<(), ServerError> {
        debug!(engine = ?self.address, "probing the container engine");
        let Some(docker) = self.client()? else {
            return Ok(());
        };
        match tokio::time::timeout(ENGINE_PROBE_TIMEOUT, docker.ping()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(self.no_engine(format!("does not answer a ping: {error}"))),
            Err(_) => Err(self.no_engine(format!(
                "did not answer a ping within {ENGINE_PROBE_TIMEOUT:?}"
            ))),
        }
    }

    /// Whether the engine has the image `name:tag` locally (`true` where this module cannot
    /// ask). This module starts a container only after this check, so it never asks the
    /// engine to pull: a missing image is [`ServerError::MissingImage`].
    pub async fn has_image(&self, name: &str, tag: &str) -> Result<bool, ServerError> {
        let Some(docker) = self.client()? else {
            return Ok(true);
        };
        let image = format!("{name}:{tag}");
        match tokio::time::timeout(ENGINE_PROBE_TIMEOUT, docker.inspect_image(&image)).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            })) => Ok(false),
            Ok(Err(BollardError::DockerResponseServerError {
                status_code,
                message,
            })) => Err(container_error(format!(
                "the engine answered {status_code} when asked for the image {image}: {message}"
            ))),
            Ok(Err(error)) => Err(self.no_engine(format!("does not answer: {error}"))),
            Err(_) => Err(self.no_engine(format!(
                "did not answer about the image {image} within {ENGINE_PROBE_TIMEOUT:?}"
            ))),
        }
    }
}

impl ContainerEngine {
    /// The image named by `image` (`(variable, default)`, see [`image_from_env`]) as
    /// `(name, tag)`; [`ServerError::MissingImage`] when the engine lacks it.
    async fn require_image(&self, image: (&str, &str)) -> Result<(String, String), ServerError> {
        let (name, tag) = image_from_env(image.0, image.1);
        if self.has_image(&name, &tag).await? {
            Ok((name, tag))
        } else {
            Err(ServerError::MissingImage {
                image: format!("{name}:{tag}"),
                hint: IMAGE_HINT.to_owned(),
            })
        }
    }
}

/// Checks, within a few seconds, that servers can run in containers here: an engine answers
/// (else [`ServerError::NoContainerEngine`]) and has the ZooKeeper, Redis and etcd images
/// (else [`ServerError::MissingImage`]). Tests skip with the error as the reason, except under
/// `LOCK_CONFORMANCE_STRICT`.
///
/// ```no_run
/// # async fn demo() {
/// if let Err(why) = lock_testbed::servers::containers::check_ready().await {
///     eprintln!("skipped: {why}");
/// }
/// # }
/// ```
pub async fn check_ready() -> Result<(), ServerError> {
    let engine = ContainerEngine::from_env()?;
    engine.check().await?;
    engine
        .require_image((ZK_IMAGE_ENV, DEFAULT_ZK_IMAGE))
        .await?;
    engine
        .require_image((REDIS_IMAGE_ENV, DEFAULT_REDIS_IMAGE))
        .await?;
    engine
        .require_image((ETCD_IMAGE_ENV, DEFAULT_ETCD_IMAGE))
        .await?;
    Ok(())
}

/// How to get a missing image, for [`ServerError::MissingImage`].
const IMAGE_HINT: &str = "build the default image with scripts/ensure-docker (in the distlock \
    repository), or name an image the engine has, laid out as Debian's packages, in \
    LOCK_TEST_ZK_IMAGE / LOCK_TEST_REDIS_IMAGE / LOCK_TEST_ETCD_IMAGE";

/// Checks, within a few seconds, that the container engine found by
/// [`ContainerEngine::from_env`] answers `GET /_ping`.
///
/// Returns [`ServerError::NoContainerEngine`] (with where it looked) otherwise.
pub async fn check_engine() -> Result<(), ServerError> {
    ContainerEngine::from_env()?.check().await
}

/// Splits `name[:tag]` (a registry `host:port/` prefix is not mistaken for a tag).
fn image_from_env(var: &str, default: &str) -> (String, String) {
    let spec = std::env::var(var)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| default.to_owned());
    let spec = spec.trim();
    let slash = spec.rfind('/').map_or(0, |i| i + 1);
    match spec[slash..].rfind(':') {
        Some(colon) => {
            let at = slash + colon;
            (spec[..at].to_owned(), spec[at + 1..].to_owned())
        }
        None => (spec.to_owned(), "latest".to_owned()),
    }
}

/// How the runtime reports a freeze that timed out (and was undone).
const FREEZE_FAILED: &str = "unable to freeze";
/// How often [`Container::pause`] tries a freeze that timed out.
const PAUSE_ATTEMPTS: u32 = 5;
/// The pause before the second attempt; it grows by as much per attempt.
const PAUSE_RETRY_PAUSE: Duration = Duration::from_millis(100);

fn container_error(err: impl std::fmt::Display) -> ServerError {
    ServerError::Container {
        detail: err.to_string(),
    }
}

/// Creates and starts the container, bounded by [`CREATE_TIMEOUT`].
async fn run(
    request: ContainerRequest<GenericImage>,
) -> Result<ContainerAsync<GenericImage>, ServerError> {
    match tokio::time::timeout(CREATE_TIMEOUT, request.start()).await {
        Ok(Ok(container)) => Ok(container),
        // The engine answered its ping just before: what fails now is this container.
        Ok(Err(err)) => Err(container_error(err)),
        Err(_) => Err(ServerError::Timeout {
            what: "the container to be created".to_owned(),
            after: CREATE_TIMEOUT,
        }),
    }
}

/// Publishes `internal` on `127.0.0.1:host_port` only (the engine's default is every
/// interface), at a port chosen here so that it survives a restart of the container.
fn publish_on_loopback(internal: u16, host_port: u16) -> impl Fn(&mut HostConfig) + Send + Sync {
    move |config: &mut HostConfig| {
        let binding = PortBinding {
            host_ip: Some("127.0.0.1".to_owned()),
            host_port: Some(host_port.to_string()),
        };
        config.port_bindings = Some(HashMap::from([(
            format!("{internal}/tcp"),
            Some(vec![binding]),
        )]));
        config.publish_all_ports = Some(false);
    }
}

/// The label that names one container handle's containers (every attempt to create it), so
/// that its watchdog removes whatever the engine made for it, even a container whose start
/// failed.
const HANDLE_LABEL: &str = "distlock-test.handle";

/// The watchdog script of a container handle: when the pipe closes, remove every container
/// labelled [`HANDLE_LABEL`]=`$1`.
const WATCHDOG_SCRIPT: &str = "read -r _ignored; \
    ids=$(docker ps --all --quiet --filter \"label=distlock-test.handle=$1\" 2>/dev/null); \
    [ -z \"$ids\" ] || docker rm --force --volumes $ids >/dev/null 2>&1; exit 0";

/// Polls `probe` until it passes; a [`ServerError::Startup`] after `timeout`.
async fn wait_ready(
    server: &str,
    probe: &Probe,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(), ServerError> {
    let began = Instant::now();
    loop {
        let attempt = Duration::from_secs(1).min(timeout.saturating_sub(began.elapsed()));
        let why = match probe.check(addr, attempt).await {
            Ok(()) => return Ok(()),
            Err(why) => why,
        };
        if began.elapsed() >= timeout {
            return Err(ServerError::Startup {
                server: server.to_owned(),
                detail: format!("not ready on {addr} after {timeout:?}; last probe: {why}"),
                log_tail: "(see the container's logs)".to_owned(),
            });
        }
        tokio::time::sleep(probe.interval()).await;
    }
}

/// A server in a container, removed when dropped: a [`ZkContainer`] or a
/// [`RedisContainer`].
///
/// Its client port is published on `127.0.0.1` only (or, on the host's network, bound
/// there by the server itself), at a port that stays the same across
/// [`restart`](Container::restart). Containers are labelled [`LABEL`], and removed also when
/// the test process ends without dropping them (a process-wide static, an abort): a small
/// watchdog process runs `docker rm --force` then.
#[derive(Debug)]
pub struct Container<K> {
    /// `None` only while being dropped.
    container: Option<ContainerAsync<GenericImage>>,
    /// Removes what the engine still has of this container when the handle is dropped (after
    /// testcontainers' own removal, if that could run) or the test process dies.
    _watchdog: Watchdog,
    server: String,
    port: u16,
    /// On the host's network (see [`ServerSpec::host_port`]).
    on_host: bool,
    probe: Probe,
    startup_timeout: Duration,
    kind: K,
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

/// The kind of a [`ZkContainer`].
#[derive(Debug)]
#[non_exhaustive]
pub struct ZooKeeper;

/// The kind of a [`RedisContainer`]: Redis, with the default user's password (for its URL).
#[derive(Debug)]
pub struct Redis {
    password: Option<String>,
}

/// The kind of an [`EtcdContainer`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Etcd;

/// ZooKeeper in a container (removed when dropped).
pub type ZkContainer = Container<ZooKeeper>;

/// A single-member etcd cluster in a container (removed when dropped).
pub type EtcdContainer = Container<Etcd>;

/// Redis in a container (removed when dropped), without persistence.
pub type RedisContainer = Container<Redis>;

/// How many times a container is created again when the port chosen for it was taken in
/// the meantime.
const PORT_ATTEMPTS: usize = 5;

/// What a server container is: the server's name (for messages), its image, its client
/// port inside the container, and how to tell that it serves.
struct ServerSpec {
    server: String,
    /// `(variable, default)`, see [`image_from_env`].
    image: (&'static str, &'static str),
    internal: u16,
    probe: Probe,
    startup_timeout: Duration,
    /// On the host's network, serving on this loopback port (which the configured command
    /// binds), rather than on its own network with `internal` published: for servers that
    /// tell each other's addresses to clients (Redis Sentinel), which must be the same
    /// inside and outside the containers.
    host_port: Option<u16>,
}

impl<K> Container<K> {
    /// [`create`](Self::create)s the container, then waits (bounded by the spec's start-up
    /// timeout) until its probe passes.
    async fn launch(
        spec: ServerSpec,
        configure: impl Fn(GenericImage) -> ContainerRequest<GenericImage>,
        kind: K,
    ) -> Result<Self, ServerError> {
        let began = Instant::now();
        let started = Self::create(spec, configure, kind).await?;
        started.wait_ready().await?;
        info!(server = %started.server, port = started.port, took = ?began.elapsed(), "container serves");
        Ok(started)
    }

    /// Checks the engine, and starts the spec's image publishing its client port on a free
    /// loopback port, with `configure` adding what the server needs. Does not wait for the
    /// server: the probe is kept for [`wait_ready`](Self::wait_ready) and
    /// [`restart`](Self::restart).
    async fn create(
        spec: ServerSpec,
        configure: impl Fn(GenericImage) -> ContainerRequest<GenericImage>,
        kind: K,
    ) -> Result<Self, ServerError> {
        let ServerSpec {
            server,
            image,
            internal,
            probe,
            startup_timeout,
            host_port,
        } = spec;
        let engine = ContainerEngine::from_env()?;
        engine.check().await?;
        let (name, tag) = engine.require_image(image).await?;
        info!(%name, %tag, "starting a {server} container");
        let handle = format!("{}-{:016x}", std::process::id(), fastrand::u64(..));
        // Before the first attempt: a container created but not started is removed too.
        let watchdog = Watchdog::spawn(WATCHDOG_SCRIPT, "container", &handle);
        let mut attempt = 0;
        let (container, port) = loop {
            attempt += 1;
            let image =
                GenericImage::new(name.clone(), tag.clone()).with_wait_for(WaitFor::Nothing);
            let (request, port) = match host_port {
                Some(port) => (configure(image).with_network("host"), port),
                None => {
                    let port = free_port()?;
                    let request = configure(image.with_exposed_port(internal.tcp()))
                        .with_host_config_modifier(publish_on_loopback(internal, port));
                    (request, port)
                }
            };
            let request = request
                .with_label(LABEL, label_value())
                .with_label(HANDLE_LABEL, handle.clone());
            match run(request).await {
                Ok(container) => break (container, port),
                // Another process took the port between its choice and the engine's bind.
                Err(ServerError::Container { detail })
                    if attempt < PORT_ATTEMPTS
                        && (detail.contains("address already in use")
                            || detail.contains("port is already allocated")) =>
                {
                    debug!(port, "the chosen port was taken; trying another");
                }
                Err(err) => return Err(err),
            }
        };
        Ok(Self {
            container: Some(container),
            _watchdog: watchdog,
            server: format!("{server} (container)"),
            port,
            on_host: host_port.is_some(),
            probe,
            startup_timeout,
            kind,
        })
    }

    /// Waits until the probe passes. On the host's network a port taken meanwhile shows
    /// as the server's exit, not as the engine's refusal (and another server on that port
    /// could answer the probe): the container must still run once the probe passes, and
    /// its exit ends the wait at once, with its log.
    async fn wait_ready(&self) -> Result<(), ServerError> {
        let probing = wait_ready(
            &self.server,
            &self.probe,
            self.socket_addr(),
            self.startup_timeout,
        );
        if !self.on_host {
            return probing.await;
        }
        let exited = async {
            while !matches!(self.is_running().await, Ok(false)) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        tokio::select! {
            ready = probing => ready?,
            () = exited => return Err(self.exit_error().await),
        }
        if self.is_running().await? {
            Ok(())
        } else {
            Err(self.exit_error().await)
        }
    }

    /// The start-up failure of a container that exited, with the end of its log.
    async fn exit_error(&self) -> ServerError {
        let log = self.container().stdout_to_vec().await.unwrap_or_default();
        let log = String::from_utf8_lossy(&log);
        let lines: Vec<&str> = log.lines().collect();
        ServerError::Startup {
            server: self.server.clone(),
            detail: format!("it exited before serving on {}", self.socket_addr()),
            log_tail: lines[lines.len().saturating_sub(20)..].join("\n"),
        }
    }

    fn container(&self) -> &ContainerAsync<GenericImage> {
        #[allow(clippy::expect_used, reason = "taken only by Drop")]
        self.container
            .as_ref()
            .expect("the container until the handle is dropped")
    }

    /// The client port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The container's id.
    pub fn id(&self) -> &str {
        self.container().id()
    }

    /// Freezes the container (`docker pause`): the server stops answering, its connections
    /// stay open.
    ///
    /// The runtime's freeze can time out while a process of the container is in the middle
    /// of a system call (it happens on a loaded machine); the runtime then thaws the
    /// container and reports "unable to freeze", and the pause is tried again, a few times.
    pub async fn pause(&self) -> Result<(), ServerError> {
        let mut attempt = 1;
        loop {
            match self.container().pause().await {
                Ok(()) => return Ok(()),
                Err(err) if attempt < PAUSE_ATTEMPTS && err.to_string().contains(FREEZE_FAILED) => {
                    warn!(attempt, error = %err, "the container did not freeze; trying again");
                    tokio::time::sleep(PAUSE_RETRY_PAUSE * attempt).await;
                    attempt += 1;
                }
                Err(err) => return Err(container_error(err)),
            }
        }
    }

    /// Continues a paused container (`docker unpause`).
    pub async fn resume(&self) -> Result<(), ServerError> {
        self.container().unpause().await.map_err(container_error)
    }

    /// Whether the container runs (not killed; a paused container runs).
    pub async fn is_running(&self) -> Result<bool, ServerError> {
        self.container().is_running().await.map_err(container_error)
    }

    /// Stops the server without grace (`docker stop --time 0`: `SIGKILL` right after
    /// `SIGTERM`). The container is kept for [`restart`](Self::restart).
    pub async fn kill(&self) -> Result<(), ServerError> {
        self.container()
            .stop_with_timeout(Some(0))
            .await
            .map_err(container_error)
    }

    /// Kills the server (if running), starts the container again on the same port, and
    /// waits (bounded by the start-up timeout) until it serves. What the server keeps in
    /// memory only is lost.
    pub async fn restart(&self) -> Result<(), ServerError> {
        if self.is_running().await? {
            self.kill().await?;
        }
        self.container().start().await.map_err(container_error)?;
        self.wait_ready().await
    }
}

/// A server container as a [`Target`](super::Target) holds it: its address and the
/// engine's faults, whatever the server.
#[async_trait]
pub trait ServerContainer: Send + Sync + std::fmt::Debug {
    /// `127.0.0.1:port`, the published client port.
    fn socket_addr(&self) -> SocketAddr;
    /// The container's id.
    fn id(&self) -> &str;
    /// [`Container::pause`].
    async fn pause(&self) -> Result<(), ServerError>;
    /// [`Container::resume`].
    async fn resume(&self) -> Result<(), ServerError>;
    /// [`Container::is_running`].
    async fn is_running(&self) -> Result<bool, ServerError>;
    /// [`Container::kill`].
    async fn kill(&self) -> Result<(), ServerError>;
    /// [`Container::restart`].
    async fn restart(&self) -> Result<(), ServerError>;
}

#[async_trait]
impl<K: Send + Sync + std::fmt::Debug> ServerContainer for Container<K> {
    fn socket_addr(&self) -> SocketAddr {
        Container::socket_addr(self)
    }

    fn id(&self) -> &str {
        Container::id(self)
    }

    async fn pause(&self) -> Result<(), ServerError> {
        Container::pause(self).await
    }

    async fn resume(&self) -> Result<(), ServerError> {
        Container::resume(self).await
    }

    async fn is_running(&self) -> Result<bool, ServerError> {
        Container::is_running(self).await
    }

    async fn kill(&self) -> Result<(), ServerError> {
        Container::kill(self).await
    }

    async fn restart(&self) -> Result<(), ServerError> {
        Container::restart(self).await
    }
}

impl<K> Drop for Container<K> {
    fn drop(&mut self) {
        // testcontainers removes the container through the engine's API, which needs a
        // runtime; without one the watchdog (dropped next) removes it.
        if let Some(container) = self.container.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                drop(container);
            } else {
                std::mem::forget(container);
            }
        }
    }
}

/// Where ZooKeeper keeps its data in a container (it survives a restart of the container).
const ZK_DATA_DIR: &str = "/var/tmp/zookeeper";

/// The command line of a ZooKeeper container: `prelude`, then write the configuration (it
/// travels in the environment, `ZOO_CFG`) and run the server with `opts.jvm_args`.
fn zk_script(opts: &ZkOptions, prelude: &str) -> String {
    format!(
        "{prelude}mkdir -p {ZK_DATA_DIR} && printf '%s' \"$ZOO_CFG\" > /etc/zoo.cfg && \
         exec java {} -cp {CONTAINER_ZK_CLASSPATH} {MAIN_CLASS} /etc/zoo.cfg",
        opts.jvm_args.join(" ")
    )
}

fn zk_spec(server: String, opts: &ZkOptions) -> ServerSpec {
    ServerSpec {
        server,
        image: (ZK_IMAGE_ENV, DEFAULT_ZK_IMAGE),
        internal: 2181,
        probe: Probe::ZkServing,
        startup_timeout: opts.startup_timeout,
        host_port: None,
    }
}

fn zk_configure(
    cfg: String,
    script: String,
) -> impl Fn(GenericImage) -> ContainerRequest<GenericImage> {
    move |image: GenericImage| {
        image.with_env_var("ZOO_CFG", cfg.clone()).with_cmd([
            "sh".to_owned(),
            "-c".to_owned(),
            script.clone(),
        ])
    }
}

impl Container<ZooKeeper> {
    /// Starts the image from [`ZK_IMAGE_ENV`] (default [`DEFAULT_ZK_IMAGE`]) with the
    /// `zoo.cfg` a local process would get (`tick_time`, `config`, every four-letter word
    /// allowed; the client port open to the engine's network) and `jvm_args`, and waits
    /// (bounded by `opts.startup_timeout`) until it serves. The image's Java and
    /// `/usr/share/java` jars are used: `opts.java`, `opts.jar` and `opts.logging_jar` are
    /// for local processes.
    pub async fn start(opts: &ZkOptions) -> Result<Self, ServerError> {
        let cfg = zoo_cfg(opts, Path::new(ZK_DATA_DIR), 2181, "0.0.0.0", &[]);
        let script = zk_script(opts, "");
        Self::launch(
            zk_spec("ZooKeeper".to_owned(), opts),
            zk_configure(cfg, script),
            ZooKeeper,
        )
        .await
    }

    /// Creates ensemble member `index` (`myid` index + 1) of `servers` (`host:quorum:election`
    /// lines) without waiting for it: it starts ZooKeeper once every host of `servers`
    /// resolves, i.e. once every member is on the ensemble's network.
    pub(crate) async fn create_member(
        opts: &ZkOptions,
        servers: &[String],
        index: usize,
    ) -> Result<Self, ServerError> {
        let cfg = zoo_cfg(opts, Path::new(ZK_DATA_DIR), 2181, "0.0.0.0", servers);
        let hosts: Vec<&str> = servers
            .iter()
            .filter_map(|server| server.split(':').next())
            .collect();
        // Bounded: a member whose network never comes exits, and its start-up probe says so.
        let prelude = format!(
            "n=0; until getent hosts {hosts} >/dev/null 2>&1; do n=$((n+1)); \
             if [ $n -ge 600 ]; then echo 'the ensemble network never came' >&2; exit 1; fi; \
             sleep 0.1; done; mkdir -p {ZK_DATA_DIR} && echo {myid} > {ZK_DATA_DIR}/myid && ",
            hosts = hosts.join(" "),
            myid = index + 1,
        );
        Self::create(
            zk_spec(format!("ZooKeeper member {index}"), opts),
            zk_configure(cfg, zk_script(opts, &prelude)),
            ZooKeeper,
        )
        .await
    }

    /// `127.0.0.1:port`.
    pub fn connect_string(&self) -> String {
        self.socket_addr().to_string()
    }

    /// Sends a four-letter word (bounded by 5 s).
    pub async fn four_letter(&self, word: &str) -> Result<String, ServerError> {
        four_letter(&self.connect_string(), word, Duration::from_secs(5)).await
    }
}

impl Container<Redis> {
    /// Starts the image from [`REDIS_IMAGE_ENV`] (default [`DEFAULT_REDIS_IMAGE`]) with the
    /// password and ACL user of `opts`, and waits (bounded by `opts.startup_timeout`) until
    /// it answers `PING`. `opts.binary` is ignored.
    pub async fn start(opts: &RedisOptions) -> Result<Self, ServerError> {
        Self::start_with(opts, None).await
    }

    /// Starts the image from [`REDIS_IMAGE_ENV`] on the host's network, serving on
    /// `127.0.0.1:port`, with the password, ACL user and arguments of `opts`, and waits
    /// (bounded by `opts.startup_timeout`) until it answers `PING`: a data server of a
    /// [`RedisSentinelSet`](super::RedisSentinelSet) in containers, whose addresses the
    /// sentinels pass on to clients.
    /// A port taken meanwhile (the server exits) is replaced by another, a few times.
    pub async fn start_on_host(opts: &RedisOptions, port: u16) -> Result<Self, ServerError> {
        on_free_port(port, |port| Self::start_with(opts, Some(port))).await
    }

    /// Starts the image on its own network, its port 6379 published on a free loopback
    /// port; or with `host_port`, on the host's network serving on `127.0.0.1:host_port`.
    async fn start_with(opts: &RedisOptions, host_port: Option<u16>) -> Result<Self, ServerError> {
        let (port, bind) = match host_port {
            Some(port) => (port, "127.0.0.1"),
            None => (6379, "0.0.0.0"),
        };
        let port_arg = port.to_string();
        let mut cmd: Vec<String> = [
            "redis-server",
            "--port",
            &port_arg,
            "--bind",
            bind,
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .map(String::from)
        .to_vec();
        cmd.extend(opts.server_args());
        let kind = Redis {
            password: opts.password.clone(),
        };
        let spec = ServerSpec {
            server: "Redis".to_owned(),
            image: (REDIS_IMAGE_ENV, DEFAULT_REDIS_IMAGE),
            internal: port,
            probe: Probe::RedisPing {
                password: opts.password.clone(),
            },
            startup_timeout: opts.startup_timeout,
            host_port,
        };
        Self::launch(
            spec,
            |image: GenericImage| image.with_cmd(cmd.clone()),
            kind,
        )
        .await
    }

    /// `redis://[:password@]127.0.0.1:port`.
    pub fn url(&self) -> String {
        redis_url("127.0.0.1", self.port, None, self.kind.password.as_deref())
    }
}

/// The kind of a [`SentinelContainer`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Sentinel;

/// A Redis Sentinel in a container (removed when dropped).
pub type SentinelContainer = Container<Sentinel>;

impl Container<Sentinel> {
    /// Starts a Redis Sentinel from the image of [`REDIS_IMAGE_ENV`] on the host's network,
    /// serving on `127.0.0.1:port`, from the configuration `config` (written to a file in
    /// the container, which the sentinel rewrites as it learns; its `dir` should be
    /// `/tmp`), and waits (bounded by `startup_timeout`) until it answers `PING`.
    pub async fn start_on_host(
        config: impl Fn(u16) -> String,
        port: u16,
        startup_timeout: Duration,
    ) -> Result<Self, ServerError> {
        // A restarted container keeps the file its sentinel rewrote (what it learned).
        let script = "[ -s /tmp/sentinel.conf ] || printf '%s' \"$SENTINEL_CONF\" > \
                      /tmp/sentinel.conf; exec redis-server /tmp/sentinel.conf --sentinel";
        on_free_port(port, |port| {
            let config = config(port);
            let configure = move |image: GenericImage| {
                image
                    .with_env_var("SENTINEL_CONF", config.clone())
                    .with_cmd(["sh", "-c", script])
            };
            let spec = ServerSpec {
                server: "Redis Sentinel".to_owned(),
                image: (REDIS_IMAGE_ENV, DEFAULT_REDIS_IMAGE),
                internal: port,
                probe: Probe::RedisPing { password: None },
                startup_timeout,
                host_port: Some(port),
            };
            Self::launch(spec, configure, Sentinel)
        })
        .await
    }
}

/// Starts a container on the host's network with `start`, on `port` first; when the
/// server exits because its port was taken meanwhile, again on another free port, a few
/// times.
async fn on_free_port<K, F>(
    port: u16,
    start: impl Fn(u16) -> F,
) -> Result<Container<K>, ServerError>
where
    F: Future<Output = Result<Container<K>, ServerError>>,
{
    let mut port = port;
    let mut attempt = 1;
    loop {
        match start(port).await {
            Err(ServerError::Startup { log_tail, .. })
                if attempt < PORT_ATTEMPTS && log_tail.contains("already in use") =>
            {
                debug!(port, "the chosen port was taken; trying another");
                attempt += 1;
                port = free_port()?;
            }
            started => return started,
        }
    }
}

/// Where etcd keeps its data in a container (it survives a restart of the container).
const ETCD_DATA_DIR: &str = "/var/tmp/etcd";

/// What an etcd container is, for [`Container::create`].
fn etcd_spec(server: String, opts: &EtcdOptions) -> ServerSpec {
    ServerSpec {
        server,
        image: (ETCD_IMAGE_ENV, DEFAULT_ETCD_IMAGE),
        internal: 2379,
        probe: Probe::EtcdHealth,
        startup_timeout: opts.startup_timeout,
        host_port: None,
    }
}

/// The command line of the member `name` of `cluster` (name, peer URL), listening for
/// peers on `listen_peer` and known to them as `advertise_peer`; its clients reach it
/// through the published port.
fn etcd_command(
    opts: &EtcdOptions,
    name: &str,
    listen_peer: &str,
    advertise_peer: &str,
    cluster: &[(&str, String)],
) -> Vec<String> {
    let initial_cluster = cluster
        .iter()
        .map(|(name, peer)| format!("{name}={peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd: Vec<String> = vec![
        "etcd".into(),
        format!("--name={name}"),
        format!("--data-dir={ETCD_DATA_DIR}"),
        "--listen-client-urls=http://0.0.0.0:2379".into(),
        "--advertise-client-urls=http://127.0.0.1:2379".into(),
        format!("--listen-peer-urls={listen_peer}"),
        format!("--initial-advertise-peer-urls={advertise_peer}"),
        format!("--initial-cluster={initial_cluster}"),
        "--initial-cluster-state=new".into(),
        format!(
            "--heartbeat-interval={}",
            opts.heartbeat_interval.as_millis().max(1)
        ),
        format!(
            "--election-timeout={}",
            opts.election_timeout.as_millis().max(1)
        ),
    ];
    cmd.extend(opts.extra_args.iter().cloned());
    cmd
}

impl Container<Etcd> {
    /// Starts the image from [`ETCD_IMAGE_ENV`] (default [`DEFAULT_ETCD_IMAGE`]) as a
    /// single-member cluster with the heartbeat, election timeout and extra arguments of
    /// `opts`, and waits (bounded by `opts.startup_timeout`) until `GET /health` says it is
    /// healthy. `opts.binary` is ignored.
    pub async fn start(opts: &EtcdOptions) -> Result<Self, ServerError> {
        let cmd = etcd_command(
            opts,
            "n1",
            "http://127.0.0.1:2380",
            "http://127.0.0.1:2380",
            &[("n1", "http://127.0.0.1:2380".to_owned())],
        );
        let configure = |image: GenericImage| image.with_cmd(cmd.clone());
        Self::launch(etcd_spec("etcd".to_owned(), opts), configure, Etcd).await
    }

    /// Creates cluster member `index` of the cluster whose members are `hosts` on its
    /// network (member `i` named `n{i + 1}`), without waiting for it: it starts etcd once
    /// every host resolves, i.e. once every member is on the cluster's network.
    pub(crate) async fn create_member(
        opts: &EtcdOptions,
        hosts: &[String],
        index: usize,
    ) -> Result<Self, ServerError> {
        let peer_url = |host: &str| format!("http://{host}:2380");
        let names: Vec<String> = (1..=hosts.len()).map(|i| format!("n{i}")).collect();
        let cluster: Vec<(&str, String)> = names
            .iter()
            .zip(hosts)
            .map(|(name, host)| (name.as_str(), peer_url(host)))
            .collect();
        let (name, host) = match (names.get(index), hosts.get(index)) {
            (Some(name), Some(host)) => (name, host),
            _ => {
                return Err(ServerError::NoSuchMember {
                    index,
                    len: hosts.len(),
                });
            }
        };
        let cmd = etcd_command(opts, name, "http://0.0.0.0:2380", &peer_url(host), &cluster);
        // Bounded: a member whose network never comes exits, and its start-up probe says so.
        let script = format!(
            "n=0; until getent hosts {hosts} >/dev/null 2>&1; do n=$((n+1)); \
             if [ $n -ge 600 ]; then echo 'the cluster network never came' >&2; exit 1; fi; \
             sleep 0.1; done; exec {cmd}",
            hosts = hosts.join(" "),
            cmd = cmd.join(" "),
        );
        let configure = |image: GenericImage| {
            image.with_cmd(["sh".to_owned(), "-c".to_owned(), script.clone()])
        };
        Self::create(
            etcd_spec(format!("etcd member {index}"), opts),
            configure,
            Etcd,
        )
        .await
    }

    /// `http://127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.socket_addr())
    }
}

mod ensemble;

pub use ensemble::{ContainerCluster, EtcdContainerCluster, ZkContainerEnsemble};

#[cfg(test)]
mod tests {
    use super::image_from_env;

    #[test]
    fn image_spec_parsing() {
        let parse = |spec: &str| image_from_env("LOCK_CONFORMANCE_UNSET_IMAGE_VAR", spec);
        assert_eq!(parse("redis:7"), ("redis".into(), "7".into()));
        assert_eq!(parse("redis"), ("redis".into(), "latest".into()));
        assert_eq!(
            parse("reg.example:5000/zk/zookeeper:3.8"),
            ("reg.example:5000/zk/zookeeper".into(), "3.8".into())
        );
        assert_eq!(
            parse("reg.example:5000/redis"),
            ("reg.example:5000/redis".into(), "latest".into())
        );
    }
}
