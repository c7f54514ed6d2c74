//! A lease backend kept in memory on the lease kit, twice: as it should be, and with a
//! renewal that blocks its thread while the server is out of reach (a synchronous client
//! stuck on a dead connection). The lease cases must tell them apart: the watchdog can give
//! the grant up at its `valid_until` only if the renewal lets go of the thread, so the
//! blocking one fires its lost signal late, which F2 catches.
#![allow(
    clippy::expect_used,
    reason = "test code: a missing case fails the test"
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::{Client, FaultResult, Harness, Outcome, SessionExpiry, Timing, async_trait};
use lock_core::kit::{Closed, Lease, Renewal, lease_guard};
use lock_core::{
    Capabilities, DistributedLock, FencingToken, Guard, LockError, LockName, LockProvider,
    MetricsSnapshot, WaitKind,
};
use tokio::time::Instant;

const BACKEND: &str = "lease-table";

/// The lease every grant and renewal sets.
const TTL: Duration = Duration::from_millis(600);

/// The "server": one row per held lock, with its owner, expiry and token.
#[derive(Debug, Default)]
struct Table {
    rows: Mutex<HashMap<String, Row>>,
    tokens: AtomicU64,
}

#[derive(Debug)]
struct Row {
    owner: u64,
    until: Instant,
}

impl Table {
    fn rows(&self) -> std::sync::MutexGuard<'_, HashMap<String, Row>> {
        self.rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One client: its id, whether the server is out of its reach, and its session.
#[derive(Debug)]
struct ClientState {
    table: Arc<Table>,
    id: u64,
    cut: AtomicBool,
    session: Closed,
    /// The mutation: renewals block their thread while the server is out of reach.
    blocking_renewal: bool,
}

impl ClientState {
    fn reach(&self) -> Result<&Table, LockError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(LockError::connection(BACKEND, "the server is out of reach"));
        }
        Ok(&self.table)
    }
}

/// One grant: renewed and released by its owner only.
#[derive(Debug)]
struct TableLease {
    client: Arc<ClientState>,
    name: String,
}

#[async_trait]
impl Lease for TableLease {
    fn backend(&self) -> &'static str {
        BACKEND
    }
    fn ttl(&self) -> Duration {
        TTL
    }
    fn drift(&self) -> Duration {
        Duration::from_millis(20)
    }
    fn session(&self) -> &Closed {
        &self.client.session
    }
    async fn extend(&self) -> Result<Renewal, LockError> {
        if self.client.blocking_renewal && self.client.cut.load(Ordering::SeqCst) {
            std::thread::sleep(TTL * 3);
        }
        let table = self.client.reach()?;
        let mut rows = table.rows();
        match rows.get_mut(&self.name) {
            Some(row) if row.owner == self.client.id && row.until > Instant::now() => {
                row.until = Instant::now() + TTL;
                Ok(Renewal::Renewed)
            }
            _ => Ok(Renewal::Gone),
        }
    }
    async fn release(&self) -> Result<bool, LockError> {
        let table = self.client.reach()?;
        let mut rows = table.rows();
        let ours = rows
            .get(&self.name)
            .is_some_and(|row| row.owner == self.client.id && row.until > Instant::now());
        if ours {
            rows.remove(&self.name);
        }
        Ok(ours)
    }
}

#[derive(Debug)]
struct TableLock {
    client: Arc<ClientState>,
    name: LockName,
}

#[async_trait]
impl DistributedLock for TableLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
        let sent = Instant::now();
        let token = {
            let table = self.client.reach()?;
            let mut rows = table.rows();
            if rows
                .get(self.name.as_str())
                .is_some_and(|row| row.until > sent)
            {
                return Ok(None);
            }
            rows.insert(
                self.name.as_str().to_owned(),
                Row {
                    owner: self.client.id,
                    until: sent + TTL,
                },
            );
            table.tokens.fetch_add(1, Ordering::SeqCst) + 1
        };
        let lease = Arc::new(TableLease {
            client: Arc::clone(&self.client),
            name: self.name.as_str().to_owned(),
        });
        lease_guard(lease, &self.name, FencingToken(token), sent, TTL).map(Some)
    }

    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        loop {
            if let Some(guard) = self.try_acquire().await? {
                return Ok(guard);
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Err(LockError::timed_out(BACKEND, &self.name, timeout));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[derive(Debug)]
struct TableProvider(Arc<ClientState>);

impl LockProvider for TableProvider {
    fn backend(&self) -> &'static str {
        BACKEND
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(WaitKind::Poll)
            .with_leases(true)
            .with_lost_detection(true)
            .with_crash_release_bound(Some(TTL))
    }
    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        Ok(Arc::new(TableLock {
            client: Arc::clone(&self.0),
            name: LockName::new(name)?,
        }))
    }
    fn metrics(&self) -> MetricsSnapshot {
        MetricsSnapshot::default()
    }
}

/// The client's connection dies for good: its leases run out on the server.
struct ConnectionDies(Arc<ClientState>);

#[async_trait]
impl SessionExpiry for ConnectionDies {
    async fn expire_session(&self) -> FaultResult {
        self.0.cut.store(true, Ordering::SeqCst);
        Ok(())
    }
}

struct TableHarness {
    table: Arc<Table>,
    clients: AtomicU64,
    blocking_renewal: bool,
}

impl TableHarness {
    fn new(blocking_renewal: bool) -> Self {
        TableHarness {
            table: Arc::default(),
            clients: AtomicU64::new(0),
            blocking_renewal,
        }
    }
}

#[async_trait]
impl Harness for TableHarness {
    async fn client(&self) -> Result<Client, LockError> {
        let state = Arc::new(ClientState {
            table: Arc::clone(&self.table),
            id: self.clients.fetch_add(1, Ordering::SeqCst),
            cut: AtomicBool::new(false),
            session: Closed::default(),
            blocking_renewal: self.blocking_renewal,
        });
        let expiry = Arc::new(ConnectionDies(Arc::clone(&state)));
        Ok(Client::new(Arc::new(TableProvider(state)), expiry))
    }

    fn timing(&self) -> Timing {
        Timing::default()
            .with_operation_slack(Duration::from_millis(250))
            .with_crash_release_bound(TTL * 2)
    }
}

fn run(harness: &TableHarness, id: &str) -> lock_conformance::CaseResult {
    let case = lock_conformance::cases::find(id).expect("the case");
    lock_conformance::runner::block_on(lock_conformance::runner::run_case((case.run)(harness))).0
}

/// The correct lease backend passes the lease cases: the harness above is sound.
#[test]
fn a_lease_backend_passes_the_lease_cases() {
    for id in ["F1", "F2"] {
        let result = run(&TableHarness::new(false), id);
        assert_eq!(result, Ok(Outcome::Passed), "{id}");
    }
}

/// A renewal that blocks past `valid_until` fails F2.
#[test]
fn a_renewal_that_blocks_fails_f2() {
    let failure = run(&TableHarness::new(true), "F2").expect_err("F2 on a blocking renewal");
    assert!(
        failure.message.contains("after the guard's valid_until"),
        "{failure}"
    );
}
