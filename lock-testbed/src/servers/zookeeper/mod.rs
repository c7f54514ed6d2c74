//! ZooKeeper 3.8 from the Debian package, standalone or as an ensemble on one host.

mod ensemble;

pub use ensemble::ZkEnsemble;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::probe::four_letter;
use super::process::{loopback, require_program};
use super::spec::{Command, Probe, ServerSpec, Site};
use super::{DEFAULT_STARTUP_TIMEOUT, Server, ServerError, Target};

/// The environment variable naming an external ZooKeeper (a connect string such as
/// `127.0.0.1:2181` or `h1:2181,h2:2181`) to use instead of starting one.
pub const ZK_ENV: &str = "LOCK_TEST_ZK";

const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
const DEFAULT_JAR: &str = "/usr/share/java/zookeeper.jar";
/// ZooKeeper's class path in an image laid out as Debian's packages.
const CONTAINER_CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";
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

    /// Serves TLS too, with the certificates in `certs` (see [`ZkTls`]); clients must
    /// present a certificate when `client_auth`.
    pub fn with_tls(mut self, certs: impl Into<PathBuf>, client_auth: bool) -> Self {
        self.tls = Some(ZkTls {
            certs: certs.into(),
            client_auth,
        });
        self
    }

    /// Checks the installation; returns the `java` path and the class path.
    fn resolve(&self) -> Result<(String, String), ServerError> {
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
        let mut classpath = self.jar.display().to_string();
        if let Some(logging) = self.logging_jar.as_ref().filter(|p| p.is_file()) {
            classpath.push_str(&format!(":{}", logging.display()));
        }
        if self.tls.is_some() {
            classpath.push_str(&format!(":{NETTY_CODEC_JAR}"));
        }
        Ok((java.display().to_string(), classpath))
    }

    fn tick_ms(&self) -> u128 {
        self.tick_time.as_millis().max(1)
    }
}

