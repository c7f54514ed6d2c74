//! ZooKeeper 3.8 from the Debian package, standalone or as an ensemble on one host.

#[cfg(feature = "testcontainers")]
mod container;
mod ensemble;

pub use ensemble::ZkEnsemble;

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::info;

use super::probe::{Probe, four_letter};
use super::process::{Instance, Launch, free_port, loopback, require_program};
use super::{
    DEFAULT_STARTUP_TIMEOUT, LocalServer, ServerError, ServerProcess, Target, TargetServer,
};

/// The environment variable naming an external ZooKeeper (a connect string such as
/// `127.0.0.1:2181` or `h1:2181,h2:2181`) to use instead of starting one.
pub const ZK_ENV: &str = "LOCK_TEST_ZK";

const SERVER: &str = "ZooKeeper";
pub(crate) const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
const DEFAULT_JAR: &str = "/usr/share/java/zookeeper.jar";
const DEFAULT_LOGGING_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty's codecs, which the TLS handler needs and Debian's `zookeeper.jar` manifest leaves
/// out of its class path.
const NETTY_CODEC_JAR: &str = "/usr/share/java/netty-codec.jar";
/// The bound on one four-letter-word exchange made on the caller's behalf.
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(5);

/// How to run ZooKeeper.
///
/// Build it from [`ZkOptions::default`] and the `with_*` methods (or by assigning fields).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ZkOptions {
    /// `tickTime`: 2000 ms by default. Session timeouts are clamped to 2×–20× this, so
    /// crash and expiry tests want 250–500 ms.
    pub tick_time: Duration,
    /// The `java` executable: `java` (looked up in `PATH`) by default.
    pub java: PathBuf,
    /// ZooKeeper's jar: `/usr/share/java/zookeeper.jar` by default (its manifest lists the
    /// dependency jars).
    pub jar: PathBuf,
    /// An SLF4J binding put on the class path when it exists, so that the server logs (to
    /// its log file): `/usr/share/java/slf4j-simple.jar` by default.
    pub logging_jar: Option<PathBuf>,
    /// JVM options: `-Xmx256m -XX:+UseSerialGC -Dzookeeper.jmx.log4j.disable=true
    /// -Djava.net.preferIPv4Stack=true -Dzookeeper.electionPortBindRetry=30` by default.
    /// The last lets an ensemble member restarted on its ports wait up to 30 s (a try a
    /// second, not 3) for an election port that an outgoing connection's kernel-chosen
    /// source port holds meanwhile: with tests side by side, one member exited on that.
    pub jvm_args: Vec<String>,
    /// Extra `zoo.cfg` lines (`key=value`), written after the defaults (so they win).
    pub config: Vec<(String, String)>,
    /// The bound on start-up and restart: [`DEFAULT_STARTUP_TIMEOUT`] by default.
    pub startup_timeout: Duration,
    /// TLS on a secure client port beside the plain one (a standalone server only): none
    /// by default.
    pub tls: Option<ZkTls>,
}

/// A standalone server's TLS: a `secureClientPort` served by Netty with the certificates
/// that [`certs`](crate::certs) made in a directory.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ZkTls {
    /// The directory holding `ca.crt` (the authority the server trusts for client
    /// certificates), `server.crt` and `server.key`.
    pub certs: PathBuf,
    /// Whether clients must present a certificate that authority signed
    /// (`ssl.clientAuth=need`); otherwise none is asked for.
    pub client_auth: bool,
}

impl Default for ZkOptions {
    fn default() -> Self {
        Self {
            tick_time: Duration::from_millis(2000),
            java: PathBuf::from("java"),
            jar: PathBuf::from(DEFAULT_JAR),
            logging_jar: Some(PathBuf::from(DEFAULT_LOGGING_JAR)),
            jvm_args: [
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-Djava.net.preferIPv4Stack=true",
                "-Dzookeeper.electionPortBindRetry=30",
            ]
            .map(String::from)
            .to_vec(),
            config: Vec::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            tls: None,
        }
    }
}

