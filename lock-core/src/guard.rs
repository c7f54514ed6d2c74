//! The held lock: one concrete type over a backend SPI.

use std::fmt;
use std::time::Instant;

use async_trait::async_trait;

use crate::{FencingToken, LockError, LockName, LostSignal};

/// The backend side of a [`Guard`]: what a backend implements to hand out guards.
///
/// Implementors are the backends, not applications. A guard backend represents exactly one
/// grant (one node, one owner key, one in-memory holder entry).
///
/// # Contract
///
/// - [`release`](GuardBackend::release) is *conditional* on ownership: it removes this
///   grant's entry only if the server still records this grant as the holder, and never
///   touches another holder's entry. When the grant is gone (revoked, expired, taken over)
///   it returns [`LockError::Lost`] and changes nothing.
/// - `release` is idempotent and may be called again after an error or after its future was
///   dropped part-way; a later call must converge to the same outcome.
/// - [`release_on_drop`](GuardBackend::release_on_drop) must not block, must not panic (also
///   outside a Tokio runtime) and must not print; it starts a best-effort release, typically
///   a spawned task, and relies on the session or lease as the backstop.
/// - The backend fires the grant's [`LostNotifier`](crate::LostNotifier) when it can no
///   longer vouch for the lock.
#[async_trait]
pub trait GuardBackend: Send + Sync + fmt::Debug + 'static {
    /// The backend's name, as in [`LockError`] messages.
    fn backend(&self) -> &'static str;

    /// Releases the grant if it is still ours. See the trait's contract.
    async fn release(&mut self) -> Result<(), LockError>;

    /// Starts a best-effort release without waiting for it. Called once, from the guard's
    /// `Drop`, when the guard was not released.
    fn release_on_drop(self: Box<Self>);

    /// A conservative local deadline for backends that hold a lease.
    fn valid_until(&self) -> Option<Instant> {
        None
    }

    /// Whether the backend currently cannot confirm the lock (e.g. ZooKeeper disconnected,
    /// session not yet expired). Not a loss: the lock may still be held.
    fn is_suspect(&self) -> bool {
        false
    }
}

/// A held lock.
///
/// One concrete type for every backend and lock kind. It carries the lock's
/// [fencing token](Guard::fencing_token) and its [lost signal](Guard::lost).
///
/// # Release contract
///
/// - [`release`](Guard::release) frees the lock *only if this guard still holds it*. It never
///   deletes another holder's node or key. If the lock was lost (revoked, session or lease
///   expired, entry deleted), it returns [`LockError::Lost`] and leaves the current holder
///   untouched.
/// - A successful release never fires the lost signal; it ends it (waiters on
///   [`LostSignal::wait`] get `None`).
/// - Releasing twice, or dropping after a release, is a no-op returning `Ok(())`.
/// - After a retryable error (e.g. [`LockError::Connection`]) the guard still owns the grant:
///   call `release` again, or drop the guard to release in the background. Once the lost
///   signal has fired, though, an error on the way is no news: `release` returns
///   [`LockError::Lost`] and finishes the release in the background.
/// - Dropping a guard without releasing starts a best-effort release in the background and
///   returns at once; the ZooKeeper session or the Redis lease frees the lock if that fails.
///   Prefer an explicit `release().await` to learn the outcome.
///
/// # Cancel safety
///
/// `release` is cancel-safe in this sense: if its future is dropped before completion, the
/// guard keeps the grant exactly as if `release` had not been called, except that the
/// server may already have removed the entry. A later `release` or the guard's drop finishes
/// the job; it is never done twice to someone else's entry.
///
/// ```
/// # async fn demo(lock: &dyn lock_core::DistributedLock) -> Result<(), lock_core::LockError> {
/// let mut guard = lock.acquire(None).await?;
/// let token = guard.fencing_token(); // send with every write to the protected resource
/// # let _ = token;
/// guard.release().await?;
/// guard.release().await?; // no-op
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct Guard {
    name: LockName,
    token: FencingToken,
    lost: LostSignal,
    backend: &'static str,
    /// `None` once released.
    inner: Option<Box<dyn GuardBackend>>,
    /// The hold's part in the metrics, for a guard of an observed lock.
    hold: Option<crate::observe::Hold>,
}

