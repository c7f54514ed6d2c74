//! The lock handles of the in-memory backend and their guards.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use super::server::{Entry, Grant, LockKey, LockState, Mode, Refusal, ServerInner, Withdrawal};
use super::{BACKEND, ProviderShared};
use crate::election::LeaderSource;
use crate::kit::{
    Abandon, Cleanup, ElectionAttempt, MutexAttempt, RwAttempt, RwSide, SemaphoreAttempt,
    unpoisoned,
};
use crate::queue::LockQueue;
use crate::{
    Deadline, Guard, GuardBackend, LeaderInfo, LockError, LockName, LossReason, LostSignal, Metrics,
};

/// What every lock handle shares: its name, its key on the server, and its provider.
pub(super) struct Handle {
    pub(super) name: LockName,
    pub(super) key: LockKey,
    pub(super) provider: Arc<ProviderShared>,
    pub(super) permits: u32,
}

impl Handle {
    /// Takes the hold, or gives up at the deadline with `Ok(None)`, leaving no queue slot.
    async fn attempt(
        &self,
        mode: Mode,
        value: Arc<[u8]>,
        deadline: Deadline,
    ) -> Result<Option<Guard>, LockError> {
        let (id, mut receiver) = match self.enter(mode, value, !deadline.is_immediate())? {
            Entry::Granted(grant) => return Ok(Some(self.guard(grant))),
            Entry::Busy => return Ok(None),
            Entry::Queued { id, grant } => (id, grant),
        };
        let mut ticket = Cleanup::new(WaitTicket {
            server: Arc::clone(&self.provider.server),
            key: self.key.clone(),
            id,
        });
        let woken = tokio::select! {
            biased;
            grant = &mut receiver => Some(grant.ok()),
            () = deadline.sleep() => None,
        };
        let grant = match woken {
            Some(grant) => grant,
            None => {
                self.provider.metrics.record_server_requests(1);
                match self.provider.server.withdraw(&self.key, id) {
                    Withdrawal::Removed => {
                        ticket.disarm();
                        return Ok(None);
                    }
                    // The grant raced the deadline: it is ours, take it.
                    Withdrawal::Granted | Withdrawal::Gone => receiver.try_recv().ok(),
                }
            }
        };
        ticket.disarm();
        match grant {
            Some(grant) => {
                self.provider.metrics.record_wakeup();
                Ok(Some(self.guard(grant)))
            }
            // The sender went without a grant: our session ended while we waited.
            None => Err(self.session_expired()),
        }
    }

    /// One visit to the server.
    fn enter(&self, mode: Mode, value: Arc<[u8]>, queue: bool) -> Result<Entry, LockError> {
        let session = *unpoisoned(&self.provider.session);
        self.provider.metrics.record_server_requests(1);
        self.provider
            .server
            .enter(&self.key, session, mode, self.permits, value, queue)
            .map_err(|refusal| match refusal {
                Refusal::SessionEnded => self.session_expired(),
                Refusal::PermitsMismatch { existing } => LockError::InvalidArgument {
                    backend: BACKEND,
                    message: format!(
                        "semaphore {:?} is in use with {existing} permits; this handle asks for {}",
                        self.name.as_str(),
                        self.permits
                    ),
                },
            })
    }

    fn guard(&self, grant: Grant) -> Guard {
        self.provider.metrics.record_grant();
        let backend = MemoryGuard {
            server: Arc::clone(&self.provider.server),
            metrics: Arc::clone(&self.provider.metrics),
            key: self.key.clone(),
            id: grant.id,
            lost: grant.lost.clone(),
        };
        Guard::new(
            self.name.clone(),
            grant.token,
            grant.lost,
            Box::new(backend),
        )
    }

    fn session_expired(&self) -> LockError {
        LockError::SessionExpired {
            backend: BACKEND,
            name: Some(self.name.to_string()),
        }
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Handle");
        out.field("name", &self.name)
            .field("namespace", &self.key.namespace);
        if self.permits != 1 {
            out.field("permits", &self.permits);
        }
        out.finish()
    }
}

/// A mutex from a [`MemoryLockProvider`](super::MemoryLockProvider).
#[derive(Debug)]
pub struct MemoryLock(pub(super) Handle);

#[async_trait]
impl MutexAttempt for MemoryLock {
    fn name(&self) -> &LockName {
        &self.0.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        self.0.attempt(Mode::Exclusive, no_value(), deadline).await
    }

