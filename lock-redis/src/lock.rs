//! The single-server Redis lock: grant, the three ways of waiting, and clean-up after
//! cancels and timeouts.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::kit::{
    Abandon, Cleanup, Closed, Lease, MutexAttempt, Renewal, Retry, Wakeups, lease_guard,
    retry_in_background,
};
use lock_core::{Deadline, FencingToken, Guard, LockError, LockName};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::RedisStrategy;
use crate::error::BACKEND;
use crate::keys::LockKeys;
use crate::provider::Shared;
use crate::scripts::{
    self, ATTEMPT, CANCEL, PERMIT_ATTEMPT, PERMIT_CANCEL, PERMIT_EXTEND, PERMIT_RELEASE, QueueArgs,
    RELEASE,
};
use crate::subscriber::Heard;

/// How many times a request whose reply was lost is sent again (with the same owner id, so
/// that a grant the server made is found, not made twice).
const ATTEMPTS: usize = 3;
/// Pause before sending a request again after a connection error.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// First and longest pause between two tries of the polling strategy.
const POLL_MIN: Duration = Duration::from_millis(10);
const POLL_MAX: Duration = Duration::from_millis(500);

/// How long a waiter blocks before it refreshes its place (and checks for a lease that ran
/// out): ttl/3, at most 2 s.
pub(crate) fn refresh_period(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_millis(10), Duration::from_secs(2))
}

/// How long a waiter that stopped refreshing keeps its place: three refresh periods, the
/// request timeout (a blocking wait may take that much longer) and a second.
pub(crate) fn liveness(ttl: Duration, timeout: Duration) -> Duration {
    refresh_period(ttl) * 3 + timeout + Duration::from_secs(1)
}

/// The lease a hand-off gives the waiter until it has picked the token up and renewed it:
/// two refresh periods (at most the ttl), so that a hand-off to a waiter that died since its
/// last refresh holds the lock no longer than that.
pub(crate) fn handoff_lease(ttl: Duration) -> Duration {
    (refresh_period(ttl) * 2).min(ttl)
}

/// The clock-drift margin taken off every validity: 1% of the ttl and 2 ms.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A lock handle from a [`RedisLockProvider`](crate::RedisLockProvider).
pub struct RedisLock {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: LockName,
    pub(crate) keys: Arc<LockKeys>,
    /// The provider's strategy, or the queue for an election, a read-write lock or a
    /// semaphore.
    strategy: RedisStrategy,
    /// What a grant takes.
    shape: Shape,
}

/// What a grant takes: the one owner key, or permits (read-write locks and semaphores).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A mutex or an election: the owner key (`handoff.lua`).
    Exclusive,
    /// `weight` of the `capacity` permits (`permits.lua`).
    Permits {
        /// The permits a holder takes.
        weight: u64,
        /// The permits there are.
        capacity: u64,
    },
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("name", &self.name)
            .field("owner_key", &self.keys.owner)
            .field("strategy", &self.strategy)
            .finish()
    }
}

/// A contender whose claim is not (yet) a grant.
struct Contender(Arc<Claim>);

/// Cancelled, or failed: leave the queue, and pass on a grant that raced the cancellation,
/// retrying until the waiter's place and any grant to it would have expired anyway.
impl Abandon for Contender {
    fn abandon(self) {
        let lease = &self.0.shared.config.lease;
        let give_up = Deadline::after(Some(lease.ttl.max(liveness(lease.ttl, lease.timeout))));
        let what = format!("clean-up of lock {}", self.0.name);
        retry_in_background(BACKEND, what, RETRY_PAUSE, give_up, move || {
            let grant = Arc::clone(&self.0);
            async move {
                match grant.cancel().await {
                    Ok(_) => Retry::Done,
                    Err(_) if grant.shared.closed.is_closed() => Retry::Done,
                    Err(error) if error.is_retryable() => Retry::Again(error.to_string()),
                    Err(error) => Retry::GiveUp(error.to_string()),
                }
            }
        });
    }
}

