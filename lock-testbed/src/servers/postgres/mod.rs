//! PostgreSQL from the Debian package: a fresh cluster (`initdb`) per server.

#[cfg(feature = "testcontainers")]
mod container;
mod pgbouncer;

pub use pgbouncer::{PgBouncer, PoolMode};

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use tracing::info;

use super::probe::Probe;
use super::process::{Instance, Launch, free_port, loopback, require_program};
use super::{
    DEFAULT_STARTUP_TIMEOUT, LocalServer, ServerError, ServerProcess, Target, TargetServer,
};

/// The environment variable naming an external PostgreSQL (a URL such as
/// `postgres://postgres@127.0.0.1:5432/postgres`) to use instead of starting one.
pub const POSTGRES_ENV: &str = "LOCK_TEST_POSTGRES";

const SERVER: &str = "PostgreSQL";

/// The superuser of every cluster started here.
pub const POSTGRES_SUPERUSER: &str = "postgres";

/// How to run PostgreSQL.
///
/// Build it from [`PostgresOptions::default`] and the `with_*` methods (or by assigning
/// fields).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// The directory of `initdb` and `postgres`: the newest `/usr/lib/postgresql/*/bin` by
    /// default (Debian's layout).
    pub bin_dir: PathBuf,
    /// The superuser's password. With one, connections over TCP must give it
    /// (`scram-sha-256`); without (the default), every role is trusted.
    pub password: Option<String>,
    /// Server settings, each passed as `-c key=value` after the defaults (which are
    /// `listen_addresses=127.0.0.1`, `fsync=off`, `max_connections=400`).
    pub settings: Vec<(String, String)>,
    /// The bound on start-up and restart: [`DEFAULT_STARTUP_TIMEOUT`] by default.
    pub startup_timeout: Duration,
    /// A directory holding `server.crt` and `server.key` (as
    /// [`certs::server_certificate`](crate::certs::server_certificate) makes them): a
    /// [`PostgresServer`] then serves TLS with them (`ssl=on`), beside plain connections.
    pub tls: Option<PathBuf>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            bin_dir: newest_bin_dir(),
            password: None,
            settings: Vec::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            tls: None,
        }
    }
}

/// The newest `/usr/lib/postgresql/<major>/bin`, or that of 15 when none is installed (the
/// start then says it is missing).
fn newest_bin_dir() -> PathBuf {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .max()
        .unwrap_or(15);
    PathBuf::from(format!("/usr/lib/postgresql/{newest}/bin"))
}

impl PostgresOptions {
    /// Sets [`bin_dir`](Self::bin_dir).
    pub fn with_bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = dir.into();
        self
    }

    /// Sets the superuser's [`password`](Self::password).
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Adds a server setting (see [`settings`](Self::settings)).
    pub fn with_setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// Sets [`tls`](Self::tls).
    pub fn with_tls(mut self, certificates: impl Into<PathBuf>) -> Self {
        self.tls = Some(certificates.into());
        self
    }

    /// Sets [`startup_timeout`](Self::startup_timeout).
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// The server's `-c` arguments: the defaults, then [`settings`](Self::settings). A
    /// test server's data need not survive the machine, so it does not wait for the disk
    /// (`fsync=off`; a killed server keeps what reached the OS).
    pub(crate) fn server_args(&self) -> Vec<String> {
        let defaults = [
            ("listen_addresses", "127.0.0.1"),
            ("fsync", "off"),
            ("max_connections", "400"),
        ];
        defaults
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .chain(self.settings.iter().cloned())
            .flat_map(|(key, value)| ["-c".to_owned(), format!("{key}={value}")])
            .collect()
    }

    /// `initdb`'s arguments after `-D dir`: the superuser, UTF-8, no waiting for the disk,
    /// and the authentication the [`password`](Self::password) asks for (its file in
    /// `password_file`).
    pub(crate) fn initdb_args(&self, password_file: Option<&str>) -> Vec<String> {
        let mut args = [
            "-U",
            POSTGRES_SUPERUSER,
            "-E",
            "UTF8",
            "--no-sync",
            "--auth-local=trust",
        ]
        .map(String::from)
        .to_vec();
        match password_file {
            Some(file) => {
                args.push("--auth-host=scram-sha-256".to_owned());
                args.push(format!("--pwfile={file}"));
            }
            None => args.push("--auth-host=trust".to_owned()),
        }
        args
    }
}

/// `postgres://user[:password]@host:port/postgres`.
pub(crate) fn postgres_url(host: &str, port: u16, password: Option<&str>) -> String {
    match password {
        Some(password) => format!(
            "postgres://{POSTGRES_SUPERUSER}:{}@{host}:{port}/postgres",
            super::redis::encode_userinfo(password)
        ),
        None => format!("postgres://{POSTGRES_SUPERUSER}@{host}:{port}/postgres"),
    }
}

