//! Held leases: the guard, its watchdog, and the clean-up of grants nobody will use.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::kit::{Closed, Retry, retry_in_background};
use lock_core::{
    Deadline, FencingToken, Guard, GuardBackend, LockError, LockName, LossReason, LostNotifier,
    lost_signal,
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
    /// The provider's session, closed once its last handle is dropped.
    fn session(&self) -> &Closed;
    /// Renews the lease.
    async fn extend(&self) -> Result<Renewal, LockError>;
    /// Gives the grant up: `Ok(true)` released, `Ok(false)` it was no longer ours.
    async fn release(&self) -> Result<bool, LockError>;
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Still ours: renewed.
    Renewed,
    /// Released by this owner already (a release whose reply was lost).
    Released,
    /// Gone, or someone else's.
    Gone,
}

/// What the guard and its watchdog share.
#[derive(Debug)]
struct LeaseState {
    valid_until: Mutex<Instant>,
    suspect: AtomicBool,
    stopped: AtomicBool,
    stop: Notify,
}

impl LeaseState {
    fn until(&self) -> MutexGuard<'_, Instant> {
        self.valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn valid_until(&self) -> Instant {
        *self.until()
    }

    fn renewed(&self, valid_until: Instant) {
        *self.until() = valid_until;
        self.suspect.store(false, Ordering::Release);
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.stop.notify_waiters();
    }

    /// The backend no longer vouches for the lock: its validity ends now.
    fn lost(&self, notifier: &LostNotifier, reason: LossReason) {
        *self.until() = Instant::now();
        notifier.fire(reason);
    }
}

/// Makes the guard of a grant whose request was sent at `sent` and whose key the server
/// set to expire after `length` (the ttl, or a hand-off's shorter claim): its validity runs
/// from then, less the drift. The watchdog starts at once.
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
    length: Duration,
) -> Result<Guard, LockError> {
    let valid_until = (sent + length).checked_sub(lease.drift()).unwrap_or(sent);
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
        stopped: AtomicBool::new(false),
        stop: Notify::new(),
    });
    // The first renewal comes early enough for a hand-off's short claim, too.
    let first_renewal = sent + (length / 2).min(lease.ttl() / 3);
    tokio::spawn(watchdog(
        lease.clone(),
        Arc::clone(&state),
        notifier,
        first_renewal,
    ));
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
    first_renewal: Instant,
) {
    let period = lease.ttl() / 3;
    let mut next = first_renewal;
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
            () = lease.session().wait() => {
                // The provider is the session: its end frees the lock at once, and the
                // guard can no longer vouch for it.
                state.lost(&notifier, LossReason::SessionExpired);
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
            tracing::warn!(
                ?lease,
                "redis: the lease ran out without a confirmed renewal"
            );
            state.lost(&notifier, LossReason::LeaseExpired);
            return;
        }
        let budget = state.valid_until().saturating_duration_since(now);
        match tokio::time::timeout(budget, lease.extend()).await {
            Ok(Ok(Renewal::Renewed)) => {
                let until = (now + lease.ttl())
                    .checked_sub(lease.drift())
                    .unwrap_or(now);
                state.renewed(until);
                next = now + period;
            }
            // Our own release went through, its reply lost: no loss, but the lock is
            // no longer this guard's to vouch for.
            Ok(Ok(Renewal::Released)) => {
                state.renewed(Instant::now());
                state.suspect.store(true, Ordering::Release);
                return;
            }
            Ok(Ok(Renewal::Gone)) => {
                tracing::warn!(?lease, "redis: the lock key is gone or someone else's");
                state.lost(&notifier, LossReason::EntryRemoved);
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
    let what = format!("release of {lease:?}");
    let give_up = Deadline::after(Some(lease.ttl()));
    retry_in_background(lease.backend(), what, RETRY_PAUSE, give_up, move || {
        let lease = Arc::clone(&lease);
        async move {
            match lease.release().await {
                Ok(_) => Retry::Done,
                Err(error) if error.is_retryable() => Retry::Again(error.to_string()),
                Err(error) => Retry::GiveUp(error.to_string()),
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
        if self.lease.session().is_closed() {
            // The provider's end gives the lock up; make sure of it.
            self.state.stop();
            release_in_background(Arc::clone(&self.lease));
            return Err(self.lost(LossReason::SessionExpired));
        }
        match self.lease.release().await {
            Ok(true) => {
                self.state.stop();
                Ok(())
            }
            Ok(false) => {
                self.state.stop();
                Err(self.lost(LossReason::EntryRemoved))
            }
            // Still ours as far as we know: the watchdog keeps renewing, and tells a
            // release that went through with its reply lost from a loss by the receipt.
            Err(error) => Err(error),
        }
    }

    fn release_on_drop(self: Box<Self>) {
        self.state.stop();
        // Conditional on ownership, so harmless after the provider's end released it.
        release_in_background(Arc::clone(&self.lease));
    }

    fn valid_until(&self) -> Option<std::time::Instant> {
        Some(self.state.valid_until().into_std())
    }

    fn is_suspect(&self) -> bool {
        self.state.suspect.load(Ordering::Acquire)
    }
}
