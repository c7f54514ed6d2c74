//! The conformance suite against a real ZooKeeper server, for every strategy.

mod common;

use common::ZkHarness;
use lock_zookeeper::ZkStrategy;

mod single_node {
    use super::*;
    lock_conformance::conformance_suite!(4, ZkHarness::new(ZkStrategy::SingleNode).await);
}

mod sequential_children {
    use super::*;
    lock_conformance::conformance_suite!(4, ZkHarness::new(ZkStrategy::WholeQueue).await);
}

mod sequential_predecessor {
    use super::*;
    lock_conformance::conformance_suite!(
        4,
        ZkHarness::new(ZkStrategy::SequentialPredecessor).await
    );
}
