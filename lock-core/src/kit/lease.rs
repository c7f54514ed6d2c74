//! Guards over leases: the watchdog that renews a grant and the guard that vouches for it.
//!
//! A lease-based backend (a key with an expiry, say) writes one [`Lease`] per grant: how to
//! renew it and how to give it up. [`lease_guard`] turns a grant into a [`Guard`] whose
//! validity runs from when the granting request was *sent* (the server set the expiry no
//! earlier), less a clock-drift margin, and starts a watchdog that renews it every ttl/3.
//! The guard's lost signal fires when the validity passes without a confirmed renewal
//! ([`LossReason::LeaseExpired`]), when the server says the grant is gone or someone
//! else's ([`LossReason::EntryRemoved`]), or when the provider's session ends
//! ([`LossReason::SessionExpired`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Closed, Retry, retry_in_background, unpoisoned};
use crate::{
    Deadline, FencingToken, Guard, GuardBackend, LockError, LockName, LossReason, LostNotifier,
    lost_signal,
};

/// How often a failed renewal or release is retried, at most.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// One grant held under a lease: what a lease-based backend writes for [`lease_guard`].
///
/// Both requests must be idempotent for the grant's owner: the watchdog and the release
/// send them again after errors, and a reply may be lost after the server acted.
#[async_trait]
pub trait Lease: Send + Sync + fmt::Debug + 'static {
    /// The backend's name, as in [`LockError`] messages.
    fn backend(&self) -> &'static str;
    /// The lease length a renewal sets.
    fn ttl(&self) -> Duration;
    /// The margin taken off every validity for clock drift between client and server.
    fn drift(&self) -> Duration;
    /// The provider's session: its end gives the grant up and counts as a loss.
    fn session(&self) -> &Closed;
    /// Renews the lease for another [`ttl`](Lease::ttl), if the grant is still ours.
    async fn extend(&self) -> Result<Renewal, LockError>;
    /// Gives the grant up: `Ok(true)` released, `Ok(false)` it was no longer ours.
    async fn release(&self) -> Result<bool, LockError>;
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewal {
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
        unpoisoned(&self.valid_until)
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

/// The guard of a grant whose request was sent at `sent` and whose lease the server set to
/// `length` (the ttl, or a shorter first lease such as a hand-off's): its validity runs
/// from `sent`, less the drift. The watchdog starts at once, and renews first within half
/// of `length`.
///
/// # Errors
///
/// When the validity had already run out by the time the reply came, the grant is given up
/// in the background and the acquisition fails with a retryable [`LockError::Backend`]
/// rather than hand out an expired lock.
pub fn lease_guard(
    lease: Arc<dyn Lease>,
    name: &LockName,
    token: FencingToken,
    sent: Instant,
    length: Duration,
) -> Result<Guard, LockError> {
    let valid_until = (sent + length).checked_sub(lease.drift()).unwrap_or(sent);
    if valid_until <= Instant::now() {
        tracing::debug!(backend = lease.backend(), lock = %name, "the grant's reply came after its lease; giving it up");
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
    let first_renewal = sent + (length / 2).min(lease.ttl() / 3);
    tokio::spawn(watchdog(
        lease.clone(),
        Arc::clone(&state),
        notifier,
        first_renewal,
    ));
    let backend = LeaseGuard {
        lease,
        state,
        name: name.to_string(),
    };
    Ok(Guard::new(name.clone(), token, lost, Box::new(backend)))
}

/// Renews the lease every ttl/3 while the guard lives; fires the lost signal when the
/// validity passes without a confirmed renewal, or the grant is gone or someone else's.
async fn watchdog(
    lease: Arc<dyn Lease>,
    state: Arc<LeaseState>,
    notifier: LostNotifier,
    first_renewal: Instant,
) {
    let backend = lease.backend();
    let period = lease.ttl() / 3;
    let mut next = first_renewal;
    loop {
        let wake = next.min(state.valid_until());
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
                backend,
                ?lease,
                "the lease ran out without a confirmed renewal"
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
                tracing::warn!(backend, ?lease, "the lease is gone or someone else's");
                state.lost(&notifier, LossReason::EntryRemoved);
                return;
            }
            Ok(Err(error)) => {
                tracing::debug!(backend, %error, "renewal failed; retrying");
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
/// out anyway: for a grant that nobody will use (a dropped guard, an abandoned vote).
pub fn release_in_background(lease: Arc<dyn Lease>) {
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

/// The backend side of a guard over a lease.
struct LeaseGuard {
    lease: Arc<dyn Lease>,
    state: Arc<LeaseState>,
    name: String,
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("lease", &self.lease)
            .field("valid_until", &self.state.valid_until())
            .finish()
    }
}

impl LeaseGuard {
    fn lost(&self, reason: LossReason) -> LockError {
        LockError::Lost {
            backend: self.lease.backend(),
            name: self.name.clone(),
            reason,
        }
    }
}

#[async_trait]
impl GuardBackend for LeaseGuard {
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
        // The release is conditional on ownership, so harmless after the session's end
        // released it.
        release_in_background(Arc::clone(&self.lease));
    }

    fn valid_until(&self) -> Option<std::time::Instant> {
        Some(self.state.valid_until().into_std())
    }

    fn is_suspect(&self) -> bool {
        self.state.suspect.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::AtomicU32;

    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    /// A lease whose renewals answer from a script (then `Renewed`), counting requests.
    #[derive(Debug, Default)]
    struct Scripted {
        session: Closed,
        renewals: Mutex<VecDeque<Result<Renewal, ()>>>,
        extends: AtomicU32,
        releases: AtomicU32,
        still_ours: AtomicBool,
    }

    impl Scripted {
        fn new(renewals: impl IntoIterator<Item = Result<Renewal, ()>>) -> Arc<Self> {
            let lease = Scripted::default();
            *lease.renewals.lock().unwrap() = renewals.into_iter().collect();
            lease.still_ours.store(true, Ordering::SeqCst);
            Arc::new(lease)
        }

        fn counts(&self) -> (u32, u32) {
            (
                self.extends.load(Ordering::SeqCst),
                self.releases.load(Ordering::SeqCst),
            )
        }
    }

    #[async_trait]
    impl Lease for Scripted {
        fn backend(&self) -> &'static str {
            "scripted"
        }
        fn ttl(&self) -> Duration {
            TTL
        }
        fn drift(&self) -> Duration {
            Duration::from_millis(30)
        }
        fn session(&self) -> &Closed {
            &self.session
        }
        async fn extend(&self) -> Result<Renewal, LockError> {
            self.extends.fetch_add(1, Ordering::SeqCst);
            let next = self.renewals.lock().unwrap().pop_front();
            next.unwrap_or(Ok(Renewal::Renewed))
                .map_err(|()| LockError::Connection {
                    backend: "scripted",
                    name: None,
                    message: "the server is down".into(),
                    source: None,
                })
        }
        async fn release(&self) -> Result<bool, LockError> {
            self.releases.fetch_add(1, Ordering::SeqCst);
            Ok(self.still_ours.swap(false, Ordering::SeqCst))
        }
    }

    fn guard_of(lease: &Arc<Scripted>) -> Guard {
        let name = LockName::new("jobs").unwrap();
        let lease = Arc::clone(lease) as Arc<dyn Lease>;
        lease_guard(lease, &name, FencingToken(7), Instant::now(), TTL).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn renews_every_third_of_the_ttl_and_releases_once() {
        let lease = Scripted::new([]);
        let mut guard = guard_of(&lease);
        tokio::time::sleep(TTL * 2).await;
        // At 1, 2, 3, 4 and 5 s, and the sixth at 6 s has not come yet or just came.
        assert!((5..=6).contains(&lease.counts().0), "{:?}", lease.counts());
        assert!(!guard.is_lost());
        let until = guard.valid_until().expect("a lease guard has a validity");
        assert!(until > std::time::Instant::now() + TTL / 2);
        guard.release().await.unwrap();
        let renewals = lease.counts().0;
        tokio::time::sleep(TTL * 2).await;
        assert_eq!(lease.counts(), (renewals, 1), "the watchdog stopped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_gone_at_renewal_is_lost_as_removed() {
        let lease = Scripted::new([Ok(Renewal::Gone)]);
        let mut guard = guard_of(&lease);
        tokio::time::sleep(TTL / 3 + Duration::from_millis(1)).await;
        assert!(guard.is_lost());
        assert!(matches!(
            guard.release().await,
            Err(LockError::Lost {
                reason: LossReason::EntryRemoved,
                ..
            })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn failed_renewals_lose_the_lease_at_its_validity_not_before() {
        let lease = Scripted::new(std::iter::repeat_n(Err(()), 1000));
        let guard = guard_of(&lease);
        tokio::time::sleep(TTL / 2).await;
        assert!(guard.is_suspect() && !guard.is_lost());
        // Validity: the ttl less the 30 ms drift, from the grant.
        tokio::time::sleep(TTL / 2 - Duration::from_millis(40)).await;
        assert!(!guard.is_lost());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(guard.is_lost());
        assert!(lease.counts().0 > 10, "retried every 100 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn the_session_end_loses_the_guard_and_releases_it() {
        let lease = Scripted::new([]);
        let mut guard = guard_of(&lease);
        lease.session.close();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(guard.is_lost());
        assert_eq!(lease.counts().1, 1);
        assert!(matches!(
            guard.release().await,
            Err(LockError::Lost {
                reason: LossReason::SessionExpired,
                ..
            })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_after_the_lease_gives_the_grant_up() {
        let lease = Scripted::new([]);
        let name = LockName::new("jobs").unwrap();
        let sent = Instant::now();
        tokio::time::sleep(TTL).await;
        let late = lease_guard(lease.clone(), &name, FencingToken(1), sent, TTL);
        assert!(matches!(late, Err(ref error) if error.is_retryable()));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(lease.counts(), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_guard_is_released_in_the_background() {
        let lease = Scripted::new([]);
        drop(guard_of(&lease));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(lease.counts(), (0, 1));
    }
}