impl RedisLock {
    /// The mutex `name`, on the provider's strategy.
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        let keys = LockKeys::new(&shared.config.lease.key_prefix, &name);
        let strategy = shared.config.strategy;
        RedisLock {
            strategy,
            ..Self::queued(shared, name, keys, Shape::Exclusive)
        }
    }

    /// A side of a read-write lock or a semaphore: `shape`'s permits of the keys
    /// `{prefix:name.kind}:…`, always queued.
    pub(crate) fn permits(shared: Arc<Shared>, name: LockName, kind: &str, shape: Shape) -> Self {
        let keys = LockKeys::for_permits(&shared.config.lease.key_prefix, &name, kind);
        Self::queued(shared, name, keys, shape)
    }

    /// The queue under the election `name`: its own keys, `{prefix:name.election}:…`, and
    /// always the queue strategy.
    pub(crate) fn election(shared: Arc<Shared>, name: LockName) -> Self {
        let keys = LockKeys::for_election(&shared.config.lease.key_prefix, &name);
        Self::queued(shared, name, keys, Shape::Exclusive)
    }

    /// The lock on `keys`, always on the queue strategy.
    fn queued(shared: Arc<Shared>, name: LockName, keys: LockKeys, shape: Shape) -> Self {
        RedisLock {
            shared,
            name,
            keys: Arc::new(keys),
            strategy: RedisStrategy::Queue,
            shape,
        }
    }
}

#[async_trait]
impl MutexAttempt for RedisLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        self.attempt_with(None, deadline).await
    }
}

impl RedisLock {
    /// Takes the lock, or gives up at the deadline; an election candidate's key carries
    /// `value`.
    pub(crate) async fn attempt_with(
        &self,
        value: Option<&[u8]>,
        deadline: Deadline,
    ) -> Result<Option<Guard>, LockError> {
        self.shared.closed.check(BACKEND, &self.name)?;
        let grant = Arc::new(Claim {
            shared: Arc::clone(&self.shared),
            keys: Arc::clone(&self.keys),
            name: self.name.clone(),
            id: Uuid::new_v4().simple().to_string(),
            strategy: self.strategy,
            shape: self.shape,
            value: value.map(Arc::from),
        });
        // Armed from before the first request is sent.
        let mut attempt = Cleanup::new(Contender(Arc::clone(&grant)));
        let granted = match self.strategy {
            RedisStrategy::Polling | RedisStrategy::PubSub => self.retry(&grant, deadline).await,
            _ => self.queue(&grant, deadline).await,
        };
        match granted? {
            Some(Found { token, sent, lease }) => {
                // With `wait_replicas`, the grant counts once the replicas have it (a renewal
                // after it, acknowledged); if they do not, the clean-up gives it back. The
                // acknowledged renewal set a full lease after `confirming`.
                let (sent, lease) = if self.shared.config.wait_replicas == 0 {
                    (sent, lease)
                } else {
                    let confirming = Instant::now();
                    let gone = "the grant was gone before the replicas had it";
                    match grant.renew("grant").await? {
                        Renewal::Renewed => (confirming, self.shared.config.lease.ttl),
                        _ => return Err(grant.retryable(gone)),
                    }
                };
                attempt.disarm();
                self.shared.metrics.record_grant();
                lease_guard(grant, &self.name, FencingToken(token), sent, lease).map(Some)
            }
            None => {
                // Only a queue waiter leaves anything behind (its place, maybe a grant that
                // raced the deadline): a plain grant that answered 0 took nothing.
                let queued = self.strategy == RedisStrategy::Queue && !deadline.is_immediate();
                // Gave up: clean up now, so that the next contender is not delayed.
                if !queued || grant.cancel().await.is_ok() {
                    attempt.disarm();
                }
                Ok(None)
            }
        }
    }

