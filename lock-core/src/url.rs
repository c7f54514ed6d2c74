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
//!
//! A backend declares its parameters as a struct deriving [`serde::Deserialize`] with
//! `#[serde(deny_unknown_fields)]` and reads them with [`LockUrl::query`]: values are parsed
//! by type (numbers, `true`/`false`, enum variants by their serde names ignoring ASCII case,
//! durations with [`duration`]), and every error names the parameter, the scheme and what
//! was expected; an unknown parameter's error lists the known ones. The struct is best the
//! configuration itself (its fields that are not parameters `#[serde(skip)]`), so that a
//! parameter is declared once, where it is documented; a configuration made of several
//! structs reads them all with [`LockUrl::query_parts`].

use std::fmt;

use percent_encoding::percent_decode_str;
use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};

use crate::LockError;

mod password;

pub use password::{
    PASSWORD_FILE, holds_password, password_file_param, password_given_twice, read_password_file,
    with_password, without_password,
};

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
/// assert_eq!(url.params, [("session_timeout".to_owned(), "10s".to_owned())]);
/// # Ok::<(), lock_core::LockError>(())
/// ```
///
/// Typed parameters, with their defaults:
///
/// ```
/// use std::time::Duration;
/// use lock_core::url::{LockUrl, duration};
///
/// #[derive(Debug, serde::Deserialize)]
/// #[serde(default, deny_unknown_fields)]
/// struct Params {
///     #[serde(with = "duration")]
///     session_timeout: Duration,
///     retries: u32,
/// }
///
/// impl Default for Params {
///     fn default() -> Self {
///         Params { session_timeout: Duration::from_secs(10), retries: 3 }
///     }
/// }
///
/// let params: Params = LockUrl::parse("zk://h?session_timeout=6s")?.query()?;
/// assert_eq!((params.session_timeout, params.retries), (Duration::from_secs(6), 3));
/// let e = LockUrl::parse("zk://h?retry=1")?.query::<Params>().unwrap_err();
/// assert!(e.to_string().contains(r#"unknown parameter "retry" for zk:// (known: session_timeout, retries)"#));
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
        let (userinfo, rest) = password::split_user_info(rest);
        let (before_query, query) = match rest.split_once('?') {
            Some((before, query)) => (before, Some(query)),
            None => (rest, None),
        };
        let (host_list, path) = match before_query.find('/') {
            Some(slash) => (&before_query[..slash], &before_query[slash..]),
            None => (before_query, ""),
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
        let mut params = match query {
            None => Vec::new(),
            Some(query) => parse_query(query)?,
        };
        let password = match params.iter().position(|(key, _)| key == PASSWORD_FILE) {
            Some(_) if password.is_some() => return Err(password_given_twice()),
            Some(at) => Some(read_password_file(&params.remove(at).1)?),
            None => password,
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

    /// The query parameters deserialised into `T`, typically a struct with
    /// `#[serde(default, deny_unknown_fields)]` (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the scheme and the parameter: an unknown one (listing
    /// the known ones), or a value that does not parse (saying what was expected).
    pub fn query<T: DeserializeOwned>(&self) -> Result<T, LockError> {
        self.read(|_| true)
    }

    /// The query parameters of a configuration made of several structs, each with
    /// `#[serde(default, deny_unknown_fields)]`: every struct of the tuple `T` (of two to
    /// four) reads the parameters that are its fields, and a parameter no struct knows is
    /// an error listing them all.
    ///
    /// ```
    /// use lock_core::url::LockUrl;
    ///
    /// #[derive(serde::Deserialize, Default)]
    /// #[serde(default, deny_unknown_fields)]
    /// struct Lease { ttl: u32 }
    ///
    /// #[derive(serde::Deserialize, Default)]
    /// #[serde(default, deny_unknown_fields)]
    /// struct Waiting { retries: u32 }
    ///
    /// let url = LockUrl::parse("x://h?ttl=30&retries=2")?;
    /// let (lease, waiting): (Lease, Waiting) = url.query_parts()?;
    /// assert_eq!((lease.ttl, waiting.retries), (30, 2));
    /// let url = LockUrl::parse("x://h?tll=30")?;
    /// let e = url.query_parts::<(Lease, Waiting)>().err().unwrap().to_string();
    /// assert!(e.contains(r#"unknown parameter "tll" for x:// (known: ttl, retries)"#), "{e}");
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`query`](Self::query).
    pub fn query_parts<T: QueryParts>(&self) -> Result<T, LockError> {
        T::read(self)
    }

    /// `T` from the parameters whose keys `take` accepts.
    fn read<T: DeserializeOwned>(&self, take: impl Fn(&str) -> bool) -> Result<T, LockError> {
        let params: Vec<_> = self.params.iter().filter(|(k, _)| take(k)).collect();
        let query = Query {
            scheme: &self.scheme,
            params: params.into_iter(),
            current: None,
        };
        T::deserialize(query).map_err(|e| match e {
            QueryError::Unknown { key, known } => {
                bad(unknown_parameter(&key, &self.scheme, &known))
            }
            QueryError::Message(message) => bad(message),
        })
    }
}

