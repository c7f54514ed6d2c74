//! PgBouncer from the Debian package, as a child process in front of a PostgreSQL server:
//! the pooler whose transaction mode breaks session locks.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use super::{AS_POSTGRES, POSTGRES_SUPERUSER, PostgresOptions, postgres_url};
use crate::servers::process::require_program;
use crate::servers::spec::{Command, Probe, ServerSpec, Site};
use crate::servers::{DEFAULT_STARTUP_TIMEOUT, Server, ServerError};

/// How PgBouncer hands its server connections to clients (its `pool_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolMode {
    /// A client keeps one server connection until it disconnects.
    Session,
    /// A client has a server connection for one transaction at a time.
    Transaction,
    /// A client has a server connection for one statement at a time.
    Statement,
}

impl fmt::Display for PoolMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        })
    }
}

/// PgBouncer on a free port of 127.0.0.1 (see [`Server`]), pooling the connections to the
/// `postgres` database of a PostgreSQL server (every role trusted, as the servers started
/// here), as the `postgres` user when the tests run as root (it refuses to run as root).
/// It ignores the start-up parameter `options` (clients' server settings), as a deployment
/// that serves libpq clients with settings does.
pub type PgBouncer = Server<PgBouncerSpec>;

impl Server<PgBouncerSpec> {
    /// Starts PgBouncer in `mode` in front of the PostgreSQL server at `server`, and waits
    /// until it takes connections.
    ///
    /// Fails promptly with [`ServerError::NotInstalled`] when it is not installed.
    pub async fn in_front_of(server: SocketAddr, mode: PoolMode) -> Result<Self, ServerError> {
        Self::start(PgBouncerSpec::new(server, mode, &[])).await
    }

    /// `postgres://postgres@127.0.0.1:port/postgres`.
    pub fn url(&self) -> String {
        self.client_address()
    }

    /// Its pool mode.
    pub fn mode(&self) -> PoolMode {
        self.options().mode
    }
}

/// PgBouncer in front of a PostgreSQL server, as a kind of server (a process only: the
/// test image has no PgBouncer).
#[derive(Debug, Clone)]
pub struct PgBouncerSpec {
    server: SocketAddr,
    mode: PoolMode,
    /// More lines of the `[pgbouncer]` section.
    settings: String,
}

impl PgBouncerSpec {
    /// PgBouncer in `mode` in front of the server at `server`, with more `pgbouncer.ini`
    /// settings (`key = value` lines of its `[pgbouncer]` section, such as
    /// `("server_round_robin", "1")`).
    pub fn new(server: SocketAddr, mode: PoolMode, settings: &[(&str, &str)]) -> Self {
        let settings = settings
            .iter()
            .map(|(key, value)| format!("{key} = {value}\n"))
            .collect();
        PgBouncerSpec {
            server,
            mode,
            settings,
        }
    }
}

impl ServerSpec for PgBouncerSpec {
    const NAME: &'static str = "PgBouncer";
    const IMAGE_ENV: &'static str = PostgresOptions::IMAGE_ENV;
    const CONTAINER_PORTS: &'static [u16] = &[6432];

    fn startup_timeout(&self) -> Duration {
        DEFAULT_STARTUP_TIMEOUT
    }

    fn probe(&self) -> Probe {
        PostgresOptions::default().probe()
    }

    fn command(&self, site: &Site<'_>) -> Result<Command, ServerError> {
        if site.in_container {
            return Err(ServerError::Unsupported {
                operation: "starting PgBouncer in a container".to_owned(),
                reason: "PgBouncer runs as a process in front of a server".to_owned(),
            });
        }
        let program = require_program(Self::NAME, Path::new("/usr/sbin/pgbouncer"), "pgbouncer")?;
        let config = format!(
            "[databases]\npostgres = host={} port={} dbname=postgres\n\n[pgbouncer]\n\
             listen_addr = {}\nlisten_port = {}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {}/users.txt\npool_mode = {}\n\
             ignore_startup_parameters = options\n{}",
            self.server.ip(),
            self.server.port(),
            site.bind,
            site.port(0),
            site.dir,
            self.mode,
            self.settings,
        );
        let script = format!(
            "d='{}'; {AS_POSTGRES} exec $as_postgres '{}' pgbouncer.ini",
            site.dir,
            program.display()
        );
        Ok(
            Command::new(["/bin/sh".to_owned(), "-c".to_owned(), script])
                .with_file("users.txt", format!("\"{POSTGRES_SUPERUSER}\" \"\"\n"))
                .with_file("pgbouncer.ini", config),
        )
    }

    fn client_address(&self, addr: SocketAddr) -> String {
        postgres_url("127.0.0.1", addr.port(), None)
    }
}
