//! Passwords given apart from a URL, and URLs shown without theirs.
//!
//! A password is in a URL's user information (`user:password@`, which ends at the last `@`
//! before the query, so that a password with an unencoded `/` is still taken as one) or,
//! for libpq's URLs, in a `password` parameter.

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use super::{bad, decode_value, redact_guess};
use crate::LockError;

/// The parameter every scheme takes for a password kept out of the URL: the path of a file
/// whose first line is the password (see [`read_password_file`]).
/// [`LockUrl::parse`](super::LockUrl::parse) reads it and removes it from the parameters.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use lock_core::url::LockUrl;
///
/// let file = std::env::temp_dir().join(format!("distlock-doc-{}", std::process::id()));
/// std::fs::write(&file, "s3cret\n")?;
/// let url = LockUrl::parse(&format!("redis://app@h?password_file={}", file.display()))?;
/// assert_eq!(url.password.as_deref(), Some("s3cret"));
/// assert!(url.params.is_empty());
/// # std::fs::remove_file(file)?;
/// # Ok(()) }
/// ```
pub const PASSWORD_FILE: &str = "password_file";

/// The schemes whose URLs are libpq's: a password given apart goes in their `password`
/// parameter (libpq takes the operating system's user name when the URL names none, which
/// an empty user name before a password would override).
const LIBPQ_SCHEMES: [&str; 2] = ["postgres", "postgresql"];

/// The password in the file at `path`: its first line, without the line ending (a file
/// written with `echo` has one).
///
/// # Errors
///
/// [`LockError::Config`] naming the file when it cannot be read or its first line is empty;
/// never its content.
pub fn read_password_file(path: &str) -> Result<String, LockError> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| LockError::config(format!("the password file {path:?}: {error}")))?;
    match text.lines().next() {
        Some(password) if !password.is_empty() => Ok(password.to_owned()),
        _ => Err(LockError::config(format!(
            "the password file {path:?} holds no password on its first line"
        ))),
    }
}

/// The password of a [`PASSWORD_FILE`] parameter whose value is `raw`, as written in the
/// query (decoded as every parameter is), for a backend that reads its URL's query itself.
///
/// # Errors
///
/// As [`read_password_file`], and for a value that does not decode.
pub fn password_file_param(raw: &str) -> Result<String, LockError> {
    read_password_file(&decode_value(raw)?)
}

/// The error for a URL that gives a password twice, for a backend that reads its URL's
/// query itself.
pub fn password_given_twice() -> LockError {
    bad("the URL gives a password twice (in the URL and from a file, say); give it once")
}

/// `rest` (what follows `scheme://`) split into its user information, if any, and what
/// follows it.
pub(super) fn split_user_info(rest: &str) -> (Option<&str>, &str) {
    let head = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    match head.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

/// The query of `rest`, if any.
fn query(rest: &str) -> Option<&str> {
    rest.split_once('?').map(|(_, query)| query)
}

/// Whether a query's `key=value` pair is a `password` parameter.
fn is_password_pair(pair: &str) -> bool {
    let key = pair.split_once('=').map_or(pair, |(key, _)| key);
    percent_decode_str(key).decode_utf8_lossy() == "password"
}

/// Whether `url` holds a password: in its user information (`user:password@`), or in a
/// `password` parameter.
///
/// ```
/// use lock_core::url::holds_password;
/// assert!(holds_password("redis://:s3cret@h") && holds_password("zk://u:ab/cd@h1,h2/x"));
/// assert!(holds_password("postgres://h/db?sslmode=require&password=s3cret"));
/// assert!(!holds_password("zk://u@h/x:y") && !holds_password("zk://h?a=b@c:d"));
/// ```
pub fn holds_password(url: &str) -> bool {
    url.split_once("://").is_some_and(|(_, rest)| {
        let (user_info, rest) = split_user_info(rest);
        user_info.is_some_and(|info| info.contains(':'))
            || query(rest).is_some_and(|query| query.split('&').any(is_password_pair))
    })
}

/// `url` with `password` (percent-encoded) added, for a password given apart from the URL
/// (an environment variable, a file): in its user information, or for libpq's URLs
/// (`postgres://`) in a `password` parameter.
///
/// ```
/// use lock_core::url::with_password;
///
/// let url = with_password("zk://app@h1:2181,h2/apps?acl=auto", "p@ss:w/rd")?;
/// assert_eq!(url, "zk://app:p%40ss%3Aw%2Frd@h1:2181,h2/apps?acl=auto");
/// let parsed = lock_core::url::LockUrl::parse(&url)?;
/// assert_eq!(parsed.password.as_deref(), Some("p@ss:w/rd"));
/// assert_eq!(with_password("redis://h:6379/2", "pw")?, "redis://:pw@h:6379/2");
/// assert_eq!(with_password("postgres://h/db", "pw")?, "postgres://h/db?password=pw");
/// # Ok::<(), lock_core::LockError>(())
/// ```
///
/// # Errors
///
/// [`LockError::Config`] for a URL without a scheme, or one that holds a password already.
pub fn with_password(url: &str, password: &str) -> Result<String, LockError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(format!("{:?} has no scheme", redact_guess(url))));
    };
    if holds_password(url) {
        return Err(password_given_twice());
    }
    let password = utf8_percent_encode(password, NON_ALPHANUMERIC);
    if LIBPQ_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        let separator = if rest.contains('?') { '&' } else { '?' };
        return Ok(format!("{url}{separator}password={password}"));
    }
    let (user_info, rest) = split_user_info(rest);
    let user = user_info.unwrap_or_default();
    Ok(format!("{scheme}://{user}:{password}@{rest}"))
}

/// `url` with its password shown as `***` (in the user information and in a `password`
/// parameter), for printing a URL a user gave; anything else as it is.
///
/// ```
/// use lock_core::url::without_password;
/// assert_eq!(without_password("redis://app:s3cret@h:6379/1"), "redis://app:***@h:6379/1");
/// assert_eq!(without_password("postgres://h/db?password=s3cret&x=1"), "postgres://h/db?password=***&x=1");
/// assert_eq!(without_password("zk://h1,h2/app"), "zk://h1,h2/app");
/// assert_eq!(without_password("--json"), "--json");
/// ```
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://").filter(|_| holds_password(url)) else {
        return url.to_owned();
    };
    let (user_info, rest) = split_user_info(rest);
    let user_info = match user_info {
        Some(info) => match info.split_once(':') {
            Some((user, _)) => format!("{user}:***@"),
            None => format!("{info}@"),
        },
        None => String::new(),
    };
    let rest = match rest.split_once('?') {
        Some((before, query)) => {
            let pairs: Vec<&str> = query
                .split('&')
                .map(|pair| {
                    if is_password_pair(pair) {
                        "password=***"
                    } else {
                        pair
                    }
                })
                .collect();
            format!("{before}?{}", pairs.join("&"))
        }
        None => rest.to_owned(),
    };
    format!("{scheme}://{user_info}{rest}")
}
