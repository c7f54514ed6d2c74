//! etcd 3.4 from the Debian package: a single-member cluster, or a cluster of several.

mod cluster;

pub use cluster::EtcdCluster;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::probe::http_get;
use super::process::require_program;
use super::spec::{Command, Probe, ServerSpec, Site};
use super::{DEFAULT_STARTUP_TIMEOUT, Server, ServerError, Target};

/// The environment variable naming an external etcd (an endpoint such as
/// `http://127.0.0.1:2379`) to use instead of starting one.
pub const ETCD_ENV: &str = "LOCK_TEST_ETCD";

/// How to run etcd.
///
/// Build it from [`EtcdOptions::default`] and the `with_*` methods (or by assigning fields).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// The `etcd` executable: `etcd` (looked up in `PATH`) by default.
    pub binary: PathBuf,
    /// `--heartbeat-interval`: 10 ms by default.
    pub heartbeat_interval: Duration,
    /// `--election-timeout`: 100 ms by default.
    pub election_timeout: Duration,
    /// Extra command-line arguments, appended last.
    pub extra_args: Vec<String>,
    /// The bound on start-up and restart: [`DEFAULT_STARTUP_TIMEOUT`] by default.
    pub startup_timeout: Duration,
    /// A certificate and its key (PEM files): the server also serves clients over TLS, on a
    /// port of its own ([`EtcdServer::tls_endpoint`]). Processes only.
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("etcd"),
            heartbeat_interval: Duration::from_millis(10),
            election_timeout: Duration::from_millis(100),
            extra_args: Vec::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            tls: None,
        }
    }
}

impl EtcdOptions {
    /// Sets [`binary`](Self::binary).
    pub fn with_binary(mut self, binary: impl Into<PathBuf>) -> Self {
        self.binary = binary.into();
        self
    }

    /// Adds a command-line argument (see [`extra_args`](Self::extra_args)).
    pub fn with_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Sets [`tls`](Self::tls): the server's certificate and key.
    pub fn with_tls(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls = Some((cert.into(), key.into()));
        self
    }
}

impl ServerSpec for EtcdOptions {
    const NAME: &'static str = "etcd";
    const ENV: &'static str = ETCD_ENV;
    const IMAGE_ENV: &'static str = "LOCK_TEST_ETCD_IMAGE";
    /// Client, peer (and, with [`tls`](EtcdOptions::tls), TLS clients).
    const CONTAINER_PORTS: &'static [u16] = &[2379, 2380];

    fn port_count(&self) -> usize {
        2 + usize::from(self.tls.is_some())
    }

    fn startup_timeout(&self) -> Duration {
        self.startup_timeout
    }

    /// `GET /health` says `"health":"true"`.
    fn probe(&self) -> Probe {
        Probe::new(Duration::from_millis(50), |addr, timeout| async move {
            let answer = http_get(addr, "/health", timeout).await?;
            match answer.contains("\"health\":\"true\"") {
                true => Ok(()),
                false => Err(std::io::Error::other(format!(
                    "GET /health answered {:?}",
                    answer.trim()
                ))
                .into()),
            }
        })
    }

    /// Member `n{index + 1}` of a cluster whose peers are `site.members`, its data in
    /// `dir/data`, not waiting for the disk.
    fn command(&self, site: &Site<'_>) -> Result<Command, ServerError> {
        let program = match site.in_container {
            true => PathBuf::from("etcd"),
            false => require_program("etcd", &self.binary, "etcd-server")?,
        };
        if site.in_container && self.tls.is_some() {
            return Err(ServerError::Unsupported {
                operation: "TLS".to_owned(),
                reason: "an etcd container serves plain connections only".to_owned(),
            });
        }
        let peer_url = |host: &str, ports: &[u16]| {
            format!("http://{host}:{}", ports.get(1).copied().unwrap_or(0))
        };
        let cluster: Vec<String> = site
            .members
            .iter()
            .enumerate()
            .map(|(i, peer)| format!("n{}={}", i + 1, peer_url(&peer.host, &peer.ports)))
            .collect();
        let mut listen_client = format!("http://{}:{}", site.bind, site.port(0));
        let mut advertise_client = format!("http://127.0.0.1:{}", site.port(0));
        if let Some(port) = site.ports().get(2) {
            for urls in [&mut listen_client, &mut advertise_client] {
                urls.push_str(&format!(",https://127.0.0.1:{port}"));
            }
        }
        let me = &site.members[site.index];
        let mut argv = vec![
            program.display().to_string(),
            format!("--name=n{}", site.index + 1),
            format!("--data-dir={}/data", site.dir),
            format!("--listen-client-urls={listen_client}"),
            format!("--advertise-client-urls={advertise_client}"),
            format!("--listen-peer-urls={}", peer_url(site.bind, site.ports())),
            format!(
                "--initial-advertise-peer-urls={}",
                peer_url(&me.host, &me.ports)
            ),
            format!("--initial-cluster={}", cluster.join(",")),
            "--initial-cluster-state=new".to_owned(),
            // As ZooKeeper's `forceSync=no`: a test member's data need not survive the
            // machine, only the member (a killed member keeps what reached the OS).
            "--unsafe-no-fsync".to_owned(),
            format!(
                "--heartbeat-interval={}",
                self.heartbeat_interval.as_millis().max(1)
            ),
            format!(
                "--election-timeout={}",
                self.election_timeout.as_millis().max(1)
            ),
        ];
        if let Some((cert, key)) = &self.tls {
            argv.push(format!("--cert-file={}", cert.display()));
            argv.push(format!("--key-file={}", key.display()));
        }
        argv.extend(self.extra_args.iter().cloned());
        Ok(Command::new(argv))
    }

    /// `http://127.0.0.1:port`.
    fn client_address(&self, addr: SocketAddr) -> String {
        format!("http://{addr}")
    }
}

/// A single-member etcd cluster running as a child process on 127.0.0.1 (see [`Server`]);
/// a [`restart`](Server::restart) keeps the ports and the data.
pub type EtcdServer = Server<EtcdOptions>;

impl Server<EtcdOptions> {
    /// The client endpoint, `http://127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        self.client_address()
    }

    /// The peer port.
    pub fn peer_port(&self) -> u16 {
        self.ports().get(1).copied().unwrap_or_default()
    }

    /// With [`EtcdOptions::tls`], the TLS client endpoint, `https://127.0.0.1:port`.
    pub fn tls_endpoint(&self) -> Option<String> {
        let port = self.ports().get(2)?;
        Some(format!("https://127.0.0.1:{port}"))
    }
}

/// The value of the metric `name` (a line `name value`, no labels) that the etcd member
/// at `endpoint` (`http://host:port` or `host:port`) reports, within 1 s; `None` when it
/// does not report it. For instance `etcd_debugging_mvcc_watch_stream_total`, the watch
/// streams it serves.
pub async fn etcd_metric(endpoint: &str, name: &str) -> Result<Option<f64>, ServerError> {
    let address = endpoint.trim_start_matches("http://");
    let addr: SocketAddr = address.parse().map_err(|_| ServerError::Unsupported {
        operation: format!("reading the metrics of {endpoint}"),
        reason: "the endpoint is not a socket address".to_owned(),
    })?;
    let metrics = http_get(addr, "/metrics", Duration::from_secs(1)).await?;
    Ok(metrics.lines().find_map(|line| {
        let (metric, value) = line.trim().split_once(' ')?;
        (metric == name)
            .then(|| value.trim().parse().ok())
            .flatten()
    }))
}

/// Either an external etcd (from [`ETCD_ENV`], an endpoint) or one started here.
pub type EtcdTarget = Target<EtcdOptions>;
