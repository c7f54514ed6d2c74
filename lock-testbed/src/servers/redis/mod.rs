//! Redis 7 from the Debian package, without persistence.

mod cluster;
mod sentinel;

pub use cluster::{RedisClusterOptions, RedisClusterSet};
pub use sentinel::{RedisSentinelOptions, RedisSentinelSet};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::probe::redis_query;
use super::process::require_program;
use super::spec::{Command, Probe, ServerSpec, Site};
use super::{DEFAULT_STARTUP_TIMEOUT, Server, ServerError, Target};

/// The environment variable naming an external Redis (a URL such as
/// `redis://127.0.0.1:6379` or `redis://:password@host:port/0`) to use instead of
/// starting one.
pub const REDIS_ENV: &str = "LOCK_TEST_REDIS";

/// How to run Redis.
///
/// Build it from [`RedisOptions::default`] and the `with_*` methods (or by assigning fields).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    /// The `redis-server` executable: `redis-server` (looked up in `PATH`) by default.
    pub binary: PathBuf,
    /// The default user's password (`--requirepass`); `None` (no password) by default.
    pub password: Option<String>,
    /// An extra ACL user `(name, password, key pattern)`, allowed every command (`+@all`)
    /// and every channel (`&*`) but only keys matching the pattern (e.g. `lock:*`).
    pub acl_user: Option<(String, String, String)>,
    /// Extra command-line arguments, appended last.
    pub extra_args: Vec<String>,
    /// The bound on start-up and restart: [`DEFAULT_STARTUP_TIMEOUT`] by default.
    pub startup_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("redis-server"),
            password: None,
            acl_user: None,
            extra_args: Vec::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
        }
    }
}

impl RedisOptions {
    /// Sets [`binary`](Self::binary).
    pub fn with_binary(mut self, binary: impl Into<PathBuf>) -> Self {
        self.binary = binary.into();
        self
    }

    /// Sets the default user's [`password`](Self::password).
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Sets the [`acl_user`](Self::acl_user): `user` with `password`, limited to keys
    /// matching `key_pattern` (e.g. `lock:*`).
    pub fn with_acl_user(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
        key_pattern: impl Into<String>,
    ) -> Self {
        self.acl_user = Some((user.into(), password.into(), key_pattern.into()));
        self
    }

    /// Adds a command-line argument (see [`extra_args`](Self::extra_args)).
    pub fn with_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Whether the server runs as a Redis Cluster node (`--cluster-enabled` among the
    /// extra arguments), which takes a second port for the cluster bus.
    fn cluster_enabled(&self) -> bool {
        self.extra_args.iter().any(|arg| arg == "--cluster-enabled")
    }
}

impl ServerSpec for RedisOptions {
    const NAME: &'static str = "Redis";
    const ENV: &'static str = REDIS_ENV;
    const IMAGE_ENV: &'static str = "LOCK_TEST_REDIS_IMAGE";
    /// The client port (and, for a cluster node, the cluster bus).
    const CONTAINER_PORTS: &'static [u16] = &[6379];

    fn port_count(&self) -> usize {
        1 + usize::from(self.cluster_enabled())
    }

    fn startup_timeout(&self) -> Duration {
        self.startup_timeout
    }

    /// `PING` answers `PONG` (after `AUTH` with the default user's password).
    fn probe(&self) -> Probe {
        let password = self.password.clone();
        Probe::new(Duration::from_millis(20), move |addr, timeout| {
            let password = password.clone();
            async move {
                match redis_query(addr, password.as_deref(), &["PING"], timeout).await? {
                    pong if pong == ["PONG"] => Ok(()),
                    other => Err(std::io::Error::other(format!("PING answered {other:?}")).into()),
                }
            }
        })
    }

    /// `redis-server` without persistence, one ACL rule per argument (a single quoted
    /// string of rules makes the server exit).
    fn command(&self, site: &Site<'_>) -> Result<Command, ServerError> {
        let program = match site.in_container {
            true => PathBuf::from("redis-server"),
            false => require_program("Redis", &self.binary, "redis-server")?,
        };
        let port = site.port(0).to_string();
        let mut argv: Vec<String> = [&program.display().to_string(), "--port", &port, "--bind"]
            .map(String::from)
            .to_vec();
        argv.push(site.bind.to_owned());
        if site.in_container {
            argv.extend(["--protected-mode".to_owned(), "no".to_owned()]);
        }
        argv.extend(
            [
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                site.dir,
            ]
            .map(String::from),
        );
        if let Some(password) = &self.password {
            argv.extend(["--requirepass".to_owned(), password.clone()]);
        }
        if let Some((user, password, pattern)) = &self.acl_user {
            argv.extend([
                "--user".to_owned(),
                user.clone(),
                "on".to_owned(),
                format!(">{password}"),
                format!("~{pattern}"),
                "&*".to_owned(),
                "+@all".to_owned(),
            ]);
        }
        argv.extend(self.extra_args.iter().cloned());
        if let Some(bus) = site.ports().get(1) {
            // The cluster bus port would be the port + 10000: maybe taken, and maybe in the
            // range of outgoing connections' source ports. One of ours instead.
            argv.extend(["--cluster-port".to_owned(), bus.to_string()]);
        }
        Ok(Command::new(argv))
    }

    /// `redis://[:password@]127.0.0.1:port`.
    fn client_address(&self, addr: SocketAddr) -> String {
        redis_url("127.0.0.1", addr.port(), None, self.password.as_deref())
    }
}

/// Percent-encodes a URL userinfo component (everything but RFC 3986 unreserved bytes).
pub(crate) fn encode_userinfo(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `redis://[user[:password]@]host:port`.
pub(crate) fn redis_url(
    host: &str,
    port: u16,
    user: Option<&str>,
    password: Option<&str>,
) -> String {
    match (user, password) {
        (None, None) => format!("redis://{host}:{port}"),
        (None, Some(pw)) => format!("redis://:{}@{host}:{port}", encode_userinfo(pw)),
        (Some(u), None) => format!("redis://{}@{host}:{port}", encode_userinfo(u)),
        (Some(u), Some(pw)) => format!(
            "redis://{}:{}@{host}:{port}",
            encode_userinfo(u),
            encode_userinfo(pw)
        ),
    }
}

/// A Redis server running as a child process on 127.0.0.1 (see [`Server`]), without
/// persistence (`--save '' --appendonly no`): a [`restart`](Server::restart)
/// keeps the port and loses all data.
pub type RedisServer = Server<RedisOptions>;

impl Server<RedisOptions> {
    /// `redis://127.0.0.1:port`, with the default user's password when one is set
    /// (`redis://:password@127.0.0.1:port`).
    pub fn url(&self) -> String {
        self.client_address()
    }

    /// The URL without credentials, whatever the options (for testing `NOAUTH`).
    pub fn url_without_auth(&self) -> String {
        redis_url("127.0.0.1", self.port(), None, None)
    }

    /// `redis://user:password@127.0.0.1:port` for the [`RedisOptions::acl_user`], if any.
    pub fn acl_url(&self) -> Option<String> {
        let (user, password, _) = self.options().acl_user.as_ref()?;
        Some(redis_url(
            "127.0.0.1",
            self.port(),
            Some(user),
            Some(password),
        ))
    }
}

/// Either an external Redis (from [`REDIS_ENV`], a URL) or one started here.
pub type RedisTarget = Target<RedisOptions>;

impl Target<RedisOptions> {
    /// The URL for clients (with the default user's password, if any).
    pub fn url(&self) -> String {
        self.client_address()
    }
}
