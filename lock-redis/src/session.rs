//! The session of a [`RedisLockProvider`](crate::RedisLockProvider): what its lock handles
//! and guards share.

use std::fmt;
use std::sync::Arc;

use lock_core::Metrics;
use lock_core::kit::Closed;

use crate::config::RedisConfig;
use crate::node::Node;

/// The provider's session, which its lock handles and guards share: the configuration, the
/// connection to the server, the metrics, and whether the session is over.
pub(crate) struct Session {
    pub(crate) config: RedisConfig,
    pub(crate) node: Node,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) closed: Closed,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("server", &self.node.address())
            .finish()
    }
}
