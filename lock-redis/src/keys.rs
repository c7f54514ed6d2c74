//! The keys of one lock. They share the hash tag `{prefix:name}`, so that one script may
//! touch them all, on Redis Cluster too.

use lock_core::LockName;

/// `{prefix:name}`, the hash tag of the mutex `name`'s keys.
pub(crate) fn hash_tag(prefix: &str, name: &LockName) -> String {
    format!("{{{prefix}:{}}}", name.escaped())
}

/// The keys and channel of the lock called `name` under `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// `{prefix:name}:owner`: the holder's owner id, with the lease as its expiry; for a
    /// read-write lock or semaphore, `…:holders`, each holder's lease end (a sorted set).
    pub(crate) owner: String,
    /// `{prefix:name}:fence`: the fencing counter; it outlives the holders on purpose.
    pub(crate) fence: String,
    /// `{prefix:name}:queue`: the waiters' owner ids, first come first.
    pub(crate) queue: String,
    /// `{prefix:name}:deadlines`: owner id → server time (ms) after which a waiter that has
    /// not refreshed it counts as dead.
    pub(crate) deadlines: String,
    /// `{prefix:name}:released`: the owner id of the last release, for a lease's length, so
    /// that a release sent again after its reply was lost learns that it had succeeded; for
    /// a read-write lock or semaphore, each release's receipt (a sorted set, id → its end).
    pub(crate) released: String,
    /// `{prefix:name}:w:`: the prefix of each waiter's own list, `…:w:<owner id>`.
    pub(crate) waiter_prefix: String,
    /// `{prefix:name}:v:`: the prefix of each election candidate's value, `…:v:<owner id>`,
    /// which lives as long as the candidate's place or lease.
    pub(crate) value_prefix: String,
    /// `{prefix:name}:released`: the channel a release is broadcast on (pub/sub strategy).
    pub(crate) channel: String,
    /// `{prefix:name}:weights`: how many permits each holder or waiter of a read-write lock
    /// or semaphore takes.
    pub(crate) weights: String,
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        Self::tagged(&hash_tag(prefix, name))
    }

    fn tagged(tag: &str) -> Self {
        LockKeys {
            owner: format!("{tag}:owner"),
            fence: format!("{tag}:fence"),
            queue: format!("{tag}:queue"),
            deadlines: format!("{tag}:deadlines"),
            released: format!("{tag}:released"),
            waiter_prefix: format!("{tag}:w:"),
            value_prefix: format!("{tag}:v:"),
            channel: format!("{tag}:released"),
            weights: format!("{tag}:weights"),
        }
    }

    /// The keys of the read-write lock or semaphore (`kind`) called `name`:
    /// `{prefix:name.kind}:…`, apart from the mutex of the same name.
    pub(crate) fn for_permits(prefix: &str, name: &LockName, kind: &str) -> Self {
        let tag = format!("{{{prefix}:{}.{kind}}}", name.escaped());
        LockKeys {
            owner: format!("{tag}:holders"),
            ..Self::tagged(&tag)
        }
    }

    /// The keys of the election called `name`: `{prefix:name.election}:…`, which no lock's
    /// can be (escaped names have no dot).
    pub(crate) fn for_election(prefix: &str, name: &LockName) -> Self {
        Self::tagged(&format!("{{{prefix}:{}.election}}", name.escaped()))
    }

    /// The keys in the order every script expects them (a permit script takes `weights`
    /// after them).
    pub(crate) fn script_keys(&self) -> [&str; 5] {
        [
            &self.owner,
            &self.fence,
            &self.queue,
            &self.deadlines,
            &self.released,
        ]
    }

    /// A waiter's own list.
    pub(crate) fn waiter_list(&self, id: &str) -> String {
        format!("{}{id}", self.waiter_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_carries_one_hash_tag() {
        let keys = LockKeys::new("lock", &LockName::new("jobs/nightly {x}").unwrap());
        let tag = "{lock:jobs%2Fnightly%20%7Bx%7D}";
        for key in keys.script_keys() {
            assert!(key.starts_with(tag), "{key}");
            assert_eq!(key.matches('{').count(), 1, "one tag in {key}");
        }
        assert!(keys.waiter_list("ab").starts_with(tag));
        assert!(keys.value_prefix.starts_with(tag));
        assert!(keys.channel.starts_with(tag));
    }
}
