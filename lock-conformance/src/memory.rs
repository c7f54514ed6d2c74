//! The harness for the in-memory reference backend: the suite's own proof that its cases
//! pass against a correct backend, and a template for new harnesses.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::LockError;
use lock_core::memory::{MemoryLockProvider, MemoryServer};

use crate::harness::{
    Client, Entries, FaultResult, Faults, Harness, Inspector, Property, SessionExpiry, Timing,
    Unproven,
};

/// A [`Harness`] over one private [`MemoryServer`].
///
/// Faults: revoke a holder, expire a client's session. Introspection: holder and waiter
/// counts. Everything is in process, so the timing is tight. The server lives in the
/// clients' own process, so it can neither stop answering them nor restart: D4 and E4 are
/// declared [unproven](Harness::unproven).
#[derive(Debug, Clone)]
pub struct MemoryHarness {
    server: MemoryServer,
    /// Used for revokes and inspection; never holds a lock.
    admin: MemoryLockProvider,
}

impl MemoryHarness {
    /// A harness over a new server.
    pub fn new() -> Self {
        let server = MemoryServer::new();
        let admin = server.provider();
        MemoryHarness { server, admin }
    }

    /// The server the clients share.
    pub fn server(&self) -> &MemoryServer {
        &self.server
    }
}

impl Default for MemoryHarness {
    fn default() -> Self {
        Self::new()
    }
}

/// Ends one memory client's session, as the server would end a dead process's.
#[derive(Debug, Clone)]
pub struct MemorySession(pub MemoryLockProvider);

#[async_trait]
impl SessionExpiry for MemorySession {
    async fn expire_session(&self) -> FaultResult {
        self.0.expire_session();
        Ok(())
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn client(&self) -> Result<Client, LockError> {
        let provider = self.server.provider();
        let session = Arc::new(MemorySession(provider.clone()));
        Ok(Client::new(Arc::new(provider), session))
    }

    fn timing(&self) -> Timing {
        Timing::default()
            .with_operation_slack(Duration::from_millis(250))
            .with_handoff_bound(Duration::from_millis(500))
            .with_loss_bound(Duration::from_millis(500))
            .with_crash_release_bound(Duration::from_millis(100))
            .with_short_timeout(Duration::from_millis(100))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspector> {
        Some(self)
    }

    async fn client_in_other_namespace(&self) -> Option<Result<Client, LockError>> {
        let provider = self.server.provider_in("other-namespace");
        let session = Arc::new(MemorySession(provider.clone()));
        Some(Ok(Client::new(Arc::new(provider), session)))
    }

    fn unproven(&self) -> Vec<Unproven> {
        vec![
            Unproven::new(
                Property::LossOnServerPause,
                "the memory server runs in its clients' process: it cannot stop answering them while they run",
            ),
            Unproven::new(
                Property::TokensSurviveRestart,
                "the memory server's state lives as long as its process: there is no restart to survive",
            ),
        ]
    }
}

#[async_trait]
impl Faults for MemoryHarness {
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        self.admin
            .revoke(name)
            .map(|token| token.is_some())
            .map_err(|e| crate::harness::FaultError::Failed(e.to_string()))
    }
}

#[async_trait]
impl Inspector for MemoryHarness {
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        let (holders, waiters) = self.admin.entries(name)?;
        Ok(Entries::new(holders, waiters))
    }
}
