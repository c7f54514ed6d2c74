//! [`RedisServer`]: one server, and the servers a URL names.

use std::fmt;
use std::path::PathBuf;

use lock_core::LockError;
use lock_core::url::{HostPort, LockUrl};
use serde::Deserialize;

use super::config_error;

/// One Redis server and how to log in to it.
///
/// `Debug` never shows the password. `Deserialize` reads the one URL parameter that is a
/// server's field, `tls_ca`; the rest of the URL gives the others.
///
/// ```
/// use lock_redis::RedisServer;
/// let server = RedisServer::new("cache.internal")
///     .with_username("locker")
///     .with_password("s3cret")
///     .with_db(2);
/// assert_eq!(server.address(), "cache.internal:6379");
/// assert!(!format!("{server:?}").contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default = "RedisServer::url_defaults", deny_unknown_fields)]
#[non_exhaustive]
pub struct RedisServer {
    /// Host name or address (IPv6 without brackets). In a URL, its host.
    #[serde(skip)]
    pub host: String,
    /// TCP port. Default 6379. In a URL, its host's port.
    #[serde(skip)]
    pub port: u16,
    /// Whether to connect with TLS (`rediss://`; with `redlock://`, its `tls` parameter).
    #[serde(skip)]
    pub tls: bool,
    /// With TLS, a PEM file of the certificate authorities to trust instead of the
    /// system's (URL: `tls_ca=/path/ca.pem`). Default none.
    pub tls_ca: Option<PathBuf>,
    /// The ACL user name, if any (Redis 6+); with only a password, the `default` user.
    #[serde(skip)]
    pub username: Option<String>,
    /// The password, if any.
    #[serde(skip)]
    pub password: Option<String>,
    /// The logical database. Default 0. In a URL, its path.
    #[serde(skip)]
    pub db: i64,
}

impl RedisServer {
    /// Redis's default port, 6379.
    pub const DEFAULT_PORT: u16 = 6379;

    /// The server at `host`, port 6379, without TLS or credentials, database 0.
    pub fn new(host: impl Into<String>) -> Self {
        RedisServer {
            host: host.into(),
            port: Self::DEFAULT_PORT,
            tls: false,
            tls_ca: None,
            username: None,
            password: None,
            db: 0,
        }
    }

    /// The settings a URL's parameters start from: no host yet.
    pub(super) fn url_defaults() -> Self {
        Self::new("")
    }

    /// `host:port`, with an IPv6 host in brackets.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Checks the server's settings.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for an empty host or one with white space, port 0, a negative
    /// database, a user name without a password, or a `tls_ca` without TLS.
    pub fn validate(&self) -> Result<(), LockError> {
        self.validate_for("redis")
    }

    /// [`validate`](Self::validate), with errors naming `backend`.
    pub(super) fn validate_for(&self, backend: &str) -> Result<(), LockError> {
        let host = &self.host;
        let problem = if host.is_empty()
            || host.contains(|c: char| c.is_whitespace() || c.is_control() || ",/".contains(c))
        {
            format!("host {host:?} is not a host name or address")
        } else if self.port == 0 {
            format!("port 0 of host {host:?} is not a port")
        } else if self.db < 0 {
            format!("database {} must not be negative", self.db)
        } else if self.username.is_some() && self.password.is_none() {
            return Err(user_without_password(backend));
        } else if self.tls_ca.is_some() && !self.tls {
            "tls_ca is set but TLS is off (use rediss://, or tls=true for redlock://)".to_owned()
        } else {
            return Ok(());
        };
        Err(config_error(backend, problem))
    }
}

lock_core::setters! { RedisServer {
    /// Trusts the certificate authorities in the PEM file at `path` (implies nothing
    /// without [`with_tls`](Self::with_tls)).
    with_tls_ca(path: impl Into<PathBuf>) => tls_ca = Some(path.into());
    /// Sets the port.
    with_port(port: u16) => port = port;
    /// Turns TLS on or off.
    with_tls(tls: bool) => tls = tls;
    /// Sets the ACL user name.
    with_username(username: impl Into<String>) => username = Some(username.into());
    /// Sets the password.
    with_password(password: impl Into<String>) => password = Some(password.into());
    /// Sets the logical database.
    with_db(db: i64) => db = db;
}}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .finish()
    }
}

