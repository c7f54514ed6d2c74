//! Configuration of the ZooKeeper backend, and its connection URL.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::LockError;
use lock_core::url::{LockUrl, duration};
use serde::Deserialize;

/// ZooKeeper's client port, used for hosts given without one.
const DEFAULT_PORT: u16 = 2181;
/// Longest accepted session and connect timeout.
const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);

fn config_error(message: impl fmt::Display) -> LockError {
    LockError::config(format!("zookeeper: {message}"))
}

mod auth;

pub use auth::{AclPolicy, DigestAuth};

lock_core::url_enum! {
    /// How a ZooKeeper lock is taken and how its waiters wait.
    ///
    /// All three are kept because the benchmark compares them; only
    /// [`SequentialPredecessor`](ZkStrategy::SequentialPredecessor) is both herd-free and FIFO.
    ///
    /// In a URL: `strategy=single`, `strategy=whole-queue` (earlier `children`, still
    /// accepted) or `strategy=predecessor`.
    ///
    /// ```
    /// use lock_zookeeper::ZkStrategy;
    /// assert_eq!("whole-queue".parse::<ZkStrategy>()?, ZkStrategy::WholeQueue);
    /// assert_eq!("children".parse::<ZkStrategy>()?, ZkStrategy::WholeQueue);
    /// assert_eq!(ZkStrategy::default().to_string(), "predecessor");
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    #[non_exhaustive]
    pub enum ZkStrategy for "strategy" {
        /// The naive lock: one ephemeral node `{dir}/lock`; whoever creates it holds the
        /// lock, and every waiter retries when it is deleted (a herd by design; not FIFO).
        SingleNode = "single",
        /// Ephemeral sequential nodes; every waiter watches the whole queue (the directory's
        /// children) and re-lists on every change (FIFO, but a herd).
        #[serde(alias = "children")]
        WholeQueue = "whole-queue",
        /// Ephemeral sequential nodes; each waiter watches only its immediate predecessor,
        /// and its own node (FIFO and herd-free). A waiter that only its predecessor kept out
        /// holds the moment the predecessor's node is deleted, without listing the directory
        /// again; any other wake-up lists again. The default.
        #[default]
        SequentialPredecessor = "predecessor",
    }
}

impl ZkStrategy {
    /// The earlier name of [`WholeQueue`](ZkStrategy::WholeQueue).
    #[deprecated(note = "renamed ZkStrategy::WholeQueue, the word etcd's strategy uses too")]
    #[allow(non_upper_case_globals)]
    pub const SequentialChildren: ZkStrategy = ZkStrategy::WholeQueue;
}

lock_core::url_enum! {
    /// The names given to the sequential lock nodes distlock creates.
    ///
    /// Whatever the format, every child of a lock directory whose name ends in a sequence
    /// number counts as a contender, so Curator, kazoo and distlock clients exclude each other
    /// on one path either way; the format only decides what the other clients' tools will show.
    ///
    /// In a URL: `node_format=curator` or `node_format=kazoo`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    #[non_exhaustive]
    pub enum NodeNameFormat for "node_format" {
        /// Curator's protected format, `_c_<uuid>-lock-<seq>`. The default.
        #[default]
        Curator = "curator",
        /// kazoo's format, `<hex32>__lock__<seq>`.
        Kazoo = "kazoo",
    }
}

