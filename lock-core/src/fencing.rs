//! Fencing tokens.

use std::fmt;

/// A number that strictly increases across the successive holders of one lock name.
///
/// Pass it with every write to the resource the lock protects, and have the resource
/// reject writes carrying a token lower than the highest it has seen: a holder that paused
/// (GC, swap, a partition) past its lease then cannot overwrite its successor's work.
///
/// How strong the guarantee is depends on the backend, see
/// [`Capabilities::fencing`](crate::Capabilities::fencing): ZooKeeper uses the lock node's
/// creation zxid (monotonic across the ensemble); Redis uses a counter that a failover can
/// roll back (best effort).
///
/// ```
/// use lock_core::FencingToken;
/// let older = FencingToken(41);
/// let newer = FencingToken(42);
/// assert!(newer > older);
/// assert_eq!(newer.to_string(), "42");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}
