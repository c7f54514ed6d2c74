//! Redis 7 from the Debian package, without persistence.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;
use tracing::{info, warn};

use super::probe::Probe;
use super::process::{Instance, Launch, PORT_CLASH_ATTEMPTS, free_port, loopback, require_program};
use super::{DEFAULT_STARTUP_TIMEOUT, ServerError};

/// The environment variable naming an external Redis (a URL such as
/// `redis://127.0.0.1:6379` or `redis://:password@host:port/0`) to use instead of
/// starting one.
pub const REDIS_ENV: &str = "LOCK_TEST_REDIS";

const SERVER: &str = "Redis";

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

    /// Sets [`startup_timeout`](Self::startup_timeout).
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// The server's arguments after `--port`, one ACL rule per argument (a single quoted
    /// string of rules makes the server exit).
    pub(crate) fn server_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(password) = &self.password {
            args.push("--requirepass".to_owned());
            args.push(password.clone());
        }
        if let Some((user, password, pattern)) = &self.acl_user {
            args.extend([
                "--user".to_owned(),
                user.clone(),
                "on".to_owned(),
                format!(">{password}"),
                format!("~{pattern}"),
                "&*".to_owned(),
                "+@all".to_owned(),
            ]);
        }
        args.extend(self.extra_args.iter().cloned());
        args
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

/// A Redis server running as a child process on 127.0.0.1, without persistence
/// (`--save '' --appendonly no`): a restart loses all data.
///
/// Dropping it kills the server (`SIGKILL` to its process group), reaps it and removes its
/// directory.
#[derive(Debug)]
pub struct RedisServer {
    node: Instance,
    opts: RedisOptions,
    dir: TempDir,
}