/// How to reach a ZooKeeper ensemble and how to lock on it.
///
/// Build one with [`ZkConfig::new`] and the `with_*` setters, or from a URL with
/// [`ZkConfig::from_url`]. The setters do not check their arguments; [`ZkConfig::validate`]
/// does (and `from_url` calls it). `Deserialize` reads a URL's parameters: every field but
/// the hosts, the chroot and the credentials, which the rest of the URL gives.
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default = "ZkConfig::url_defaults", deny_unknown_fields)]
#[non_exhaustive]
pub struct ZkConfig {
    /// The ensemble's servers as `host:port` (IPv6 hosts in brackets); at least one. In a
    /// URL, its hosts.
    #[serde(skip)]
    pub hosts: Vec<String>,
    /// A chroot applied to every path (e.g. `/apps`), or `None`. In a URL, its path. Made
    /// at connect where it is missing (persistent, with the [`acl`](Self::acl) policy's ACL),
    /// as Curator makes its namespace.
    #[serde(skip)]
    pub chroot: Option<String>,
    /// The session timeout requested from the server (the server may negotiate it into its
    /// own bounds); it bounds how long a crashed client's locks stay held. More than 0 and
    /// at most 1 h; default 10 s.
    #[serde(with = "duration")]
    pub session_timeout: Duration,
    /// How long to wait for a session when connecting, trying the servers again while none
    /// answers. Replacing a session that ended for an acquisition also stops trying at the
    /// acquisition's timeout (`try_acquire` makes one try). More than 0 and at most 1 h;
    /// default 5 s.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// The parent of every lock directory: the lock called `N` lives in `{root}/{N}`.
    /// Default `/distlock`.
    pub root: String,
    /// How locks are taken and waited for. Default [`ZkStrategy::SequentialPredecessor`].
    pub strategy: ZkStrategy,
    /// The names of the nodes distlock creates. Default [`NodeNameFormat::Curator`].
    pub node_format: NodeNameFormat,
    /// The ACL of the nodes distlock creates. Default [`AclPolicy::Auto`]: the creator's
    /// with credentials, open without (see [`node_acl`](Self::node_acl));
    /// [`AclPolicy::CreatorAll`] needs credentials.
    pub acl: AclPolicy,
    /// Digest credentials added to the session, if any. In a URL, its `user:password@`.
    #[serde(skip)]
    pub auth: Option<DigestAuth>,
    /// Whether to connect over TLS, to the servers' `secureClientPort`, verifying that
    /// their certificates name the hosts. In a URL, the `zks://` scheme (or `tls=true`);
    /// give the secure port with each host, since a host without one gets 2181, ZooKeeper's
    /// plain port. Default off.
    pub tls: bool,
    /// A PEM file of the authorities to trust instead of the system's (URL:
    /// `tls_ca=/path/ca.pem`). Needs [`tls`](Self::tls). Default none.
    pub tls_ca: Option<PathBuf>,
    /// A PEM file of the client certificate (and its chain) to present, for servers that
    /// require one (`ssl.clientAuth=need`), with [`tls_key`](Self::tls_key) (URL:
    /// `tls_cert=/path/client.crt`). Needs [`tls`](Self::tls). Default none.
    pub tls_cert: Option<PathBuf>,
    /// A PEM file of [`tls_cert`](Self::tls_cert)'s private key (PKCS #8, PKCS #1 or SEC1;
    /// URL: `tls_key=/path/client.key`). Default none.
    pub tls_key: Option<PathBuf>,
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
            tls: false,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
        }
    }

    /// The settings a URL's parameters start from: [`new`](Self::new)'s.
    fn url_defaults() -> Self {
        Self::new(Vec::<String>::new())
    }

    /// Sets the chroot; `""` and `"/"` mean none.
    #[must_use]
    pub fn with_chroot(mut self, chroot: impl Into<String>) -> Self {
        let chroot = chroot.into();
        self.chroot = (!chroot.is_empty() && chroot != "/").then_some(chroot);
        self
    }

    /// The ACL a lock's directory and nodes get: [`acl`](Self::acl), with
    /// [`AclPolicy::Auto`] made [`AclPolicy::CreatorAll`] when the session has credentials
    /// and [`AclPolicy::Open`] without. Under `Auto` the nodes above the locks (the chroot,
    /// the root, the directories between) stay open, so that other identities can make
    /// locks of their own there; under an explicit `CreatorAll` they are the creator's too.
    ///
    /// ```
    /// use lock_zookeeper::{AclPolicy, DigestAuth, ZkConfig};
    ///
    /// let anonymous = ZkConfig::new(["zk1:2181"]);
    /// assert_eq!(anonymous.node_acl(), AclPolicy::Open);
    /// let owner = anonymous.with_auth(DigestAuth::new("app", "s3cret"));
    /// assert_eq!(owner.node_acl(), AclPolicy::CreatorAll);
    /// assert_eq!(owner.with_acl(AclPolicy::Open).node_acl(), AclPolicy::Open);
    /// ```
    pub fn node_acl(&self) -> AclPolicy {
        match (self.acl, &self.auth) {
            (AclPolicy::Auto, Some(_)) => AclPolicy::CreatorAll,
            (AclPolicy::Auto, None) => AclPolicy::Open,
            (explicit, _) => explicit,
        }
    }

    /// The connect string ZooKeeper clients take: `host:port,host:port[/chroot]` (the
    /// provider's session connects to the hosts alone and roots itself at the chroot once
    /// it stands).
    pub fn connect_string(&self) -> String {
        let chroot = self.chroot.as_deref().unwrap_or("");
        format!("{}{chroot}", self.hosts.join(","))
    }

    /// Parses a `zk://` (or `zookeeper://`, or `zks://` for TLS) connection URL and
    /// [validates](Self::validate) the result.
    ///
    /// ```text
    /// zk://[user:password@]host1[:port1],host2[:port2][/chroot]?session_timeout=10s
    ///     &connect_timeout=5s&strategy=predecessor&root=/distlock&node_format=curator&acl=auto
    /// zks://host1:2182,host2:2182?tls_ca=/ca.pem&tls_cert=/client.crt&tls_key=/client.key
    /// ```
    ///
    /// The credentials add digest auth; the hosts are the ensemble (port 2181 when not
    /// given, IPv6 in brackets; with TLS, the servers' `secureClientPort`); the path is the
    /// chroot (empty or `/` for none). Each parameter sets the field of its name, with the
    /// default and bounds that field's docs give.
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
    /// `acl=creator` without credentials, a TLS file without TLS, a client certificate
    /// without its key or the reverse.
    pub fn from_url(url: &str) -> Result<ZkConfig, LockError> {
        let url = LockUrl::parse(url)?;
        if !matches!(url.scheme.as_str(), "zk" | "zookeeper" | "zks") {
            return Err(config_error(format!(
                "the URL scheme is {:?}; expected zk://, zookeeper:// or zks:// (TLS)",
                url.scheme
            )));
        }
        let mut config: ZkConfig = url.query()?;
        config.tls |= url.scheme == "zks";
        if url.hosts.is_empty() {
            return Err(config_error(
                "the URL names no host; expected zk://host[:port][,host[:port]...]",
            ));
        }
        config.hosts = url
            .hosts
            .iter()
            .map(|h| h.to_address(DEFAULT_PORT))
            .collect();
        config = config.with_chroot(url.path);
        config.auth = DigestAuth::from_url(url.username, url.password)?;
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
    /// name that is empty or contains `:`, a TLS file without [`tls`](Self::tls), a
    /// client certificate without its key or the reverse.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.hosts.is_empty() {
            return Err(config_error("at least one host is required"));
        }
        let forbidden = |c: char| c.is_whitespace() || c.is_control() || c == ',' || c == '/';
        let malformed = |host: &&String| host.is_empty() || host.chars().any(forbidden);
        if let Some(host) = self.hosts.iter().find(malformed) {
            return Err(config_error(format!(
                "host {host:?} is not a host:port address"
            )));
        }
        if let Some(chroot) = &self.chroot {
            check_path(chroot).map_err(|why| config_error(format!("chroot {chroot:?} {why}")))?;
        }
        check_path(&self.root)
            .map_err(|why| config_error(format!("root {:?} {why}", self.root)))?;
        let (what, top) = match &self.chroot {
            Some(chroot) => ("chroot", chroot),
            None => ("root", &self.root),
        };
        if top.split('/').nth(1) == Some("zookeeper") {
            return Err(config_error(format!(
                "{what} {top:?} is under /zookeeper, which ZooKeeper reserves for itself"
            )));
        }
        for (name, value) in [
            ("session_timeout", self.session_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if value.is_zero() || value > MAX_TIMEOUT {
                return Err(config_error(format!(
                    "{name} is {value:?}; it must be more than 0 and at most 1h"
                )));
            }
        }
        if let Some(auth) = &self.auth {
            auth.validate()?;
        }
        if self.acl == AclPolicy::CreatorAll && self.auth.is_none() {
            return Err(config_error(
                "acl=creator needs digest credentials (zk://user:password@hosts...)",
            ));
        }
        self.validate_tls()
    }

    fn validate_tls(&self) -> Result<(), LockError> {
        let files = [
            ("tls_ca", &self.tls_ca),
            ("tls_cert", &self.tls_cert),
            ("tls_key", &self.tls_key),
        ];
        let given = files.iter().find(|(_, file)| file.is_some());
        if let (Some((name, _)), false) = (given, self.tls) {
            return Err(config_error(format!(
                "{name} is set but TLS is off (use zks://, or tls=true)"
            )));
        }
        // A certificate names a DNS name or an IP address; the client would give up on any
        // other host (a panic inside it), so such a host is refused here.
        let unnamed = |host: &&String| {
            let name = match host.rsplit_once(':') {
                Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
                _ => host.as_str(),
            };
            let name = name.trim_start_matches('[').trim_end_matches(']');
            rustls::pki_types::ServerName::try_from(name).is_err()
        };
        if let Some(host) = self.hosts.iter().find(unnamed).filter(|_| self.tls) {
            return Err(config_error(format!(
                "host {host:?} is neither a DNS name nor an IP address, which TLS needs"
            )));
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => Err(config_error(
                "tls_cert needs tls_key (the certificate's key)",
            )),
            (None, Some(_)) => Err(config_error(
                "tls_key needs tls_cert (the key's certificate)",
            )),
            _ => Ok(()),
        }
    }
}