/// The text of a `zoo.cfg`: the defaults, `server.N=` lines for an ensemble's `servers`
/// (`host:quorum:election`, N counting from 1), then `opts.config`.
fn zoo_cfg(
    opts: &ZkOptions,
    data_dir: &str,
    client_port: u16,
    client_address: &str,
    servers: &[String],
) -> String {
    let mut cfg = String::new();
    let _ = writeln!(cfg, "tickTime={}", opts.tick_ms());
    let _ = writeln!(cfg, "initLimit=10");
    let _ = writeln!(cfg, "syncLimit=5");
    let _ = writeln!(cfg, "dataDir={data_dir}");
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

impl ServerSpec for ZkOptions {
    const NAME: &'static str = "ZooKeeper";
    const ENV: &'static str = ZK_ENV;
    const IMAGE_ENV: &'static str = "LOCK_TEST_ZK_IMAGE";
    /// Client, quorum, election (and, with [`tls`](ZkOptions::tls), the secure client port).
    const CONTAINER_PORTS: &'static [u16] = &[2181, 2888, 3888];

    fn port_count(&self) -> usize {
        3 + usize::from(self.tls.is_some())
    }

    fn startup_timeout(&self) -> Duration {
        self.startup_timeout
    }

    /// `srvr` reports a `Mode:` (it serves requests, under a leader if in an ensemble).
    fn probe(&self) -> Probe {
        Probe::new(Duration::from_millis(100), |addr, timeout| async move {
            let answer = four_letter(&addr.to_string(), "srvr", timeout).await?;
            match answer.contains("Mode:") {
                true => Ok(()),
                false => {
                    Err(std::io::Error::other(format!("srvr answered {:?}", answer.trim())).into())
                }
            }
        })
    }

    /// `java … QuorumPeerMain zoo.cfg`, with `data/myid` for a member of an ensemble and
    /// the key and trust stores for TLS.
    fn command(&self, site: &Site<'_>) -> Result<Command, ServerError> {
        let (java, classpath) = match site.in_container {
            true if self.tls.is_some() => {
                return Err(ServerError::Unsupported {
                    operation: "TLS".to_owned(),
                    reason: "a ZooKeeper container serves plain connections only; start a \
                             ZkServer process for TLS"
                        .to_owned(),
                });
            }
            true => ("java".to_owned(), CONTAINER_CLASSPATH.to_owned()),
            false => self.resolve()?,
        };
        let servers: Vec<String> = match site.in_set() {
            true => site
                .members
                .iter()
                .map(|peer| {
                    let port = |nth: usize| peer.ports.get(nth).copied().unwrap_or(0);
                    format!("{}:{}:{}", peer.host, port(1), port(2))
                })
                .collect(),
            false => Vec::new(),
        };
        let data = format!("{}/data", site.dir);
        let mut cfg = zoo_cfg(self, &data, site.port(0), site.bind, &servers);
        let mut command = Command::default();
        if site.in_container && site.in_set() {
            // A member's address on the ensemble's network may change when it is healed.
            cfg.push_str("quorumListenOnAllIPs=true\n");
        }
        if site.in_set() {
            command = command.with_file("data/myid", format!("{}\n", site.index + 1));
        }
        if let (Some(tls), Some(port)) = (&self.tls, site.ports().get(3)) {
            let (lines, stores) = tls_cfg(tls, site.dir, *port)?;
            cfg.push_str(&lines);
            command.files.extend(stores);
        }
        command.argv = [java]
            .into_iter()
            .chain(self.jvm_args.iter().cloned())
            .collect();
        command.argv.extend([
            "-cp".to_owned(),
            classpath,
            MAIN_CLASS.to_owned(),
            "zoo.cfg".to_owned(),
        ]);
        Ok(command.with_file("zoo.cfg", cfg))
    }

    /// `127.0.0.1:port`.
    fn client_address(&self, addr: SocketAddr) -> String {
        addr.to_string()
    }
}

/// The `zoo.cfg` lines of a secure client port on `port`, and the files they name: the PEM
/// key store that ZooKeeper reads (the key, then the certificate, in one file),
/// `server.pem`, and the authority, `ca.crt` (the trust store), so that the server needs
/// nothing outside its directory `dir`.
fn tls_cfg(
    tls: &ZkTls,
    dir: &str,
    port: u16,
) -> Result<(String, Vec<(String, String)>), ServerError> {
    let read = |file: &str| std::fs::read_to_string(tls.certs.join(file));
    let stores = vec![
        (
            "server.pem".to_owned(),
            read("server.key")? + &read("server.crt")?,
        ),
        ("ca.crt".to_owned(), read("ca.crt")?),
    ];
    let (key_store, trust_store) = (format!("{dir}/server.pem"), format!("{dir}/ca.crt"));
    let client_auth = if tls.client_auth { "need" } else { "none" };
    let lines = format!(
        "secureClientPort={port}\n\
         secureClientPortAddress=127.0.0.1\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={key_store}\n\
         ssl.keyStore.type=PEM\n\
         ssl.trustStore.location={trust_store}\n\
         ssl.trustStore.type=PEM\n\
         ssl.clientAuth={client_auth}\n"
    );
    Ok((lines, stores))
}

/// A standalone ZooKeeper server running as a child process on 127.0.0.1 (see
/// [`Server`]); a [`restart`](Server::restart) keeps the port and the data
/// directory, so sessions and znodes survive it.
pub type ZkServer = Server<ZkOptions>;

impl Server<ZkOptions> {
    /// The connect string for clients (`127.0.0.1:port`).
    pub fn connect_string(&self) -> String {
        self.client_address()
    }

    /// The connect string of the secure client port (`127.0.0.1:port`), when started
    /// [with TLS](ZkOptions::with_tls).
    pub fn secure_connect_string(&self) -> Option<String> {
        self.ports().get(3).map(|port| loopback(*port).to_string())
    }

    /// The authority the server trusts, copied into its directory when started
    /// [with TLS](ZkOptions::with_tls) (it signed the server's certificate too, as
    /// [`certs`](crate::certs) makes them): the `tls_ca` of its clients, there as long as
    /// the server.
    pub fn trusted_authority(&self) -> Option<PathBuf> {
        self.options().tls.as_ref()?;
        Some(self.dir().join("ca.crt"))
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

#[cfg(feature = "testcontainers")]
impl super::containers::ZkContainer {
    /// Sends a four-letter word (bounded by 5 s).
    pub async fn four_letter(&self, word: &str) -> Result<String, ServerError> {
        four_letter(&self.client_address(), word, FOUR_LETTER_TIMEOUT).await
    }
}

/// Either an external ZooKeeper (from [`ZK_ENV`], a connect string) or one started here.
pub type ZkTarget = Target<ZkOptions>;

impl Target<ZkOptions> {
    /// The connect string for clients.
    pub fn connect_string(&self) -> String {
        self.client_address()
    }

    /// A four-letter word to the server (for an external one: to the first host of the
    /// connect string, which must allow the word), bounded by 5 s.
    pub async fn four_letter(&self, word: &str) -> Result<String, ServerError> {
        let connect_string = self.client_address();
        let first = connect_string.split([',', '/']).next().unwrap_or_default();
        four_letter(first.trim(), word, FOUR_LETTER_TIMEOUT).await
    }
}
