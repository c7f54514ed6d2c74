//! Lock directories and contender nodes: names, sequence numbers, order.

use lock_core::{FencingToken, LockName};
use uuid::Uuid;

use crate::config::NodeNameFormat;

/// The one node of the [`SingleNode`](crate::ZkStrategy::SingleNode) strategy's holder,
/// in the lock's directory.
pub(crate) const SINGLE_NODE: &str = "lock";

/// Where the lock called `name` lives: `{root}/{escaped name}{suffix}`, the suffix being the
/// kind's: none for the mutex, `.rwlock`, `.semaphore` (with Curator's `locks` and `leases`
/// directories under it) or `.election`. Escaped names never contain a dot, so no mutex
/// directory can be called as another kind's.
pub(crate) fn lock_dir(root: &str, name: &LockName, suffix: &str) -> String {
    format!("{root}/{}{suffix}", name.escaped())
}

/// What a sequential node stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// A mutex contender.
    Lock,
    /// A reader of a read-write lock.
    Read,
    /// A writer of a read-write lock.
    Write,
    /// A semaphore lease.
    Lease,
    /// A leader election's candidate, its value in the node.
    Candidate,
}

/// The prefix of the sequential node a contender creates; the server appends the sequence.
/// The uuid lets a retry find a node whose create reply was lost. Curator's recipes
/// (`InterProcessMutex`, `InterProcessReadWriteLock`, `InterProcessSemaphoreV2`,
/// `LeaderLatch`) and kazoo's (`Lock`, `ReadLock`, `WriteLock`, `Election`) use these names.
pub(crate) fn node_prefix(format: NodeNameFormat, uuid: Uuid, kind: NodeKind) -> String {
    match format {
        NodeNameFormat::Curator => {
            let base = match kind {
                NodeKind::Lock => "lock-",
                NodeKind::Read => "__READ__",
                NodeKind::Write => "__WRIT__",
                NodeKind::Lease => "lease-",
                NodeKind::Candidate => "latch-",
            };
            format!("_c_{uuid}-{base}")
        }
        NodeNameFormat::Kazoo => {
            let base = match kind {
                NodeKind::Lock | NodeKind::Write | NodeKind::Candidate => "__lock__",
                NodeKind::Read => "__rlock__",
                NodeKind::Lease => "__lease__",
            };
            format!("{}{base}", uuid.simple())
        }
    }
}

/// Whether a contender in a read-write lock's directory is a reader (Curator's `__READ__`,
/// kazoo's `__rlock__`). Every other contender excludes everyone, as a writer does.
pub(crate) fn is_reader(child: &str) -> bool {
    child.contains("__READ__") || child.contains("__rlock__")
}

/// Whether `child` was created with `uuid` (in either format).
pub(crate) fn has_uuid(child: &str, uuid: Uuid) -> bool {
    child.contains(&uuid.to_string()) || child.contains(&uuid.simple().to_string())
}

/// The sequence number a child's name ends with, if it has one: the server appends ten
/// digits (nineteen past `i32::MAX`), and a wrapped counter shows as a negative number.
pub(crate) fn sequence(child: &str) -> Option<i64> {
    let head = child.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = &child[head.len()..];
    match digits.len() {
        10 | 19 => digits.parse().ok(),
        // `%010d` of a negative number: a minus sign and nine digits.
        9 if head.ends_with('-') => digits.parse::<i64>().ok().map(|value| -value),
        _ => None,
    }
}

/// The contenders among `children`: every child whose name ends in a sequence number,
/// ordered by that number (wrapped negative sequences first), whoever created it.
pub(crate) fn contenders(children: Vec<String>) -> Vec<(i64, String)> {
    let mut contenders: Vec<_> = children
        .into_iter()
        .filter_map(|child| sequence(&child).map(|seq| (seq, child)))
        .collect();
    contenders.sort();
    contenders
}

/// The fencing token of a grant: the lock node's creation zxid.
pub(crate) fn token(czxid: i64) -> FencingToken {
    FencingToken(u64::try_from(czxid).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_of_every_peer_format() {
        for (child, expected) in [
            ("_c_8a1b-lock-0000000042", Some(42)),
            ("8a1b3c__lock__0000000007", Some(7)),
            ("lock-0000000001", Some(1)),
            ("x-0000000000123456789", Some(123456789)),
            ("lock", None),
            ("short-123", None),
            ("_c_8a1b-lock--000000001", Some(-1)), // a wrapped counter
        ] {
            assert_eq!(sequence(child), expected, "{child}");
        }
    }

    #[test]
    fn contenders_are_ordered_by_sequence_not_name() {
        let children = vec![
            "zzz-lock-0000000003".to_owned(),
            "_c_aaa-lock-0000000010".to_owned(),
            "abc__lock__0000000001".to_owned(),
            "not-a-contender".to_owned(),
            "_c_bbb-lock--000000005".to_owned(),
        ];
        let order: Vec<_> = contenders(children)
            .into_iter()
            .map(|(seq, _)| seq)
            .collect();
        assert_eq!(order, [-5, 1, 3, 10], "wrapped negative sequences first");
    }

    #[test]
    fn prefixes_carry_the_uuid() {
        use NodeKind as K;
        let uuid = Uuid::new_v4();
        for format in [NodeNameFormat::Curator, NodeNameFormat::Kazoo] {
            for kind in [K::Lock, K::Read, K::Write, K::Lease, K::Candidate] {
                let child = format!("{}0000000001", node_prefix(format, uuid, kind));
                assert!(has_uuid(&child, uuid), "{child}");
                assert_eq!(sequence(&child), Some(1));
                assert_eq!(is_reader(&child), kind == NodeKind::Read, "{child}");
            }
        }
    }

    #[test]
    fn peers_names_for_readers_and_writers() {
        let curator = "_c_0b6e2d1c-8d7a-4d1e-9a55-3f1f2c3d4e5f-";
        assert!(is_reader(&format!("{curator}__READ__0000000003")));
        assert!(!is_reader(&format!("{curator}__WRIT__0000000004")));
        assert!(is_reader("4f1c9e__rlock__0000000001"));
        assert!(!is_reader("4f1c9e__lock__0000000002"));
        assert!(!is_reader("lock-0000000002"), "a plain mutex node excludes");
    }

    #[test]
    fn kinds_live_apart() {
        let name = LockName::new("a/b").unwrap();
        let dirs = ["", ".rwlock", ".semaphore", ".election"]
            .map(|suffix| lock_dir("/distlock", &name, suffix));
        assert_eq!(
            dirs,
            [
                "/distlock/a%2Fb",
                "/distlock/a%2Fb.rwlock",
                "/distlock/a%2Fb.semaphore",
                "/distlock/a%2Fb.election"
            ]
        );
        // No mutex name escapes to a directory with a dot in it.
        let dotted = LockName::new("a%2Fb.rwlock").unwrap();
        assert_ne!(lock_dir("/distlock", &dotted, ""), dirs[1]);
    }
}