impl Guard {
    /// Assembles a guard. Called by backends when a grant succeeds.
    pub fn new(
        name: LockName,
        token: FencingToken,
        lost: LostSignal,
        inner: Box<dyn GuardBackend>,
    ) -> Self {
        Guard {
            name,
            token,
            lost,
            backend: inner.backend(),
            inner: Some(inner),
            hold: None,
        }
    }

    /// The guard, measuring its hold (and counting its loss) as `hold` says.
    pub(crate) fn with_hold(mut self, hold: crate::observe::Hold) -> Self {
        self.lost.count_loss_with(hold.recording());
        self.hold = Some(hold);
        self
    }

    /// Ends the hold's measure, if any: as `otherwise` says, or `lost` when the backend
    /// stopped vouching for the lock.
    fn end_hold(&mut self, otherwise: crate::observe::HoldEnd) {
        if let Some(hold) = self.hold.take() {
            hold.end(if self.lost.is_lost() {
                crate::observe::HoldEnd::Lost
            } else {
                otherwise
            });
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The backend that granted the lock.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The fencing token of this grant; larger than every earlier holder's token for this name
    /// (see [`Capabilities::fencing`](crate::Capabilities::fencing) for how strong that is).
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The lost signal of this grant; clone it freely, for example into a watchdog task.
    pub fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Shorthand for `self.lost().is_lost()`.
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Whether the backend currently cannot confirm the lock (connection down, session not
    /// yet expired). The lock may still be held; stop or pause work that needs certainty.
    pub fn is_suspect(&self) -> bool {
        self.inner.as_ref().is_some_and(|inner| inner.is_suspect())
    }

    /// A conservative local deadline until which the backend vouches for the lock, for
    /// lease backends; `None` for session backends (use [`Guard::lost`]) and after release.
    pub fn valid_until(&self) -> Option<Instant> {
        self.inner.as_ref().and_then(|inner| inner.valid_until())
    }

    /// Whether [`release`](Guard::release) has completed.
    pub fn is_released(&self) -> bool {
        self.inner.is_none()
    }

    /// Releases the lock if this guard still holds it. See the release contract and cancel
    /// safety above.
    pub async fn release(&mut self) -> Result<(), LockError> {
        let Some(inner) = self.inner.as_mut() else {
            return Ok(());
        };
        let released = match inner.release().await {
            Ok(()) => {
                self.inner = None;
                match self.lost.reason() {
                    // The backend had already stopped vouching for the lock: whatever the
                    // server did, the caller must learn that its hold was not continuous.
                    Some(reason) => Err(self.lost_error(reason)),
                    None => {
                        self.lost.end();
                        Ok(())
                    }
                }
            }
            Err(LockError::Lost { reason, .. }) => {
                self.inner = None;
                self.lost.mark_lost(reason.clone());
                Err(self.lost_error(reason))
            }
            Err(other) => match self.lost.reason() {
                // Lost already: the hold is over whatever the server answers, and a release
                // that cannot reach it (a connection cut past the session, say) is finished
                // in the background — conditional, so it leaves a new holder alone.
                Some(reason) => {
                    if let Some(inner) = self.inner.take() {
                        tracing::debug!(backend = self.backend, lock = %self.name, error = %other, "the release of a lost guard failed; finishing it in the background");
                        inner.release_on_drop();
                    }
                    Err(self.lost_error(reason))
                }
                None => Err(other),
            },
        };
        if self.inner.is_none() {
            self.end_hold(crate::observe::HoldEnd::Released);
        }
        released
    }

    fn lost_error(&self, reason: crate::LossReason) -> LockError {
        LockError::Lost {
            backend: self.backend,
            name: self.name.as_str().to_owned(),
            reason,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let inner = self.inner.take();
        if inner.is_some() {
            // First: a loss firing from now on is no loss of this hold.
            self.lost.end();
        }
        self.end_hold(crate::observe::HoldEnd::Dropped);
        if let Some(inner) = inner {
            tracing::debug!(backend = self.backend, lock = %self.name, "guard dropped without release; releasing in the background");
            inner.release_on_drop();
        }
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("backend", &self.backend)
            .field("name", &self.name)
            .field("token", &self.token)
            .field("lost", &self.lost)
            .field("released", &self.inner.is_none())
            .finish()
    }
}
