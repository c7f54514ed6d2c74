//! Guards over leases: the session's timer that renews every grant, and the guard that
//! vouches for it.
//!
//! A lease-based backend (a key with an expiry, say) writes one [`Lease`] per grant: how to
//! renew it and how to give it up. [`lease_guard`] turns a grant into a [`Guard`] whose
//! validity runs from when the granting request was *sent* (the server set the expiry no
//! earlier), less a clock-drift margin, and has it renewed every ttl/3.
//! The guard's lost signal fires when the validity passes without a confirmed renewal
//! ([`LossReason::LeaseExpired`]), when the server says the grant is gone or someone
//! else's ([`LossReason::EntryRemoved`]), or when the provider's session ends
//! ([`LossReason::SessionExpired`]).
//!
//! Implementation details: a process may hold many thousands of leases, so a held lease is
//! a small record ([`Held`]) and no task of its own. Each session ([`Closed`]) has one
//! timer task and one queue of the times its leases next need it: at such a time the timer
//! either finds the validity passed (the lease is lost) or spawns the renewal, which runs
//! as long as the server takes and then queues the lease again. A renewal is the only
//! other place a lease's next time is decided, so a lease is in the queue or being renewed,
//! never both. When the session ends, the timer fires every queued lease's signal before
//! it sends any clean-up, and a renewal under way ends its own lease.

use std::cmp::Ordering as Order;
use std::collections::BinaryHeap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Closed, Retry, retry_in_background, unpoisoned};
use crate::{
    Deadline, FencingToken, Guard, GuardBackend, LockError, LockName, LossReason, LostNotifier,
    lost_signal,
};

/// How often a failed renewal or release is retried, at most.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A poll of [`Lease::extend`] that takes longer than this blocked its thread.
const BLOCKING_POLL: Duration = Duration::from_millis(50);

/// One grant held under a lease: what a lease-based backend writes for [`lease_guard`].
///
/// Both requests must be idempotent for the grant's owner: the renewals and the release
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
    ///
    /// It must not block its thread (wrap blocking I/O in `tokio::task::spawn_blocking`):
    /// a renewal is cut short at the validity's end by a timer, which cannot cut a renewal
    /// that holds the thread — the lost signal would fire only once the
    /// renewal returned, after `valid_until`. A poll of it that takes more than 50 ms is
    /// logged as an error.
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
    /// Released by this owner already: a release whose reply was lost, or this guard's
    /// own release, which the renewal raced.
    Released,
    /// Gone, or someone else's. Not a loss while the guard's own release is on its way
    /// (the release may have gone through first): the release's answer decides.
    Gone,
}

/// A held lease: what its guard, its session's timer and its renewals share.
struct Held {
    lease: Arc<dyn Lease>,
    notifier: LostNotifier,
    valid_until: Mutex<Instant>,
    suspect: AtomicBool,
    stopped: AtomicBool,
    /// The guard's release is on its way: a renewal that finds the grant gone is no loss.
    releasing: AtomicBool,
}

impl Held {
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

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// No more renewals: the guard's release went through, or the lease is lost.
    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// The backend no longer vouches for the lock: its validity ends now.
    fn lost(&self, reason: LossReason) {
        *self.until() = Instant::now();
        self.notifier.fire(reason);
    }

    /// The session ended: the lease is lost, unless it was stopped already. Returns whether
    /// its grant is left to give up.
    fn end_with_session(&self) -> bool {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.lost(LossReason::SessionExpired);
        true
    }

    /// Has the session's timer look at this lease at `at`, or at its validity's end if
    /// that comes first.
    fn schedule(self: &Arc<Self>, at: Instant) {
        let at = at.min(self.valid_until());
        self.lease.session().renewals().enqueue(self, at);
    }

    /// The timer's look: the validity has passed without a confirmed renewal, or it is
    /// time to renew.
    fn come_due(self: Arc<Self>, now: Instant) {
        if self.is_stopped() {
            return;
        }
        if now >= self.valid_until() {
            tracing::warn!(
                backend = self.lease.backend(),
                lease = ?self.lease,
                "the lease ran out without a confirmed renewal"
            );
            self.lost(LossReason::LeaseExpired);
            return;
        }
        tokio::spawn(renew(self));
    }
}