/// The command line that runs `program` as the `postgres` user when this process is root
/// (the server refuses to run as root), or as is otherwise. `setpriv` changes the user and
/// executes the program in its own place (no child), so the server is the process the
/// runner signals, kills and reaps.
fn as_postgres_user(program: &Path, args: Vec<OsString>) -> (PathBuf, Vec<OsString>) {
    if !nix::unistd::geteuid().is_root() {
        return (program.to_path_buf(), args);
    }
    let mut wrapped: Vec<OsString> = [
        "--reuid",
        POSTGRES_SUPERUSER,
        "--regid",
        POSTGRES_SUPERUSER,
        "--init-groups",
        "--",
    ]
    .map(OsString::from)
    .to_vec();
    wrapped.push(program.into());
    wrapped.extend(args);
    (PathBuf::from("/usr/bin/setpriv"), wrapped)
}

/// `server`'s instance: `program args` run as the `postgres` user (see
/// [`as_postgres_user`]) in `dir`, logging to `dir/log`, ready once it answers a PostgreSQL
/// start-up message on 127.0.0.1:`port`.
fn postgres_user_instance(
    server: &str,
    (program, args): (&Path, Vec<OsString>),
    (dir, log): (&Path, &str),
    port: u16,
    startup_timeout: Duration,
) -> Instance {
    let (program, args) = as_postgres_user(program, args);
    let launch = Launch {
        program,
        args,
        cwd: dir.to_path_buf(),
    };
    Instance::new(
        server,
        launch,
        dir.join(log),
        loopback(port),
        Probe::PostgresStartup,
        startup_timeout,
    )
}

/// Makes `dir` the `postgres` user's when this process is root.
fn hand_to_postgres_user(dir: &Path) -> Result<(), ServerError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let user = nix::unistd::User::from_name(POSTGRES_SUPERUSER)?.ok_or_else(|| {
        ServerError::NotInstalled {
            package: "postgresql".to_owned(),
            detail: "PostgreSQL refuses to run as root, and there is no user postgres".to_owned(),
        }
    })?;
    nix::unistd::chown(dir, Some(user.uid), Some(user.gid))?;
    Ok(())
}

/// Copies `server.crt` and `server.key` from `certificates` into the server's `dir`, the
/// key readable by the server's user only (as the server demands), and returns the
/// settings that serve TLS with them.
fn serve_tls(certificates: &Path, dir: &Path) -> Result<Vec<OsString>, ServerError> {
    let mut args = vec![OsString::from("-c"), OsString::from("ssl=on")];
    for (file, setting) in [
        ("server.crt", "ssl_cert_file"),
        ("server.key", "ssl_key_file"),
    ] {
        let copy = dir.join(file);
        std::fs::copy(certificates.join(file), &copy)?;
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o600))?;
        hand_to_postgres_user(&copy)?;
        args.push("-c".into());
        args.push(format!("{setting}={}", copy.display()).into());
    }
    Ok(args)
}

/// Runs `initdb` for a cluster in `dir/data`.
fn init_cluster(opts: &PostgresOptions, dir: &Path) -> Result<(), ServerError> {
    let initdb = require_program(SERVER, &opts.bin_dir.join("initdb"), "postgresql")?;
    hand_to_postgres_user(dir)?;
    let password_file = match &opts.password {
        Some(password) => {
            let file = dir.join("password");
            std::fs::write(&file, password)?;
            hand_to_postgres_user(&file)?;
            Some(file.display().to_string())
        }
        None => None,
    };
    let mut args: Vec<OsString> = vec!["-D".into(), dir.join("data").into()];
    args.extend(
        opts.initdb_args(password_file.as_deref())
            .into_iter()
            .map(OsString::from),
    );
    let (program, args) = as_postgres_user(&initdb, args);
    let log = std::fs::File::create(dir.join("initdb.log"))?;
    hand_to_postgres_user(&dir.join("initdb.log"))?;
    let status = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()?;
    if status.success() {
        return Ok(());
    }
    Err(ServerError::from(std::io::Error::other(format!(
        "initdb failed ({status}): {}",
        super::process::log_tail(&dir.join("initdb.log"), 10)
    ))))
}

/// A PostgreSQL server running as a child process on 127.0.0.1 (as the `postgres` user
/// when the tests run as root), its cluster made by `initdb` in its directory, without
/// waiting for the disk (`fsync=off`). A restart keeps the data.
///
/// Its address, pid, directory (data and log) and fault injection come from
/// [`LocalServer`]; a [`restart`](LocalServer::restart) keeps the port.
///
/// Dropping it kills the server (`SIGKILL` to its process group), reaps it and removes its
/// directory.
#[derive(Debug)]
pub struct PostgresServer {
    process: ServerProcess,
    opts: PostgresOptions,
}