impl ZkOptions {
    /// Sets [`tick_time`](Self::tick_time).
    pub fn with_tick_time(mut self, tick_time: Duration) -> Self {
        self.tick_time = tick_time;
        self
    }

    /// Sets [`java`](Self::java).
    pub fn with_java(mut self, java: impl Into<PathBuf>) -> Self {
        self.java = java.into();
        self
    }

    /// Sets [`jar`](Self::jar).
    pub fn with_jar(mut self, jar: impl Into<PathBuf>) -> Self {
        self.jar = jar.into();
        self
    }

    /// Sets [`startup_timeout`](Self::startup_timeout).
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Serves TLS too, with the certificates in `certs` (see [`ZkTls`]); clients must
    /// present a certificate when `client_auth`.
    pub fn with_tls(mut self, certs: impl Into<PathBuf>, client_auth: bool) -> Self {
        self.tls = Some(ZkTls {
            certs: certs.into(),
            client_auth,
        });
        self
    }

    /// Adds a `zoo.cfg` line `key=value` (see [`config`](Self::config)).
    pub fn with_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    /// Checks the installation; returns the `java` path and the class path.
    fn resolve(&self) -> Result<(PathBuf, OsString), ServerError> {
        if !self.jar.is_file() {
            return Err(ServerError::NotInstalled {
                package: "zookeeper".to_owned(),
                detail: format!("ZooKeeper not found: {} is missing", self.jar.display()),
            });
        }
        let java = require_program(
            "Java (needed by ZooKeeper)",
            &self.java,
            "default-jre-headless",
        )?;
        let mut classpath = OsString::from(&self.jar);
        if let Some(logging) = self.logging_jar.as_ref().filter(|p| p.is_file()) {
            classpath.push(":");
            classpath.push(logging);
        }
        if self.tls.is_some() {
            classpath.push(":");
            classpath.push(NETTY_CODEC_JAR);
        }
        Ok((java, classpath))
    }

    fn tick_ms(&self) -> u128 {
        self.tick_time.as_millis().max(1)
    }
}

/// Ports of one ensemble member: (client, quorum, election).
#[derive(Debug, Clone, Copy)]
struct MemberPorts {
    client: u16,
    quorum: u16,
    election: u16,
}

/// The text of a `zoo.cfg`: the defaults, `server.N=` lines for an ensemble's `servers`
/// (`host:quorum:election`, N counting from 1), then `opts.config`.
pub(crate) fn zoo_cfg(
    opts: &ZkOptions,
    data_dir: &Path,
    client_port: u16,
    client_address: &str,
    servers: &[String],
) -> String {
    let mut cfg = String::new();
    let _ = writeln!(cfg, "tickTime={}", opts.tick_ms());
    let _ = writeln!(cfg, "initLimit=10");
    let _ = writeln!(cfg, "syncLimit=5");
    let _ = writeln!(cfg, "dataDir={}", data_dir.display());
    let _ = writeln!(cfg, "clientPort={client_port}");
    let _ = writeln!(cfg, "clientPortAddress={client_address}");
    let _ = writeln!(cfg, "maxClientCnxns=0");
    let _ = writeln!(cfg, "admin.enableServer=false");
    let _ = writeln!(cfg, "4lw.commands.whitelist=*");
    // A test server's data lives as long as its test: waiting for the disk on every write
    // measures the disk, and under load made sessions miss their timeouts. A killed server
    // still keeps what reached the OS.
    let _ = writeln!(cfg, "forceSync=no");
    for (i, server) in servers.iter().enumerate() {
        let _ = writeln!(cfg, "server.{}={server}", i + 1);
    }
    for (key, value) in &opts.config {
        let _ = writeln!(cfg, "{key}={value}");
    }
    cfg
}