    /// The server's own view, which only this process shares.
    async fn queue(&self) -> Result<LockQueue, LockError> {
        let state = self.0.provider.server.state();
        let queue = state.locks.get(&self.0.key).map(LockState::queue);
        Ok(queue.unwrap_or_default().with_note(ONE_PROCESS))
    }
}

/// What a listing of an in-memory lock cannot show.
const ONE_PROCESS: &str = "only this process's own view: the in-memory backend does not \
                           reach across processes, so another process's locks are never shown";

/// A read-write lock from a [`MemoryLockProvider`](super::MemoryLockProvider).
#[derive(Debug)]
pub struct MemoryRwLock(pub(super) Handle);

#[async_trait]
impl RwAttempt for MemoryRwLock {
    fn name(&self) -> &LockName {
        &self.0.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, side: RwSide, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let mode = match side {
            RwSide::Read => Mode::Read,
            RwSide::Write => Mode::Write,
        };
        self.0.attempt(mode, no_value(), deadline).await
    }
}

/// A counting semaphore from a [`MemoryLockProvider`](super::MemoryLockProvider).
#[derive(Debug)]
pub struct MemorySemaphore(pub(super) Handle);

#[async_trait]
impl SemaphoreAttempt for MemorySemaphore {
    fn name(&self) -> &LockName {
        &self.0.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn permits(&self) -> u32 {
        self.0.permits
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        self.0.attempt(Mode::Permit, no_value(), deadline).await
    }
}

/// The value of a lock's holder: none.
fn no_value() -> Arc<[u8]> {
    Arc::from(&[][..])
}

/// A leader election from a [`MemoryLockProvider`](super::MemoryLockProvider): a mutex whose
/// holder leads, its entry carrying the candidate's value.
#[derive(Debug)]
pub struct MemoryElection(pub(super) Handle);

#[async_trait]
impl ElectionAttempt for MemoryElection {
    fn name(&self) -> &LockName {
        &self.0.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, value: &[u8], deadline: Deadline) -> Result<Option<Guard>, LockError> {
        self.0
            .attempt(Mode::Exclusive, Arc::from(value), deadline)
            .await
    }
}

#[async_trait]
impl LeaderSource for MemoryElection {
    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        let session = *unpoisoned(&self.0.provider.session);
        self.0.provider.metrics.record_server_requests(1);
        match self.0.provider.server.head(&self.0.key, session) {
            Ok(head) => Ok(head),
            Err(_) => Err(self.0.session_expired()),
        }
    }

    async fn changed(&self, seen: &Option<LeaderInfo>) -> Result<(), LockError> {
        let mut changes = self.0.provider.server.observe(&self.0.key);
        // A change between the caller's read and this subscription would be missed:
        // compare once more now that nothing can slip by.
        if self.leader().await? != *seen {
            return Ok(());
        }
        // The server never drops a sender that has receivers.
        let _ = changes.changed().await;
        Ok(())
    }
}

/// The backend side of a guard from the in-memory backend.
struct MemoryGuard {
    server: Arc<ServerInner>,
    metrics: Arc<Metrics>,
    key: LockKey,
    id: u64,
    lost: LostSignal,
}

impl fmt::Debug for MemoryGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryGuard")
            .field("name", &self.key.name)
            .field("family", &self.key.family)
            .field("id", &self.id)
            .finish()
    }
}

#[async_trait]
impl GuardBackend for MemoryGuard {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn release(&mut self) -> Result<(), LockError> {
        self.metrics.record_server_requests(1);
        if self.server.release(&self.key, self.id) {
            Ok(())
        } else {
            Err(LockError::Lost {
                backend: BACKEND,
                name: self.key.name.to_string(),
                reason: self.lost.reason().unwrap_or(LossReason::EntryRemoved),
            })
        }
    }

    fn release_on_drop(self: Box<Self>) {
        self.metrics.record_server_requests(1);
        self.server.release(&self.key, self.id);
    }
}

/// A queued waiter's claim; abandoned (its attempt dropped), it withdraws the waiter, and
/// passes the lock on if a grant raced the cancellation.
struct WaitTicket {
    server: Arc<ServerInner>,
    key: LockKey,
    id: u64,
}

impl Abandon for WaitTicket {
    fn abandon(self) {
        if let Withdrawal::Granted = self.server.withdraw(&self.key, self.id) {
            self.server.release(&self.key, self.id);
        }
    }
}
