//! Held leases: the guard, its watchdog, and the clean-up of grants nobody will use.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    FencingToken, Guard, GuardBackend, LockError, LockName, LossReason, LostNotifier, lost_signal,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often a failed renewal or clean-up is retried, at most.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// One grant on the server(s): what the guard and its watchdog act on.
#[async_trait]
pub(crate) trait Lease: Send + Sync + fmt::Debug + 'static {
    /// The backend's name.
    fn backend(&self) -> &'static str;
    /// The lease length.
    fn ttl(&self) -> Duration;
    /// The margin taken off every validity for clock drift.
    fn drift(&self) -> Duration;
    /// Whether the provider is gone (its last handle dropped).
    fn is_closed(&self) -> bool;
    /// Resolves when the provider is gone.
    async fn closed(&self);
    /// Renews the lease: `Ok(true)` renewed, `Ok(false)` no longer ours.
    async fn extend(&self) -> Result<bool, LockError>;
    /// Gives the grant up: `Ok(true)` released, `Ok(false)` it was no longer ours.
    async fn release(&self) -> Result<bool, LockError>;
}

/// What the guard and its watchdog share.
#[derive(Debug)]
struct LeaseState {
    valid_until: Mutex<Instant>,
    suspect: AtomicBool,
    /// Set while a release is under way or done: a failed renewal is then no loss.
    releasing: AtomicBool,
    stopped: AtomicBool,
    stop: Notify,
}

impl LeaseState {
    fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn renewed(&self, valid_until: Instant) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = valid_until;
        self.suspect.store(false, Ordering::Release);
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.stop.notify_waiters();
    }
}

/// Makes the guard of a grant whose request was sent at `sent`: its validity runs from then,
/// less the drift. The watchdog starts at once.
///
/// # Errors
///
/// When the validity had already run out by the time the reply came, the grant is given up
/// in the background and the acquisition fails with a retryable error rather than hand out
/// an expired lock.
pub(crate) fn grant(
    lease: Arc<dyn Lease>,
    name: &LockName,
    token: u64,
    sent: Instant,
) -> Result<Guard, LockError> {
    let valid_until = (sent + lease.ttl())
        .checked_sub(lease.drift())
        .unwrap_or(sent);
    if valid_until <= Instant::now() {
        tracing::debug!(lock = %name, "redis: the grant's reply came after its lease; giving it up");
        release_in_background(lease.clone());
        return Err(LockError::Backend {
            backend: lease.backend(),
            name: Some(name.to_string()),
            message: "the server's reply came after the lease had run out; the grant was given up"
                .to_owned(),
            retryable: true,
            source: None,
        });
    }
    let (notifier, lost) = lost_signal();
    let state = Arc::new(LeaseState {
        valid_until: Mutex::new(valid_until),
        suspect: AtomicBool::new(false),
        releasing: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        stop: Notify::new(),
    });
    tokio::spawn(watchdog(lease.clone(), Arc::clone(&state), notifier, sent));
    let backend = RedisGuard {
        lease,
        state,
        name: name.to_string(),
    };
    Ok(Guard::new(
        name.clone(),
        FencingToken(token),
        lost,
        Box::new(backend),
    ))
}