/// Writes `dir/zoo.cfg` (and `dir/data/myid` for an ensemble member, `dir/server.pem` for
/// TLS on `secure_port`); returns the launch description.
#[allow(
    clippy::too_many_arguments,
    reason = "one call per runner, each naming its own"
)]
fn prepare_node(
    opts: &ZkOptions,
    java: &Path,
    classpath: &OsString,
    dir: &Path,
    myid: Option<usize>,
    client_port: u16,
    secure_port: Option<u16>,
    members: &[MemberPorts],
) -> Result<Launch, ServerError> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    if let Some(id) = myid {
        std::fs::write(data.join("myid"), format!("{id}\n"))?;
    }
    let servers: Vec<String> = members
        .iter()
        .map(|m| format!("127.0.0.1:{}:{}", m.quorum, m.election))
        .collect();
    let mut cfg = zoo_cfg(opts, &data, client_port, "127.0.0.1", &servers);
    if let (Some(tls), Some(port)) = (&opts.tls, secure_port) {
        cfg.push_str(&tls_cfg(tls, dir, port)?);
    }
    let cfg_path = dir.join("zoo.cfg");
    std::fs::write(&cfg_path, cfg)?;
    let mut args: Vec<OsString> = opts.jvm_args.iter().map(OsString::from).collect();
    args.push("-cp".into());
    args.push(classpath.clone());
    args.push(MAIN_CLASS.into());
    args.push(cfg_path.into());
    Ok(Launch {
        program: java.to_path_buf(),
        args,
        cwd: dir.to_path_buf(),
    })
}

/// The `zoo.cfg` lines of a secure client port on `port`; writes the PEM key store that
/// ZooKeeper reads (the key, then the certificate, in one file) to `dir/server.pem`, and
/// copies the authority to `dir/ca.crt` (the trust store), so that the server needs nothing
/// outside its directory.
fn tls_cfg(tls: &ZkTls, dir: &Path, port: u16) -> Result<String, ServerError> {
    let key_store = dir.join("server.pem");
    let mut pem = std::fs::read(tls.certs.join("server.key"))?;
    pem.extend(std::fs::read(tls.certs.join("server.crt"))?);
    std::fs::write(&key_store, pem)?;
    let trust_store = dir.join("ca.crt");
    std::fs::copy(tls.certs.join("ca.crt"), &trust_store)?;
    let client_auth = if tls.client_auth { "need" } else { "none" };
    Ok(format!(
        "secureClientPort={port}\n\
         secureClientPortAddress=127.0.0.1\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={}\n\
         ssl.keyStore.type=PEM\n\
         ssl.trustStore.location={}\n\
         ssl.trustStore.type=PEM\n\
         ssl.clientAuth={client_auth}\n",
        key_store.display(),
        trust_store.display()
    ))
}

fn new_instance(name: String, launch: Launch, dir: &Path, port: u16, opts: &ZkOptions) -> Instance {
    Instance::new(
        name,
        launch,
        dir.join("server.log"),
        loopback(port),
        Probe::ZkServing,
        opts.startup_timeout,
    )
}

/// A standalone ZooKeeper server running as a child process on 127.0.0.1.
///
/// Its address, pid, directory (configuration, data, log) and fault injection come from
/// [`LocalServer`]; a [`restart`](LocalServer::restart) keeps the port and the data
/// directory, so sessions and znodes survive it.
///
/// Dropping it kills the server (`SIGKILL` to its process group), reaps it and removes its
/// data directory.
#[derive(Debug)]
pub struct ZkServer {
    process: ServerProcess,
    opts: ZkOptions,
    secure_port: Option<u16>,
}

impl ZkServer {
    /// Starts a standalone server on a free port and waits (bounded by
    /// [`ZkOptions::startup_timeout`]) until it serves requests (`srvr` reports a `Mode:`).
    ///
    /// Fails promptly with [`ServerError::NotInstalled`] when the jar or `java` is missing.
    pub async fn start(opts: ZkOptions) -> Result<Self, ServerError> {
        let (java, classpath) = opts.resolve()?;
        let (process, secure_port, took) = ServerProcess::start(SERVER, "lock-zk-", |dir| {
            let port = free_port()?;
            let secure_port = opts.tls.as_ref().map(|_| free_port()).transpose()?;
            let launch = prepare_node(&opts, &java, &classpath, dir, None, port, secure_port, &[])?;
            Ok((
                new_instance(SERVER.to_owned(), launch, dir, port, &opts),
                secure_port,
            ))
        })
        .await?;
        let server = Self {
            process,
            opts,
            secure_port,
        };
        info!(port = server.port(), ?took, dir = %server.dir().display(), "ZooKeeper standalone started");
        Ok(server)
    }

