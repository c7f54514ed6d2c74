//! The connection-URL syntax shared by every backend.
//!
//! ```text
//! scheme://[user[:password]@]host[:port][,host[:port]...][/path][?key=value&...]
//! ```
//!
//! Several hosts are separated by commas (a ZooKeeper ensemble, Redlock's servers); IPv6
//! addresses go in brackets. User, password, path and parameter values are
//! percent-decoded. Errors are [`LockError::Config`] naming the bad part, and never repeat
//! the password.

use std::time::Duration;

use percent_encoding::percent_decode_str;

use crate::LockError;

/// One `host[:port]` of a connection URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// The port, when given.
    pub port: Option<u16>,
}

impl HostPort {
    /// `host:port` with the given default port; IPv6 hosts in brackets.
    pub fn to_address(&self, default_port: u16) -> String {
        let port = self.port.unwrap_or(default_port);
        if self.host.contains(':') {
            format!("[{}]:{port}", self.host)
        } else {
            format!("{}:{port}", self.host)
        }
    }
}

/// A parsed connection URL.
///
/// ```
/// use lock_core::url::LockUrl;
/// let url = LockUrl::parse("zk://alice:pw@h1:2181,h2/app?session_timeout=10s")?;
/// assert_eq!(url.scheme, "zk");
/// assert_eq!(url.hosts.len(), 2);
/// assert_eq!(url.path, "/app");
/// assert_eq!(url.username.as_deref(), Some("alice"));
/// assert_eq!(url.duration_param("session_timeout")?, Some(std::time::Duration::from_secs(10)));
/// url.check_params(&["session_timeout"])?;
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockUrl {
    /// The scheme, lower-cased.
    pub scheme: String,
    /// The user name, if any.
    pub username: Option<String>,
    /// The password, if any.
    pub password: Option<String>,
    /// The hosts, in the order given; empty for `scheme://` or `scheme:///path`.
    pub hosts: Vec<HostPort>,
    /// The path, starting with `/`, or empty.
    pub path: String,
    /// The query parameters, in the order given; keys are unique.
    pub params: Vec<(String, String)>,
}

impl std::fmt::Debug for LockUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockUrl")
            .field("scheme", &self.scheme)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("params", &self.params)
            .finish()
    }
}

fn bad(message: impl std::fmt::Display) -> LockError {
    LockError::Config {
        message: format!("invalid connection URL: {message}"),
    }
}

fn decode(part: &str, what: &str) -> Result<String, LockError> {
    percent_decode_str(part)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            bad(format!(
                "the {what} is not valid UTF-8 after percent-decoding"
            ))
        })
}

impl LockUrl {
    /// Parses `url`.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the part that is wrong: a missing scheme, an empty host
    /// in the list, a bad port, a fragment, a malformed or repeated parameter.
    pub fn parse(url: &str) -> Result<LockUrl, LockError> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(bad(format!(
                "{:?} has no scheme; expected something like zk://127.0.0.1:2181 or redis://127.0.0.1:6379",
                redact_guess(url)
            )));
        };
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        {
            return Err(bad(format!("the scheme {scheme:?} is not a valid scheme")));
        }
        if rest.contains('#') {
            return Err(bad("fragments (`#...`) are not allowed"));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((before, query)) => (before, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(slash) => (&before_query[..slash], &before_query[slash..]),
            None => (before_query, ""),
        };
        let (userinfo, host_list) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (info, None),
                };
                let user = decode(user, "user name")?;
                let pass = pass.map(|p| decode(p, "password")).transpose()?;
                ((!user.is_empty()).then_some(user), pass)
            }
        };
        let hosts = if host_list.is_empty() {
            Vec::new()
        } else {
            host_list
                .split(',')
                .map(parse_host)
                .collect::<Result<Vec<_>, _>>()?
        };
        let path = decode(path, "path")?;
        let params = match query {
            None => Vec::new(),
            Some(query) => parse_query(query)?,
        };
        Ok(LockUrl {
            scheme: scheme.to_ascii_lowercase(),
            username,
            password,
            hosts,
            path,
            params,
        })
    }

    /// The value of parameter `key`.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Parameter `key` as a duration such as `10s`, `500ms` or `1m 30s`.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the parameter when the value is not a duration.
    pub fn duration_param(&self, key: &str) -> Result<Option<Duration>, LockError> {
        self.param(key)
            .map(|value| {
                humantime::parse_duration(value).map_err(|e| {
                    bad(format!(
                        "parameter {key}={value:?} is not a duration such as 10s or 500ms ({e})"
                    ))
                })
            })
            .transpose()
    }

    /// Parameter `key` parsed with `FromStr`.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the parameter when the value does not parse; `expected`
    /// describes the accepted values.
    pub fn parsed_param<T: std::str::FromStr>(
        &self,
        key: &str,
        expected: &str,
    ) -> Result<Option<T>, LockError> {
        self.param(key)
            .map(|value| {
                value
                    .parse()
                    .map_err(|_| bad(format!("parameter {key}={value:?}: expected {expected}")))
            })
            .transpose()
    }

    /// Fails on any parameter not in `known`, so that typos are not silently ignored.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the unknown parameter and listing the known ones.
    pub fn check_params(&self, known: &[&str]) -> Result<(), LockError> {
        match self
            .params
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            None => Ok(()),
            Some((key, _)) => Err(bad(format!(
                "unknown parameter {key:?} for {}:// (known: {})",
                self.scheme,
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))),
        }
    }
}

