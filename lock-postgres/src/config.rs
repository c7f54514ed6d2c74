//! Configuration of the PostgreSQL backend.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use lock_core::LockError;
use lock_core::url::LockUrl;
use serde::{Deserialize, Serialize};
use tokio_postgres::config::SslMode;

/// The longest timeout or keepalive accepted: an hour.
const MAX_DURATION: Duration = Duration::from_secs(60 * 60);

/// Checks that `schema` is an SQL identifier distlock accepts: lower-case letters, digits
/// and `_`, not starting with a digit, at most 63 bytes.
pub(crate) fn check_schema(schema: &str) -> Result<(), LockError> {
    let bytes = schema.as_bytes();
    let identifier = !bytes.is_empty()
        && bytes.len() <= 63
        && !bytes[0].is_ascii_digit()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_');
    if identifier {
        return Ok(());
    }
    Err(config_error(format!(
        "schema={schema:?}: expected lower-case letters, digits and _, not starting with a \
         digit, at most 63 bytes"
    )))
}

fn config_error(message: impl std::fmt::Display) -> LockError {
    LockError::config(format!("postgres: {message}"))
}

lock_core::url_enum! {
    /// How waiters wait for a lock.
    ///
    /// In a URL: `strategy=advisory`, `strategy=notify` or `strategy=polling`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    #[non_exhaustive]
    pub enum PostgresStrategy for "strategy" {
        /// The server's own queue: a waiter's `pg_advisory_lock` blocks on the server, which
        /// grants the lock to the waiters in the order they asked, and wakes one per release
        /// (herd-free, FIFO).
        #[default]
        Advisory = "advisory",
        /// Waiters `LISTEN` on the lock's channel and try again when a release notifies it:
        /// every release wakes every waiter (a herd).
        Notify = "notify",
        /// Waiters try again every [`poll_interval`](PostgresConfig::poll_interval), with
        /// jitter: a release wakes nobody.
        Polling = "polling",
    }
}

/// How to reach PostgreSQL and how to lock there.
///
/// ```
/// use std::time::Duration;
/// use lock_postgres::{PostgresConfig, PostgresStrategy};
///
/// let config = PostgresConfig::from_url(
///     "postgres://locker@10.0.0.1:5432/app?schema=locks&keepalive=3s&application_name=jobs",
/// )?;
/// assert_eq!(config.connection, "postgres://locker@10.0.0.1:5432/app?application_name=jobs");
/// assert_eq!(config.schema, "locks");
/// assert_eq!(config.keepalive, Duration::from_secs(3));
/// assert_eq!(config.strategy, PostgresStrategy::Advisory);
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// The server and the role, as libpq takes them: a `postgres://` URL or `key=value`
    /// pairs, read by tokio-postgres (`host`, `port`, `user`, `password`, `dbname`,
    /// `application_name`, `options`, ...).
    pub connection: String,
    /// The schema of the fencing table `distlock_fencing` (created if missing). Locks of
    /// two schemas never exclude each other. An SQL identifier (lower-case letters, digits
    /// and `_`, not starting with a digit, at most 63 bytes); default `public`.
    pub schema: String,
    /// How waiters wait. Default [`PostgresStrategy::Advisory`].
    pub strategy: PostgresStrategy,
    /// How soon a dead peer is noticed. The holder's connection is checked every third of
    /// it, and the server is asked to probe the client's socket after it (TCP keepalives,
    /// whole seconds): a holder that vanished without closing its connection frees its
    /// locks within 2 × keepalive + 1 s. From 1 s to 1 h; default 5 s.
    #[serde(with = "lock_core::url::duration")]
    pub keepalive: Duration,
    /// The bound on connecting and on every request that does not wait for a lock. More
    /// than 0, at most 1 h; default 5 s.
    #[serde(with = "lock_core::url::duration")]
    pub timeout: Duration,
    /// How often a waiter of the `polling` strategy tries again (with up to a half of it
    /// added at random). More than 0, at most 1 h; default 50 ms.
    #[serde(with = "lock_core::url::duration")]
    pub poll_interval: Duration,
    /// The certificates (PEM) of the authorities the server's certificate must chain to;
    /// the system's when unset (URL and serde: `sslrootcert`, libpq's name). Setting it makes TLS required. TLS is
    /// used with `sslmode=require` (libpq's `verify-ca` and `verify-full` mean the same
    /// here: whenever distlock uses TLS it verifies the server's certificate and host
    /// name); `prefer`, tokio-postgres's default, connects without TLS.
    #[serde(rename = "sslrootcert")]
    pub ssl_root_cert: Option<PathBuf>,
}