    /// [`start`](Self::start) for synchronous code (or from inside a runtime, without
    /// blocking it on a nested runtime): runs on a fresh runtime in a scoped thread.
    pub fn start_blocking(opts: ZkOptions) -> Result<Self, ServerError> {
        super::process::block_on(Self::start(opts)).and_then(|r| r)
    }

    /// The connect string for clients (`127.0.0.1:port`).
    pub fn connect_string(&self) -> String {
        self.address()
    }

    /// The connect string of the secure client port (`127.0.0.1:port`), when started
    /// [with TLS](ZkOptions::with_tls).
    pub fn secure_connect_string(&self) -> Option<String> {
        self.secure_port.map(|port| loopback(port).to_string())
    }

    /// The authority the server trusts, copied into its directory when started
    /// [with TLS](ZkOptions::with_tls) (it signed the server's certificate too, as
    /// [`certs`](crate::certs) makes them): the `tls_ca` of its clients, there as long as
    /// the server.
    pub fn trusted_authority(&self) -> Option<PathBuf> {
        self.secure_port.map(|_| self.dir().join("ca.crt"))
    }

    /// The options it was started with.
    pub fn options(&self) -> &ZkOptions {
        &self.opts
    }

    /// Sends a four-letter word (`ruok`, `srvr`, `mntr`, ...) and returns the whole answer.
    /// Bounded by 5 s; see [`four_letter_with_timeout`](Self::four_letter_with_timeout).
    pub async fn four_letter(&self, word: &str) -> Result<String, ServerError> {
        self.four_letter_with_timeout(word, FOUR_LETTER_TIMEOUT)
            .await
    }

    /// [`four_letter`](Self::four_letter) with an explicit bound; running out gives
    /// [`ServerError::Timeout`] (what a paused server produces).
    pub async fn four_letter_with_timeout(
        &self,
        word: &str,
        timeout: Duration,
    ) -> Result<String, ServerError> {
        four_letter(&self.address(), word, timeout).await
    }
}

impl LocalServer for ZkServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

impl TargetServer for ZkServer {
    const NAME: &'static str = SERVER;
    const ENV: &'static str = ZK_ENV;
    type Options = ZkOptions;

    fn start_local(opts: ZkOptions) -> impl Future<Output = Result<Self, ServerError>> + Send {
        Self::start(opts)
    }

    fn client_address(&self) -> String {
        self.connect_string()
    }

    #[cfg(feature = "testcontainers")]
    async fn start_container(
        opts: ZkOptions,
    ) -> Result<(String, Box<dyn super::Member>), ServerError> {
        let container = super::containers::ZkContainer::start(&opts).await?;
        Ok((container.connect_string(), Box::new(container)))
    }
}

/// Either an external ZooKeeper (from [`ZK_ENV`], a connect string) or a [`ZkServer`]
/// started here.
pub type ZkTarget = Target<ZkServer>;

impl Target<ZkServer> {
    /// The connect string for clients.
    pub fn connect_string(&self) -> String {
        self.client_address()
    }

    /// A four-letter word to the server (for an external one: to the first host of the
    /// connect string, which must allow the word), bounded by 5 s.
    pub async fn four_letter(&self, word: &str) -> Result<String, ServerError> {
        match self.server() {
            Some(server) => server.four_letter(word).await,
            None => {
                let connect_string = self.client_address();
                let first = connect_string
                    .split(',')
                    .next()
                    .unwrap_or_default()
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .trim();
                four_letter(first, word, FOUR_LETTER_TIMEOUT).await
            }
        }
    }
}