    /// `GRANT` until granted or the deadline. Between two tries, a polling waiter sleeps
    /// (jittered exponential back-off); a pub/sub waiter subscribes to the release channel,
    /// then tries again on every broadcast (and every refresh period, for leases that run
    /// out unannounced). A try that fails with a retryable error is made again, for as long
    /// as a queued waiter's place would last.
    async fn retry(&self, grant: &Claim, deadline: Deadline) -> Result<Option<Found>, LockError> {
        let polling = self.strategy == RedisStrategy::Polling;
        let period = refresh_period(self.shared.config.lease.ttl);
        let mut pause = POLL_MIN;
        let mut pubsub = None;
        let mut wakeups = Wakeups::new(&self.shared.metrics);
        // A waiter rides out a short outage (a failover, a slot that moved) as a queued
        // waiter does while its place lasts: for as long, since its last answer.
        let lease = &self.shared.config.lease;
        let rides_out = liveness(lease.ttl, lease.timeout);
        let mut answered = Instant::now();
        loop {
            match grant.try_grant().await {
                Ok(Some(granted)) => return Ok(Some(granted)),
                Ok(None) => answered = Instant::now(),
                Err(error)
                    if error.is_retryable()
                        && answered.elapsed() < rides_out
                        && !deadline.is_immediate()
                        && !deadline.has_passed() =>
                {
                    tracing::debug!(lock = %self.name, %error, "redis: try failed; trying again");
                    tokio::time::sleep(deadline.cap(RETRY_PAUSE)).await;
                    if deadline.has_passed() {
                        return Err(error);
                    }
                    continue;
                }
                Err(error) => return Err(error),
            }
            wakeups.busy();
            if deadline.is_immediate() || deadline.has_passed() {
                return Ok(None);
            }
            if polling {
                let jittered = pause.mul_f64(0.5 + fastrand::f64());
                tokio::time::sleep(deadline.cap(jittered)).await;
                pause = (pause * 2).min(POLL_MAX);
                wakeups.woke();
                continue;
            }
            let Some(subscription) = pubsub.as_mut() else {
                // Subscribe, then try once more: a release between the first try and the
                // subscription would otherwise go unheard.
                let joining = self
                    .shared
                    .node
                    .subscribe(&self.keys.channel, self.name.as_str());
                match joining.await {
                    Ok(joined) => {
                        pubsub = Some(joined);
                        pause = POLL_MIN;
                    }
                    // No subscription for now (a failover, a shard in trouble): wait as a
                    // poller does, then try the lock and to subscribe again.
                    Err(error) if error.is_retryable() => {
                        tracing::debug!(lock = %self.name, %error, "redis: no subscription; trying again");
                        tokio::time::sleep(deadline.cap(pause)).await;
                        pause = (pause * 2).min(period);
                    }
                    Err(error) => return Err(error),
                }
                continue;
            };
            let heard = tokio::select! {
                heard = subscription.next() => Some(heard),
                () = tokio::time::sleep(deadline.cap(period)) => None,
            };
            match heard {
                Some(Heard::Release) => wakeups.woke(),
                // The subscription connection ended: join again.
                Some(Heard::Ended) => pubsub = None,
                None => {}
            }
        }
    }