lock_core::setters! { ZkConfig {
    /// Sets the session timeout.
    with_session_timeout(timeout: Duration) => session_timeout = timeout;
    /// Sets the connect timeout.
    with_connect_timeout(timeout: Duration) => connect_timeout = timeout;
    /// Sets the root under which lock directories are created.
    with_root(root: impl Into<String>) => root = root.into();
    /// Sets the strategy.
    with_strategy(strategy: ZkStrategy) => strategy = strategy;
    /// Sets the node name format.
    with_node_format(format: NodeNameFormat) => node_format = format;
    /// Sets the ACL policy.
    with_acl(acl: AclPolicy) => acl = acl;
    /// Sets the digest credentials.
    with_auth(auth: DigestAuth) => auth = Some(auth);
    /// Turns TLS on or off.
    with_tls(tls: bool) => tls = tls;
    /// Sets the authorities to trust instead of the system's.
    with_tls_ca(path: impl Into<PathBuf>) => tls_ca = Some(path.into());
}}

impl ZkConfig {
    /// Sets the client certificate and its key (PEM files), for mutual TLS.
    #[must_use]
    pub fn with_tls_identity(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_cert = Some(cert.into());
        self.tls_key = Some(key.into());
        self
    }
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

    pub(super) fn from(url: &str) -> ZkConfig {
        ZkConfig::from_url(url).unwrap()
    }

