//! One server in a container: created from its spec, probed until it serves, and faulted
//! through the engine.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use testcontainers::bollard::models::{HostConfig, PortBinding};
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ContainerRequest, GenericImage, ImageExt};
use tracing::{debug, info, warn};

use super::{ContainerEngine, LABEL, container_error, label_value};
use crate::servers::ServerError;
use crate::servers::probe::Probe;
use crate::servers::process::{Watchdog, free_port};

/// The bound on creating and starting the container.
const CREATE_TIMEOUT: Duration = Duration::from_secs(300);

/// How the runtime reports a freeze that timed out (and was undone).
const FREEZE_FAILED: &str = "unable to freeze";
/// How often [`Container::pause`] tries a freeze that timed out.
const PAUSE_ATTEMPTS: u32 = 5;
/// The pause before the second attempt; it grows by as much per attempt.
const PAUSE_RETRY_PAUSE: Duration = Duration::from_millis(100);

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
pub(crate) async fn wait_ready(
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

/// A server in a container, removed when dropped: a [`ZkContainer`](super::ZkContainer),
/// a [`RedisContainer`](super::RedisContainer), an [`EtcdContainer`](super::EtcdContainer).
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
    pub(crate) kind: K,
}

/// How many lines of a container's output [`Container::condition`] gives.
const CONDITION_LINES: usize = 20;

/// How many times a container is created again when the port chosen for it was taken in
/// the meantime.
const PORT_ATTEMPTS: usize = 5;

/// What a server container is: the server's name (for messages), its image, its client
/// port inside the container, and how to tell that it serves.
pub(crate) struct ServerSpec {
    pub(crate) server: String,
    /// `(variable, default)`, see [`image_from_env`].
    pub(crate) image: (&'static str, &'static str),
    pub(crate) internal: u16,
    pub(crate) probe: Probe,
    pub(crate) startup_timeout: Duration,
    /// On the host's network, serving on this loopback port (which the configured command
    /// binds), rather than on its own network with `internal` published: for servers that
    /// tell each other's addresses to clients (Redis Sentinel), which must be the same
    /// inside and outside the containers.
    pub(crate) host_port: Option<u16>,
}

impl<K> Container<K> {
    /// [`create`](Self::create)s the container, then waits (bounded by the spec's start-up
    /// timeout) until its probe passes.
    pub(crate) async fn launch(
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
    pub(crate) async fn create(
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
    pub(crate) async fn wait_ready(&self) -> Result<(), ServerError> {
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

    /// What a failure message should say of the container: whether it runs (or its exit
    /// code) and the last lines of its output.
    pub async fn condition(&self) -> String {
        let container = self.container();
        let state = match (container.is_running().await, container.exit_code().await) {
            (Ok(true), _) => "runs".to_owned(),
            (Ok(false), Ok(Some(code))) => format!("has exited with code {code}"),
            (Ok(false), _) => "does not run".to_owned(),
            (Err(err), _) => format!("is in a state the engine did not give ({err})"),
        };
        let mut output = container.stdout_to_vec().await.unwrap_or_default();
        output.extend(container.stderr_to_vec().await.unwrap_or_default());
        let output = String::from_utf8_lossy(&output);
        let lines: Vec<&str> = output.lines().collect();
        let tail = lines[lines.len().saturating_sub(CONDITION_LINES)..].join("\n");
        format!(
            "the {} container {} {state}; the last lines of its output:\n{tail}",
            self.server,
            self.id()
        )
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

/// Starts a container on the host's network with `start`, on `port` first; when the
/// server exits because its port was taken meanwhile, again on another free port, a few
/// times.
pub(crate) async fn on_free_port<K, F>(
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