    /// `ATTEMPT`, queueing; then block on this waiter's own list, refreshing the place in
    /// the queue every refresh period.
    async fn queue(&self, grant: &Claim, deadline: Deadline) -> Result<Option<Found>, LockError> {
        let ttl = self.shared.config.lease.ttl;
        let period = refresh_period(ttl);
        let queue = !deadline.is_immediate();
        let mut mode = if queue { Queueing::Join } else { Queueing::No };
        let mut connection = None;
        // A queued waiter rides out an outage (a failover, a restart) while its place lasts:
        // the server keeps it for `liveness` after its last refresh; a margin of one
        // refresh period is kept for the request that refreshes it.
        let lasts = liveness(ttl, self.shared.config.lease.timeout).saturating_sub(period);
        let mut refreshed = Instant::now();
        loop {
            // Grants pushed to our list come after this request was handled: the lease
            // runs from no earlier than its sending.
            let sent = Instant::now();
            let token = match grant.attempt(mode).await {
                Ok(token) => token,
                Err(error)
                    if matches!(mode, Queueing::Refresh)
                        && error.is_retryable()
                        && refreshed.elapsed() < lasts
                        && !deadline.has_passed() =>
                {
                    tracing::debug!(lock = %self.name, %error, "redis: refresh failed; the place lasts, trying again");
                    connection = None;
                    tokio::time::sleep(deadline.cap(RETRY_PAUSE)).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            refreshed = sent;
            // Done waiting, one way or another: keep the blocking connection for the next.
            if (token != 0 || !queue || deadline.has_passed())
                && let Some(done) = connection.take()
            {
                self.shared.node.give_back(done);
            }
            if token > 0 {
                if matches!(mode, Queueing::Refresh) {
                    // A hand-off that came while this waiter was between two waits: it
                    // learns of it now, as it would have on its list.
                    self.shared.metrics.record_wakeup();
                }
                let (token, lease) = (token.unsigned_abs(), ttl);
                return Ok(Some(Found { token, sent, lease }));
            }
            if token < 0 {
                return Err(grant.retryable(
                    "this waiter's place in the queue is gone (deleted by another client, or \
                     dropped after the waiter fell silent)",
                ));
            }
            if !queue || deadline.has_passed() {
                return Ok(None);
            }
            mode = Queueing::Refresh;
            // A connection to a server that is no longer the primary would block on a list
            // that no hand-off reaches.
            connection = connection.filter(|kept| self.shared.node.is_current(kept));
            if connection.is_none() {
                connection = match self.shared.node.dedicated(self.name.as_str()).await {
                    Ok(dedicated) => Some(dedicated),
                    // The place lasts: the next refresh decides (as after a failed wait).
                    Err(error) if error.is_retryable() => {
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                    Err(error) => return Err(error),
                };
            }
            let Some(blocking) = connection.as_mut() else {
                continue;
            };
            let wait = deadline.cap(period);
            let mut blpop = redis::cmd("BLPOP");
            blpop
                .arg(self.keys.waiter_list(&grant.id))
                .arg(format!("{:.3}", wait.as_secs_f64().max(0.001)));
            self.shared.metrics.record_server_requests(1);
            let budget = wait + self.shared.node.timeout();
            let popping = blpop.query_async(&mut blocking.connection);
            let popped: Option<(String, u64)> = match tokio::time::timeout(budget, popping).await {
                Ok(Ok(popped)) => popped,
                Ok(Err(error)) => {
                    // The server went away, or stopped being the primary (a demoted primary
                    // unblocks its waiters with UNBLOCKED, and refuses with READONLY):
                    // wait again on a new connection, after the next refresh.
                    if let Some(failed) = connection.take() {
                        self.shared.node.failed_on(&failed, &error);
                    }
                    let error = self.shared.node.lock_error(error, Some(self.name.as_str()));
                    if !error.is_retryable() {
                        // Refused (an ACL without BLPOP, say): no use trying again.
                        return Err(error);
                    }
                    tracing::debug!(lock = %self.name, %error, "redis: blocking wait failed; reconnecting");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    None
                }
                Err(_) => {
                    // The reply may still come on this connection: drop it, and let the
                    // next `ATTEMPT` pick up a grant it carried.
                    connection = None;
                    None
                }
            };
            if let Some((_, token)) = popped {
                if let Some(done) = connection.take() {
                    self.shared.node.give_back(done);
                }
                self.shared.metrics.record_wakeup();
                let lease = handoff_lease(ttl);
                return Ok(Some(Found { token, sent, lease }));
            }
        }
    }
}

/// A grant as a waiting strategy found it.
struct Found {
    /// The fencing token.
    token: u64,
    /// When the request that confirmed the grant was sent: the lease runs from no earlier.
    sent: Instant,
    /// The lease the server set.
    lease: Duration,
}

/// What an `ATTEMPT` does when the lock is busy.
#[derive(Debug, Clone, Copy)]
enum Queueing {
    /// Nothing (a try).
    No,
    /// Join the queue.
    Join,
    /// Stay in the queue; fail if one's place is gone.
    Refresh,
}

/// A contender's claim: its owner id and the lock's keys; the lease once granted, and what a
/// cancel removes.
#[derive(Debug)]
pub(crate) struct Claim {
    shared: Arc<Shared>,
    keys: Arc<LockKeys>,
    name: LockName,
    id: String,
    strategy: RedisStrategy,
    shape: Shape,
    /// An election candidate's value.
    value: Option<Arc<[u8]>>,
}

impl Claim {
    async fn run<T: redis::FromRedisValue>(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        self.shared.node.run(invocation, self.name.as_str()).await
    }

    /// Runs the script `invocation` builds, sending it again (same owner id) after a
    /// connection error.
    async fn retrying<T, F>(&self, invocation: F) -> Result<T, LockError>
    where
        T: redis::FromRedisValue,
        F: Fn() -> redis::ScriptInvocation<'static>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.run(invocation()).await {
                Err(error @ LockError::Connection { .. }) if tries < ATTEMPTS => {
                    tracing::debug!(lock = %self.name, %error, "redis: no reply; sending again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                other => return other,
            }
        }
    }

    /// One `GRANT` (sent again after a lost reply): the grant, if the lock was free.
    async fn try_grant(&self) -> Result<Option<Found>, LockError> {
        let lease = self.shared.config.lease.ttl;
        let sent = Instant::now();
        let (token, _holder): (u64, String) = self
            .retrying(|| scripts::grant(&self.keys, &self.id, lease))
            .await?;
        Ok((token > 0).then_some(Found { token, sent, lease }))
    }

    /// `EXTEND`; with `wait_replicas`, a renewal counts only once that many replicas have
    /// acknowledged it (`what` names it in the error: the renewal, or a grant's
    /// confirmation).
    async fn renew(&self, what: &str) -> Result<Renewal, LockError> {
        let config = &self.shared.config;
        let ttl = config.lease.ttl;
        let extend = match self.shape {
            Shape::Exclusive => scripts::extend(&self.keys, &self.id, ttl, self.value.is_some()),
            Shape::Permits { capacity, .. } => {
                let args = self.queue_args();
                scripts::permits(&PERMIT_EXTEND, &self.keys, &self.id, &args, capacity)
            }
        };
        let renewed: u64 = if config.wait_replicas == 0 {
            self.run(extend).await?
        } else {
            let (wanted, wait) = (config.wait_replicas, config.wait_timeout);
            let name = self.name.as_str();
            // Only a renewal writes (answer 1): gone or released, there is nothing to wait for.
            let renewal = self.shared.node.run_acknowledged(
                extend,
                (name, &self.keys.owner),
                (wanted, wait),
                |answer: &u64| *answer == 1,
            );
            match renewal.await? {
                (_, Some(acknowledged)) if acknowledged < wanted => {
                    return Err(self.retryable(&format!(
                        "the {what} reached {acknowledged} of {wanted} replicas \
                         (wait_replicas) within {wait:?}"
                    )));
                }
                (renewed, _) => renewed,
            }
        };
        Ok(match renewed {
            1 => Renewal::Renewed,
            2 => Renewal::Released,
            _ => Renewal::Gone,
        })
    }

    /// A retryable error about this claim: a grant or renewal the replicas did not confirm,
    /// a place in the queue gone.
    fn retryable(&self, message: &str) -> LockError {
        LockError::other(BACKEND, message)
            .retryable(true)
            .for_lock(&self.name)
    }

    /// What every queue script takes after the owner id.
    fn queue_args(&self) -> QueueArgs {
        let lease = &self.shared.config.lease;
        QueueArgs {
            ttl: lease.ttl,
            liveness: liveness(lease.ttl, lease.timeout),
            mode: self.announcement(),
            claim: handoff_lease(lease.ttl),
            candidate: self.value.is_some(),
        }
    }

    /// How a release tells this lock's waiters (the scripts' `mode`): on a cluster, pub/sub
    /// is sharded (`SPUBLISH`, heard by `SSUBSCRIBE` on the primary serving the slot).
    fn announcement(&self) -> &'static str {
        match self.strategy {
            RedisStrategy::PubSub if self.shared.config.cluster.is_some() => "spubsub",
            strategy => strategy.as_str(),
        }
    }

    /// The queue script `exclusive`, or its permit form `permits`, for this claim.
    fn script(
        &self,
        exclusive: &'static redis::Script,
        permits: &'static redis::Script,
    ) -> redis::ScriptInvocation<'static> {
        let args = self.queue_args();
        match self.shape {
            Shape::Exclusive => scripts::queue(exclusive, &self.keys, &self.id, &args),
            Shape::Permits { capacity, .. } => {
                scripts::permits(permits, &self.keys, &self.id, &args, capacity)
            }
        }
    }