/// One renewal of `held`, then its next time in the session's queue (unless it ended).
async fn renew(held: Arc<Held>) {
    let lease = held.lease.as_ref();
    let backend = lease.backend();
    let period = lease.ttl() / 3;
    let now = Instant::now();
    let budget = held.valid_until().saturating_duration_since(now);
    let answer = tokio::select! {
        () = lease.session().wait() => {
            if held.end_with_session() {
                release_in_background(Arc::clone(&held.lease));
            }
            return;
        }
        answer = tokio::time::timeout(budget, extend_checked(lease)) => answer,
    };
    // Read before `stopped`: a release that ends sets `stopped`, then clears this.
    let releasing = held.releasing.load(Ordering::Acquire);
    if held.is_stopped() {
        return;
    }
    let outcome = match &answer {
        Ok(Ok(Renewal::Renewed)) => Some("renewed"),
        Ok(Ok(Renewal::Gone)) if !releasing => Some("refused"),
        Ok(Err(_)) | Err(_) => Some("failed"),
        Ok(Ok(Renewal::Released | Renewal::Gone)) => None,
    };
    if let Some(outcome) = outcome {
        crate::observe::record_renewal(backend, outcome);
    }
    let next = match answer {
        // The guard's own release is on its way and may have gone through first: its
        // answer decides, and the renewals stop with it.
        Ok(Ok(Renewal::Released | Renewal::Gone)) if releasing => {
            Instant::now() + RETRY_PAUSE.min(period)
        }
        Ok(Ok(Renewal::Renewed)) => {
            let until = (now + lease.ttl())
                .checked_sub(lease.drift())
                .unwrap_or(now);
            held.renewed(until);
            now + period
        }
        // Our own release went through, its reply lost: no loss, but the lock is no
        // longer this guard's to vouch for.
        Ok(Ok(Renewal::Released)) => {
            held.renewed(Instant::now());
            held.suspect.store(true, Ordering::Release);
            return;
        }
        Ok(Ok(Renewal::Gone)) => {
            tracing::warn!(backend, ?lease, "the lease is gone or someone else's");
            held.lost(LossReason::EntryRemoved);
            return;
        }
        Ok(Err(error)) => {
            tracing::debug!(backend, %error, "renewal failed; retrying");
            held.suspect.store(true, Ordering::Release);
            Instant::now() + RETRY_PAUSE.min(period)
        }
        // The validity has run out: the timer finds it so at once.
        Err(_) => {
            held.suspect.store(true, Ordering::Release);
            Instant::now()
        }
    };
    held.schedule(next);
}

/// A lease's next look by its session's timer. Ordered so that the earliest is on top of
/// the queue.
struct Due {
    at: Instant,
    /// Weak, so that a released guard's record goes with the guard, not at its next time.
    held: Weak<Held>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Order> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> Order {
        other.at.cmp(&self.at)
    }
}

/// One session's lease timer (see the module's implementation details).
#[derive(Default)]
pub(super) struct Renewals {
    queued: Mutex<Queued>,
    /// A lease was queued ahead of the timer's next time, or after the session's end.
    changed: Notify,
}

/// The due times, and the task that serves them: one lock for both, taken once per lease
/// queued.
#[derive(Default)]
struct Queued {
    due: BinaryHeap<Due>,
    /// The timer task. One that finished before the session ended ran on a runtime that
    /// has shut down since: the next lease starts another on the caller's runtime.
    timer: Option<JoinHandle<()>>,
}

impl fmt::Debug for Renewals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Renewals")
            .field("queued", &unpoisoned(&self.queued).due.len())
            .finish()
    }
}

