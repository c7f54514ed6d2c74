//! What operators watch: how long callers wait for locks, how long holders keep them, how
//! acquisitions end and why holds are lost, emitted here once for every backend through the
//! [`metrics`](https://docs.rs/metrics) facade and `tracing` spans.
//!
//! Nothing is recorded unless the application installs a `metrics` recorder (a Prometheus
//! or OpenTelemetry exporter, say); without one each event costs a check of the global
//! recorder. A backend wraps the locks its provider hands out with [`observe_lock`], and
//! the [`Guard`](crate::Guard) of every grant measures its hold.
//!
//! | metric | type | unit | labels |
//! | --- | --- | --- | --- |
//! | `distlock_acquisitions_total` | counter | acquisitions | `backend`, `strategy`, `kind`, `call`, `outcome` |
//! | `distlock_wait_seconds` | histogram | seconds, from the call to its end | `backend`, `strategy`, `kind`, `call`, `outcome` |
//! | `distlock_waiting` | gauge | callers in `acquire` now | `backend`, `strategy`, `kind` |
//! | `distlock_held` | gauge | guards held now | `backend`, `strategy`, `kind` |
//! | `distlock_hold_seconds` | histogram | seconds, from the grant to the release, drop or loss | `backend`, `strategy`, `kind`, `end` |
//! | `distlock_losses_total` | counter | holds lost | `backend`, `strategy`, `kind`, `reason` |
//!
//! - `call`: `acquire` or `try_acquire`;
//! - `outcome`: `granted`, `busy` (a `try_acquire` that found the lock held), `timeout`,
//!   `cancelled` (the caller dropped the `acquire` future), or the error's kind
//!   ([`error_kind`]);
//! - `kind`: `mutex` (more kinds to come);
//! - `end`: `released`, `dropped` (the guard was dropped unreleased) or `lost`;
//! - `reason`: the [`LossReason`](crate::LossReason) as [`loss_label`] gives it.
//!
//! Labels stay few and bounded, as the exporters want them: the lock's name, which
//! applications make per entity (a customer, a file), is added as a `lock` label only when
//! the application asks for it with [`label_lock_names`].
//!
//! Every acquisition also runs inside a `tracing` span (`distlock.acquire` or
//! `distlock.try_acquire`, level `DEBUG`) with the lock's name, the backend and the
//! strategy, and ends with an event giving its outcome, wait and fencing token: a trace shows
//! where a request spent its time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use metrics::{Label, counter, gauge, histogram};
use tracing::Instrument;

use crate::{DistributedLock, Guard, LockError, LockName, LossReason, queue::LockQueue};

/// `distlock_acquisitions_total`: acquisitions by how they ended.
pub const ACQUISITIONS: &str = "distlock_acquisitions_total";
/// `distlock_wait_seconds`: from an acquisition's call to its end.
pub const WAIT_SECONDS: &str = "distlock_wait_seconds";
/// `distlock_waiting`: callers inside `acquire`.
pub const WAITING: &str = "distlock_waiting";
/// `distlock_held`: guards held.
pub const HELD: &str = "distlock_held";
/// `distlock_hold_seconds`: from a grant to its release, drop or loss.
pub const HOLD_SECONDS: &str = "distlock_hold_seconds";
/// `distlock_losses_total`: holds lost, by reason.
pub const LOSSES: &str = "distlock_losses_total";

static LOCK_NAMES: AtomicBool = AtomicBool::new(false);

/// Adds (or, with `false`, stops adding) the lock's name as a `lock` label to every metric
/// recorded from now on. Off by default: names are usually per entity, and every distinct
/// label value is a series the exporter keeps and the monitoring system stores.
pub fn label_lock_names(on: bool) {
    LOCK_NAMES.store(on, Ordering::Relaxed);
}

