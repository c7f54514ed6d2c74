//! Redlock: one lock over several independent Redis servers, held while a majority grants it.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::{join_all, try_join_all};
use lock_core::kit::{
    Abandon, Cleanup, Closed, Lease, MutexAttempt, Renewal, SessionOwner, Wakeups, lease_guard,
    release_in_background, unpoisoned,
};
use lock_core::observe::observe_lock;
use lock_core::{
    Capabilities, Deadline, DistributedLock, Fencing, FencingToken, Guard, LockError, LockName,
    LockProvider, Metrics, MetricsSnapshot, WaitKind,
};
use redis::{FromRedisValue, ScriptInvocation};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::RedlockConfig;
use crate::connection::Settings;
use crate::error::connection;
use crate::keys::LockKeys;
use crate::node::Node;
use crate::scripts::{self, QueueArgs, RELEASE};

pub(crate) const REDLOCK: &str = "redlock";

/// A distlock provider running Redlock over several independent Redis servers.
///
/// A grant asks every server at once (the same Lua script as the single-server lock) and
/// holds when a majority ([`RedlockConfig::quorum`]) granted within the validity
/// `ttl − elapsed − drift`, drift being `clock_drift_factor × ttl + 2 ms`; otherwise it
/// releases on every server, so that no partial grant is left, and retries after a random
/// delay. Release and renewal go to every server; the provider's renewal timer renews at
/// ttl/3 and a renewal counts when a majority confirms it.
///
/// **Fencing tokens increase from grant to grant** while the servers keep their data. Each
/// server keeps its own counter, and a vote counts it up; a grant's token is the largest
/// count of its majority, and a second round raises the counters of the servers that voted
/// to that token before the grant holds. Any later grant needs a majority of the owner
/// keys, so it votes on one of those servers after this grant let go there, and counts
/// past the token. (One more round trip per grant; without it, a later majority lacking
/// the server with the largest count would report a smaller token.) A server restarted
/// without its data breaks this, as it breaks a single server's counter:
/// [`Fencing::BestEffort`]. Waiters poll (with jittered delays): no FIFO order.
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_redis::RedlockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locks = RedlockProvider::connect_url("redlock://10.0.0.1,10.0.0.2,10.0.0.3?ttl=10s").await?;
/// let mut guard = locks.lock("reports/nightly")?.acquire(None).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockProvider {
    shared: Arc<RedlockSession>,
    _owner: SessionOwner,
}

/// The provider's session: its servers, configuration and metrics, and whether it is over.
struct RedlockSession {
    config: RedlockConfig,
    nodes: Vec<Node>,
    metrics: Arc<Metrics>,
    closed: Closed,
}

impl fmt::Debug for RedlockSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let servers: Vec<_> = self.nodes.iter().map(Node::address).collect();
        f.debug_struct("RedlockSession")
            .field("servers", &servers)
            .finish()
    }
}

impl RedlockSession {
    fn quorum(&self) -> usize {
        self.config.quorum()
    }

    fn drift(&self) -> Duration {
        self.config
            .lease
            .ttl
            .mul_f64(self.config.clock_drift_factor)
            .saturating_add(Duration::from_millis(2))
    }

    /// How long one round waits for the servers: short against the ttl, so that a dead
    /// server does not eat the validity.
    fn round_budget(&self) -> Duration {
        self.config.lease.timeout.min(self.config.lease.ttl / 3)
    }
}

/// The most telling of several servers' errors: credentials first, then permissions, then
/// the rest.
fn worst(errors: Vec<LockError>, name: &LockName, what: &str) -> LockError {
    // The errors that tell more than "no majority answered", most telling first.
    let rank = |error: &LockError| match error {
        LockError::Auth { .. } => 0,
        LockError::PermissionDenied { .. } => 1,
        LockError::Backend {
            retryable: false, ..
        } => 2,
        _ => 3,
    };
    let failed = match errors.len() {
        0 => String::new(),
        count => format!(" ({count} failed)"),
    };
    match errors.into_iter().min_by_key(rank) {
        Some(error) if rank(&error) < 3 => error,
        error => LockError::Connection {
            backend: REDLOCK,
            name: Some(name.to_string()),
            message: format!("{what}: no majority of the servers answered{failed}"),
            source: error.map(|error| Box::new(error) as _),
        },
    }
}

