//! The Redis lock handle: a claim (see [`claim`](crate::claim)) and the three ways of
//! waiting for its grant: polling, pub/sub, and the queue.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::kit::{Cleanup, MutexAttempt, Renewal, Wakeups, lease_guard};
use lock_core::queue::LockQueue;
use lock_core::{Deadline, FencingToken, Guard, LockError, LockName};
use tokio::time::Instant;

use crate::claim::{
    Claim, Contender, Found, Queueing, RETRY_PAUSE, Shape, handoff_lease, liveness, refresh_period,
};
use crate::config::RedisStrategy;
use crate::error::BACKEND;
use crate::holders::RedisHolders;
use crate::keys::LockKeys;
use crate::session::Session;
use crate::subscriber::Heard;

/// First and longest pause between two tries of the polling strategy.
const POLL_MIN: Duration = Duration::from_millis(10);
const POLL_MAX: Duration = Duration::from_millis(500);

/// A lock handle from a [`RedisLockProvider`](crate::RedisLockProvider).
pub struct RedisLock {
    pub(crate) shared: Arc<Session>,
    pub(crate) name: LockName,
    pub(crate) keys: Arc<LockKeys>,
    /// The provider's strategy, or the queue for an election, a read-write lock or a
    /// semaphore.
    strategy: RedisStrategy,
    /// What a grant takes.
    shape: Shape,
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

impl RedisLock {
    /// The mutex `name`, on the provider's strategy.
    pub(crate) fn new(shared: Arc<Session>, name: LockName) -> Self {
        let keys = LockKeys::new(&shared.config.lease.key_prefix, &name);
        let strategy = shared.config.strategy;
        RedisLock {
            strategy,
            ..Self::queued(shared, name, keys, Shape::Exclusive)
        }
    }

    /// A side of a read-write lock or a semaphore: `shape`'s permits of the keys
    /// `{prefix:name.kind}:…`, always queued.
    pub(crate) fn permits(shared: Arc<Session>, name: LockName, kind: &str, shape: Shape) -> Self {
        let keys = LockKeys::for_permits(&shared.config.lease.key_prefix, &name, kind);
        Self::queued(shared, name, keys, shape)
    }

    /// The queue under the election `name`: its own keys, `{prefix:name.election}:…`, and
    /// always the queue strategy.
    pub(crate) fn election(shared: Arc<Session>, name: LockName) -> Self {
        let keys = LockKeys::for_election(&shared.config.lease.key_prefix, &name);
        Self::queued(shared, name, keys, Shape::Exclusive)
    }

    /// The lock on `keys`, always on the queue strategy.
    fn queued(shared: Arc<Session>, name: LockName, keys: LockKeys, shape: Shape) -> Self {
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

    async fn queue(&self) -> Result<LockQueue, LockError> {
        let holders = RedisHolders::read(&self.shared, &self.name, &self.keys).await?;
        Ok(holders.queue(self.strategy, &self.keys.owner))
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
        let grant = Arc::new(Claim::new(
            Arc::clone(&self.shared),
            Arc::clone(&self.keys),
            self.name.clone(),
            self.strategy,
            self.shape,
            value,
        ));
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

    /// `ATTEMPT`, queueing; then block on this waiter's own list for a refresh period, and
    /// `ATTEMPT` again, which refreshes the place (and picks up a hand-off that came between
    /// two waits), until granted or the deadline. The decision is the script's; the wait is
    /// the node's [`ListWait`](crate::node::list_wait::ListWait); a refresh that fails is made again
    /// while the place lasts on the server.
    async fn queue(&self, grant: &Claim, deadline: Deadline) -> Result<Option<Found>, LockError> {
        let ttl = self.shared.config.lease.ttl;
        let period = refresh_period(ttl);
        let queue = !deadline.is_immediate();
        let mut mode = if queue { Queueing::Join } else { Queueing::No };
        let mut list = self.shared.node.list_wait(self.name.as_str());
        let mut wakeups = Wakeups::new(&self.shared.metrics);
        // The server keeps a silent waiter's place for `liveness` after its last refresh; a
        // margin of one refresh period is kept for the request that refreshes it.
        let lasts = liveness(ttl, self.shared.config.lease.timeout).saturating_sub(period);
        let mut refreshed = Instant::now();
        loop {
            // Grants pushed to our list come after this request was handled: the lease
            // runs from no earlier than its sending.
            let sent = Instant::now();
            match grant.attempt(mode).await {
                Ok(token) if token > 0 => {
                    if matches!(mode, Queueing::Refresh) {
                        // A hand-off that came between two waits, learnt of now.
                        wakeups.woke();
                    }
                    return Ok(Some(Found::new(token.unsigned_abs(), sent, ttl)));
                }
                Ok(token) if token < 0 => return Err(grant.place_gone()),
                Ok(_) => refreshed = sent,
                Err(error)
                    if matches!(mode, Queueing::Refresh)
                        && error.is_retryable()
                        && refreshed.elapsed() < lasts
                        && !deadline.has_passed() =>
                {
                    tracing::debug!(lock = %self.name, %error, "redis: refresh failed; the place lasts, trying again");
                    list.reconnect();
                    tokio::time::sleep(deadline.cap(RETRY_PAUSE)).await;
                    continue;
                }
                Err(error) => return Err(error),
            }
            if !queue || deadline.has_passed() {
                return Ok(None);
            }
            mode = Queueing::Refresh;
            if let Some(token) = list.pop(&grant.waiter_list(), deadline.cap(period)).await? {
                wakeups.woke();
                return Ok(Some(Found::new(token, sent, handoff_lease(ttl))));
            }
        }
    }
}
