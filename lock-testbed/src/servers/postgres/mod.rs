//! PostgreSQL from the Debian package: a fresh cluster (`initdb`) per server.

mod pgbouncer;

pub use pgbouncer::{PgBouncer, PgBouncerSpec, PoolMode};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::process::require_program;
use super::spec::{Command, Probe, ServerSpec, Site};
use super::{DEFAULT_STARTUP_TIMEOUT, Server, ServerError, Target};

/// The environment variable naming an external PostgreSQL (a URL such as
/// `postgres://postgres@127.0.0.1:5432/postgres`) to use instead of starting one.
pub const POSTGRES_ENV: &str = "LOCK_TEST_POSTGRES";

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

    /// The shell script that makes the cluster in `dir/data` on its first start and runs
    /// the server from `bin` (as the `postgres` user when run as root: the server refuses
    /// to run as root), listening on `bind`:`port`.
    fn script(&self, bin: &str, dir: &str, bind: &str, port: u16) -> String {
        let quote = |text: &str| format!("'{}'", text.replace('\'', "'\\''"));
        let (method, password_file) = match &self.password {
            Some(_) => ("scram-sha-256", " --pwfile=\"$d/password\"".to_owned()),
            None => ("trust", String::new()),
        };
        // A test server's data need not survive the machine, so it does not wait for the
        // disk (`fsync=off`; a killed server keeps what reached the OS).
        let defaults = [("fsync", "off"), ("max_connections", "400")];
        let mut settings: Vec<String> = defaults
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .chain([("listen_addresses".to_owned(), bind.to_owned())])
            .chain(self.settings.iter().cloned())
            .map(|(key, value)| format!("-c {}", quote(&format!("{key}={value}"))))
            .collect();
        if self.tls.is_some() {
            let files = "-c ssl_cert_file=\"$d/server.crt\" -c ssl_key_file=\"$d/server.key\"";
            settings.push(format!("-c ssl=on {files}"));
        }
        format!(
            "set -e; bin={bin}; d={dir}; {AS_POSTGRES} \
             [ ! -e \"$d/server.key\" ] || chmod 600 \"$d/server.key\"; \
             if [ ! -d \"$d/data\" ]; then \
               $as_postgres \"$bin/initdb\" -D \"$d/data\" -U {user} -E UTF8 --no-sync \
                 --auth-local=trust --auth-host={method}{password_file} > \"$d/initdb.log\" 2>&1 \
                 || {{ cat \"$d/initdb.log\"; exit 1; }}; \
               echo 'host all all 0.0.0.0/0 {method}' >> \"$d/data/pg_hba.conf\"; \
             fi; \
             exec $as_postgres \"$bin/postgres\" -D \"$d/data\" -p {port} -k \"$d\" {settings}",
            dir = quote(dir),
            user = POSTGRES_SUPERUSER,
            settings = settings.join(" "),
        )
    }
}

impl ServerSpec for PostgresOptions {
    const NAME: &'static str = "PostgreSQL";
    const ENV: &'static str = POSTGRES_ENV;
    const IMAGE_ENV: &'static str = "LOCK_TEST_POSTGRES_IMAGE";
    const CONTAINER_PORTS: &'static [u16] = &[5432];

    fn startup_timeout(&self) -> Duration {
        self.startup_timeout
    }

    /// A start-up message is answered with an authentication request, not with an error
    /// (such as "the database system is starting up").
    fn probe(&self) -> Probe {
        Probe::new(Duration::from_millis(50), |addr, timeout| async move {
            let answer = tokio::time::timeout(timeout, first_answer(addr)).await;
            match answer.map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))? {
                Ok(()) => Ok(()),
                Err(err) => Err(err.into()),
            }
        })
    }

    /// `sh -c` a script that makes the cluster in `data/` on its first start and runs the
    /// server (as the `postgres` user when run as root): the image's newest PostgreSQL in a container,
    /// `bin_dir`'s otherwise.
    fn command(&self, site: &Site<'_>) -> Result<Command, ServerError> {
        let bin = match site.in_container {
            true => "$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)".to_owned(),
            false => {
                for program in ["initdb", "postgres"] {
                    require_program(Self::NAME, &self.bin_dir.join(program), "postgresql")?;
                }
                format!("'{}'", self.bin_dir.display())
            }
        };
        let script = self.script(&bin, site.dir, site.bind, site.port(0));
        let mut command = Command::new(["/bin/sh".to_owned(), "-c".to_owned(), script]);
        if let Some(password) = &self.password {
            command = command.with_file("password", password.clone());
        }
        if let Some(certificates) = &self.tls {
            for file in ["server.crt", "server.key"] {
                command =
                    command.with_file(file, std::fs::read_to_string(certificates.join(file))?);
            }
        }
        Ok(command)
    }

    /// `postgres://postgres[:password]@127.0.0.1:port/postgres`.
    fn client_address(&self, addr: SocketAddr) -> String {
        postgres_url("127.0.0.1", addr.port(), self.password.as_deref())
    }
}

/// Sends PostgreSQL a start-up message (protocol 3.0, user and database `postgres`) and
/// reads the first byte of the answer: `R` (an authentication request, or its success)
/// means the server takes connections.
async fn first_answer(addr: SocketAddr) -> std::io::Result<()> {
    let mut body = 196_608_u32.to_be_bytes().to_vec();
    body.extend_from_slice(b"user\0postgres\0database\0postgres\0\0");
    let length = u32::try_from(body.len() + 4).unwrap_or(u32::MAX);
    let mut message = length.to_be_bytes().to_vec();
    message.extend_from_slice(&body);
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(&message).await?;
    let mut first = [0_u8; 1];
    stream.read_exact(&mut first).await?;
    if first[0] == b'R' {
        return Ok(());
    }
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest).await;
    Err(std::io::Error::other(format!(
        "PostgreSQL is not ready: {}",
        String::from_utf8_lossy(&rest).trim_matches(char::from(0))
    )))
}

/// The start of a script run as root or not: when root, it hands the directory `$d` to the
/// `postgres` user, and `$as_postgres` runs a program as that user (PostgreSQL and
/// PgBouncer refuse to run as root). `setpriv` executes the program in its own place (no
/// child), so the server is the process the runner signals, kills and reaps.
const AS_POSTGRES: &str = "as_postgres=; if [ \"$(id -u)\" = 0 ]; then \
    chown -R postgres:postgres \"$d\"; \
    as_postgres='setpriv --reuid postgres --regid postgres --init-groups --'; fi;";

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

/// A PostgreSQL server running as a child process on 127.0.0.1 (see [`Server`]; as the
/// `postgres` user when the tests run as root), its cluster made by `initdb` in its
/// directory, without waiting for the disk (`fsync=off`). A
/// [`restart`](Server::restart) keeps the port and the data (after crash
/// recovery); fault injection reaches its server processes too, each a session of its own.
pub type PostgresServer = Server<PostgresOptions>;

impl Server<PostgresOptions> {
    /// `postgres://postgres[:password]@127.0.0.1:port/postgres`.
    pub fn url(&self) -> String {
        self.client_address()
    }
}

/// Either an external PostgreSQL (from [`POSTGRES_ENV`], a URL) or one started here.
pub type PostgresTarget = Target<PostgresOptions>;

impl Target<PostgresOptions> {
    /// The URL for clients, as the superuser.
    pub fn url(&self) -> String {
        self.client_address()
    }
}