/// Renews the lease every ttl/3 while the guard lives; fires the lost signal when the
/// validity passes without a confirmed renewal, or the key is gone or someone else's.
async fn watchdog(
    lease: Arc<dyn Lease>,
    state: Arc<LeaseState>,
    notifier: LostNotifier,
    granted: Instant,
) {
    let period = lease.ttl() / 3;
    let mut next = granted + period;
    loop {
        let valid_until = state.valid_until();
        let wake = next.min(valid_until);
        let stopped = state.stop.notified();
        tokio::pin!(stopped);
        stopped.as_mut().enable();
        if state.stopped.load(Ordering::Acquire) {
            return;
        }
        tokio::select! {
            () = &mut stopped => return,
            () = lease.closed() => {
                // The provider is the session: its end frees the lock at once, and the
                // guard can no longer vouch for it.
                notifier.fire(LossReason::SessionExpired);
                state.stop();
                release_in_background(lease);
                return;
            }
            () = tokio::time::sleep_until(wake) => {}
        }
        if state.stopped.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        if now >= state.valid_until() {
            if !state.releasing.load(Ordering::Acquire) {
                tracing::warn!(
                    ?lease,
                    "redis: the lease ran out without a confirmed renewal"
                );
                notifier.fire(LossReason::LeaseExpired);
            }
            return;
        }
        let budget = state.valid_until().saturating_duration_since(now);
        match tokio::time::timeout(budget, lease.extend()).await {
            Ok(Ok(true)) => {
                let until = (now + lease.ttl())
                    .checked_sub(lease.drift())
                    .unwrap_or(now);
                state.renewed(until);
                next = now + period;
            }
            Ok(Ok(false)) => {
                if !state.releasing.load(Ordering::Acquire) {
                    tracing::warn!(?lease, "redis: the lock key is gone or someone else's");
                    notifier.fire(LossReason::EntryRemoved);
                }
                return;
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "redis: renewal failed; retrying");
                state.suspect.store(true, Ordering::Release);
                next = Instant::now() + RETRY_PAUSE.min(period);
            }
            Err(_) => {
                state.suspect.store(true, Ordering::Release);
                next = Instant::now();
            }
        }
    }
}

/// Releases `lease` in the background, retrying failures until the lease would have run
/// out anyway.
pub(crate) fn release_in_background(lease: Arc<dyn Lease>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(
            ?lease,
            "redis: no runtime for the release; the lease will expire"
        );
        return;
    };
    runtime.spawn(async move {
        let give_up = Instant::now() + lease.ttl();
        loop {
            match lease.release().await {
                Ok(_) => return,
                Err(error) if error.is_retryable() && Instant::now() < give_up => {
                    tracing::debug!(%error, "redis: background release failed; retrying");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(error) => {
                    tracing::debug!(%error, "redis: background release failed; the lease will expire");
                    return;
                }
            }
        }
    });
}

/// The backend side of a Redis guard.
struct RedisGuard {
    lease: Arc<dyn Lease>,
    state: Arc<LeaseState>,
    name: String,
}

impl fmt::Debug for RedisGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisGuard")
            .field("lease", &self.lease)
            .field("valid_until", &self.state.valid_until())
            .finish()
    }
}

impl RedisGuard {
    fn lost(&self, reason: LossReason) -> LockError {
        LockError::Lost {
            backend: self.lease.backend(),
            name: self.name.clone(),
            reason,
        }
    }
}

#[async_trait]
impl GuardBackend for RedisGuard {
    fn backend(&self) -> &'static str {
        self.lease.backend()
    }

    async fn release(&mut self) -> Result<(), LockError> {
        if self.lease.is_closed() {
            self.state.stop();
            return Err(self.lost(LossReason::SessionExpired));
        }
        self.state.releasing.store(true, Ordering::Release);
        match self.lease.release().await {
            Ok(true) => {
                self.state.stop();
                Ok(())
            }
            Ok(false) => {
                self.state.stop();
                Err(self.lost(LossReason::EntryRemoved))
            }
            Err(error) => {
                // The release may have happened with its reply lost: the watchdog keeps
                // renewing while the key is ours, but a key found gone is no loss now
                // (a release sent again tells which it was, from the receipt).
                Err(error)
            }
        }
    }

    fn release_on_drop(self: Box<Self>) {
        self.state.releasing.store(true, Ordering::Release);
        self.state.stop();
        if !self.lease.is_closed() {
            release_in_background(Arc::clone(&self.lease));
        }
    }

    fn valid_until(&self) -> Option<std::time::Instant> {
        Some(self.state.valid_until().into_std())
    }

    fn is_suspect(&self) -> bool {
        self.state.suspect.load(Ordering::Acquire)
    }
}