/// The parameters a struct with `#[serde(deny_unknown_fields)]` reads, in the order of its
/// fields (serde names them in the error for a key that is none of them); empty for a
/// struct that accepts unknown keys.
///
/// ```
/// #[derive(serde::Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct Params {
///     ttl: u32,
///     #[serde(rename = "prefix")]
///     key_prefix: String,
///     #[serde(skip)]
///     hosts: Vec<String>,
/// }
///
/// assert_eq!(lock_core::url::parameter_names::<Params>(), ["ttl", "prefix"]);
/// ```
pub fn parameter_names<T: DeserializeOwned>() -> Vec<&'static str> {
    let probe = [("\u{0}".to_owned(), String::new())];
    let query = Query {
        scheme: "",
        params: probe.iter().collect::<Vec<_>>().into_iter(),
        current: None,
    };
    match T::deserialize(query) {
        Err(QueryError::Unknown { known, .. }) => known,
        _ => Vec::new(),
    }
}

/// A tuple of parameter structs that [`LockUrl::query_parts`] reads from one URL.
pub trait QueryParts: Sized {
    /// Reads every struct of the tuple from `url`'s parameters.
    ///
    /// # Errors
    ///
    /// As [`LockUrl::query_parts`].
    fn read(url: &LockUrl) -> Result<Self, LockError>;
}

macro_rules! query_parts {
    ($($part:ident),+) => {
        impl<$($part: DeserializeOwned),+> QueryParts for ($($part,)+) {
            fn read(url: &LockUrl) -> Result<Self, LockError> {
                let mut known: Vec<&'static str> = Vec::new();
                $(
                    #[allow(non_snake_case)]
                    let $part = parameter_names::<$part>();
                    known.extend($part.iter().filter(|name| !known.contains(name)).collect::<Vec<_>>());
                )+
                if let Some((key, _)) = url.params.iter().find(|(k, _)| !known.contains(&k.as_str())) {
                    return Err(bad(unknown_parameter(key, &url.scheme, &known)));
                }
                Ok(($(url.read(|key| $part.contains(&key))?,)+))
            }
        }
    };
}

query_parts!(A, B);
query_parts!(A, B, C);
query_parts!(A, B, C, D);

/// The error message for parameter `key`, not among the `known` ones of `scheme`.
fn unknown_parameter(key: &str, scheme: &str, known: &[&str]) -> String {
    let known = match known {
        [] => "none".to_owned(),
        known => known.join(", "),
    };
    format!("unknown parameter {key:?} for {scheme}:// (known: {known})")
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

/// A parameter's value as written in a query: `+` for a space, percent-encoded.
fn decode_value(raw: &str) -> Result<String, LockError> {
    decode(&raw.replace('+', " "), "parameter value")
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
        let value = decode_value(value)?;
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

/// Serde helpers for a [`Duration`](std::time::Duration) written as in `10s`, `500ms` or
/// `1m 30s` (humantime's format): `#[serde(with = "lock_core::url::duration")]`.
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Writes `duration` as humantime text, such as `1m 30s`.
    ///
    /// # Errors
    ///
    /// The serializer's.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&humantime::format_duration(*duration))
    }

    /// Reads humantime text, such as `10s` or `500ms`.
    ///
    /// # Errors
    ///
    /// A text that is not a duration, saying so.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map_err(|e| {
            D::Error::custom(format_args!("not a duration such as 10s or 500ms ({e})"))
        })
    }
}

