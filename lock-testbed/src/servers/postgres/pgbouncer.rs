//! PgBouncer from the Debian package, as a child process in front of a PostgreSQL server:
//! the pooler whose transaction mode breaks session locks.

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use tracing::info;

use super::{POSTGRES_SUPERUSER, hand_to_postgres_user, postgres_url, postgres_user_instance};
use crate::servers::process::{free_port, require_program};
use crate::servers::{DEFAULT_STARTUP_TIMEOUT, LocalServer, ServerError, ServerProcess};

const SERVER: &str = "PgBouncer";

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

/// PgBouncer on a free port of 127.0.0.1, pooling the connections to the `postgres`
/// database of the server at `server` (every role trusted, as the servers started here),
/// as the `postgres` user when the tests run as root (it refuses to run as root). It
/// ignores the start-up parameter `options` (clients' server settings), as a deployment
/// that serves libpq clients with settings does.
///
/// Dropping it kills it and removes its directory.
#[derive(Debug)]
pub struct PgBouncer {
    process: ServerProcess,
    mode: PoolMode,
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` in front of the PostgreSQL server at `server`, and waits
    /// until it takes connections.
    ///
    /// Fails promptly with [`ServerError::NotInstalled`] when it is not installed.
    pub async fn start(server: SocketAddr, mode: PoolMode) -> Result<Self, ServerError> {
        Self::start_with(server, mode, &[]).await
    }

    /// [`start`](Self::start), with more `pgbouncer.ini` settings (`key = value` lines of
    /// its `[pgbouncer]` section, such as `("server_round_robin", "1")`).
    pub async fn start_with(
        server: SocketAddr,
        mode: PoolMode,
        settings: &[(&str, &str)],
    ) -> Result<Self, ServerError> {
        let program = require_program(SERVER, Path::new("/usr/sbin/pgbouncer"), "pgbouncer")?;
        let (process, (), took) = ServerProcess::start(SERVER, "lock-pgbouncer-", |dir| {
            hand_to_postgres_user(dir)?;
            let port = free_port()?;
            let users = dir.join("users.txt");
            std::fs::write(&users, format!("\"{POSTGRES_SUPERUSER}\" \"\"\n"))?;
            let config = dir.join("pgbouncer.ini");
            let more: String = settings
                .iter()
                .map(|(key, value)| format!("{key} = {value}\n"))
                .collect();
            std::fs::write(
                &config,
                format!(
                    "[databases]\npostgres = host={} port={} dbname=postgres\n\n[pgbouncer]\n\
                     listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                     auth_type = trust\nauth_file = {}\npool_mode = {mode}\n\
                     ignore_startup_parameters = options\n{more}",
                    server.ip(),
                    server.port(),
                    users.display()
                ),
            )?;
            let node = postgres_user_instance(
                SERVER,
                (&program, vec![OsString::from(&config)]),
                (dir, "pgbouncer.log"),
                port,
                DEFAULT_STARTUP_TIMEOUT,
            );
            Ok((node, ()))
        })
        .await?;
        info!(port = process.node_addr().port(), ?took, %mode, "PgBouncer started");
        Ok(PgBouncer { process, mode })
    }

    /// `postgres://postgres@127.0.0.1:port/postgres`.
    pub fn url(&self) -> String {
        postgres_url("127.0.0.1", self.port(), None)
    }

    /// Its pool mode.
    pub fn mode(&self) -> PoolMode {
        self.mode
    }
}

impl LocalServer for PgBouncer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}