impl RedlockProvider {
    /// Prepares a connection to every server and checks that a majority answers.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for an invalid configuration; [`LockError::Auth`] when a
    /// server refuses the credentials; [`LockError::Connection`] when fewer than a majority
    /// answer within the request timeout.
    pub async fn connect(config: RedlockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let metrics = Arc::new(Metrics::new());
        // Each connects on its first request: a server that is down must not keep the others
        // from being used.
        let settings = Settings {
            timeout: config.lease.timeout,
            backend: REDLOCK,
            metrics: Arc::clone(&metrics),
        };
        let lazy = |server| Node::connect(server, settings.clone(), true);
        let nodes = try_join_all(config.servers.iter().map(lazy)).await?;
        let shared = Arc::new(RedlockSession {
            config,
            nodes,
            metrics,
            closed: Closed::new(),
        });
        let answers = join_all(shared.nodes.iter().map(Node::ping)).await;
        let answered = answers.iter().filter(|answer| answer.is_ok()).count();
        let errors: Vec<_> = answers.into_iter().filter_map(Result::err).collect();
        if let Some(auth) = errors.iter().find(|e| matches!(e, LockError::Auth { .. })) {
            return Err(LockError::Auth {
                backend: REDLOCK,
                message: auth.to_string(),
            });
        }
        if answered < shared.quorum() {
            return Err(LockError::Connection {
                backend: REDLOCK,
                name: None,
                message: format!(
                    "{answered} of {} servers answered; a majority ({}) is needed",
                    shared.nodes.len(),
                    shared.quorum()
                ),
                source: errors.into_iter().next().map(|e| Box::new(e) as _),
            });
        }
        let closing = Arc::clone(&shared);
        Ok(RedlockProvider {
            _owner: SessionOwner::new(move || {
                closing.closed.close();
            }),
            shared,
        })
    }

    /// Parses a `redlock://` URL (see [`RedlockConfig::from_url`]) and connects.
    ///
    /// # Errors
    ///
    /// As for [`RedlockConfig::from_url`] and [`connect`](Self::connect).
    pub async fn connect_url(url: &str) -> Result<Self, LockError> {
        Self::connect(RedlockConfig::from_url(url)?).await
    }

    /// The configuration the provider was made with.
    pub fn config(&self) -> &RedlockConfig {
        &self.shared.config
    }
}

impl fmt::Debug for RedlockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let servers: Vec<_> = self.shared.nodes.iter().map(Node::address).collect();
        f.debug_struct("RedlockProvider")
            .field("servers", &servers)
            .field("quorum", &self.shared.quorum())
            .field("key_prefix", &self.shared.config.lease.key_prefix)
            .field("ttl", &self.shared.config.lease.ttl)
            .finish()
    }
}

impl LockProvider for RedlockProvider {
    fn backend(&self) -> &'static str {
        REDLOCK
    }

    fn capabilities(&self) -> Capabilities {
        let config = &self.shared.config;
        Capabilities::new(WaitKind::Poll)
            .with_fencing(Fencing::BestEffort)
            .with_lost_detection(true)
            .with_fifo(false)
            .with_leases(true)
            .with_crash_release_bound(Some(config.lease.ttl + config.retry_delay))
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let name = LockName::new(name)?;
        let keys = Arc::new(LockKeys::new(&self.shared.config.lease.key_prefix, &name));
        let lock = Arc::new(RedlockLock {
            shared: Arc::clone(&self.shared),
            name,
            keys,
        });
        Ok(observe_lock(lock, REDLOCK, "redlock"))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }
}

