//! Configuration of the ZooKeeper backend, and its connection URL.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lock_core::LockError;
use lock_core::url::LockUrl;

/// ZooKeeper's client port, used for hosts given without one.
const DEFAULT_PORT: u16 = 2181;
/// Longest accepted session and connect timeout.
const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// The URL parameters `zk://` understands.
const PARAMS: &[&str] = &[
    "session_timeout",
    "connect_timeout",
    "strategy",
    "root",
    "node_format",
    "acl",
];

fn config_error(message: impl fmt::Display) -> LockError {
    LockError::config(format!("zookeeper: {message}"))
}

/// How a ZooKeeper lock is taken and how its waiters wait.
///
/// All three are kept because the benchmark compares them; only
/// [`SequentialPredecessor`](ZkStrategy::SequentialPredecessor) is both herd-free and FIFO.
///
/// In a URL: `strategy=single`, `strategy=children` or `strategy=predecessor`.
///
/// ```
/// use lock_zookeeper::ZkStrategy;
/// assert_eq!("children".parse::<ZkStrategy>()?, ZkStrategy::SequentialChildren);
/// assert_eq!(ZkStrategy::default().to_string(), "predecessor");
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ZkStrategy {
    /// The naive lock: one ephemeral node `{dir}/lock`; whoever creates it holds the lock,
    /// and every waiter retries when it is deleted (a herd by design; not FIFO).
    SingleNode,
    /// Ephemeral sequential nodes; every waiter watches the directory's children and re-lists
    /// on every change (FIFO, but a herd).
    SequentialChildren,
    /// Ephemeral sequential nodes; each waiter watches only its immediate predecessor, and
    /// its own node (FIFO and herd-free). A waiter that only its predecessor kept out holds
    /// the moment the predecessor's node is deleted, without listing the directory again;
    /// any other wake-up lists again. The default.
    #[default]
    SequentialPredecessor,
}

impl ZkStrategy {
    /// The value used in URLs: `single`, `children` or `predecessor`.
    pub fn as_str(self) -> &'static str {
        match self {
            ZkStrategy::SingleNode => "single",
            ZkStrategy::SequentialChildren => "children",
            ZkStrategy::SequentialPredecessor => "predecessor",
        }
    }
}

impl fmt::Display for ZkStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ZkStrategy {
    type Err = LockError;

    /// Parses a URL value, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            ZkStrategy::SingleNode,
            ZkStrategy::SequentialChildren,
            ZkStrategy::SequentialPredecessor,
        ]
        .into_iter()
        .find(|v| v.as_str().eq_ignore_ascii_case(s))
        .ok_or_else(|| {
            config_error(format!(
                "unknown strategy {s:?} (expected single, children or predecessor)"
            ))
        })
    }
}

/// The names given to the sequential lock nodes distlock creates.
///
/// Whatever the format, every child of a lock directory whose name ends in a sequence number
/// counts as a contender, so Curator, kazoo and distlock clients exclude each other on one
/// path either way; the format only decides what the other clients' tools will show.
///
/// In a URL: `node_format=curator` or `node_format=kazoo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum NodeNameFormat {
    /// Curator's protected format, `_c_<uuid>-lock-<seq>`. The default.
    #[default]
    Curator,
    /// kazoo's format, `<hex32>__lock__<seq>`.
    Kazoo,
}

impl NodeNameFormat {
    /// The value used in URLs: `curator` or `kazoo`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeNameFormat::Curator => "curator",
            NodeNameFormat::Kazoo => "kazoo",
        }
    }
}

impl fmt::Display for NodeNameFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NodeNameFormat {
    type Err = LockError;

    /// Parses a URL value, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [NodeNameFormat::Curator, NodeNameFormat::Kazoo]
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                config_error(format!(
                    "unknown node_format {s:?} (expected curator or kazoo)"
                ))
            })
    }
}