/// The `outcome` label of an error: `timeout`, `lost`, `invalid_name`, `invalid_argument`,
/// `connection`, `auth`, `permission_denied`, `session_expired`, `backend`, `unsupported`,
/// `config`.
pub fn error_kind(error: &LockError) -> &'static str {
    match error {
        LockError::Timeout { .. } => "timeout",
        LockError::Lost { .. } => "lost",
        LockError::InvalidName { .. } => "invalid_name",
        LockError::InvalidArgument { .. } => "invalid_argument",
        LockError::Connection { .. } => "connection",
        LockError::Auth { .. } => "auth",
        LockError::PermissionDenied { .. } => "permission_denied",
        LockError::SessionExpired { .. } => "session_expired",
        LockError::Backend { .. } => "backend",
        LockError::Unsupported { .. } => "unsupported",
        LockError::Config { .. } => "config",
    }
}

/// The `reason` label of a loss: `revoked`, `session_expired`, `disconnected`,
/// `lease_expired`, `entry_removed` or `other`.
pub fn loss_label(reason: &LossReason) -> &'static str {
    match reason {
        LossReason::Revoked => "revoked",
        LossReason::SessionExpired => "session_expired",
        LossReason::Disconnected => "disconnected",
        LossReason::LeaseExpired => "lease_expired",
        LossReason::EntryRemoved => "entry_removed",
        _ => "other",
    }
}

/// What a lock's metrics are labelled with (see the [module docs](self)).
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    backend: &'static str,
    strategy: &'static str,
    kind: &'static str,
    /// The lock's name, when [`label_lock_names`] was on as the lock was made.
    lock: Option<String>,
}

impl Labels {
    fn new(backend: &'static str, strategy: &'static str, name: &LockName) -> Self {
        let lock = LOCK_NAMES
            .load(Ordering::Relaxed)
            .then(|| name.as_str().to_owned());
        Labels {
            backend,
            strategy,
            kind: "mutex",
            lock,
        }
    }

    /// The labels, and `extra` after them.
    fn with(&self, extra: &[(&'static str, &'static str)]) -> Vec<Label> {
        let mut labels = Vec::with_capacity(4 + extra.len());
        labels.push(Label::from_static_parts("backend", self.backend));
        labels.push(Label::from_static_parts("strategy", self.strategy));
        labels.push(Label::from_static_parts("kind", self.kind));
        if let Some(lock) = &self.lock {
            labels.push(Label::new("lock", lock.clone()));
        }
        labels.extend(
            extra
                .iter()
                .map(|(key, value)| Label::from_static_parts(key, value)),
        );
        labels
    }

    fn acquisition(&self, call: &'static str, outcome: &'static str, waited: Duration) {
        let labels = self.with(&[("call", call), ("outcome", outcome)]);
        counter!(ACQUISITIONS, labels.clone()).increment(1);
        histogram!(WAIT_SECONDS, labels).record(waited.as_secs_f64());
    }

    pub(crate) fn loss(&self, reason: &LossReason) {
        counter!(LOSSES, self.with(&[("reason", loss_label(reason))])).increment(1);
    }
}

/// A held guard's part in the metrics: the `held` gauge while it lives, the hold's length
/// when it ends.
#[derive(Debug)]
pub(crate) struct Hold {
    labels: Arc<Labels>,
    granted: Instant,
}

impl Hold {
    fn start(labels: Arc<Labels>) -> Self {
        gauge!(HELD, labels.with(&[])).increment(1.0);
        Hold {
            labels,
            granted: Instant::now(),
        }
    }

    /// The labels a loss of this hold is counted with.
    pub(crate) fn labels(&self) -> Arc<Labels> {
        Arc::clone(&self.labels)
    }

    /// Ends the hold: `released`, `dropped` or `lost`.
    pub(crate) fn end(self, end: &'static str) {
        let labels = &self.labels;
        gauge!(HELD, labels.with(&[])).decrement(1.0);
        histogram!(HOLD_SECONDS, labels.with(&[("end", end)]))
            .record(self.granted.elapsed().as_secs_f64());
    }
}

/// Counts a caller inside `acquire` while it lives; a caller that drops the future counts
/// as `cancelled`.
struct Waiting<'a> {
    labels: &'a Labels,
    began: Instant,
    done: bool,
}

