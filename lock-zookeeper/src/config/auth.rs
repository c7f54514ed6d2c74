//! Who may touch the nodes distlock creates: [`AclPolicy`] and [`DigestAuth`].

use std::fmt;

use lock_core::LockError;

use super::config_error;

lock_core::url_enum! {
    /// The ACL put on the nodes distlock creates.
    ///
    /// In a URL: `acl=auto`, `acl=open` or `acl=creator`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    #[non_exhaustive]
    pub enum AclPolicy for "acl" {
        /// [`CreatorAll`](Self::CreatorAll) for the locks' directories and nodes when the
        /// session has credentials, so that a user who gives them owns its locks, and open
        /// nodes above them (the chroot, the root), where other identities make their own;
        /// [`Open`](Self::Open) without credentials. The default.
        #[default]
        Auto = "auto",
        /// `world:anyone` with all permissions (ZooKeeper's `OPEN_ACL_UNSAFE`): any client
        /// can delete another's lock node and break exclusion. Only where the servers are
        /// reachable by trusted clients alone, or to share lock directories with clients of
        /// other identities.
        Open = "open",
        /// `auth` with all permissions (ZooKeeper's `CREATOR_ALL_ACL`) on every node
        /// distlock creates, the root and the chroot included: only clients authenticated
        /// as the creator can read, change or delete them, or lock under that root. Requires
        /// [digest authentication](DigestAuth).
        CreatorAll = "creator",
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

    /// The credentials in a URL's `user:password@`, if any.
    pub(super) fn from_url(
        user: Option<String>,
        password: Option<String>,
    ) -> Result<Option<DigestAuth>, LockError> {
        let missing = match (user, password) {
            (None, None) => return Ok(None),
            (Some(user), Some(password)) => return Ok(Some(DigestAuth::new(user, password))),
            (Some(_), None) => "a user name but no password",
            (None, Some(_)) => "a password but no user name",
        };
        Err(config_error(format!(
            "the URL has {missing}; digest auth needs user:password@"
        )))
    }

    pub(super) fn validate(&self) -> Result<(), LockError> {
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

#[cfg(test)]
mod tests {
    use super::super::tests::{from, rejects};
    use super::*;

    #[test]
    fn each_acl_value_and_credentials() {
        for (url, acl, nodes) in [
            ("zk://h", AclPolicy::Auto, AclPolicy::Open),
            ("zk://u:p@h", AclPolicy::Auto, AclPolicy::CreatorAll),
            (
                "zk://u:p@h?acl=auto",
                AclPolicy::Auto,
                AclPolicy::CreatorAll,
            ),
            ("zk://h?acl=open", AclPolicy::Open, AclPolicy::Open),
            ("zk://u:p@h?acl=open", AclPolicy::Open, AclPolicy::Open),
            (
                "zk://u:p@h?acl=CREATOR",
                AclPolicy::CreatorAll,
                AclPolicy::CreatorAll,
            ),
        ] {
            let config = from(url);
            assert_eq!((config.acl, config.node_acl()), (acl, nodes), "{url}");
            assert_eq!(acl.as_str().parse::<AclPolicy>().unwrap(), acl);
            assert_eq!(acl.to_string(), acl.as_str());
        }
        // The password may be empty.
        let config = from("zk://u:@h");
        assert_eq!(config.auth, Some(DigestAuth::new("u", "")));
    }

    #[test]
    fn rejected_credentials() {
        for case in [
            "zk://alice@h|a user name but no password",
            "zk://:topsecret@h|a password but no user name",
            "zk://a%3Ab:topsecret@h|':'",
            "zk://a%01b:topsecret@h|control",
            "zk://u:topsecret@h?acl=closed|acl|\"closed\"|auto, open or creator",
            "zk://h?acl=creator|acl=creator|credentials",
        ] {
            let (url, parts) = case.split_once('|').unwrap();
            rejects(url, parts);
        }
    }
}