/// The ACL put on the nodes distlock creates.
///
/// In a URL: `acl=open` or `acl=creator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AclPolicy {
    /// `world:anyone` with all permissions (ZooKeeper's `OPEN_ACL_UNSAFE`). The default.
    #[default]
    Open,
    /// `auth` with all permissions (ZooKeeper's `CREATOR_ALL_ACL`): only clients
    /// authenticated as the creator can read, change or delete the nodes. Requires
    /// [digest authentication](DigestAuth).
    CreatorAll,
}

impl AclPolicy {
    /// The value used in URLs: `open` or `creator`.
    pub fn as_str(self) -> &'static str {
        match self {
            AclPolicy::Open => "open",
            AclPolicy::CreatorAll => "creator",
        }
    }
}

impl fmt::Display for AclPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AclPolicy {
    type Err = LockError;

    /// Parses a URL value, ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [AclPolicy::Open, AclPolicy::CreatorAll]
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| config_error(format!("unknown acl {s:?} (expected open or creator)")))
    }
}

/// Credentials for ZooKeeper's `digest` authentication scheme.
///
/// `Debug` shows the user but never the password.
///
/// ```
/// use lock_zookeeper::DigestAuth;
/// let auth = DigestAuth::new("app", "s3cret");
/// assert!(!format!("{auth:?}").contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct DigestAuth {
    /// The user name; it must not contain `:`.
    pub user: String,
    /// The password.
    pub password: String,
}