    /// Checks that `url` is rejected with a `Config` error containing each `|`-separated
    /// part of `parts`, and not the password `topsecret`.
    pub(super) fn rejects(url: &str, parts: &str) {
        let Err(LockError::Config { message }) = ZkConfig::from_url(url) else {
            panic!("{url} is not a Config error");
        };
        assert!(
            parts.split('|').all(|p| message.contains(p)),
            "{url}: {message}"
        );
        assert!(!message.contains("topsecret"), "{url}: {message}");
    }

    #[test]
    fn minimal_url_takes_every_default() {
        let config = from("zk://localhost");
        assert_eq!(config, ZkConfig::new(["localhost:2181"]));
        assert_eq!(config.connect_string(), "localhost:2181");
        let (chroot, root, auth) = (&config.chroot, config.root.as_str(), &config.auth);
        assert_eq!((chroot, root, auth), (&None, "/distlock", &None));
        let timeouts = (config.session_timeout, config.connect_timeout);
        assert_eq!(timeouts, (Duration::from_secs(10), Duration::from_secs(5)));
        assert_eq!(config.strategy, ZkStrategy::SequentialPredecessor);
        assert_eq!(config.node_format, NodeNameFormat::Curator);
        assert_eq!(config.acl, AclPolicy::Auto);
        assert_eq!(config.node_acl(), AclPolicy::Open);
    }