impl<'a> Waiting<'a> {
    fn new(labels: &'a Labels) -> Self {
        gauge!(WAITING, labels.with(&[])).increment(1.0);
        Waiting {
            labels,
            began: Instant::now(),
            done: false,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        gauge!(WAITING, self.labels.with(&[])).decrement(1.0);
        if !self.done {
            self.labels
                .acquisition("acquire", "cancelled", self.began.elapsed());
            tracing::debug!(waited = ?self.began.elapsed(), "distlock: acquisition cancelled");
        }
    }
}

/// A backend's lock with its acquisitions observed: see [`observe_lock`].
#[derive(Debug)]
struct Observed {
    inner: Arc<dyn DistributedLock>,
    labels: Arc<Labels>,
}

/// `lock` with its acquisitions, waits, holds and losses recorded (see the
/// [module docs](self)), labelled with `backend` and `strategy`: what a backend's
/// [`LockProvider::lock`](crate::LockProvider::lock) hands out.
///
/// ```
/// use std::sync::Arc;
/// use lock_core::DistributedLock;
///
/// /// What a backend's `LockProvider::lock` hands out for its own lock type.
/// fn hand_out(lock: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
///     lock_core::observe::observe_lock(lock, "my-backend", "queue")
/// }
/// ```
pub fn observe_lock(
    lock: Arc<dyn DistributedLock>,
    backend: &'static str,
    strategy: &'static str,
) -> Arc<dyn DistributedLock> {
    let labels = Arc::new(Labels::new(backend, strategy, lock.name()));
    Arc::new(Observed {
        inner: lock,
        labels,
    })
}

impl Observed {
    fn span(&self, call: &'static str) -> tracing::Span {
        let labels = &self.labels;
        match call {
            "acquire" => tracing::debug_span!(
                "distlock.acquire",
                lock = %self.inner.name(),
                backend = labels.backend,
                strategy = labels.strategy
            ),
            _ => tracing::debug_span!(
                "distlock.try_acquire",
                lock = %self.inner.name(),
                backend = labels.backend,
                strategy = labels.strategy
            ),
        }
    }

    /// Records how an acquisition ended.
    fn record(
        &self,
        call: &'static str,
        result: Result<Option<&Guard>, &LockError>,
        waited: Duration,
    ) {
        let outcome = match result {
            Ok(Some(guard)) => {
                tracing::debug!(?waited, token = %guard.fencing_token(), "distlock: granted");
                "granted"
            }
            Ok(None) => {
                tracing::debug!(?waited, "distlock: busy");
                "busy"
            }
            Err(error) => {
                tracing::debug!(?waited, %error, "distlock: not granted");
                error_kind(error)
            }
        };
        self.labels.acquisition(call, outcome, waited);
    }

    /// A grant's guard, measuring its hold.
    fn held(&self, guard: Guard) -> Guard {
        guard.with_hold(Hold::start(Arc::clone(&self.labels)))
    }
}

#[async_trait]
impl DistributedLock for Observed {
    fn name(&self) -> &LockName {
        self.inner.name()
    }

    async fn try_acquire(&self) -> Result<Option<Guard>, LockError> {
        let span = self.span("try_acquire");
        let began = Instant::now();
        let result = self.inner.try_acquire().instrument(span.clone()).await;
        let _entered = span.enter();
        self.record(
            "try_acquire",
            result.as_ref().map(Option::as_ref),
            began.elapsed(),
        );
        result.map(|guard| guard.map(|guard| self.held(guard)))
    }

    async fn acquire(&self, timeout: Option<Duration>) -> Result<Guard, LockError> {
        let span = self.span("acquire");
        let mut waiting = Waiting::new(&self.labels);
        let result = self.inner.acquire(timeout).instrument(span.clone()).await;
        waiting.done = true;
        let _entered = span.enter();
        self.record(
            "acquire",
            result.as_ref().map(Some),
            waiting.began.elapsed(),
        );
        result.map(|guard| self.held(guard))
    }

    async fn queue(&self) -> Result<LockQueue, LockError> {
        self.inner.queue().await
    }
}