impl RedisServer {
    /// Starts Redis on a free port and waits (bounded by [`RedisOptions::startup_timeout`])
    /// until `PING` answers `PONG` (after `AUTH` when a password is set).
    ///
    /// Fails promptly with [`ServerError::NotInstalled`] when the binary is missing.
    pub async fn start(opts: RedisOptions) -> Result<Self, ServerError> {
        let program = require_program("Redis", &opts.binary, "redis-server")?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = tempfile::Builder::new().prefix("lock-redis-").tempdir()?;
            let port = free_port()?;
            let mut args: Vec<OsString> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
            ]
            .into_iter()
            .map(OsString::from)
            .collect();
            args.push(dir.path().into());
            args.extend(opts.server_args().into_iter().map(OsString::from));
            let launch = Launch {
                program: program.clone(),
                args,
                cwd: dir.path().to_path_buf(),
            };
            let mut node = Instance::new(
                SERVER,
                launch,
                dir.path().join("server.log"),
                loopback(port),
                Probe::RedisPing {
                    password: opts.password.clone(),
                },
                opts.startup_timeout,
            );
            match node.start().await {
                Ok(took) => {
                    info!(port, ?took, "Redis started");
                    return Ok(Self { node, opts, dir });
                }
                Err(err) if attempt < PORT_CLASH_ATTEMPTS && node.port_clash(&err) => {
                    warn!(
                        port,
                        attempt, "Redis's port was taken; retrying on a fresh port"
                    );
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// [`start`](Self::start) for synchronous code (or from inside a runtime, without
    /// blocking it on a nested runtime): runs on a fresh runtime in a scoped thread.
    pub fn start_blocking(opts: RedisOptions) -> Result<Self, ServerError> {
        super::process::block_on(Self::start(opts)).and_then(|r| r)
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> String {
        self.node.addr().to_string()
    }

    /// The socket address.
    pub fn socket_addr(&self) -> SocketAddr {
        self.node.addr()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.node.addr().port()
    }

    /// `redis://127.0.0.1:port`, with the default user's password when one is set
    /// (`redis://:password@127.0.0.1:port`).
    pub fn url(&self) -> String {
        redis_url(
            "127.0.0.1",
            self.port(),
            None,
            self.opts.password.as_deref(),
        )
    }

    /// The URL without credentials, whatever the options (for testing `NOAUTH`).
    pub fn url_without_auth(&self) -> String {
        redis_url("127.0.0.1", self.port(), None, None)
    }

    /// `redis://user:password@127.0.0.1:port` for the [`RedisOptions::acl_user`], if any.
    pub fn acl_url(&self) -> Option<String> {
        self.opts
            .acl_user
            .as_ref()
            .map(|(user, pw, _)| redis_url("127.0.0.1", self.port(), Some(user), Some(pw)))
    }

    /// The options it was started with.
    pub fn options(&self) -> &RedisOptions {
        &self.opts
    }

    /// The server's pid (also its process-group id), or `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// The server's directory (working directory and log); removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log file (stdout and stderr of every launch).
    pub fn log_path(&self) -> &Path {
        self.node.log_path()
    }

    /// Freezes the server (`SIGSTOP` to its process group). Undo with
    /// [`resume`](Self::resume).
    pub fn pause(&self) -> Result<(), ServerError> {
        self.node.signal(Signal::SIGSTOP)
    }

    /// Continues a paused server (`SIGCONT`).
    pub fn resume(&self) -> Result<(), ServerError> {
        self.node.signal(Signal::SIGCONT)
    }

    /// Kills the server (`SIGKILL` to its process group) and reaps it; the port is kept for
    /// [`restart`](Self::restart). No-op when already killed.
    pub fn kill(&mut self) {
        self.node.kill();
    }

    /// Kills the server if running and starts it again on the same port, empty (there is
    /// no persistence), waiting until it answers `PING`.
    pub async fn restart(&mut self) -> Result<(), ServerError> {
        let took = self.node.start().await?;
        info!(port = self.port(), ?took, "Redis restarted");
        Ok(())
    }
}

/// Either an external Redis (from [`REDIS_ENV`]) or one started here.
#[derive(Debug)]
pub struct RedisTarget {
    inner: RedisTargetInner,
}

#[derive(Debug)]
enum RedisTargetInner {
    External { url: String },
    Local(Box<RedisServer>),
}

impl RedisTarget {
    /// Uses the URL in [`REDIS_ENV`] when it is set and not empty; otherwise starts a
    /// [`RedisServer`] with `opts`.
    pub async fn from_env_or_start(opts: RedisOptions) -> Result<Self, ServerError> {
        match std::env::var(REDIS_ENV) {
            Ok(url) if !url.trim().is_empty() => {
                info!("using the external Redis from {REDIS_ENV}");
                Ok(Self::external(url.trim()))
            }
            _ => Ok(Self::from(RedisServer::start(opts).await?)),
        }
    }

    /// An external server; fault injection is unsupported.
    pub fn external(url: impl Into<String>) -> Self {
        Self {
            inner: RedisTargetInner::External { url: url.into() },
        }
    }

    /// The URL for clients (with the default user's password, if any).
    pub fn url(&self) -> String {
        match &self.inner {
            RedisTargetInner::External { url } => url.clone(),
            RedisTargetInner::Local(server) => server.url(),
        }
    }

    /// True for an external server.
    pub fn is_external(&self) -> bool {
        matches!(self.inner, RedisTargetInner::External { .. })
    }

    /// The started server, `None` for an external one.
    pub fn server(&self) -> Option<&RedisServer> {
        match &self.inner {
            RedisTargetInner::External { .. } => None,
            RedisTargetInner::Local(server) => Some(server),
        }
    }

    /// The started server, mutably; `None` for an external one.
    pub fn server_mut(&mut self) -> Option<&mut RedisServer> {
        match &mut self.inner {
            RedisTargetInner::External { .. } => None,
            RedisTargetInner::Local(server) => Some(server),
        }
    }

    fn local(&self, operation: &str) -> Result<&RedisServer, ServerError> {
        self.server()
            .ok_or_else(|| ServerError::unsupported_external(operation, REDIS_ENV))
    }

    /// [`RedisServer::pause`]; unsupported with an external server.
    pub fn pause(&self) -> Result<(), ServerError> {
        self.local("pause")?.pause()
    }

    /// [`RedisServer::resume`]; unsupported with an external server.
    pub fn resume(&self) -> Result<(), ServerError> {
        self.local("resume")?.resume()
    }

    /// [`RedisServer::kill`]; unsupported with an external server.
    pub fn kill(&mut self) -> Result<(), ServerError> {
        let server = self
            .server_mut()
            .ok_or_else(|| ServerError::unsupported_external("kill", REDIS_ENV))?;
        server.kill();
        Ok(())
    }

    /// [`RedisServer::restart`]; unsupported with an external server.
    pub async fn restart(&mut self) -> Result<(), ServerError> {
        let server = self
            .server_mut()
            .ok_or_else(|| ServerError::unsupported_external("restart", REDIS_ENV))?;
        server.restart().await
    }
}

impl From<RedisServer> for RedisTarget {
    fn from(server: RedisServer) -> Self {
        Self {
            inner: RedisTargetInner::Local(Box::new(server)),
        }
    }
}
