//! Lock directories and contender nodes: names, sequence numbers, order.

use lock_core::LockName;
use uuid::Uuid;

use crate::config::NodeNameFormat;

/// Where the lock called `name` lives: `{root}/{escaped name}`.
pub(crate) fn lock_dir(root: &str, name: &LockName) -> String {
    format!("{root}/{}", name.escaped())
}

/// The prefix of the sequential node a contender creates; the server appends the sequence.
/// The uuid lets a retry find a node whose create reply was lost.
pub(crate) fn node_prefix(format: NodeNameFormat, uuid: Uuid) -> String {
    match format {
        NodeNameFormat::Curator => format!("_c_{uuid}-lock-"),
        NodeNameFormat::Kazoo => format!("{}__lock__", uuid.simple()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_of_every_peer_format() {
        assert_eq!(sequence("_c_8a1b-lock-0000000042"), Some(42));
        assert_eq!(sequence("8a1b3c__lock__0000000007"), Some(7));
        assert_eq!(sequence("lock-0000000001"), Some(1));
        assert_eq!(sequence("x-0000000000123456789"), Some(123456789));
        assert_eq!(sequence("lock"), None);
        assert_eq!(sequence("short-123"), None);
        assert_eq!(
            sequence("_c_8a1b-lock--000000001"),
            Some(-1),
            "a wrapped counter"
        );
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
        let uuid = Uuid::new_v4();
        for format in [NodeNameFormat::Curator, NodeNameFormat::Kazoo] {
            let child = format!("{}0000000001", node_prefix(format, uuid));
            assert!(has_uuid(&child, uuid), "{child}");
            assert_eq!(sequence(&child), Some(1));
        }
    }
}