impl Renewals {
    /// Queues `held` for `at`, starting the timer task unless it runs.
    fn enqueue(self: &Arc<Self>, held: &Arc<Held>, at: Instant) {
        let session = held.lease.session();
        let first = {
            let mut queued = unpoisoned(&self.queued);
            let first = queued.due.peek().is_none_or(|due| at < due.at);
            queued.due.push(Due {
                at,
                held: Arc::downgrade(held),
            });
            if queued.timer.as_ref().is_none_or(JoinHandle::is_finished) {
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => {
                        let timer = timer(Arc::clone(self), session.subscribe());
                        queued.timer = Some(runtime.spawn(timer));
                    }
                    Err(_) => {
                        tracing::error!(
                            "a lease guard made outside a tokio runtime is not renewed"
                        );
                    }
                }
            }
            first
        };
        if first || session.is_closed() {
            self.changed.notify_one();
        }
    }

    /// Takes the leases whose time has come, and returns the next time.
    fn take_due(&self, now: Instant) -> (Vec<Arc<Held>>, Option<Instant>) {
        let mut queued = unpoisoned(&self.queued);
        let mut due = Vec::new();
        while queued.due.peek().is_some_and(|next| next.at <= now) {
            if let Some(held) = queued.due.pop().and_then(|next| next.held.upgrade()) {
                due.push(held);
            }
        }
        (due, queued.due.peek().map(|next| next.at))
    }

    /// Takes every queued lease.
    fn take_all(&self) -> Vec<Arc<Held>> {
        let due = std::mem::take(&mut unpoisoned(&self.queued).due);
        due.into_iter()
            .filter_map(|due| due.held.upgrade())
            .collect()
    }
}

/// The session's timer: looks at each lease at its time until the session ends, then ends
/// every lease queued, then and later, until the session is dropped.
async fn timer(renewals: Arc<Renewals>, mut ended: watch::Receiver<bool>) {
    loop {
        // `notify_one` keeps a permit for a wait not yet begun: nothing queued while this
        // pass runs is missed.
        let changed = renewals.changed.notified();
        let next = if *ended.borrow_and_update() {
            let ending = renewals.take_all();
            // Every signal first, then the clean-ups: 100 000 of them must not hold the
            // last signal back.
            let left: Vec<_> = ending
                .into_iter()
                .filter(|held| held.end_with_session())
                .collect();
            for held in left {
                release_in_background(Arc::clone(&held.lease));
            }
            None
        } else {
            let now = Instant::now();
            let (due, next) = renewals.take_due(now);
            for held in due {
                held.come_due(now);
            }
            next
        };
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = ended.changed() => if changed.is_err() { return },
            () = changed => {}
            () = sleep => {}
        }
    }
}

/// The guard of a grant whose request was sent at `sent` and whose lease the server set to
/// `length` (the ttl, or a shorter first lease such as a hand-off's): its validity runs
/// from `sent`, less the drift. The session's timer renews it first within half of
/// `length`, then every ttl/3.
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
        let message = "the server's reply came after the lease had run out; the grant was given up";
        return Err(LockError::other(lease.backend(), message)
            .retryable(true)
            .for_lock(name));
    }
    let (notifier, lost) = lost_signal();
    let first_renewal = sent + (length / 2).min(lease.ttl() / 3);
    let held = Arc::new(Held {
        lease,
        notifier,
        valid_until: Mutex::new(valid_until),
        suspect: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        releasing: AtomicBool::new(false),
    });
    held.schedule(first_renewal);
    let backend = LeaseGuard {
        held,
        name: name.to_string(),
    };
    Ok(Guard::new(name.clone(), token, lost, Box::new(backend)))
}

/// `lease.extend()`, with a poll that blocks its thread logged as an error (see
/// [`Lease::extend`]).
async fn extend_checked(lease: &dyn Lease) -> Result<Renewal, LockError> {
    let mut extend = lease.extend();
    std::future::poll_fn(|cx| {
        let began = std::time::Instant::now();
        let polled = extend.as_mut().poll(cx);
        let took = began.elapsed();
        if took > BLOCKING_POLL {
            tracing::error!(
                backend = lease.backend(),
                ?took,
                "Lease::extend blocked its thread, which keeps the lease's timer from giving \
                 the grant up in time; it must not block (use spawn_blocking)"
            );
        }
        polled
    })
    .await
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

/// Clears the `releasing` flag when the release ends, however it ends (dropped too).
struct Releasing<'a>(&'a AtomicBool);