/// Shows at most the start of an unparseable URL, without anything that looks like a password.
fn redact_guess(url: &str) -> String {
    match url.rsplit_once('@') {
        Some((_, after)) => format!("…@{after}"),
        None => url.to_owned(),
    }
}

fn parse_host(entry: &str) -> Result<HostPort, LockError> {
    if entry.is_empty() {
        return Err(bad("empty host in the host list"));
    }
    let (host, port) = if let Some(bracketed) = entry.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return Err(bad(format!("host {entry:?} has an unclosed '['")));
        };
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(bad(format!("unexpected {after:?} after host [{host}]"))),
            },
        }
    } else {
        match entry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        }
    };
    if host.is_empty() {
        return Err(bad(format!("host {entry:?} has no name")));
    }
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(format!("host {host:?} contains white space")));
    }
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => {
                return Err(bad(format!(
                    "port {port:?} of host {host:?} is not a number from 1 to 65535"
                )));
            }
        },
    };
    Ok(HostPort {
        host: host.to_owned(),
        port,
    })
}

fn parse_query(query: &str) -> Result<Vec<(String, String)>, LockError> {
    let mut params: Vec<(String, String)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(bad(format!(
                "parameter {pair:?} has no value (expected key=value)"
            )));
        };
        let key = decode(key, "parameter name")?;
        let value = decode(&value.replace('+', " "), "parameter value")?;
        if key.is_empty() {
            return Err(bad(format!("parameter {pair:?} has no name")));
        }
        if params.iter().any(|(k, _)| *k == key) {
            return Err(bad(format!("parameter {key:?} is given twice")));
        }
        params.push((key, value));
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        LockUrl::parse(url).unwrap_err().to_string()
    }

    #[test]
    fn parses_every_part() {
        let url = LockUrl::parse("ZK://u%40x:p%3Aw@h1:1,[::1]:2,h3/ch%20root?a=1&b=x+y").unwrap();
        assert_eq!(url.scheme, "zk");
        assert_eq!(url.username.as_deref(), Some("u@x"));
        assert_eq!(url.password.as_deref(), Some("p:w"));
        assert_eq!(
            url.hosts,
            vec![
                HostPort {
                    host: "h1".into(),
                    port: Some(1)
                },
                HostPort {
                    host: "::1".into(),
                    port: Some(2)
                },
                HostPort {
                    host: "h3".into(),
                    port: None
                },
            ]
        );
        assert_eq!(url.hosts[1].to_address(9), "[::1]:2");
        assert_eq!(url.hosts[2].to_address(9), "h3:9");
        assert_eq!(url.path, "/ch root");
        assert_eq!(url.param("b"), Some("x y"));
        assert!(
            !format!("{url:?}").contains("p:w"),
            "password redacted in Debug"
        );
    }

    #[test]
    fn empty_authority_is_allowed() {
        let url = LockUrl::parse("memory://").unwrap();
        assert!(url.hosts.is_empty());
        assert_eq!(url.path, "");
        let url = LockUrl::parse("redis://:secret@localhost").unwrap();
        assert_eq!(url.username, None);
        assert_eq!(url.password.as_deref(), Some("secret"));
    }

    #[test]
    fn errors_name_the_bad_part() {
        assert!(err("localhost:2181").contains("no scheme"));
        assert!(err("zk://h1,,h2").contains("empty host"));
        assert!(err("zk://h1:abc").contains("port \"abc\""));
        assert!(err("zk://h1:0").contains("1 to 65535"));
        assert!(err("zk://h1:70000").contains("\"70000\""));
        assert!(err("zk://[::1").contains("unclosed"));
        assert!(err("zk://h1#frag").contains("fragment"));
        assert!(err("zk://h1?a").contains("\"a\" has no value"));
        assert!(err("zk://h1?a=1&a=2").contains("given twice"));
        assert!(err("z k://h1").contains("scheme"));
        assert!(!err("nope:secret@host").contains("secret"));
    }

    #[test]
    fn typed_params() {
        let url = LockUrl::parse("x://h?t=250ms&n=3&bad=zz").unwrap();
        assert_eq!(
            url.duration_param("t").unwrap(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(url.duration_param("missing").unwrap(), None);
        assert!(
            url.duration_param("bad")
                .unwrap_err()
                .to_string()
                .contains("bad=\"zz\"")
        );
        assert_eq!(url.parsed_param::<u32>("n", "a count").unwrap(), Some(3));
        assert!(
            url.parsed_param::<u32>("bad", "a count")
                .unwrap_err()
                .to_string()
                .contains("expected a count")
        );
        let unknown = url.check_params(&["t", "n"]).unwrap_err().to_string();
        assert!(
            unknown.contains("unknown parameter \"bad\"") && unknown.contains("t, n"),
            "{unknown}"
        );
    }
}