impl DigestAuth {
    /// Credentials for `user` with `password`.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        DigestAuth {
            user: user.into(),
            password: password.into(),
        }
    }

    fn validate(&self) -> Result<(), LockError> {
        if self.user.is_empty() {
            return Err(config_error("the digest auth user name is empty"));
        }
        if self.user.contains(':') || self.user.chars().any(char::is_control) {
            return Err(config_error(
                "the digest auth user name must not contain ':' or control characters",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for DigestAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DigestAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How to reach a ZooKeeper ensemble and how to lock on it.
///
/// Build one with [`ZkConfig::new`] and the `with_*` setters, or from a URL with
/// [`ZkConfig::from_url`]. The setters do not check their arguments; [`ZkConfig::validate`]
/// does (and `from_url` calls it).
///
/// ```
/// use std::time::Duration;
/// use lock_zookeeper::{AclPolicy, DigestAuth, ZkConfig};
///
/// let config = ZkConfig::new(["zk1:2181", "zk2:2181"])
///     .with_chroot("/apps")
///     .with_session_timeout(Duration::from_secs(6))
///     .with_auth(DigestAuth::new("app", "s3cret"))
///     .with_acl(AclPolicy::CreatorAll);
/// config.validate()?;
/// assert_eq!(config.connect_string(), "zk1:2181,zk2:2181/apps");
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkConfig {
    /// The ensemble's servers as `host:port` (IPv6 hosts in brackets); at least one.
    pub hosts: Vec<String>,
    /// A chroot applied to every path (e.g. `/apps`), or `None`.
    pub chroot: Option<String>,
    /// The session timeout requested from the server (the server may negotiate it into its
    /// own bounds); it bounds how long a crashed client's locks stay held. Default 10 s.
    pub session_timeout: Duration,
    /// How long to wait for the first connection to the ensemble. Default 5 s.
    pub connect_timeout: Duration,
    /// The parent of every lock directory: the lock called `N` lives in `{root}/{N}`.
    /// Default `/distlock`.
    pub root: String,
    /// How locks are taken and waited for. Default [`ZkStrategy::SequentialPredecessor`].
    pub strategy: ZkStrategy,
    /// The names of the nodes distlock creates. Default [`NodeNameFormat::Curator`].
    pub node_format: NodeNameFormat,
    /// The ACL of the nodes distlock creates. Default [`AclPolicy::Open`].
    pub acl: AclPolicy,
    /// Digest credentials added to the session, if any.
    pub auth: Option<DigestAuth>,
}

impl ZkConfig {
    /// The default session timeout, 10 s.
    pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
    /// The default connect timeout, 5 s.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default root, `/distlock`.
    pub const DEFAULT_ROOT: &'static str = "/distlock";

    /// A configuration for the given `host:port` servers with every other setting at its
    /// default.
    pub fn new<I, S>(hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ZkConfig {
            hosts: hosts.into_iter().map(Into::into).collect(),
            chroot: None,
            session_timeout: Self::DEFAULT_SESSION_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            root: Self::DEFAULT_ROOT.to_owned(),
            strategy: ZkStrategy::default(),
            node_format: NodeNameFormat::default(),
            acl: AclPolicy::default(),
            auth: None,
        }
    }

    /// Sets the chroot; `""` and `"/"` mean none.
    #[must_use]
    pub fn with_chroot(mut self, chroot: impl Into<String>) -> Self {
        let chroot = chroot.into();
        self.chroot = (!chroot.is_empty() && chroot != "/").then_some(chroot);
        self
    }

    /// Sets the session timeout.
    #[must_use]
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets the connect timeout.
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the root under which lock directories are created.
    #[must_use]
    pub fn with_root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Sets the strategy.
    #[must_use]
    pub fn with_strategy(mut self, strategy: ZkStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Sets the node name format.
    #[must_use]
    pub fn with_node_format(mut self, format: NodeNameFormat) -> Self {
        self.node_format = format;
        self
    }

    /// Sets the ACL policy.
    #[must_use]
    pub fn with_acl(mut self, acl: AclPolicy) -> Self {
        self.acl = acl;
        self
    }

    /// Sets the digest credentials.
    #[must_use]
    pub fn with_auth(mut self, auth: DigestAuth) -> Self {
        self.auth = Some(auth);
        self
    }

    /// The connect string ZooKeeper clients take: `host:port,host:port[/chroot]`.
    pub fn connect_string(&self) -> String {
        let mut s = self.hosts.join(",");
        if let Some(chroot) = &self.chroot {
            s.push_str(chroot);
        }
        s
    }

    /// Parses a `zk://` (or `zookeeper://`) connection URL and [validates](Self::validate)
    /// the result.
    ///
    /// ```text
    /// zk://[user:password@]host1[:port1],host2[:port2][/chroot]?session_timeout=10s
    ///     &connect_timeout=5s&strategy=predecessor&root=/distlock&node_format=curator&acl=open
    /// ```
    ///
    /// | part | meaning | default |
    /// |---|---|---|
    /// | `user:password@` | digest credentials added to the session | none |
    /// | hosts | the ensemble, comma-separated, IPv6 in brackets | port 2181 |
    /// | `/chroot` | chroot of every path; empty or `/` for none | none |
    /// | `session_timeout` | requested session timeout, more than 0 and at most 1 h | `10s` |
    /// | `connect_timeout` | first-connection timeout, more than 0 and at most 1 h | `5s` |
    /// | `strategy` | `single`, `children` or `predecessor` ([`ZkStrategy`]) | `predecessor` |
    /// | `root` | parent of the lock directories | `/distlock` |
    /// | `node_format` | `curator` or `kazoo` ([`NodeNameFormat`]) | `curator` |
    /// | `acl` | `open` or `creator` ([`AclPolicy`]; `creator` needs credentials) | `open` |
    ///
    /// User, password, chroot and parameter values are percent-decoded.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_zookeeper::{AclPolicy, ZkConfig};
    ///
    /// let config = ZkConfig::from_url(
    ///     "zk://app:s3cret@zk1,zk2:2182/apps?session_timeout=6s&acl=creator",
    /// )?;
    /// assert_eq!(config.hosts, ["zk1:2181", "zk2:2182"]);
    /// assert_eq!(config.session_timeout, Duration::from_secs(6));
    /// assert_eq!(config.acl, AclPolicy::CreatorAll);
    /// assert_eq!(config.auth.as_ref().map(|a| a.user.as_str()), Some("app"));
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the bad part (never repeating the password): another
    /// scheme, a malformed URL, no host, a user without a password or the reverse, an
    /// invalid chroot or root, an unknown parameter or value, a timeout out of range,
    /// `acl=creator` without credentials.
    pub fn from_url(url: &str) -> Result<ZkConfig, LockError> {
        let url = LockUrl::parse(url)?;
        if url.scheme != "zk" && url.scheme != "zookeeper" {
            return Err(config_error(format!(
                "the URL scheme is {:?}; expected zk:// or zookeeper://",
                url.scheme
            )));
        }
        url.check_params(PARAMS)?;
        if url.hosts.is_empty() {
            return Err(config_error(
                "the URL names no host; expected zk://host[:port][,host[:port]...]",
            ));
        }
        let mut config = ZkConfig::new(url.hosts.iter().map(|h| h.to_address(DEFAULT_PORT)))
            .with_chroot(url.path.as_str());
        config.auth = match (&url.username, &url.password) {
            (None, None) => None,
            (Some(user), Some(password)) => Some(DigestAuth::new(user, password)),
            (Some(_), None) => {
                return Err(config_error(
                    "the URL has a user name but no password; digest auth needs user:password@",
                ));
            }
            (None, Some(_)) => {
                return Err(config_error(
                    "the URL has a password but no user name; digest auth needs user:password@",
                ));
            }
        };
        if let Some(timeout) = url.duration_param("session_timeout")? {
            config.session_timeout = timeout;
        }
        if let Some(timeout) = url.duration_param("connect_timeout")? {
            config.connect_timeout = timeout;
        }
        if let Some(root) = url.param("root") {
            config.root = root.to_owned();
        }
        if let Some(strategy) = url.param("strategy") {
            config.strategy = strategy.parse()?;
        }
        if let Some(format) = url.param("node_format") {
            config.node_format = format.parse()?;
        }
        if let Some(acl) = url.param("acl") {
            config.acl = acl.parse()?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming the bad setting: no host, an empty or malformed host,
    /// an invalid chroot or root, a path under ZooKeeper's reserved `/zookeeper`, a timeout
    /// of zero or over one hour, [`AclPolicy::CreatorAll`] without credentials, a user
    /// name that is empty or contains `:`.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.hosts.is_empty() {
            return Err(config_error("at least one host is required"));
        }
        for host in &self.hosts {
            if host.is_empty()
                || host
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == ',' || c == '/')
            {
                return Err(config_error(format!(
                    "host {host:?} is not a host:port address"
                )));
            }
        }
        if let Some(chroot) = &self.chroot {
            check_path(chroot).map_err(|why| config_error(format!("chroot {chroot:?} {why}")))?;
        }
        check_path(&self.root)
            .map_err(|why| config_error(format!("root {:?} {why}", self.root)))?;
        let first_segment = self
            .chroot
            .as_deref()
            .unwrap_or(&self.root)
            .split('/')
            .nth(1);
        if first_segment == Some("zookeeper") {
            return Err(config_error(format!(
                "{} is under /zookeeper, which ZooKeeper reserves for itself",
                match &self.chroot {
                    Some(chroot) => format!("chroot {chroot:?}"),
                    None => format!("root {:?}", self.root),
                }
            )));
        }
        check_timeout("session_timeout", self.session_timeout)?;
        check_timeout("connect_timeout", self.connect_timeout)?;
        if let Some(auth) = &self.auth {
            auth.validate()?;
        }
        if self.acl == AclPolicy::CreatorAll && self.auth.is_none() {
            return Err(config_error(
                "acl=creator needs digest credentials (zk://user:password@hosts...)",
            ));
        }
        Ok(())
    }
}

fn check_timeout(name: &str, value: Duration) -> Result<(), LockError> {
    if value.is_zero() || value > MAX_TIMEOUT {
        return Err(config_error(format!(
            "{name} is {value:?}; it must be more than 0 and at most 1h"
        )));
    }
    Ok(())
}

/// Checks an absolute ZooKeeper path other than `/`; the error completes "path {p:?} …".
fn check_path(path: &str) -> Result<(), &'static str> {
    let Some(relative) = path.strip_prefix('/') else {
        return Err("must start with '/'");
    };
    if relative.is_empty() || relative.ends_with('/') {
        return Err("must not end with '/'");
    }
    for segment in relative.split('/') {
        match segment {
            "" => return Err("has an empty segment ('//')"),
            "." | ".." => return Err("has a '.' or '..' segment"),
            _ => {}
        }
        if segment.chars().any(forbidden_in_path) {
            return Err("contains a control or other character ZooKeeper forbids in paths");
        }
    }
    Ok(())
}

/// Characters ZooKeeper's `PathUtils.validatePath` rejects (besides surrogates, which a Rust
/// string cannot hold).
fn forbidden_in_path(c: char) -> bool {
    c.is_control()
        || ('\u{e000}'..='\u{f8ff}').contains(&c)
        || ('\u{fff0}'..='\u{ffff}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match ZkConfig::from_url(url) {
            Err(LockError::Config { message }) => message,
            other => panic!("expected a Config error for {url}, got {other:?}"),
        }
    }

    #[test]
    fn minimal_url_takes_every_default() {
        let config = ZkConfig::from_url("zk://localhost").unwrap();
        assert_eq!(config, ZkConfig::new(["localhost:2181"]));
        assert_eq!(config.chroot, None);
        assert_eq!(config.session_timeout, Duration::from_secs(10));
        assert_eq!(config.connect_timeout, Duration::from_secs(5));
        assert_eq!(config.root, "/distlock");
        assert_eq!(config.strategy, ZkStrategy::SequentialPredecessor);
        assert_eq!(config.node_format, NodeNameFormat::Curator);
        assert_eq!(config.acl, AclPolicy::Open);
        assert_eq!(config.auth, None);
        assert_eq!(config.connect_string(), "localhost:2181");
    }

    #[test]
    fn full_url() {
        let config = ZkConfig::from_url(
            "zookeeper://app:s%40cret@zk1:2182,zk2,[::1]:2183/apps/locks\
             ?session_timeout=30s&connect_timeout=1500ms&strategy=single&root=/my/locks\
             &node_format=kazoo&acl=creator",
        )
        .unwrap();
        assert_eq!(config.hosts, ["zk1:2182", "zk2:2181", "[::1]:2183"]);
        assert_eq!(config.chroot.as_deref(), Some("/apps/locks"));
        assert_eq!(config.session_timeout, Duration::from_secs(30));
        assert_eq!(config.connect_timeout, Duration::from_millis(1500));
        assert_eq!(config.root, "/my/locks");
        assert_eq!(config.strategy, ZkStrategy::SingleNode);
        assert_eq!(config.node_format, NodeNameFormat::Kazoo);
        assert_eq!(config.acl, AclPolicy::CreatorAll);
        assert_eq!(config.auth, Some(DigestAuth::new("app", "s@cret")));
        assert_eq!(
            config.connect_string(),
            "zk1:2182,zk2:2181,[::1]:2183/apps/locks"
        );
        let debug = format!("{config:?}");
        assert!(!debug.contains("s@cret"), "{debug}");
        assert!(debug.contains("app"), "{debug}");
    }

    #[test]
    fn each_strategy_format_and_acl_value() {
        for (value, strategy) in [
            ("single", ZkStrategy::SingleNode),
            ("children", ZkStrategy::SequentialChildren),
            ("predecessor", ZkStrategy::SequentialPredecessor),
            ("Predecessor", ZkStrategy::SequentialPredecessor),
        ] {
            let config = ZkConfig::from_url(&format!("zk://h?strategy={value}")).unwrap();
            assert_eq!(config.strategy, strategy);
            assert_eq!(strategy.to_string(), value.to_ascii_lowercase());
            assert_eq!(strategy.as_str().parse::<ZkStrategy>().unwrap(), strategy);
        }
        for (value, format) in [
            ("curator", NodeNameFormat::Curator),
            ("kazoo", NodeNameFormat::Kazoo),
        ] {
            let config = ZkConfig::from_url(&format!("zk://h?node_format={value}")).unwrap();
            assert_eq!(config.node_format, format);
            assert_eq!(format.to_string(), value);
            assert_eq!(value.parse::<NodeNameFormat>().unwrap(), format);
        }
        for (url, acl) in [
            ("zk://h?acl=open", AclPolicy::Open),
            ("zk://u:p@h?acl=creator", AclPolicy::CreatorAll),
        ] {
            assert_eq!(ZkConfig::from_url(url).unwrap().acl, acl);
            assert_eq!(acl.as_str().parse::<AclPolicy>().unwrap(), acl);
            assert_eq!(acl.to_string(), acl.as_str());
        }
    }

    #[test]
    fn chroot_forms() {
        assert_eq!(ZkConfig::from_url("zk://h/").unwrap().chroot, None);
        assert_eq!(ZkConfig::from_url("zk://h").unwrap().chroot, None);
        assert_eq!(
            ZkConfig::from_url("zk://h/a%20b")
                .unwrap()
                .chroot
                .as_deref(),
            Some("/a b")
        );
        assert_eq!(ZkConfig::new(["h:1"]).with_chroot("/").chroot, None);
        assert_eq!(ZkConfig::new(["h:1"]).with_chroot("").chroot, None);
        // A chroot may itself contain a segment called zookeeper below the top.
        assert!(ZkConfig::from_url("zk://h/app/zookeeper").is_ok());
        // With a chroot, the root is relative to it and may be /zookeeper.
        assert!(ZkConfig::from_url("zk://h/app?root=/zookeeper").is_ok());
    }

    #[test]
    fn credentials_with_open_acl_are_kept() {
        let config = ZkConfig::from_url("zk://u:@h").unwrap();
        assert_eq!(config.auth, Some(DigestAuth::new("u", "")));
        assert_eq!(config.acl, AclPolicy::Open);
    }

    #[test]
    fn wrong_scheme() {
        let e = err("redis://h");
        assert!(e.contains("\"redis\"") && e.contains("zk://"), "{e}");
    }

    #[test]
    fn malformed_url() {
        assert!(err("h1:2181").contains("no scheme"));
        assert!(err("zk://h1,,h2").contains("empty host"));
        assert!(err("zk://h1:99999").contains("port"));
    }

    #[test]
    fn no_host() {
        assert!(err("zk://").contains("no host"));
        assert!(err("zk:///chroot").contains("no host"));
    }

    #[test]
    fn half_credentials() {
        let e = err("zk://alice@h");
        assert!(e.contains("no password"), "{e}");
        let e = err("zk://:topsecret@h");
        assert!(
            e.contains("no user name") && !e.contains("topsecret"),
            "{e}"
        );
    }

    #[test]
    fn bad_user_name() {
        let e = err("zk://a%3Ab:topsecret@h");
        assert!(e.contains("':'") && !e.contains("topsecret"), "{e}");
    }

    #[test]
    fn bad_chroots() {
        for (url, why) in [
            ("zk://h/apps/", "must not end with '/'"),
            ("zk://h//apps", "empty segment"),
            ("zk://h/apps//x", "empty segment"),
            ("zk://h/apps/./x", "'.' or '..'"),
            ("zk://h/..", "'.' or '..'"),
            ("zk://h/a%01b", "control"),
            ("zk://h/a%EF%80%80", "forbids"),
            ("zk://h/zookeeper", "reserves"),
            ("zk://h/zookeeper/quota", "reserves"),
        ] {
            let e = err(url);
            assert!(e.contains("chroot") && e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn bad_roots() {
        for (root, why) in [
            ("distlock", "must start with '/'"),
            ("/", "must not end with '/'"),
            ("/distlock/", "must not end with '/'"),
            ("/a//b", "empty segment"),
            ("/a/../b", "'.' or '..'"),
            ("/a%7Fb", "control"),
            ("", "must start with '/'"),
            ("/zookeeper", "reserves"),
        ] {
            let e = err(&format!("zk://h?root={root}"));
            assert!(e.contains("root") && e.contains(why), "{root}: {e}");
        }
    }

    #[test]
    fn timeouts_out_of_range() {
        for param in ["session_timeout", "connect_timeout"] {
            for value in ["0s", "0ms", "61m", "2h"] {
                let e = err(&format!("zk://h?{param}={value}"));
                assert!(e.contains(param) && e.contains("at most 1h"), "{e}");
            }
            assert!(ZkConfig::from_url(&format!("zk://h?{param}=1h")).is_ok());
            assert!(ZkConfig::from_url(&format!("zk://h?{param}=1ms")).is_ok());
            let e = err(&format!("zk://h?{param}=soon"));
            assert!(e.contains(param) && e.contains("not a duration"), "{e}");
        }
    }

    #[test]
    fn bad_enum_values() {
        let e = err("zk://h?strategy=fast");
        assert!(
            e.contains("strategy") && e.contains("\"fast\"") && e.contains("predecessor"),
            "{e}"
        );
        let e = err("zk://h?node_format=zk");
        assert!(e.contains("node_format") && e.contains("kazoo"), "{e}");
        let e = err("zk://h?acl=closed");
        assert!(e.contains("acl") && e.contains("creator"), "{e}");
    }

    #[test]
    fn creator_acl_needs_credentials() {
        let e = err("zk://h?acl=creator");
        assert!(
            e.contains("acl=creator") && e.contains("credentials"),
            "{e}"
        );
        let config = ZkConfig::new(["h:2181"]).with_acl(AclPolicy::CreatorAll);
        assert!(config.validate().is_err());
        assert!(
            config
                .with_auth(DigestAuth::new("u", "p"))
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn unknown_parameter() {
        let e = err("zk://h?sesion_timeout=5s");
        assert!(e.contains("unknown parameter \"sesion_timeout\""), "{e}");
        assert!(e.contains("session_timeout"), "{e}");
    }

    #[test]
    fn no_error_repeats_the_password() {
        for url in [
            "zk://u:topsecret@h?acl=nope",
            "zk://u:topsecret@h?root=bad",
            "zk://u:topsecret@h/bad/?x=1",
            "zk://u:topsecret@h?session_timeout=0s",
            "zk://u:topsecret@h,,x",
            "zk://u:topsecret@h?bogus=1",
            "redis://u:topsecret@h",
            "u:topsecret@h",
        ] {
            assert!(!err(url).contains("topsecret"), "{url}");
        }
    }

    #[test]
    fn validate_checks_hand_built_configs() {
        assert!(ZkConfig::new(["h:2181"]).validate().is_ok());
        let e = ZkConfig::new(Vec::<String>::new()).validate().unwrap_err();
        assert!(e.to_string().contains("at least one host"), "{e}");
        let e = ZkConfig::new(["h1:1,h2:2"]).validate().unwrap_err();
        assert!(e.to_string().contains("host"), "{e}");
        let e = ZkConfig::new([""]).validate().unwrap_err();
        assert!(e.to_string().contains("host"), "{e}");
        let e = ZkConfig::new(["h:1"])
            .with_session_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("session_timeout"), "{e}");
        let e = ZkConfig::new(["h:1"])
            .with_auth(DigestAuth::new("", "p"))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("user name is empty"), "{e}");
        let e = ZkConfig::new(["h:1"])
            .with_root("/x/")
            .validate()
            .unwrap_err();
        assert!(matches!(e, LockError::Config { .. }), "{e}");
    }
}
