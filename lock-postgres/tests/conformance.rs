//! The conformance suite against a real PostgreSQL server, for every strategy.

mod common;

use common::PgHarness;
use lock_postgres::PostgresStrategy;

mod advisory {
    use super::*;
    lock_conformance::conformance_suite!(4, PgHarness::new(PostgresStrategy::Advisory).await);
}

mod notify {
    use super::*;
    lock_conformance::conformance_suite!(4, PgHarness::new(PostgresStrategy::Notify).await);
}

mod polling {
    use super::*;
    lock_conformance::conformance_suite!(4, PgHarness::new(PostgresStrategy::Polling).await);
}
