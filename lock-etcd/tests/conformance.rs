//! The conformance suite against a real etcd server, for every strategy.

mod common;

use common::EtcdHarness;
use lock_etcd::EtcdStrategy;

mod single {
    use super::*;
    lock_conformance::conformance_suite!(4, EtcdHarness::new(EtcdStrategy::Single).await);
}

mod prefix {
    use super::*;
    lock_conformance::conformance_suite!(4, EtcdHarness::new(EtcdStrategy::WholeQueue).await);
}

mod predecessor {
    use super::*;
    lock_conformance::conformance_suite!(4, EtcdHarness::new(EtcdStrategy::Predecessor).await);
}
