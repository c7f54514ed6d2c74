//! One server in a container: created from its spec, probed until it serves, and faulted
//! through the engine.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::time::Instant;

use testcontainers::bollard::models::{HostConfig, PortBinding};
use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ContainerRequest, GenericImage, ImageExt};
use tracing::{info, warn};

use async_trait::async_trait;

use super::{ContainerEngine, DEFAULT_IMAGE, LABEL, container_error, label_value};
use crate::servers::ServerError;
use crate::servers::member::Member;
use crate::servers::process::{Watchdog, free_port, free_ports, retry_port_clash};
use crate::servers::spec::{Command, Peer, ServerSpec, Site, slug};

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

/// A server of the kind `S` in a container, removed when dropped: a
/// [`ZkContainer`](super::ZkContainer), a [`RedisContainer`](super::RedisContainer), an
/// [`EtcdContainer`](super::EtcdContainer), a [`PostgresContainer`](super::PostgresContainer).
///
/// Its client port is published on `127.0.0.1` only (or, on the host's network, bound
/// there by the server itself), at a port that stays the same across
/// [`restart`](Container::restart). Containers are labelled [`LABEL`], and removed also when
/// the test process ends without dropping them (a process-wide static, an abort): a small
/// watchdog process runs `docker rm --force` then.
#[derive(Debug)]
pub struct Container<S> {
    /// `None` only while being dropped.
    container: Option<ContainerAsync<GenericImage>>,
    /// Removes what the engine still has of this container when the handle is dropped (after
    /// testcontainers' own removal, if that could run) or the test process dies.
    _watchdog: Watchdog,
    server: String,
    port: u16,
    /// On the host's network (see [`start_on_host`](Container::start_on_host)).
    on_host: bool,
    spec: S,
}

/// How many lines of a container's output [`Container::condition`] gives.
const CONDITION_LINES: usize = 20;

/// Quotes `text` for `sh`.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// The `sh -c` script of the member at `site` and the environment it reads: it waits until
/// every other member's host resolves (a member of a set), writes the spec's files where
/// they do not exist yet, and executes the command. The files travel in the environment.
fn script<S: ServerSpec>(
    spec: &S,
    site: &Site<'_>,
) -> Result<(String, Vec<(String, String)>), ServerError> {
    let Command { argv, files } = spec.command(site)?;
    let mut script = String::from("set -e; ");
    if site.in_set() {
        let hosts: Vec<&str> = site.members.iter().map(|peer| peer.host.as_str()).collect();
        // Bounded: a member whose network never comes exits, and its start-up probe says so.
        script.push_str(&format!(
            "n=0; until getent hosts {} >/dev/null 2>&1; do n=$((n+1)); \
             if [ $n -ge 600 ]; then echo 'the network never came' >&2; exit 1; fi; \
             sleep 0.1; done; ",
            hosts.join(" ")
        ));
    }
    script.push_str(&format!(
        "mkdir -p {dir}; cd {dir}; ",
        dir = quoted(site.dir)
    ));
    let mut env = Vec::with_capacity(files.len());
    for (index, (path, text)) in files.into_iter().enumerate() {
        let variable = format!("LOCK_TESTBED_FILE_{index}");
        script.push_str(&format!(
            "[ -e {path} ] || {{ mkdir -p \"$(dirname {path})\"; printf '%s' \"${variable}\" > {path}; }}; ",
            path = quoted(&path)
        ));
        env.push((variable, text));
    }
    let argv: Vec<String> = argv.iter().map(|arg| quoted(arg)).collect();
    script.push_str(&format!("exec {}", argv.join(" ")));
    Ok((script, env))
}

/// Where a container's server listens.
#[derive(Clone, Copy)]
enum Placement {
    /// On a network of the engine, its client port published on a free loopback port.
    Published,
    /// On the host's network, serving on loopback ports chosen here: for servers that tell
    /// each other's addresses to clients (Redis Sentinel), which must be the same inside
    /// and outside the containers.
    Host,
}

impl<S: ServerSpec> Container<S> {
    /// Starts a server of the kind `spec` in a container of the image
    /// [`S::IMAGE_ENV`](ServerSpec::IMAGE_ENV) names (default [`DEFAULT_IMAGE`]), its client
    /// port published on a free loopback port, and waits (bounded by the spec's start-up
    /// timeout) until it serves. The image's programs run: the options' paths of programs
    /// are for local processes.
    pub async fn start(spec: &S) -> Result<Self, ServerError> {
        let peers = [Peer::new("127.0.0.1", S::CONTAINER_PORTS.to_vec())];
        Self::launch(spec, &peers, Placement::Published).await
    }