impl PostgresServer {
    /// Makes a cluster, starts PostgreSQL on a free port, and waits (bounded by
    /// [`PostgresOptions::startup_timeout`]) until it takes connections.
    ///
    /// Fails promptly with [`ServerError::NotInstalled`] when the binaries are missing.
    pub async fn start(opts: PostgresOptions) -> Result<Self, ServerError> {
        let postgres = require_program(SERVER, &opts.bin_dir.join("postgres"), "postgresql")?;
        let (process, (), took) = ServerProcess::start(SERVER, "lock-postgres-", |dir| {
            init_cluster(&opts, dir)?;
            let port = free_port()?;
            let mut args: Vec<OsString> = vec![
                "-D".into(),
                dir.join("data").into(),
                "-p".into(),
                port.to_string().into(),
                "-k".into(),
                dir.into(),
            ];
            args.extend(opts.server_args().into_iter().map(OsString::from));
            if let Some(certificates) = &opts.tls {
                args.extend(serve_tls(certificates, dir)?);
            }
            let node = postgres_user_instance(
                SERVER,
                (&postgres, args),
                (dir, "server.log"),
                port,
                opts.startup_timeout,
            );
            Ok((node, ()))
        })
        .await?;
        let server = Self { process, opts };
        info!(port = server.port(), ?took, "PostgreSQL started");
        Ok(server)
    }

    /// `postgres://postgres[:password]@127.0.0.1:port/postgres`.
    pub fn url(&self) -> String {
        postgres_url("127.0.0.1", self.port(), self.opts.password.as_deref())
    }

    /// The options it was started with.
    pub fn options(&self) -> &PostgresOptions {
        &self.opts
    }
}

impl LocalServer for PostgresServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// Freezes the postmaster, then every server process it started: each of those is a
    /// session of its own, out of reach of a signal to the postmaster's group.
    fn pause(&self) -> Result<(), ServerError> {
        self.process.node_signal(Signal::SIGSTOP)?;
        self.signal_children(Signal::SIGSTOP);
        Ok(())
    }

    /// Lets the server processes go on, then the postmaster.
    fn resume(&self) -> Result<(), ServerError> {
        self.signal_children(Signal::SIGCONT);
        self.process.node_signal(Signal::SIGCONT)
    }

    /// Kills the server processes, then the postmaster: a server process left over holds
    /// the shared memory that a restarted postmaster must find free.
    fn kill(&mut self) {
        self.kill_children();
        self.process.node_kill();
    }

    /// Kills the server processes and the postmaster, and starts the server again on the
    /// same port and data (after crash recovery).
    fn restart(&mut self) -> impl Future<Output = Result<(), ServerError>> + Send {
        self.kill_children();
        self.process.node_restart()
    }
}

impl PostgresServer {
    /// Freezes the postmaster (it starts no more), kills every server process it started,
    /// and waits (up to 5 s) until they have exited.
    fn kill_children(&self) {
        if self.process.node_signal(Signal::SIGSTOP).is_err() {
            return;
        }
        let children = self.children();
        for pid in &children {
            let _ = nix::sys::signal::kill(*pid, Signal::SIGKILL);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        // An exited process that is not yet reaped (a zombie) holds no memory.
        let running = |pid: &nix::unistd::Pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .is_some_and(|state| state != "Z")
            })
        };
        while children.iter().any(running) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to every process whose parent is the postmaster.
    fn signal_children(&self, signal: Signal) {
        for pid in self.children() {
            // A child that exited meanwhile has nothing to stop.
            let _ = nix::sys::signal::kill(pid, signal);
        }
    }

    /// The processes whose parent is the postmaster: each a session of its own.
    fn children(&self) -> Vec<nix::unistd::Pid> {
        let Some(postmaster) = self.pid() else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut children = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            // `/proc/<pid>/stat`: "pid (comm) state ppid ...", comm possibly with spaces.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|ppid| ppid.parse::<u32>().ok());
            if parent == Some(postmaster) {
                children.push(nix::unistd::Pid::from_raw(pid));
            }
        }
        children
    }
}

impl TargetServer for PostgresServer {
    const NAME: &'static str = SERVER;
    const ENV: &'static str = POSTGRES_ENV;
    type Options = PostgresOptions;

    fn start_local(
        opts: PostgresOptions,
    ) -> impl Future<Output = Result<Self, ServerError>> + Send {
        Self::start(opts)
    }

    fn client_address(&self) -> String {
        self.url()
    }

    #[cfg(feature = "testcontainers")]
    async fn start_container(
        opts: PostgresOptions,
    ) -> Result<(String, Box<dyn super::Member>), ServerError> {
        let container = super::containers::PostgresContainer::start(&opts).await?;
        Ok((container.url(), Box::new(container)))
    }
}

/// Either an external PostgreSQL (from [`POSTGRES_ENV`], a URL) or a [`PostgresServer`]
/// started here.
pub type PostgresTarget = Target<PostgresServer>;

impl Target<PostgresServer> {
    /// The URL for clients, as the superuser.
    pub fn url(&self) -> String {
        self.client_address()
    }
}
