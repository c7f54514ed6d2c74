//! The distlock conformance suite: one set of cases that every backend runs against real
//! servers.
//!
//! The cases are `pub async fn`s over [`&dyn Harness`](Harness), grouped as in the
//! [catalogue](cases::catalogue) (exclusion, timeouts and cancellation, release, loss detection, fencing,
//! leases, names, errors and resilience, read-write locks, semaphores, adapters and API). [`conformance_tests!`] stamps one
//! `#[test]` per case, named after it, from the same list that feeds [`cases::CASES`].
//!
//! # Plugging in a backend
//!
//! A harness gives the suite new, independent clients, and for each client a way to end its
//! session behind its back ([`SessionExpiry`]): the cases make stale holders with it, so that
//! conditional release and fencing are proven for every backend. This is a whole harness, in
//! a backend crate's `tests/conformance.rs` (here over the in-memory backend; put your
//! provider where `MemoryServer` is):
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use lock_conformance::{async_trait, Client, FaultResult, Harness, SessionExpiry, Timing};
//! use lock_core::{memory::{MemoryLockProvider, MemoryServer}, LockError};
//!
//! struct MyHarness {
//!     server: MemoryServer, // e.g. the URL of the server your tests started
//! }
//!
//! /// Ends one client's session as a crash or a long partition would.
//! struct Expiry(MemoryLockProvider); // e.g. the client's fault proxy, or its connection
//!
//! #[async_trait]
//! impl SessionExpiry for Expiry {
//!     async fn expire_session(&self) -> FaultResult {
//!         self.0.expire_session(); // e.g. cut the proxy for longer than the session
//!         Ok(())
//!     }
//! }
//!
//! #[async_trait]
//! impl Harness for MyHarness {
//!     async fn client(&self) -> Result<Client, LockError> {
//!         let provider = self.server.provider(); // e.g. MyLockProvider::connect(..).await?
//!         let expiry = Arc::new(Expiry(provider.clone()));
//!         Ok(Client::new(Arc::new(provider), expiry))
//!     }
//!
//!     fn timing(&self) -> Timing {
//!         // The crash-release bound is your session timeout or lease TTL, plus slack.
//!         Timing::default().with_crash_release_bound(Duration::from_secs(1))
//!     }
//! }
//!
//! lock_conformance::conformance_tests!(MyHarness { server: MemoryServer::new() });
//! # fn main() {}
//! ```
//!
//! Then `cargo test --test conformance` runs every case; `cargo test --test conformance a7`
//! runs one. Cases whose capability your provider does not declare (see
//! [`Capabilities`](lock_core::Capabilities)) or whose optional fault hook your harness lacks
//! are skipped and print why. Set `LOCK_CONFORMANCE_STRICT=1` in CI: a case that proves a
//! capability you *declare* then fails instead of skipping, and so does a check not made.
//! Some properties of a capability need a fault hook ([`Property`]); a harness that cannot
//! offer it declares the property in [`Harness::unproven`], with why, and the verdict reports
//! it as not proven rather than failing.
//!
//! To go further, implement [`Harness::inspector`] ([`Inspector`]: what the server records
//! for a lock, for the residue checks; without it those checks are not made),
//! [`Harness::faults`] ([`Faults`]: revoke a holder, pause or restart the server, an
//! unreachable or wrongly authenticated provider), [`Client::with_faults`] ([`ClientFaults`]:
//! cut or delay this client's connection, lose a create reply), and
//! [`Harness::client_in_other_namespace`]. [`memory::MemoryHarness`] is a complete example;
//! `lock-conformance/tests/file_lock` in the repository is a backend from outside the
//! workspace (a `flock` per name) with its harness and an inspector, passing under
//! `LOCK_CONFORMANCE_STRICT=1`.
//!
//! Real servers to run against, and faults on the wire, come from the `lock-testbed` crate
//! (ZooKeeper, Redis and etcd as child processes or containers, and a fault-injecting TCP
//! proxy), which this crate does not depend on: use it in your tests, or bring your own
//! servers. A harness that starts its servers with `lock_testbed::servers::Target::start`
//! runs them as processes or, under `LOCK_TEST_SERVERS=containers`, in containers, with
//! the same faults through the container engine.
//!
//! # Pinning the suite
//!
//! New cases make the suite stricter, so a backend should choose when to take them: depend
//! on an exact version in `[dev-dependencies]`, e.g. `lock-conformance = "=0.1.0"`, and
//! raise it deliberately. Cases are only added or tightened in new minor versions.

pub mod cases;
mod harness;
pub mod memory;
mod outcome;
pub mod runner;
mod support;

pub use async_trait::async_trait;
pub use harness::{
    Client, ClientFaults, Entries, FaultError, FaultResult, Faults, Harness, Inspector, LockKind,
    Property, SessionExpiry, Timing, Unproven,
};
pub use outcome::{CaseFailure, CaseResult, Context, Outcome, Skip};
pub use support::{
    FencedStore, Occupancy, Occupant, PollBudget, StaleToken, crash_release_bound, eventually,
    expect_entries, expect_entries_of, expire_session, no_residue, observe_until, take,
    unique_name, within,
};
