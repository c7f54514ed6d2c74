//! The conformance suite against a real Redis server, for every waiting strategy. Each case
//! runs on a server of its own, reached as an ACL user limited to the lock keys.

mod common;

use common::RedisHarness;
use lock_redis::RedisStrategy;

mod polling {
    use super::*;
    lock_conformance::conformance_suite!(4, RedisHarness::new(RedisStrategy::Polling).await);
}

mod pubsub {
    use super::*;
    lock_conformance::conformance_suite!(4, RedisHarness::new(RedisStrategy::PubSub).await);
}

mod queue {
    use super::*;
    lock_conformance::conformance_suite!(4, RedisHarness::new(RedisStrategy::Queue).await);
}

mod redlock {
    use super::*;
    lock_conformance::conformance_suite!(4, common::RedlockHarness::new().await);
}