    /// `ATTEMPT`: a token, 0, or -1 when a refreshing waiter's place is gone.
    async fn attempt(&self, mode: Queueing) -> Result<i64, LockError> {
        self.retrying(|| {
            let mut invocation = self.script(&ATTEMPT, &PERMIT_ATTEMPT);
            invocation.arg(match mode {
                Queueing::No => "0",
                Queueing::Join => "1",
                Queueing::Refresh => "2",
            });
            if let Shape::Permits { weight, .. } = self.shape {
                invocation.arg(weight);
            }
            // A refresh only keeps the value the join stored: up to 64 KiB need not travel
            // every ttl/3.
            if let Some(value) = &self.value
                && !matches!(mode, Queueing::Refresh)
            {
                invocation.arg(&value[..]);
            }
            invocation
        })
        .await
    }

    /// Leaves the queue and passes on a grant that raced the cancel.
    async fn cancel(&self) -> Result<bool, LockError> {
        let passed_on: u64 = self.run(self.script(&CANCEL, &PERMIT_CANCEL)).await?;
        Ok(passed_on == 1)
    }
}

#[async_trait]
impl Lease for Claim {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn ttl(&self) -> Duration {
        self.shared.config.lease.ttl
    }

    fn drift(&self) -> Duration {
        drift(self.shared.config.lease.ttl)
    }

    fn session(&self) -> &Closed {
        &self.shared.closed
    }

    async fn extend(&self) -> Result<Renewal, LockError> {
        self.renew("renewal").await
    }

    async fn release(&self) -> Result<bool, LockError> {
        let released: u64 = self.run(self.script(&RELEASE, &PERMIT_RELEASE)).await?;
        Ok(released == 1)
    }
}