    /// Starts a server of the kind `spec` on the host's network, serving on
    /// `127.0.0.1:port` (and free ports for the others it needs), and waits until it
    /// serves. A port taken meanwhile (the server exits) is replaced by another, a few
    /// times.
    pub async fn start_on_host(spec: &S, port: u16) -> Result<Self, ServerError> {
        retry_port_clash(S::NAME, |attempt| async move {
            let no_clash = |err: ServerError| (err, false);
            let port = match attempt {
                1 => port,
                _ => free_port().map_err(no_clash)?,
            };
            let mut ports = vec![port];
            ports.extend(free_ports(spec.port_count().saturating_sub(1)).map_err(no_clash)?);
            let peers = [Peer::new("127.0.0.1", ports)];
            Self::launch(spec, &peers, Placement::Host)
                .await
                .map_err(|err| {
                    let clash = matches!(&err, ServerError::Startup { log_tail, .. } if log_tail.contains("already in use"));
                    (err, clash)
                })
        })
        .await
    }

    /// Creates member `index` of `peers` (their names on the set's network, the container
    /// ports) without waiting for it: it starts once every host of `peers` resolves, i.e.
    /// once every member has joined the network.
    pub(crate) async fn create_member(
        spec: &S,
        peers: &[Peer],
        index: usize,
    ) -> Result<Self, ServerError> {
        Self::create(spec, peers, index, Placement::Published).await
    }

    /// [`create`](Self::create)s the container, then waits (bounded by the spec's start-up
    /// timeout) until its probe passes.
    async fn launch(spec: &S, peers: &[Peer], placement: Placement) -> Result<Self, ServerError> {
        let began = Instant::now();
        let started = Self::create(spec, peers, 0, placement).await?;
        started.wait_ready().await?;
        info!(server = %started.server, port = started.port, took = ?began.elapsed(), "container serves");
        Ok(started)
    }

    /// Checks the engine, and starts the image with the member's script. Does not wait
    /// for the server.
    async fn create(
        spec: &S,
        peers: &[Peer],
        index: usize,
        placement: Placement,
    ) -> Result<Self, ServerError> {
        let dir = format!("/var/tmp/{}", slug::<S>());
        let bind = match placement {
            Placement::Published => "0.0.0.0",
            Placement::Host => "127.0.0.1",
        };
        let site = Site {
            index,
            bind,
            dir: &dir,
            members: peers,
            in_container: true,
        };
        let (script, env) = script(spec, &site)?;
        let internal = site.port(0);
        let server = match site.in_set() {
            true => format!("{} member {index}", S::NAME),
            false => S::NAME.to_owned(),
        };
        let engine = ContainerEngine::from_env()?;
        engine.check().await?;
        let (name, tag) = engine.require_image((S::IMAGE_ENV, DEFAULT_IMAGE)).await?;
        info!(%name, %tag, "starting a {server} container");
        let handle = format!("{}-{:016x}", std::process::id(), fastrand::u64(..));
        // Before the first attempt: a container created but not started is removed too.
        let watchdog = Watchdog::spawn(WATCHDOG_SCRIPT, "container", &handle);
        let configure = |image: GenericImage| {
            let mut request = image.with_cmd(["sh".to_owned(), "-c".to_owned(), script.clone()]);
            for (variable, value) in &env {
                request = request.with_env_var(variable.clone(), value.clone());
            }
            request
        };
        let (name, tag, handle, configure) = (&name, &tag, &handle, &configure);
        // Another process may take the port between its choice and the engine's bind.
        let (container, port) = retry_port_clash(&server, |_| async move {
            let image =
                GenericImage::new(name.clone(), tag.clone()).with_wait_for(WaitFor::Nothing);
            let (request, port) = match placement {
                Placement::Host => (configure(image).with_network("host"), internal),
                Placement::Published => {
                    let port = free_port().map_err(|err| (err, false))?;
                    let request = configure(image.with_exposed_port(internal.tcp()))
                        .with_host_config_modifier(publish_on_loopback(internal, port));
                    (request, port)
                }
            };
            let request = request
                .with_label(LABEL, label_value())
                .with_label(HANDLE_LABEL, handle.clone());
            match run(request).await {
                Ok(container) => Ok((container, port)),
                Err(err) => {
                    let clash = matches!(&err, ServerError::Container { detail }
                        if detail.contains("address already in use")
                            || detail.contains("port is already allocated"));
                    Err((err, clash))
                }
            }
        })
        .await?;
        Ok(Self {
            container: Some(container),
            _watchdog: watchdog,
            server: format!("{server} (container)"),
            port,
            on_host: matches!(placement, Placement::Host),
            spec: spec.clone(),
        })
    }