/// A lock handle from a [`RedlockProvider`].
pub struct RedlockLock {
    shared: Arc<RedlockSession>,
    name: LockName,
    keys: Arc<LockKeys>,
}

impl fmt::Debug for RedlockLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLock")
            .field("name", &self.name)
            .field("owner_key", &self.keys.owner)
            .finish()
    }
}

/// What one round of votes came to.
enum Round {
    /// A majority granted in time: the token and when the earliest vote was asked for.
    Held(u64, Instant),
    /// Another contender holds a majority: busy.
    Busy,
    /// The votes split, or servers failed: try again. `kept` when this contender keeps its
    /// votes (it has the smallest owner id among the holders, so the others give theirs up).
    Split { errors: Vec<LockError>, kept: bool },
}

/// Votes not yet a grant: given up on every server if abandoned, so that a cancelled round
/// leaves no partial grant.
struct Votes(Arc<RedlockClaim>);

impl Abandon for Votes {
    fn abandon(self) {
        release_in_background(self.0 as Arc<dyn Lease>);
    }
}

#[async_trait]
impl MutexAttempt for RedlockLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn backend(&self) -> &'static str {
        REDLOCK
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        self.shared.closed.check(REDLOCK, &self.name)?;
        let grant = Arc::new(RedlockClaim {
            shared: Arc::clone(&self.shared),
            keys: Arc::clone(&self.keys),
            name: self.name.clone(),
            id: Uuid::new_v4().simple().to_string(),
            released: Mutex::new(vec![false; self.shared.nodes.len()]),
        });
        let mut votes = Cleanup::new(Votes(Arc::clone(&grant)));
        let mut split_rounds = 0;
        let mut wakeups = Wakeups::new(&self.shared.metrics);
        let mut first_vote = None;
        loop {
            let (round, asked) = grant.round(first_vote).await;
            let mut kept_votes = false;
            match round {
                Round::Held(token, asked) => {
                    votes.disarm();
                    self.shared.metrics.record_grant();
                    let ttl = self.shared.config.lease.ttl;
                    return lease_guard(grant, &self.name, FencingToken(token), asked, ttl)
                        .map(Some);
                }
                Round::Busy => split_rounds = 0,
                Round::Split { errors, kept } => {
                    if errors.len() > self.shared.nodes.len() - self.shared.quorum() {
                        // No majority can answer: a bounded, retryable error, not a wait.
                        return Err(worst(errors, &self.name, "grant"));
                    }
                    split_rounds += 1;
                    kept_votes = kept;
                }
            }
            first_vote = kept_votes.then_some(asked);
            wakeups.busy();
            // A try retries split votes `retry_count` times; a wait goes on to its deadline.
            // The contender that keeps its votes (the split is settled for it) goes on while
            // they are valid: were it to give up with the others, overlapping tries on a free
            // lock could all fail.
            let retrying =
                split_rounds > 0 && (kept_votes || split_rounds <= self.shared.config.retry_count);
            let gave_up = if deadline.is_immediate() {
                !retrying
            } else {
                deadline.has_passed()
            };
            if gave_up {
                if kept_votes {
                    grant.release_all().await.ok();
                }
                return Ok(None);
            }
            // The contender that kept its votes comes back first, for the servers the others
            // gave up.
            let delay = self.shared.config.retry_delay;
            let delay = if kept_votes {
                delay / 4
            } else {
                delay.mul_f64(0.5 + fastrand::f64())
            };
            tokio::time::sleep(deadline.cap(delay)).await;
            wakeups.woke();
        }
    }
}

/// A contender's claim on every server: its owner id; the lease once held.
#[derive(Debug)]
struct RedlockClaim {
    shared: Arc<RedlockSession>,
    keys: Arc<LockKeys>,
    name: LockName,
    id: String,
    /// Which servers have confirmed a release, so that a retried release converges.
    released: Mutex<Vec<bool>>,
}