/// `Debug` shows the connection as tokio-postgres reads it, whose password it never shows.
///
/// ```
/// let config = lock_postgres::PostgresConfig::new("postgres://app:s3cret@db/app");
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let connection = tokio_postgres::Config::from_str(&self.connection).map_or_else(
            |_| "<not a connection string>".to_owned(),
            |c| format!("{c:?}"),
        );
        f.debug_struct("PostgresConfig")
            .field("connection", &connection)
            .field("schema", &self.schema)
            .field("strategy", &self.strategy)
            .field("keepalive", &self.keepalive)
            .field("timeout", &self.timeout)
            .field("poll_interval", &self.poll_interval)
            .field("ssl_root_cert", &self.ssl_root_cert)
            .finish()
    }
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            connection: "postgres://localhost/postgres".to_owned(),
            schema: Self::DEFAULT_SCHEMA.to_owned(),
            strategy: PostgresStrategy::default(),
            keepalive: Self::DEFAULT_KEEPALIVE,
            timeout: Self::DEFAULT_TIMEOUT,
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
            ssl_root_cert: None,
        }
    }
}

impl PostgresConfig {
    /// The default schema: `public`.
    pub const DEFAULT_SCHEMA: &'static str = "public";
    /// The default keepalive: 5 s.
    pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(5);
    /// The default bound on connecting and on a request: 5 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default polling interval: 50 ms.
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(50);

    /// The server `connection` (a `postgres://` URL or libpq's `key=value` pairs), every
    /// other setting at its default.
    pub fn new(connection: impl Into<String>) -> Self {
        PostgresConfig {
            connection: connection.into(),
            ..PostgresConfig::default()
        }
    }