    /// The options it was started with.
    pub fn spec(&self) -> &S {
        &self.spec
    }

    /// What its clients are given (see [`ServerSpec::client_address`]).
    pub fn client_address(&self) -> String {
        self.spec.client_address(self.socket_addr())
    }

    /// Waits until the probe passes, bounded by the spec's start-up timeout. On the host's
    /// network a port taken meanwhile shows as the server's exit, not as the engine's
    /// refusal (and another server on that port could answer the probe): the container
    /// must still run once the probe passes, and its exit ends the wait at once, with its
    /// log.
    pub(crate) async fn wait_ready(&self) -> Result<(), ServerError> {
        let (addr, bound) = (self.socket_addr(), self.spec.startup_timeout());
        let probe = self.spec.probe();
        let probing = probe.wait(addr, Instant::now() + bound);
        let exited = async {
            if !self.on_host {
                return std::future::pending().await;
            }
            while !matches!(self.is_running().await, Ok(false)) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        let detail = tokio::select! {
            ready = probing => match ready {
                Ok(()) if !self.on_host || self.is_running().await? => return Ok(()),
                Ok(()) => format!("it exited before serving on {addr}"),
                Err(why) => format!("not ready on {addr} after {bound:?}; last probe: {why}"),
            },
            () = exited => format!("it exited before serving on {addr}"),
        };
        Err(ServerError::Startup {
            server: self.server.clone(),
            detail,
            log_tail: self.output_tail().await,
        })
    }

    /// The last lines of the container's output (stdout, then stderr).
    async fn output_tail(&self) -> String {
        let container = self.container();
        let mut output = container.stdout_to_vec().await.unwrap_or_default();
        output.extend(container.stderr_to_vec().await.unwrap_or_default());
        let output = String::from_utf8_lossy(&output);
        let lines: Vec<&str> = output.lines().collect();
        lines[lines.len().saturating_sub(CONDITION_LINES)..].join("\n")
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
}

/// A container's faults go through the engine.
#[async_trait]
impl<S: ServerSpec> Member for Container<S> {
    fn socket_addr(&self) -> SocketAddr {
        Container::socket_addr(self)
    }

    fn container_id(&self) -> Option<&str> {
        Some(self.id())
    }

    /// Freezes the container (`docker pause`): the server stops answering, its connections
    /// stay open.
    ///
    /// The runtime's freeze can time out while a process of the container is in the middle
    /// of a system call (it happens on a loaded machine); the runtime then thaws the
    /// container and reports "unable to freeze", and the pause is tried again, a few times.
    async fn pause(&self) -> Result<(), ServerError> {
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
    async fn resume(&self) -> Result<(), ServerError> {
        self.container().unpause().await.map_err(container_error)
    }

    /// Whether the container runs (not killed; a paused container runs).
    async fn is_running(&self) -> Result<bool, ServerError> {
        self.container().is_running().await.map_err(container_error)
    }

    /// What a failure message should say of the container: whether it runs (or its exit
    /// code) and the last lines of its output.
    async fn condition(&self) -> String {
        let container = self.container();
        let state = match (container.is_running().await, container.exit_code().await) {
            (Ok(true), _) => "runs".to_owned(),
            (Ok(false), Ok(Some(code))) => format!("has exited with code {code}"),
            (Ok(false), _) => "does not run".to_owned(),
            (Err(err), _) => format!("is in a state the engine did not give ({err})"),
        };
        let tail = self.output_tail().await;
        format!(
            "the {} container {} {state}; the last lines of its output:\n{tail}",
            self.server,
            self.id()
        )
    }

    /// Stops the server without grace (`docker stop --time 0`: `SIGKILL` right after
    /// `SIGTERM`). The container is kept for [`restart`](Self::restart).
    async fn kill(&mut self) -> Result<(), ServerError> {
        self.container()
            .stop_with_timeout(Some(0))
            .await
            .map_err(container_error)
    }

    /// Kills the server (if running), starts the container again on the same port, and
    /// waits (bounded by the start-up timeout) until it serves. What the server keeps in
    /// memory only is lost.
    async fn restart(&mut self) -> Result<(), ServerError> {
        if self.is_running().await? {
            self.kill().await?;
        }
        self.container().start().await.map_err(container_error)?;
        self.wait_ready().await
    }
}

impl<S> Drop for Container<S> {
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