impl RedlockClaim {
    /// One round: `GRANT` on every server at once, each answer a vote; held with a majority
    /// inside the validity (counted from `first_vote`, when votes kept from an earlier round
    /// were asked for). Otherwise the votes are taken back, unless this contender has the
    /// smallest owner id among the holders: then it keeps them and the others give theirs
    /// up, so that split votes settle. Returns the outcome and when the earliest vote was
    /// asked for.
    async fn round(&self, first_vote: Option<Instant>) -> (Round, Instant) {
        let asked = Instant::now();
        let began = first_vote.unwrap_or(asked);
        let ttl = self.shared.config.lease.ttl;
        let vote = || scripts::grant(&self.keys, &self.id, ttl);
        let answers = self.on::<(u64, String)>(&self.shared.nodes, vote).await;
        let answered = answers.iter().flatten().cloned();
        let (votes, holders): (Vec<_>, Vec<_>) = answered.partition(|(token, _)| *token > 0);
        let tokens: Vec<u64> = votes.into_iter().map(|(token, _)| token).collect();
        let holders: Vec<String> = holders.into_iter().map(|(_, holder)| holder).collect();
        let quorum = self.shared.quorum();
        let mut errors: Vec<LockError> = Vec::new();
        if tokens.len() >= quorum && self.valid(began) {
            let token = tokens.iter().copied().max().unwrap_or_default();
            let voters: Vec<bool> = answers
                .iter()
                .map(|answer| answer.as_ref().is_ok_and(|(token, _)| *token > 0))
                .collect();
            errors = self.raise(token, &voters).await;
            if errors.is_empty() && self.valid(began) {
                return (Round::Held(token, began), began);
            }
        }
        let valid = self.valid(began);
        errors.extend(answers.into_iter().filter_map(Result::err));
        // Busy when another contender holds a majority; otherwise the votes are split
        // (say one each on three servers), which the smallest owner id settles.
        let busy = holders
            .iter()
            .any(|holder| holders.iter().filter(|h| *h == holder).count() >= quorum);
        let kept = !busy
            && valid
            && errors.is_empty()
            && !tokens.is_empty()
            && holders.iter().all(|holder| self.id < *holder);
        if kept {
            return (Round::Split { errors, kept }, began);
        }
        // Take back whatever was granted; a release that fails now is retried in the
        // background, and the ttl is the backstop.
        if (!tokens.is_empty() || !errors.is_empty())
            && let Err(error) = self.release_all().await
        {
            tracing::debug!(lock = %self.name, %error, "redlock: a vote was not taken back; it will expire");
        }
        unpoisoned(&self.released).fill(false);
        if busy {
            return (Round::Busy, asked);
        }
        (Round::Split { errors, kept }, asked)
    }

    /// Whether votes asked for at `began` still leave some validity: `ttl − elapsed −
    /// drift`.
    fn valid(&self, began: Instant) -> bool {
        began.elapsed().saturating_add(self.shared.drift()) < self.shared.config.lease.ttl
    }