/// The servers at the URL's hosts (at least one), each with the URL's credentials and
/// database.
pub(super) fn servers(
    url: &LockUrl,
    tls: bool,
    tls_ca: Option<PathBuf>,
    backend: &str,
) -> Result<Vec<RedisServer>, LockError> {
    if url.hosts.is_empty() {
        let form = match backend {
            "redis" => "redis://host[:port]",
            _ => "redlock://host1[:port],host2[:port],host3[:port]",
        };
        let message = format!("the URL names no host; expected {form}");
        return Err(config_error(backend, message));
    }
    if url.username.is_some() && url.password.is_none() {
        return Err(user_without_password(backend));
    }
    let db = parse_db(&url.path, backend)?;
    let server = |host: &HostPort| RedisServer {
        host: host.host.clone(),
        port: host.port.unwrap_or(RedisServer::DEFAULT_PORT),
        tls,
        tls_ca: tls_ca.clone(),
        username: url.username.clone(),
        password: url.password.clone(),
        db,
    };
    Ok(url.hosts.iter().map(server).collect())
}

/// The database in a URL path: empty or `/` for 0, `/N` for N.
fn parse_db(path: &str, backend: &str) -> Result<i64, LockError> {
    let digits = path.strip_prefix('/').unwrap_or(path);
    if digits.is_empty() {
        return Ok(0);
    }
    let all_digits = digits.bytes().all(|b| b.is_ascii_digit());
    digits.parse().ok().filter(|_| all_digits).ok_or_else(|| {
        let expected = "is not a database number (expected /0, /1, ...)";
        config_error(backend, format!("the URL path {path:?} {expected}"))
    })
}

fn user_without_password(backend: &str) -> LockError {
    // The "user name" may be a password written without its leading ':', so never show it.
    config_error(
        backend,
        "a user name is given without a password; write user:password@, \
         or :password@ for the default user",
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::rejects;
    use super::super::{RedisConfig, RedlockConfig};
    use super::*;

    #[test]
    fn credentials_and_database_from_the_url() {
        let server = RedisConfig::from_url("redis://localhost").unwrap().server;
        assert_eq!(server, RedisServer::new("localhost"));
        assert_eq!((server.port, server.tls, server.db), (6379, false, 0));
        assert_eq!((&server.username, &server.password), (&None, &None));
        let server = RedisConfig::from_url("redis://:s3cret@h/0").unwrap().server;
        assert_eq!((server.username, server.db), (None, 0));
        assert_eq!(server.password.as_deref(), Some("s3cret"));
        let servers = RedlockConfig::from_url("redlock://u:p@r1,[::1]:6380/15")
            .unwrap()
            .servers;
        assert_eq!(servers[1].address(), "[::1]:6380");
        let with_login = |host| RedisServer::new(host).with_username("u").with_password("p");
        assert!(
            servers
                .iter()
                .all(|s| *s == with_login(&*s.host).with_port(s.port).with_db(15))
        );
    }

    #[test]
    fn rejected_servers() {
        let redis = |case: &str| rejects(RedisConfig::from_url, case);
        let redlock = |case: &str| rejects(RedlockConfig::from_url, case);
        for path in [
            "/-1",
            "/+1",
            "/x",
            "/1/2",
            "/1.5",
            "/99999999999999999999",
            "/%201",
        ] {
            redis(&format!("redis://u:topsecret@h{path}|database"));
            redlock(&format!("redlock://r1,r2{path}|database number"));
        }
        redis("redis://topsecret@h|without a password");
        redis("redis://topsecret@h/1?ttl=1s|without a password");
        redlock("redlock://topsecret@r1,r2,r3|without a password");
        redis("redis://h?tls_ca=/ca.pem|tls_ca is set but TLS is off");
        redlock("redlock://r1?tls_ca=/ca.pem|tls_ca is set but TLS is off");
    }

    #[test]
    fn validate_checks_hand_built_servers() {
        let h = || RedisServer::new("h");
        assert!(h().validate().is_ok());
        for (server, expected) in [
            (RedisServer::new(""), "redis: host \"\""),
            (RedisServer::new("a b"), "host \"a b\""),
            (RedisServer::new("a,b"), "host \"a,b\""),
            (h().with_port(0), "port 0"),
            (h().with_db(-1), "database -1"),
            (h().with_username("u"), "without a password"),
            (h().with_tls_ca("/ca.pem"), "TLS is off"),
        ] {
            let e = server.validate().unwrap_err().to_string();
            assert!(e.contains(expected), "{server:?}: {e}");
            assert!(RedisConfig::new(server).validate().is_err());
        }
        assert!(h().with_tls(true).with_tls_ca("/ca.pem").validate().is_ok());
    }
}