    #[test]
    fn full_url() {
        let config = from(
            "zookeeper://app:s%40cret@zk1:2182,zk2,[::1]:2183/apps/locks\
             ?session_timeout=30s&connect_timeout=1500ms&strategy=single&root=/my/locks\
             &node_format=kazoo&acl=creator",
        );
        let expected = ZkConfig::new(["zk1:2182", "zk2:2181", "[::1]:2183"])
            .with_chroot("/apps/locks")
            .with_session_timeout(Duration::from_secs(30))
            .with_connect_timeout(Duration::from_millis(1500))
            .with_strategy(ZkStrategy::SingleNode)
            .with_root("/my/locks")
            .with_node_format(NodeNameFormat::Kazoo)
            .with_acl(AclPolicy::CreatorAll)
            .with_auth(DigestAuth::new("app", "s@cret"));
        assert_eq!(config, expected);
        let connect = "zk1:2182,zk2:2181,[::1]:2183/apps/locks";
        assert_eq!(config.connect_string(), connect);
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("s@cret") && debug.contains("app"),
            "{debug}"
        );
    }

    #[test]
    fn each_strategy_and_format_value() {
        use {NodeNameFormat as F, ZkStrategy as S};
        for (value, strategy) in [
            ("single", S::SingleNode),
            ("whole-queue", S::WholeQueue),
            ("predecessor", S::SequentialPredecessor),
            ("Predecessor", S::SequentialPredecessor),
        ] {
            assert_eq!(from(&format!("zk://h?strategy={value}")).strategy, strategy);
            assert_eq!(strategy.to_string(), value.to_ascii_lowercase());
            assert_eq!(strategy.as_str().parse::<S>().unwrap(), strategy);
        }
        for (value, format) in [("curator", F::Curator), ("KAZOO", F::Kazoo)] {
            let config = from(&format!("zk://h?node_format={value}"));
            assert_eq!(config.node_format, format);
            assert_eq!(format.to_string(), value.to_ascii_lowercase());
            assert_eq!(format.as_str().parse::<F>().unwrap(), format);
        }
        // The earlier name stays accepted.
        assert_eq!(from("zk://h?strategy=Children").strategy, S::WholeQueue);
        #[allow(deprecated)]
        let earlier = S::SequentialChildren;
        assert_eq!(earlier, S::WholeQueue);
        let e = "fast".parse::<S>().unwrap_err().to_string();
        assert!(
            e.contains(r#"strategy "fast": expected single, children, whole-queue or predecessor"#)
        );
    }

    #[test]
    fn chroot_forms() {
        assert_eq!(from("zk://h/").chroot, None);
        assert_eq!(from("zk://h").chroot, None);
        assert_eq!(from("zk://h/a%20b").chroot.as_deref(), Some("/a b"));
        assert_eq!(ZkConfig::new(["h:1"]).with_chroot("/").chroot, None);
        assert_eq!(ZkConfig::new(["h:1"]).with_chroot("").chroot, None);
        // A chroot may itself contain a segment called zookeeper below the top.
        assert!(ZkConfig::from_url("zk://h/app/zookeeper").is_ok());
        // With a chroot, the root is relative to it and may be /zookeeper.
        assert!(ZkConfig::from_url("zk://h/app?root=/zookeeper").is_ok());
    }

    #[test]
    fn rejected_urls_name_the_bad_part() {
        for param in ["session_timeout", "connect_timeout"] {
            for value in ["0s", "0ms", "61m", "2h"] {
                rejects(
                    &format!("zk://u:topsecret@h?{param}={value}"),
                    &format!("{param}|at most 1h"),
                );
            }
            rejects(
                &format!("zk://h?{param}=soon"),
                &format!("{param}|not a duration"),
            );
            assert!(ZkConfig::from_url(&format!("zk://h?{param}=1h")).is_ok());
            assert!(ZkConfig::from_url(&format!("zk://h?{param}=1ms")).is_ok());
        }
        for case in [
            "redis://u:topsecret@h|\"redis\"|zk://",
            "u:topsecret@h1:2181|no scheme",
            "zk://u:topsecret@h1,,h2|empty host",
            "zk://h1:99999|port",
            "zk://|no host",
            "zk:///chroot|no host",
            "zk://h?strategy=fast|strategy|\"fast\"|single, children, whole-queue or predecessor",
            "zk://h?node_format=zk|node_format|curator or kazoo",
            "zk://u:topsecret@h?bogus=1|unknown parameter \"bogus\" for zk://",
            "zk://u:topsecret@h/bad/?x=1|unknown parameter \"x\"",
            "zk://h?sesion_timeout=5s|\"sesion_timeout\"\
             |known: session_timeout, connect_timeout, root, strategy, node_format, acl",
            "zk://u:topsecret@h/apps/|chroot|must not end with '/'",
            "zk://h//apps|chroot|empty segment",
            "zk://h/apps//x|chroot|empty segment",
            "zk://h/apps/./x|chroot|'.' or '..'",
            "zk://h/..|chroot|'.' or '..'",
            "zk://h/a%01b|chroot|control",
            "zk://h/a%EF%80%80|chroot|forbids",
            "zk://h/zookeeper|chroot|reserves",
            "zk://h/zookeeper/quota|chroot|reserves",
            "zk://u:topsecret@h?root=distlock|root|must start with '/'",
            "zk://h?root=/|root|must not end with '/'",
            "zk://h?root=/distlock/|root|must not end with '/'",
            "zk://h?root=/a//b|root|empty segment",
            "zk://h?root=/a/../b|root|'.' or '..'",
            "zk://h?root=/a%7Fb|root|control",
            "zk://h?root=|root|must start with '/'",
            "zk://h?root=/zookeeper|root|reserves",
        ] {
            let (url, parts) = case.split_once('|').unwrap();
            rejects(url, parts);
        }
    }

    #[test]
    fn validate_checks_hand_built_configs() {
        let h = || ZkConfig::new(["h:1"]);
        let creator = || h().with_acl(AclPolicy::CreatorAll);
        let auth = |user: &str| DigestAuth::new(user, "p");
        assert!(h().validate().is_ok());
        assert!(creator().with_auth(auth("u")).validate().is_ok());
        for (config, expected) in [
            (ZkConfig::new(Vec::<String>::new()), "at least one host"),
            (ZkConfig::new(["h1:1,h2:2"]), "host \"h1:1,h2:2\""),
            (ZkConfig::new([""]), "host \"\""),
            (h().with_session_timeout(Duration::ZERO), "session_timeout"),
            (h().with_connect_timeout(Duration::ZERO), "connect_timeout"),
            (h().with_root("/x/"), "root"),
            (creator(), "acl=creator needs digest credentials"),
            (h().with_auth(auth("")), "user name is empty"),
        ] {
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        }
    }

    #[test]
    fn zks_urls_and_tls_parameters_turn_tls_on() {
        let config = from("zks://h1:2182?tls_ca=/ca.pem&tls_cert=/app.crt&tls_key=/app.key");
        let expected = ZkConfig::new(["h1:2182"])
            .with_tls(true)
            .with_tls_ca("/ca.pem")
            .with_tls_identity("/app.crt", "/app.key");
        assert_eq!(config, expected);
        assert_eq!(
            from("zk://h?tls=true"),
            ZkConfig::new(["h:2181"]).with_tls(true)
        );
        assert!(!from("zk://h").tls);
        assert_eq!(from("zks://[::1]:2182,10.0.0.1:2182").hosts.len(), 2);
        assert!(
            from("zk://zk!1:2181").validate().is_ok(),
            "plain TCP resolves it or not"
        );
        for case in [
            "zk://h?tls_ca=/ca.pem|tls_ca is set but TLS is off",
            "zk://h?tls_cert=/c&tls_key=/k|tls_cert is set but TLS is off",
            "zks://h?tls_cert=/c|tls_cert needs tls_key",
            "zks://h?tls_key=/k|tls_key needs tls_cert",
            "zkss://h|expected zk://, zookeeper:// or zks://",
            "zks://zk!1:2182|host \"zk!1:2182\" is neither a DNS name nor an IP address",
        ] {
            let (url, parts) = case.split_once('|').unwrap();
            rejects(url, parts);
        }
    }
}