    /// Runs the script `invocation` builds on each of `nodes` at once, each bounded by the
    /// round budget.
    async fn on<'a, T: FromRedisValue>(
        &'a self,
        nodes: impl IntoIterator<Item = &'a Node>,
        invocation: impl Fn() -> ScriptInvocation<'static>,
    ) -> Vec<Result<T, LockError>> {
        let budget = self.shared.round_budget();
        let calls = nodes.into_iter().map(|node| {
            let call = node.run::<T>(invocation(), self.name.as_str());
            async move {
                let Ok(answer) = tokio::time::timeout(budget, call).await else {
                    let message = format!("{} did not answer within {budget:?}", node.address());
                    return Err(connection(REDLOCK, None, message));
                };
                answer
            }
        });
        join_all(calls).await
    }

    /// The second round of a grant: the fencing counter of each of the `voters` (the
    /// servers whose votes made the majority) raised to at least `token`, and confirmed.
    /// Tokens then strictly increase from grant to grant while the servers keep their
    /// data: a later grant needs a majority of the owner keys, so it votes on one of these
    /// servers, and only after this grant let go of the key there, which is after the
    /// raise; its vote counts past `token`. The servers' errors: without every voter's
    /// confirmation the grant does not hold.
    async fn raise(&self, token: u64, voters: &[bool]) -> Vec<LockError> {
        // Only the voters: the argument needs no other server, and one that did not answer
        // the vote would cost a second round budget of the validity.
        let nodes = self.shared.nodes.iter().zip(voters);
        let nodes = nodes.filter(|(_, voted)| **voted).map(|(node, _)| node);
        let raise = || scripts::raise(&self.keys, token);
        let answers = self.on::<u64>(nodes, raise).await;
        answers.into_iter().filter_map(Result::err).collect()
    }

    /// `RELEASE` on every server not yet confirmed: how many confirmed in all, and how
    /// many answered that the key was not ours.
    async fn release_all(&self) -> Result<(usize, usize), LockError> {
        let before = unpoisoned(&self.released).clone();
        let ttl = self.shared.config.lease.ttl;
        // No waiters to tell: Redlock's wait polls.
        let args = QueueArgs {
            ttl,
            liveness: ttl,
            mode: "none",
            claim: ttl,
            candidate: false,
        };
        let release = || scripts::queue(&RELEASE, &self.keys, &self.id, &args);
        let answers = self.on::<u64>(&self.shared.nodes, release).await;
        let mut released = unpoisoned(&self.released);
        let mut not_ours = 0;
        let mut errors = Vec::new();
        for ((answer, done), was) in answers.into_iter().zip(released.iter_mut()).zip(before) {
            match answer {
                Ok(1) => *done = true,
                Ok(_) if !was => not_ours += 1,
                Ok(_) => {}
                Err(error) => errors.push(error),
            }
        }
        let confirmed = released.iter().filter(|done| **done).count();
        if errors.is_empty() || confirmed >= self.shared.quorum() {
            Ok((confirmed, not_ours))
        } else {
            Err(worst(errors, &self.name, "release"))
        }
    }
}

#[async_trait]
impl Lease for RedlockClaim {
    fn backend(&self) -> &'static str {
        REDLOCK
    }

    fn ttl(&self) -> Duration {
        self.shared.config.lease.ttl
    }

    fn drift(&self) -> Duration {
        self.shared.drift()
    }

    fn session(&self) -> &Closed {
        &self.shared.closed
    }

    async fn extend(&self) -> Result<Renewal, LockError> {
        let ttl = self.shared.config.lease.ttl;
        let extend = || scripts::extend(&self.keys, &self.id, ttl, false);
        let answers = self.on::<u64>(&self.shared.nodes, extend).await;
        let renewed = answers.iter().filter(|a| matches!(a, Ok(1))).count();
        let released = answers.iter().filter(|a| matches!(a, Ok(2))).count();
        let refused = answers.iter().filter(|a| matches!(a, Ok(0))).count();
        if renewed >= self.shared.quorum() {
            Ok(Renewal::Renewed)
        } else if released >= self.shared.quorum() {
            Ok(Renewal::Released)
        } else if refused + released > self.shared.nodes.len() - self.shared.quorum() {
            Ok(Renewal::Gone)
        } else {
            let errors = answers.into_iter().filter_map(Result::err).collect();
            Err(worst(errors, &self.name, "renewal"))
        }
    }

    async fn release(&self) -> Result<bool, LockError> {
        let (confirmed, not_ours) = self.release_all().await?;
        if confirmed >= self.shared.quorum() {
            Ok(true)
        } else if not_ours > self.shared.nodes.len() - self.shared.quorum() {
            Ok(false)
        } else {
            let message = "release: no majority of the servers confirmed";
            Err(connection(REDLOCK, Some(self.name.as_str()), message))
        }
    }
}
