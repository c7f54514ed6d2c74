//! A contender's claim on a Redis lock: the scripts it runs (grant, queue, renew, release,
//! cancel), sent again after a lost reply with the same owner id, and the lease the guard
//! holds once granted.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::kit::{Abandon, Closed, Lease, Renewal, Retry, retry_in_background};
use lock_core::{Deadline, LockError, LockName};
use tokio::time::Instant;

use crate::config::RedisStrategy;
use crate::error::BACKEND;
use crate::keys::LockKeys;
use crate::scripts::{
    self, ATTEMPT, CANCEL, PERMIT_ATTEMPT, PERMIT_CANCEL, PERMIT_EXTEND, PERMIT_RELEASE, QueueArgs,
    RELEASE,
};
use crate::session::Session;

/// How many times a request whose reply was lost is sent again (with the same owner id, so
/// that a grant the server made is found, not made twice).
const ATTEMPTS: usize = 3;
/// Pause before sending a request again after a connection error.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(100);

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

/// A grant as a waiting strategy found it.
pub(crate) struct Found {
    /// The fencing token.
    pub(crate) token: u64,
    /// When the request that confirmed the grant was sent: the lease runs from no earlier.
    pub(crate) sent: Instant,
    /// The lease the server set.
    pub(crate) lease: Duration,
}

impl Found {
    /// The grant of `token`, confirmed by a request sent at `sent`, with a lease of
    /// `lease`.
    pub(crate) fn new(token: u64, sent: Instant, lease: Duration) -> Self {
        Found { token, sent, lease }
    }
}

/// What an `ATTEMPT` does when the lock is busy.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Queueing {
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
    shared: Arc<Session>,
    keys: Arc<LockKeys>,
    name: LockName,
    id: String,
    strategy: RedisStrategy,
    shape: Shape,
    /// An election candidate's value.
    value: Option<Arc<[u8]>>,
}

impl Claim {
    /// A new claim (a fresh owner id) of `name`'s `keys`, waiting as `strategy` says and
    /// taking what `shape` says; an election candidate's key carries `value`.
    pub(crate) fn new(
        session: Arc<Session>,
        keys: Arc<LockKeys>,
        name: LockName,
        strategy: RedisStrategy,
        shape: Shape,
        value: Option<&[u8]>,
    ) -> Self {
        Claim {
            shared: session,
            keys,
            name,
            id: uuid::Uuid::new_v4().simple().to_string(),
            strategy,
            shape,
            value: value.map(Arc::from),
        }
    }

    /// The list a hand-off pushes this waiter's token onto.
    pub(crate) fn waiter_list(&self) -> String {
        self.keys.waiter_list(&self.id)
    }

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
    pub(crate) async fn try_grant(&self) -> Result<Option<Found>, LockError> {
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
    pub(crate) async fn renew(&self, what: &str) -> Result<Renewal, LockError> {
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

    /// The error of a waiter whose place in the queue is gone.
    pub(crate) fn place_gone(&self) -> LockError {
        self.retryable(
            "this waiter's place in the queue is gone (deleted by another client, or dropped \
             after the waiter fell silent)",
        )
    }

    /// A retryable error about this claim: a grant or renewal the replicas did not confirm,
    /// a place in the queue gone.
    pub(crate) fn retryable(&self, message: &str) -> LockError {
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
    pub(crate) async fn attempt(&self, mode: Queueing) -> Result<i64, LockError> {
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
    pub(crate) async fn cancel(&self) -> Result<bool, LockError> {
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

/// A contender whose claim is not (yet) a grant.
pub(crate) struct Contender(pub(crate) Arc<Claim>);

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