/// Defines a fieldless enum written in URLs by the given names: one `#[serde(rename)]` per
/// variant, `as_str` (the name), `Display` (the same) and `FromStr` (through serde, ignoring
/// ASCII case, with errors naming the parameter). The enum's own attributes, such as its
/// derives, are kept; `Serialize` and `Deserialize` are added, so the crate needs `serde`.
///
/// ```
/// lock_core::url_enum! {
///     /// How to wait.
///     #[derive(Debug, Clone, Copy, PartialEq, Eq)]
///     pub enum Waiting for "waiting" {
///         /// Poll.
///         Polling = "poll",
///         /// Be told.
///         Notified = "notify",
///     }
/// }
/// assert_eq!("NOTIFY".parse::<Waiting>()?, Waiting::Notified);
/// assert_eq!(Waiting::Polling.to_string(), "poll");
/// let e = "push".parse::<Waiting>().unwrap_err().to_string();
/// assert!(e.contains(r#"waiting "push": expected poll or notify"#), "{e}");
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[macro_export]
macro_rules! url_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident for $param:literal {
            $($(#[$variant_meta:meta])* $variant:ident = $value:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(::serde::Serialize, ::serde::Deserialize)]
        $vis enum $name {
            $($(#[$variant_meta])* #[serde(rename = $value)] $variant,)*
        }

        impl $name {
            /// The value used in URLs and by serde.
            $vis fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $value,)*
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::LockError;

            /// Parses a URL value, ignoring ASCII case.
            fn from_str(s: &str) -> ::std::result::Result<Self, $crate::LockError> {
                $crate::url::parse_value($param, s)
            }
        }
    };
}

/// Builder methods that each set one field of a configuration and return it, all
/// `#[must_use]`: `METHOD(ARG: TYPE) => FIELD = VALUE;` after each method's docs.
///
/// ```
/// #[derive(Debug, Default)]
/// pub struct Config {
///     /// The name.
///     pub name: String,
///     /// The retries.
///     pub retries: Option<u32>,
/// }
///
/// lock_core::setters! { Config {
///     /// Sets the name.
///     with_name(name: impl Into<String>) => name = name.into();
///     /// Sets the retries.
///     with_retries(count: u32) => retries = Some(count);
/// }}
///
/// let config = Config::default().with_name("a").with_retries(3);
/// assert_eq!((config.name.as_str(), config.retries), ("a", Some(3)));
/// ```
#[macro_export]
macro_rules! setters {
    ($ty:ty { $($(#[$meta:meta])* $method:ident($arg:ident: $arg_ty:ty) => $field:ident = $value:expr;)* }) => {
        impl $ty {
            $(
                $(#[$meta])*
                #[must_use]
                pub fn $method(mut self, $arg: $arg_ty) -> Self {
                    self.$field = $value;
                    self
                }
            )*
        }
    };
}

/// `a, b or c`.
fn one_of(names: &[&str]) -> String {
    match names {
        [] => "nothing".to_owned(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// An error inside [`LockUrl::query`], before the scheme is added.
#[derive(Debug)]
enum QueryError {
    /// A parameter that is not a field, and the fields.
    Unknown {
        key: String,
        known: Vec<&'static str>,
    },
    /// Anything else.
    Message(String),
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueryError::Unknown { key, known } => {
                write!(f, "unknown parameter {key:?} (known: {known:?})")
            }
            QueryError::Message(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for QueryError {}

impl de::Error for QueryError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        QueryError::Message(message.to_string())
    }

    fn invalid_type(_: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        QueryError::Message(format!("expected {expected}"))
    }

    fn invalid_value(_: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        QueryError::Message(format!("expected {expected}"))
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        QueryError::Message(format!("expected {}", one_of(expected)))
    }

    fn unknown_field(key: &str, expected: &'static [&'static str]) -> Self {
        QueryError::Unknown {
            key: key.to_owned(),
            known: expected.to_vec(),
        }
    }
}

/// The parameters of a URL (or some of them) as a map, for [`LockUrl::query`].
struct Query<'a> {
    scheme: &'a str,
    params: std::vec::IntoIter<&'a (String, String)>,
    /// The parameter whose value is next.
    current: Option<&'a (String, String)>,
}

impl<'de> de::Deserializer<'de> for Query<'_> {
    type Error = QueryError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_map(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de> de::MapAccess<'de> for Query<'_> {
    type Error = QueryError;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, QueryError> {
        self.current = self.params.next();
        match self.current {
            None => Ok(None),
            Some((key, _)) => seed.deserialize(key.as_str().into_deserializer()).map(Some),
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, QueryError> {
        let Some((key, value)) = self.current else {
            return Err(QueryError::Message(
                "a value without a parameter".to_owned(),
            ));
        };
        seed.deserialize(Value(value)).map_err(|e| {
            QueryError::Message(format!(
                "parameter {key}={value:?} for {}://: {e}",
                self.scheme
            ))
        })
    }
}

/// One parameter value, parsed by the type asked for.
struct Value<'a>(&'a str);

impl Value<'_> {
    /// The value parsed with `FromStr`, or an error saying what was `expected`.
    fn parse<T: std::str::FromStr>(
        &self,
        expected: impl FnOnce() -> String,
    ) -> Result<T, QueryError> {
        self.0
            .parse()
            .map_err(|_| QueryError::Message(format!("expected {}", expected())))
    }
}

/// `deserialize_*` methods for numbers, parsed with `FromStr`.
macro_rules! numbers {
    ($($method:ident $visit:ident $ty:ty, $expected:expr;)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
            visitor.$visit(self.parse::<$ty>(|| $expected.into())?)
        }
    )*};
}

/// The expectation for an integer type.
fn whole(min: impl fmt::Display, max: impl fmt::Display) -> String {
    format!("a whole number from {min} to {max}")
}

impl<'de> de::Deserializer<'de> for Value<'_> {
    type Error = QueryError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_str(self.0)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_bool(self.parse(|| "true or false".into())?)
    }

    numbers! {
        deserialize_u8 visit_u8 u8, whole(0, u8::MAX);
        deserialize_u16 visit_u16 u16, whole(0, u16::MAX);
        deserialize_u32 visit_u32 u32, whole(0, u32::MAX);
        deserialize_u64 visit_u64 u64, whole(0, u64::MAX);
        deserialize_i8 visit_i8 i8, whole(i8::MIN, i8::MAX);
        deserialize_i16 visit_i16 i16, whole(i16::MIN, i16::MAX);
        deserialize_i32 visit_i32 i32, whole(i32::MIN, i32::MAX);
        deserialize_i64 visit_i64 i64, whole(i64::MIN, i64::MAX);
        deserialize_f32 visit_f32 f32, "a number";
        deserialize_f64 visit_f64 f64, "a number";
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, QueryError> {
        visitor.visit_newtype_struct(self)
    }

    /// A unit variant by its serde name or alias (serde lists both), ignoring ASCII case.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, QueryError> {
        match variants.iter().find(|v| v.eq_ignore_ascii_case(self.0)) {
            Some(variant) => visitor.visit_enum((*variant).into_deserializer()),
            None => Err(de::Error::unknown_variant(self.0, variants)),
        }
    }

    serde::forward_to_deserialize_any! {
        i128 u128 char str string bytes byte_buf unit unit_struct seq tuple tuple_struct map
        struct identifier ignored_any
    }
}

/// Parses `value` as the value of parameter `key` would be parsed by [`LockUrl::query`]
/// (enum variants by their serde names ignoring ASCII case): for `FromStr` impls.
///
/// ```
/// #[derive(Debug, PartialEq, serde::Deserialize)]
/// #[serde(rename_all = "lowercase")]
/// enum Mode { Fast, Safe }
///
/// assert_eq!(lock_core::url::parse_value::<Mode>("mode", "SAFE")?, Mode::Safe);
/// let e = lock_core::url::parse_value::<Mode>("mode", "slow").unwrap_err();
/// assert!(e.to_string().contains(r#"mode "slow": expected fast or safe"#), "{e}");
/// # Ok::<(), lock_core::LockError>(())
/// ```
///
/// # Errors
///
/// [`LockError::Config`] naming `key` and the value, and saying what was expected.
pub fn parse_value<T: DeserializeOwned>(key: &str, value: &str) -> Result<T, LockError> {
    T::deserialize(Value(value))
        .map_err(|e| LockError::config(format!("invalid {key} {value:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn err(url: &str) -> String {
        LockUrl::parse(url).unwrap_err().to_string()
    }

    #[test]
    fn a_password_from_a_file() {
        let dir = std::env::temp_dir().join(format!("distlock-url-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let (secret, empty) = (file("secret", "pa ss\r\nnext\n"), file("empty", "\n"));
        let url = LockUrl::parse(&format!("zk://u@h?password_file={secret}&a=1")).unwrap();
        assert_eq!(url.password.as_deref(), Some("pa ss"));
        assert_eq!(url.params, [("a".to_owned(), "1".to_owned())]);
        for (url, part) in [
            (format!("zk://u:x@h?password_file={secret}"), "twice"),
            (
                format!("zk://u@h?password_file={empty}"),
                "holds no password",
            ),
            (
                "zk://u@h?password_file=/nonexistent/f".to_owned(),
                "/nonexistent/f",
            ),
        ] {
            let error = err(&url);
            assert!(error.contains(part), "{url}: {error}");
            assert!(!error.contains("pa ss"), "{error}");
        }
        assert!(holds_password("redis://:p@h") && holds_password("zk://u:p@h1,h2/x"));
        assert!(!holds_password("zk://u@h/x:y") && !holds_password("zk://h?a=b@c:d"));
        assert!(with_password("zk://u:x@h", "y").is_err());
        assert_eq!(
            with_password("redis://h:6379/2", "p").unwrap(),
            "redis://:p@h:6379/2"
        );
        std::fs::remove_dir_all(dir).unwrap();
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
        assert_eq!(url.params[1], ("b".to_owned(), "x y".to_owned()));
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

    #[derive(Debug, PartialEq, serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    enum Mode {
        Fast,
        #[serde(rename = "safe")]
        VerySafe,
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Params {
        #[serde(default, with = "duration")]
        ttl: Duration,
        count: Option<u32>,
        ratio: Option<f64>,
        tls: Option<bool>,
        mode: Option<Mode>,
        name: Option<String>,
    }

    fn query(url: &str) -> Result<Params, String> {
        LockUrl::parse(url)
            .unwrap()
            .query()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn query_parses_by_type() {
        let params =
            query("x://h?ttl=1m+30s&count=3&ratio=0.5&tls=true&mode=SAFE&name=a%26b").unwrap();
        assert_eq!(
            params,
            Params {
                ttl: Duration::from_secs(90),
                count: Some(3),
                ratio: Some(0.5),
                tls: Some(true),
                mode: Some(Mode::VerySafe),
                name: Some("a&b".to_owned()),
            }
        );
        let params = query("x://h?mode=fast").unwrap();
        assert_eq!(
            (params.ttl, params.mode),
            (Duration::ZERO, Some(Mode::Fast))
        );
    }

    #[test]
    fn query_errors_name_the_scheme_and_the_parameter() {
        for (url, expected) in [
            (
                "zk://h?cuont=1",
                r#"unknown parameter "cuont" for zk:// (known: ttl, count, ratio, tls, mode, name)"#,
            ),
            (
                "x://h?ttl=soon",
                r#"parameter ttl="soon" for x://: not a duration such as 10s"#,
            ),
            (
                "x://h?count=-1",
                r#"parameter count="-1" for x://: expected a whole number from 0 to 4294967295"#,
            ),
            (
                "x://h?ratio=lots",
                r#"parameter ratio="lots" for x://: expected a number"#,
            ),
            (
                "x://h?tls=yes",
                r#"parameter tls="yes" for x://: expected true or false"#,
            ),
            (
                "x://h?mode=slow",
                r#"parameter mode="slow" for x://: expected fast or safe"#,
            ),
        ] {
            let e = query(url).unwrap_err();
            assert!(e.contains("invalid connection URL: "), "{url}: {e}");
            assert!(e.contains(expected), "{url}: {e}");
        }
    }

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Lease {
        #[serde(with = "duration")]
        ttl: Duration,
        mode: Option<Mode>,
    }

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Login {
        tls: bool,
        mode: Option<Mode>,
    }

    #[test]
    fn query_parts_give_each_struct_its_own_parameters() {
        let url = LockUrl::parse("x://h?count=2&tls=true&mode=fast&ttl=2s").unwrap();
        let (lease, login, params): (Lease, Login, Params) = url.query_parts().unwrap();
        assert_eq!(lease.ttl, Duration::from_secs(2));
        // A parameter that two structs declare is read by both.
        assert_eq!(
            (lease.mode, login.mode),
            (Some(Mode::Fast), Some(Mode::Fast))
        );
        assert_eq!(
            (login.tls, params.count, params.tls),
            (true, Some(2), Some(true))
        );
        let (lease, login): (Lease, Login) =
            LockUrl::parse("x://h").unwrap().query_parts().unwrap();
        assert_eq!((lease, login), (Lease::default(), Login::default()));
        let parts = |url: &str| {
            let url = LockUrl::parse(url).unwrap();
            url.query_parts::<(Lease, Login)>().unwrap_err().to_string()
        };
        let e = parts("x://h?tls=true&count=1");
        assert!(
            e.contains(r#"unknown parameter "count" for x:// (known: ttl, mode, tls)"#),
            "{e}"
        );
        let e = parts("x://h?tls=maybe");
        assert!(
            e.contains(r#"parameter tls="maybe" for x://: expected true or false"#),
            "{e}"
        );
    }

    #[test]
    fn parse_value_uses_the_same_rules() {
        assert_eq!(parse_value::<Mode>("mode", "Fast").unwrap(), Mode::Fast);
        assert_eq!(parse_value::<u32>("n", "7").unwrap(), 7);
        let e = parse_value::<Mode>("mode", "x").unwrap_err().to_string();
        assert!(
            e.contains(r#"invalid mode "x": expected fast or safe"#),
            "{e}"
        );
        assert_eq!(one_of(&["a"]), "a");
        assert_eq!(one_of(&["a", "b", "c"]), "a, b or c");
    }
}