impl Drop for Releasing<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The backend side of a guard over a lease.
struct LeaseGuard {
    held: Arc<Held>,
    name: String,
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("lease", &self.held.lease)
            .field("valid_until", &self.held.valid_until())
            .finish()
    }
}

impl LeaseGuard {
    fn lost(&self, reason: LossReason) -> LockError {
        LockError::Lost {
            backend: self.held.lease.backend(),
            name: self.name.clone(),
            reason,
        }
    }
}

#[async_trait]
impl GuardBackend for LeaseGuard {
    fn backend(&self) -> &'static str {
        self.held.lease.backend()
    }

    async fn release(&mut self) -> Result<(), LockError> {
        if self.held.lease.session().is_closed() {
            // The provider's end gives the lock up; make sure of it.
            self.held.stop();
            release_in_background(Arc::clone(&self.held.lease));
            return Err(self.lost(LossReason::SessionExpired));
        }
        // Until the release has answered, a renewal that finds the grant gone is no loss.
        self.held.releasing.store(true, Ordering::Release);
        let _releasing = Releasing(&self.held.releasing);
        match self.held.lease.release().await {
            Ok(true) => {
                self.held.stop();
                Ok(())
            }
            Ok(false) => {
                self.held.stop();
                Err(self.lost(LossReason::EntryRemoved))
            }
            // Still ours as far as we know: the renewals go on, and tells a
            // release that went through with its reply lost from a loss by the receipt.
            Err(error) => Err(error),
        }
    }

    fn release_on_drop(self: Box<Self>) {
        self.held.stop();
        // The release is conditional on ownership, so harmless after the session's end
        // released it.
        release_in_background(Arc::clone(&self.held.lease));
    }

    fn valid_until(&self) -> Option<std::time::Instant> {
        Some(self.held.valid_until().into_std())
    }

    fn is_suspect(&self) -> bool {
        self.held.suspect.load(Ordering::Acquire)
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
        /// How long a release takes to answer, after the grant is gone on the server.
        release_takes: Duration,
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
            if !self.still_ours.load(Ordering::SeqCst) {
                return Ok(Renewal::Gone);
            }
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
            let was_ours = self.still_ours.swap(false, Ordering::SeqCst);
            tokio::time::sleep(self.release_takes).await;
            Ok(was_ours)
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
        assert_eq!(lease.counts(), (renewals, 1), "the renewals stopped");
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
    async fn a_renewal_that_races_the_release_is_no_loss() {
        let mut lease = Scripted::default();
        lease.still_ours.store(true, Ordering::SeqCst);
        lease.release_takes = TTL / 3;
        let lease = Arc::new(lease);
        let mut guard = guard_of(&lease);
        // The release is on its way when the first renewal (at TTL / 3) finds the key gone.
        tokio::time::sleep(TTL / 3 - Duration::from_millis(10)).await;
        guard.release().await.unwrap();
        assert!(lease.counts().0 >= 1, "a renewal ran during the release");
        assert!(
            !guard.is_lost(),
            "a renewal during the release fired the lost signal"
        );
    }

    /// How long a [`Blocking`] renewal holds its thread.
    const BLOCKED: Duration = Duration::from_millis(100);

    /// A lease whose renewals block their thread.
    #[derive(Debug, Default)]
    struct Blocking {
        session: Closed,
    }

    #[async_trait]
    impl Lease for Blocking {
        fn backend(&self) -> &'static str {
            "blocking"
        }
        fn ttl(&self) -> Duration {
            Duration::from_millis(600)
        }
        fn drift(&self) -> Duration {
            Duration::from_millis(30)
        }
        fn session(&self) -> &Closed {
            &self.session
        }
        async fn extend(&self) -> Result<Renewal, LockError> {
            std::thread::sleep(BLOCKED);
            Ok(Renewal::Renewed)
        }
        async fn release(&self) -> Result<bool, LockError> {
            Ok(true)
        }
    }

    /// What a test's subscriber wrote.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_renewal_that_blocks_its_thread_is_reported() {
        let written = Written::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let written = written.clone();
                move || written.clone()
            })
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            runtime.block_on(async {
                let lease: Arc<dyn Lease> = Arc::new(Blocking::default());
                let name = LockName::new("jobs").unwrap();
                let ttl = lease.ttl();
                let guard = lease_guard(lease, &name, FencingToken(1), Instant::now(), ttl);
                // The first renewal, at a third of the ttl, blocks.
                tokio::time::sleep(ttl / 3 + BLOCKED + Duration::from_millis(50)).await;
                drop(guard);
            });
        });
        let written = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
        assert!(
            written.contains("Lease::extend blocked its thread"),
            "nothing reported: {written:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_timer_serves_every_lease_of_a_session() {
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = tasks();
        let leases = Arc::new(Shares::default());
        let guards: Vec<Guard> = (0..1000).map(|_| leases.guard()).collect();
        assert_eq!(tasks() - before, 1, "one timer task, however many leases");
        tokio::time::sleep(TTL * 2).await;
        assert!(guards.iter().all(|guard| !guard.is_lost()));
        let renewals = leases.extends.load(Ordering::SeqCst);
        // Each lease renewed at 1, 2, 3, 4 and 5 s (and maybe at 6 s).
        assert!((5000..=6000).contains(&renewals), "{renewals} renewals");
        assert_eq!(tasks() - before, 1, "the renewals' tasks have ended");
        leases.session.close();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            guards.iter().all(Guard::is_lost),
            "the session's end loses every lease"
        );
        assert_eq!(leases.releases.load(Ordering::SeqCst), 1000);
        // A lease granted as the session ended is lost at once.
        let late = leases.guard();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(late.is_lost());
        assert_eq!(leases.releases.load(Ordering::SeqCst), 1001);
    }

    /// Leases on one session that renew and release successfully, counted together.
    #[derive(Debug, Default)]
    struct Shares {
        session: Closed,
        extends: AtomicU32,
        releases: AtomicU32,
    }

    /// One lease of [`Shares`].
    #[derive(Debug)]
    struct Share(Arc<Shares>);

    impl Shares {
        fn guard(self: &Arc<Self>) -> Guard {
            let name = LockName::new("jobs").unwrap();
            let lease = Arc::new(Share(Arc::clone(self))) as Arc<dyn Lease>;
            lease_guard(lease, &name, FencingToken(1), Instant::now(), TTL).unwrap()
        }
    }

    #[async_trait]
    impl Lease for Share {
        fn backend(&self) -> &'static str {
            "shares"
        }
        fn ttl(&self) -> Duration {
            TTL
        }
        fn drift(&self) -> Duration {
            Duration::from_millis(30)
        }
        fn session(&self) -> &Closed {
            &self.0.session
        }
        async fn extend(&self) -> Result<Renewal, LockError> {
            self.0.extends.fetch_add(1, Ordering::SeqCst);
            Ok(Renewal::Renewed)
        }
        async fn release(&self) -> Result<bool, LockError> {
            self.0.releases.fetch_add(1, Ordering::SeqCst);
            Ok(true)
        }
    }

    #[test]
    fn a_timer_whose_runtime_ended_is_started_again() {
        let leases = Arc::new(Shares::default());
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        let first = runtime().block_on(async { leases.guard() });
        let second = runtime().block_on(async {
            let second = leases.guard();
            tokio::time::sleep(TTL * 2).await;
            second
        });
        // Both leases renewed, by a timer on the second runtime.
        assert!(leases.extends.load(Ordering::SeqCst) >= 10);
        assert!(!second.is_lost());
        drop((first, second));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_guard_is_released_in_the_background() {
        let lease = Scripted::new([]);
        drop(guard_of(&lease));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(lease.counts(), (0, 1));
    }
}