    /// Parses a `postgres://` (or `postgresql://`) URL: libpq's URL, whose query may also
    /// hold this backend's parameters: each sets the field of its name (every field but
    /// `connection`), with the default and bounds that field's docs give. The rest of the
    /// URL is left to tokio-postgres.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming what is wrong: another scheme, a parameter neither ours
    /// nor one tokio-postgres takes (or with a value it rejects), a bad value of ours, a URL
    /// tokio-postgres rejects, or what [`validate`](Self::validate) rejects.
    pub fn from_url(url: &str) -> Result<PostgresConfig, LockError> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(config_error(
                "the URL must begin with postgres:// or postgresql://",
            ));
        }
        let names = lock_core::url::parameter_names::<PostgresConfig>();
        let ours_named = |key: &str| key != "connection" && names.contains(&key);
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (mut ours, mut kept) = (Vec::new(), Vec::<String>::new());
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                _ if ours_named(key) => ours.push(pair),
                // libpq's modes that verify: TLS verifies whenever distlock uses it.
                "sslmode" if matches!(value, "verify-ca" | "verify-full") => {
                    kept.push("sslmode=require".to_owned());
                }
                // Every scheme's password kept out of the URL, read here.
                lock_core::url::PASSWORD_FILE => {
                    if lock_core::url::holds_password(url) {
                        return Err(lock_core::url::password_given_twice());
                    }
                    let password = lock_core::url::password_file_param(value)?;
                    let encoded = percent_encoding::utf8_percent_encode(
                        &password,
                        percent_encoding::NON_ALPHANUMERIC,
                    );
                    kept.push(format!("password={encoded}"));
                }
                // libpq's, as tokio-postgres reads them: asked one at a time, so that the
                // error can name the parameter (and never repeat a password).
                _ if tokio_postgres::Config::from_str(&format!("postgres://h?{pair}")).is_ok() => {
                    kept.push(pair.to_owned());
                }
                _ => {
                    let ours = names.iter().filter(|name| ours_named(name));
                    let ours = ours.copied().collect::<Vec<_>>().join(", ");
                    return Err(config_error(format!(
                        "unknown or invalid URL parameter {key:?} for postgres:// (known: \
                         {ours}; and libpq's, as tokio-postgres reads them)"
                    )));
                }
            }
        }
        let mut config: PostgresConfig =
            LockUrl::parse(&format!("postgres://?{}", ours.join("&")))?.query()?;
        config.connection = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting: the connection string as tokio-postgres reads it, the schema
    /// (an SQL identifier: letters, digits and `_`, not starting with a digit, at most 63
    /// bytes), and the durations (above zero, at most an hour; the keepalive at least
    /// 1 s, the server's unit).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the setting.
    pub fn validate(&self) -> Result<(), LockError> {
        self.pg_config()?;
        check_schema(&self.schema)?;
        for (key, value, least) in [
            ("keepalive", self.keepalive, Duration::from_secs(1)),
            ("timeout", self.timeout, Duration::from_millis(1)),
            (
                "poll_interval",
                self.poll_interval,
                Duration::from_millis(1),
            ),
        ] {
            if value < least || value > MAX_DURATION {
                return Err(config_error(format!(
                    "{key}={value:?}: expected {least:?} to {MAX_DURATION:?}"
                )));
            }
        }
        Ok(())
    }

    /// The connection string as tokio-postgres reads it, with the timeouts and keepalives
    /// of this configuration.
    pub(crate) fn pg_config(&self) -> Result<tokio_postgres::Config, LockError> {
        let mut pg = tokio_postgres::Config::from_str(&self.connection)
            .map_err(|error| config_error(format!("the connection string: {error}")))?;
        if self.ssl_root_cert.is_some() {
            if pg.get_ssl_mode() == SslMode::Disable {
                return Err(config_error(
                    "sslrootcert with sslmode=disable: drop one of them",
                ));
            }
            pg.ssl_mode(SslMode::Require);
        }
        let seconds = self.keepalive.as_secs().max(1);
        // The server probes an idle client after `keepalive`, then every second, and gives
        // up after `keepalive` seconds more: a vanished holder's locks are freed within
        // 2 × keepalive + 1 s (on TCP connections; a Unix socket's peer closes for sure).
        let server_keepalives = format!(
            "-c tcp_keepalives_idle={seconds} -c tcp_keepalives_interval=1 \
             -c tcp_keepalives_count={seconds}"
        );
        let options = match pg.get_options() {
            Some(theirs) => format!("{theirs} {server_keepalives}"),
            None => server_keepalives,
        };
        pg.options(options)
            .connect_timeout(self.timeout)
            .keepalives(true)
            .keepalives_idle(self.keepalive)
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(u32::try_from(seconds).unwrap_or(u32::MAX));
        if pg.get_application_name().is_none() {
            pg.application_name("distlock");
        }
        Ok(pg)
    }

    /// The bound a crashed holder's locks are freed within: 2 × keepalive + 1 s.
    pub(crate) fn crash_release_bound(&self) -> Duration {
        self.keepalive * 2 + Duration::from_secs(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_parameters_are_taken_out_of_the_url() {
        let config =
            PostgresConfig::from_url("postgresql://a:b@h/db?strategy=polling&poll_interval=20ms")
                .map_err(|e| e.to_string());
        let config = config.as_ref().map(|c| (c.connection.as_str(), c.strategy));
        assert_eq!(
            config,
            Ok(("postgresql://a:b@h/db", PostgresStrategy::Polling))
        );
    }

    #[test]
    fn a_password_from_a_file_joins_the_connection_and_never_shows() {
        let file = std::env::temp_dir().join(format!("distlock-pg-pw-{}", std::process::id()));
        std::fs::write(&file, "p@ss word\n").unwrap();
        let url = format!(
            "postgres://app@h/db?password_file={}&schema=locks",
            file.display()
        );
        let config = PostgresConfig::from_url(&url).unwrap();
        assert_eq!(
            config.connection,
            "postgres://app@h/db?password=p%40ss%20word"
        );
        let read = tokio_postgres::Config::from_str(&config.connection).unwrap();
        assert_eq!(read.get_password(), Some(&b"p@ss word"[..]));
        assert!(!format!("{config:?}").contains("ss word"), "{config:?}");
        let twice = format!("postgres://app:x@h/db?password_file={}", file.display());
        let error = PostgresConfig::from_url(&twice).unwrap_err().to_string();
        assert!(
            error.contains("twice") && !error.contains("ss word"),
            "{error}"
        );
        std::fs::remove_file(file).unwrap();
    }

    #[test]
    fn verifying_tls_modes_are_tls_that_verifies() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let config = PostgresConfig::from_url(&format!(
                "postgres://h/db?sslmode={mode}&sslrootcert=/etc/ca.crt"
            ))
            .map_err(|e| e.to_string());
            let config = config
                .as_ref()
                .map(|c| (c.connection.as_str(), c.ssl_root_cert.as_deref()));
            assert_eq!(
                config,
                Ok((
                    "postgres://h/db?sslmode=require",
                    Some(std::path::Path::new("/etc/ca.crt"))
                ))
            );
        }
        let contradiction =
            PostgresConfig::from_url("postgres://h/db?sslmode=disable&sslrootcert=/etc/ca.crt")
                .map(drop)
                .map_err(|e| e.to_string());
        assert!(
            matches!(&contradiction, Err(message) if message.contains("sslmode=disable")),
            "{contradiction:?}"
        );
    }

    #[test]
    fn bad_values_name_the_setting() {
        for (url, named) in [
            ("redis://h", "postgres://"),
            ("postgres://h?strategy=fast", "strategy"),
            ("postgres://h?schema=Bad-Name", "schema"),
            ("postgres://h?keepalive=0s", "keepalive"),
            ("postgres://h?timeout=2h", "timeout"),
            (
                "postgres://h?sslmode=sometimes",
                "URL parameter \"sslmode\"",
            ),
            (
                "postgres://h?lease=1s",
                "unknown or invalid URL parameter \"lease\"",
            ),
        ] {
            let error = PostgresConfig::from_url(url)
                .map(drop)
                .map_err(|e| e.to_string());
            assert!(
                matches!(&error, Err(message) if message.contains(named)),
                "{url}: {error:?}"
            );
        }
    }
}
