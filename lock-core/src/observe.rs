//! What operators watch: how long callers wait for locks, how long holders keep them, how
//! acquisitions end and why holds are lost, emitted here once for every backend through the
//! [`metrics`](https://docs.rs/metrics) facade and `tracing` spans.
//!
//! Nothing is recorded unless the application installs a `metrics` recorder (a Prometheus
//! or OpenTelemetry exporter, say). A backend wraps what its provider hands out with
//! [`observe_lock`], [`observe_rw_lock`], [`observe_semaphore`] and [`observe_election`],
//! and the [`Guard`] of every grant measures its hold.
//!
//! What it costs: with no recorder installed and the `DEBUG` spans below disabled, an
//! acquisition costs one look at the facade's recorder and the spans' level, and the
//! backend's own future runs untouched (nothing timed, nothing wrapped); a lock of the kit
//! ([`MutexAttempt`]) is observed at its attempt, in the one future the kit makes around
//! it anyway, so that observing it allocates nothing of its own. Otherwise each
//! thread registers a series' handle with the recorder on its first event and keeps it
//! (a recorder looks a key up in a registry shared by every thread, which alone cost
//! several times an in-memory acquisition), and registers again for another recorder: a
//! local one (`metrics::with_local_recorder`), or the global one installed since; a
//! recorder is told apart by its address, so a local recorder made on one thread at the
//! address of an earlier, dropped one would be taken for it (keep each alive). The
//! facade falls back to its no-op recorder, of size zero; a recorder of size zero (one that
//! keeps nothing of its own) is taken for it and gets nothing. With the lock's name as a
//! label ([`label_lock_names`]), keys are made and registered per event.
//!
//! | metric | type | unit | labels |
//! | --- | --- | --- | --- |
//! | `distlock_acquisitions_total` | counter | acquisitions | `backend`, `strategy`, `kind`, `call`, `outcome` |
//! | `distlock_wait_seconds` | histogram | seconds, from the call to its end | `backend`, `strategy`, `kind`, `call`, `outcome` |
//! | `distlock_waiting` | gauge | callers waiting in `acquire` now (one granted as it asks never counts) | `backend`, `strategy`, `kind` |
//! | `distlock_held` | gauge | guards held now | `backend`, `strategy`, `kind` |
//! | `distlock_hold_seconds` | histogram | seconds, from the grant to the guard's release or drop | `backend`, `strategy`, `kind`, `end` |
//! | `distlock_losses_total` | counter | holds lost | `backend`, `strategy`, `kind`, `reason` |
//! | `distlock_renewals_total` | counter | lease renewals | `backend`, `outcome` (`renewed`, `refused`, `failed`) |
//! | `distlock_reconnects_total` | counter | reconnections | `backend`, `what` (`session`, `connection`) |
//!
//! - `call`: `acquire` or `try_acquire`;
//! - `outcome`: `granted`, `busy` (a `try_acquire` that found the lock held), `timeout`,
//!   `cancelled` (the caller dropped the `acquire` future), or the error's kind
//!   ([`error_kind`]);
//! - `kind`: `mutex`, `read` or `write` (the sides of a read-write lock), `permit` (a
//!   semaphore's), `election` (a campaign: its wait to lead, then the term);
//! - `end`: `released`, `dropped` (the guard was dropped unreleased) or `lost` (the hold
//!   was lost by then; a lost guard counts as held until it is released or dropped);
//! - `reason`: the [`LossReason`] as [`loss_label`] gives it.
//!
//! Labels stay few and bounded, as the exporters want them: the lock's name, which
//! applications make per entity (a customer, a file), is added as a `lock` label only when
//! the application asks for it with [`label_lock_names`].
//!
//! Every acquisition also runs inside a `tracing` span (`distlock.acquire` or
//! `distlock.try_acquire`, level `DEBUG`; a campaign is an `acquire`) with the lock's
//! name, the backend, the strategy and the kind, and ends with an event giving its outcome, wait and fencing token: a trace shows
//! where a request spent its time.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder};
use quanta::Clock;

use crate::election::{LeaderInfo, LeaderWatch, Leadership};
use crate::kit::MutexAttempt;
use crate::{
    Deadline, DistributedLock, DistributedRwLock, DistributedSemaphore, Election, Guard, LockError,
    LockName, LossReason, queue::LockQueue,
};

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

/// `distlock_renewals_total`: renewals of a lease, by outcome.
pub const RENEWALS: &str = "distlock_renewals_total";
/// `distlock_reconnects_total`: sessions and connections made again.
pub const RECONNECTS: &str = "distlock_reconnects_total";

static LOCK_NAMES: AtomicBool = AtomicBool::new(false);

/// Counts one renewal of a lease (a Redis lock's renewal, an etcd session's keep-alive)
/// under `distlock_renewals_total`: `renewed`, `refused` (the server says the lease or the
/// grant is gone) or `failed` (no answer, an error; the renewal is tried again).
///
/// ```
/// lock_core::observe::record_renewal("my-backend", "renewed");
/// ```
pub fn record_renewal(backend: &'static str, outcome: &'static str) {
    metrics::counter!(RENEWALS, "backend" => backend, "outcome" => outcome).increment(1);
}

/// Counts a reconnection under `distlock_reconnects_total`: `session` (a new session after
/// the last one ended: its locks were lost) or `connection` (the connection came back within
/// the session, whose locks are kept).
///
/// ```
/// lock_core::observe::record_reconnect("my-backend", "session");
/// ```
pub fn record_reconnect(backend: &'static str, what: &'static str) {
    metrics::counter!(RECONNECTS, "backend" => backend, "what" => what).increment(1);
}

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

/// The `call` label's values, in the order of [`Catalog`]'s tables.
const CALLS: [&str; 2] = ["acquire", "try_acquire"];
/// The `outcome` label's values, in the order of [`Catalog`]'s tables.
const OUTCOMES: [&str; 14] = [
    "granted",
    "busy",
    "cancelled",
    "timeout",
    "lost",
    "invalid_name",
    "invalid_argument",
    "connection",
    "auth",
    "permission_denied",
    "session_expired",
    "backend",
    "unsupported",
    "config",
];
/// [`OUTCOMES`]' places of the outcomes an acquisition reaches without an error.
const GRANTED: usize = 0;
const BUSY: usize = 1;
const CANCELLED: usize = 2;
/// The `end` label's values, in the order of [`Catalog`]'s tables and of [`HoldEnd`].
const ENDS: [&str; 3] = ["released", "dropped", "lost"];

/// The `call` label, as its place in [`CALLS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Acquire = 0,
    TryAcquire = 1,
}

/// How a hold ended (the `end` label), as its place in [`ENDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldEnd {
    Released = 0,
    Dropped = 1,
    Lost = 2,
}
/// The `reason` label's values, in the order of [`Catalog`]'s tables.
const REASONS: [&str; 6] = [
    "revoked",
    "session_expired",
    "disconnected",
    "lease_expired",
    "entry_removed",
    "other",
];

/// What the metrics say of where they come from.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

fn index(values: &[&str], value: &str) -> usize {
    values.iter().position(|v| *v == value).unwrap_or(0)
}

/// One series of a lock's: a metric, and the labels it adds to the lock's own (indices
/// into [`CALLS`], [`OUTCOMES`], [`ENDS`] and [`REASONS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Series {
    Acquisitions { call: usize, outcome: usize },
    Wait { call: usize, outcome: usize },
    Held,
    Waiting,
    Hold { end: usize },
    Loss { reason: usize },
}

/// How many acquisition series (one per call and outcome) there are.
const PER_CALL: usize = CALLS.len() * OUTCOMES.len();

impl Series {
    /// Every series, in the order of their [`slot`](Self::slot)s.
    fn all() -> impl Iterator<Item = Series> {
        let calls =
            || (0..CALLS.len()).flat_map(|call| (0..OUTCOMES.len()).map(move |o| (call, o)));
        calls()
            .map(|(call, outcome)| Series::Acquisitions { call, outcome })
            .chain(calls().map(|(call, outcome)| Series::Wait { call, outcome }))
            .chain([Series::Held, Series::Waiting])
            .chain((0..ENDS.len()).map(|end| Series::Hold { end }))
            .chain((0..REASONS.len()).map(|reason| Series::Loss { reason }))
    }

    /// Its place in a [`Catalog`].
    fn slot(self) -> usize {
        match self {
            Series::Acquisitions { call, outcome } => call * OUTCOMES.len() + outcome,
            Series::Wait { call, outcome } => PER_CALL + call * OUTCOMES.len() + outcome,
            Series::Held => 2 * PER_CALL,
            Series::Waiting => 2 * PER_CALL + 1,
            Series::Hold { end } => 2 * PER_CALL + 2 + end,
            Series::Loss { reason } => 2 * PER_CALL + 2 + ENDS.len() + reason,
        }
    }

    /// Its key for a lock labelled `labels`.
    fn key(self, labels: &Labels) -> Key {
        let (name, extra) = match self {
            Series::Acquisitions { call, outcome } => (
                ACQUISITIONS,
                vec![("call", CALLS[call]), ("outcome", OUTCOMES[outcome])],
            ),
            Series::Wait { call, outcome } => (
                WAIT_SECONDS,
                vec![("call", CALLS[call]), ("outcome", OUTCOMES[outcome])],
            ),
            Series::Held => (HELD, vec![]),
            Series::Waiting => (WAITING, vec![]),
            Series::Hold { end } => (HOLD_SECONDS, vec![("end", ENDS[end])]),
            Series::Loss { reason } => (LOSSES, vec![("reason", REASONS[reason])]),
        };
        Key::from_parts(name, labels.with(&extra))
    }
}

/// Every key one backend, strategy and kind of lock records under, made once, and its
/// place among the catalogs (by which each thread finds the handles it registered).
#[derive(Debug)]
pub(crate) struct Catalog {
    labels: Labels,
    index: usize,
    /// By [`Series::slot`].
    keys: Vec<Key>,
}

/// The catalogs made so far: one per backend, strategy and kind, a handful per process.
static CATALOGS: Mutex<Vec<&'static Catalog>> = Mutex::new(Vec::new());

impl Catalog {
    fn of(labels: Labels) -> &'static Self {
        let mut catalogs = CATALOGS.lock().unwrap_or_else(PoisonError::into_inner);
        let known = catalogs.iter().find(|c| c.labels == labels);
        if let Some(catalog) = known {
            return catalog;
        }
        let keys = Series::all().map(|series| series.key(&labels)).collect();
        let index = catalogs.len();
        let catalog: &'static Catalog = Box::leak(Box::new(Catalog {
            labels,
            index,
            keys,
        }));
        catalogs.push(catalog);
        catalog
    }

    /// The catalog made `index`-th.
    fn at(index: usize) -> Option<&'static Self> {
        let catalogs = CATALOGS.lock().unwrap_or_else(PoisonError::into_inner);
        catalogs.get(index).copied()
    }

    /// Records each change of its series with this thread's handles from `recorder`,
    /// registering each on first use.
    fn record(&self, recorder: &dyn Recorder, changes: &[(Series, Change)]) {
        let from = (recorder as *const dyn Recorder).cast::<()>();
        REGISTERED.with_borrow_mut(|registered| {
            let current = registered
                .get(self.index)
                .and_then(Option::as_ref)
                .is_some_and(|known| std::ptr::eq(known.from, from));
            if !current {
                self.fresh_handles(registered, from);
            }
            let Some(Some(handles)) = registered.get_mut(self.index) else {
                return;
            };
            for &(series, change) in changes {
                let slot = series.slot();
                let Some(handle) = handles.by_slot.get_mut(slot) else {
                    continue;
                };
                match handle {
                    Some(handle) => handle.apply(change),
                    None => {
                        if let Some(key) = self.keys.get(slot) {
                            handle
                                .insert(Handle::register(recorder, series, key))
                                .apply(change);
                        }
                    }
                }
            }
        });
    }

    /// Empties this thread's place for the handles of this catalog, for the recorder at
    /// `from`: the catalog's first event on the thread, or its first under another
    /// recorder.
    #[cold]
    fn fresh_handles(&self, registered: &mut Vec<Option<Registered>>, from: *const ()) {
        if registered.len() <= self.index {
            registered.resize_with(self.index + 1, || None);
        }
        let mut by_slot = Vec::new();
        by_slot.resize_with(self.keys.len(), || None);
        if let Some(place) = registered.get_mut(self.index) {
            *place = Some(Registered { from, by_slot });
        }
    }
}

/// A series' handle, registered with a recorder.
enum Handle {
    Counter(Counter),
    Gauge(Gauge),
    Histogram(Histogram),
}

/// What an event does to its series.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// A counter goes up by one.
    Count,
    /// A gauge moves by this much.
    Move(f64),
    /// A histogram takes this value.
    Record(f64),
}

impl Handle {
    fn register(recorder: &dyn Recorder, series: Series, key: &Key) -> Self {
        match series {
            Series::Acquisitions { .. } | Series::Loss { .. } => {
                Handle::Counter(recorder.register_counter(key, &METADATA))
            }
            Series::Held | Series::Waiting => {
                Handle::Gauge(recorder.register_gauge(key, &METADATA))
            }
            Series::Wait { .. } | Series::Hold { .. } => {
                Handle::Histogram(recorder.register_histogram(key, &METADATA))
            }
        }
    }

    fn apply(&self, change: Change) {
        match (self, change) {
            (Handle::Counter(counter), Change::Count) => counter.increment(1),
            (Handle::Gauge(gauge), Change::Move(by)) => gauge.increment(by),
            (Handle::Histogram(histogram), Change::Record(value)) => histogram.record(value),
            // Each series is one kind of metric and each event one kind of change.
            _ => {}
        }
    }
}

/// The handles one thread registered for one catalog, and the recorder they came from.
struct Registered {
    /// The recorder's address, to tell when another one records (a local recorder, or
    /// the global one installed since): only compared, never followed.
    from: *const (),
    /// By [`Series::slot`], registered on first use.
    by_slot: Vec<Option<Handle>>,
}

thread_local! {
    /// This thread's handles, by [`Catalog::index`]: a recorder looks a key up in a
    /// registry shared by every thread, which costs several times the rest of an
    /// acquisition on the in-memory backend; a handle does not.
    static REGISTERED: RefCell<Vec<Option<Registered>>> = const { RefCell::new(Vec::new()) };
}

/// Whether a recorder is installed, here or globally. The facade falls back to its no-op
/// recorder, a type of size zero; a recorder that records keeps state, so has a size.
fn recorder_installed() -> bool {
    metrics::with_recorder(records)
}

/// Whether `recorder` records: not the facade's no-op fallback (see
/// [`recorder_installed`]).
fn records(recorder: &dyn Recorder) -> bool {
    std::mem::size_of_val(recorder) != 0
}

/// A reading of the process's clock: the CPU's time-stamp counter where it is usable, read
/// as is (about half the cost of a scaled read) and scaled only when a duration is taken.
#[derive(Debug, Clone, Copy)]
struct Tick(u64);

impl Tick {
    /// The clock, calibrated on its first use in the process (well under a millisecond).
    fn clock() -> &'static Clock {
        static CLOCK: OnceLock<Clock> = OnceLock::new();
        CLOCK.get_or_init(Clock::new)
    }

    fn now() -> Self {
        Tick(Self::clock().raw())
    }

    /// The time from this reading to `later` (zero if `later` is not later).
    fn until(self, later: Tick) -> Duration {
        Self::clock().delta(self.0, later.0)
    }

    /// [`until`](Self::until) in seconds, as metrics take it: nanoseconds multiplied,
    /// where a `Duration` would divide three times.
    #[expect(
        clippy::cast_precision_loss,
        reason = "a wait or hold of 2^53 ns is 104 days; a histogram keeps less"
    )]
    fn seconds_until(self, later: Tick) -> f64 {
        Self::clock().delta_as_nanos(self.0, later.0) as f64 * 1e-9
    }
}

/// What a lock's metrics are labelled with (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Labels {
    backend: &'static str,
    strategy: &'static str,
    kind: &'static str,
    /// The lock's name, when [`label_lock_names`] was on as the lock was made.
    lock: Option<String>,
}

/// Where a lock's metrics go: its catalog (keys made once, handles registered once per
/// thread and recorder), or, with its name as a label, keys made and registered per event.
#[derive(Debug, Clone)]
pub(crate) enum Recording {
    Catalog(&'static Catalog),
    Named(Arc<Labels>),
}

impl Labels {
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
}

impl Recording {
    fn new(
        backend: &'static str,
        strategy: &'static str,
        kind: &'static str,
        name: &LockName,
    ) -> Self {
        let named = LOCK_NAMES.load(Ordering::Relaxed);
        let labels = Labels {
            backend,
            strategy,
            kind,
            lock: named.then(|| name.as_str().to_owned()),
        };
        match named {
            true => Recording::Named(Arc::new(labels)),
            false => Recording::Catalog(Catalog::of(labels)),
        }
    }

    fn labels(&self) -> &Labels {
        match self {
            Recording::Catalog(catalog) => &catalog.labels,
            Recording::Named(labels) => labels,
        }
    }

    fn backend(&self) -> &'static str {
        self.labels().backend
    }

    fn strategy(&self) -> &'static str {
        self.labels().strategy
    }

    fn kind(&self) -> &'static str {
        self.labels().kind
    }

    /// Records each change of its series, if a recorder is installed; returns whether one
    /// was.
    fn record(&self, changes: &[(Series, Change)]) -> bool {
        metrics::with_recorder(|recorder| {
            if !records(recorder) {
                return false;
            }
            match self {
                Recording::Catalog(catalog) => catalog.record(recorder, changes),
                Recording::Named(labels) => {
                    for &(series, change) in changes {
                        Handle::register(recorder, series, &series.key(labels)).apply(change);
                    }
                }
            }
            true
        })
    }

    /// An acquisition's end: how it ended, how long it waited, and, if it was granted, the
    /// hold's start (returns whether the `held` gauge took it).
    fn acquisition(&self, call: Call, outcome: usize, waited: f64) -> bool {
        let call = call as usize;
        let waited = Change::Record(waited);
        let ended = [
            (Series::Acquisitions { call, outcome }, Change::Count),
            (Series::Wait { call, outcome }, waited),
            (Series::Held, Change::Move(1.0)),
        ];
        let granted = outcome == GRANTED;
        self.record(if granted { &ended } else { &ended[..2] }) && granted
    }

    /// Moves the `waiting` gauge; returns whether a recorder took it.
    fn waiting(&self, change: f64) -> bool {
        self.record(&[(Series::Waiting, Change::Move(change))])
    }

    /// A hold's end, and whether the `held` gauge took its start.
    fn hold(&self, end: HoldEnd, held: f64, counted: bool) {
        let end = end as usize;
        let ended = [
            (Series::Hold { end }, Change::Record(held)),
            (Series::Held, Change::Move(-1.0)),
        ];
        self.record(if counted { &ended } else { &ended[..1] });
    }

    pub(crate) fn loss(&self, reason: &LossReason) {
        let reason = index(&REASONS, loss_label(reason));
        self.record(&[(Series::Loss { reason }, Change::Count)]);
    }
}

/// Where a held lock's loss is counted, set once its guard is observed: one plus the
/// catalog's index in one atomic word (set with one store, where a `OnceLock` takes two
/// read-modify-writes on every grant), or the labels of a lock named in its metrics.
#[derive(Debug, Default)]
pub(crate) struct LossRecording {
    catalog: AtomicUsize,
    named: OnceLock<Arc<Labels>>,
}

impl LossRecording {
    /// Sets where losses are counted. Sequentially consistent, as the read of the loss
    /// that follows it in `LostSignal::count_loss_with`: of this and a loss fired
    /// meanwhile, one sees the other.
    pub(crate) fn set(&self, recording: Recording) {
        match recording {
            Recording::Catalog(catalog) => self.catalog.store(catalog.index + 1, Ordering::SeqCst),
            Recording::Named(labels) => {
                let _ = self.named.set(labels);
            }
        }
    }

    /// Where losses are counted, if set.
    pub(crate) fn get(&self) -> Option<Recording> {
        match self.catalog.load(Ordering::SeqCst).checked_sub(1) {
            Some(index) => Catalog::at(index).map(Recording::Catalog),
            None => self.named.get().cloned().map(Recording::Named),
        }
    }
}

/// A held guard's part in the metrics: the `held` gauge while it lives, the hold's length
/// when it ends.
#[derive(Debug)]
pub(crate) struct Hold {
    recording: Recording,
    granted: Tick,
    /// Whether the `held` gauge took this hold (a recorder was installed at its start),
    /// so that its end moves the gauge back only then.
    counted: bool,
}

impl Hold {
    /// A hold from `granted` on, `counted` in the `held` gauge or not.
    fn start(recording: Recording, granted: Tick, counted: bool) -> Self {
        Hold {
            recording,
            granted,
            counted,
        }
    }

    /// Where a loss of this hold is counted.
    pub(crate) fn recording(&self) -> Recording {
        self.recording.clone()
    }

    /// Ends the hold.
    pub(crate) fn end(self, end: HoldEnd) {
        let held = self.granted.seconds_until(Tick::now());
        self.recording.hold(end, held, self.counted);
    }
}

/// One kind of lock's acquisitions observed: the span each runs in, how it ended and how
/// long it waited, and the hold of what it granted.
#[derive(Debug)]
struct Observer {
    recording: Recording,
}

/// What an acquisition grants: a [`Guard`], or a [`Leadership`] over one.
trait Grant: Sized {
    fn guard(&self) -> &Guard;
    fn with_hold(self, hold: Hold) -> Self;
}

impl Grant for Guard {
    fn guard(&self) -> &Guard {
        self
    }
    fn with_hold(self, hold: Hold) -> Self {
        Guard::with_hold(self, hold)
    }
}

impl Grant for Leadership {
    fn guard(&self) -> &Guard {
        Leadership::guard(self)
    }
    fn with_hold(self, hold: Hold) -> Self {
        let value = self.value().to_vec();
        Leadership::new(self.into_guard().with_hold(hold), value)
    }
}

impl Observer {
    fn new(
        backend: &'static str,
        strategy: &'static str,
        kind: &'static str,
        name: &LockName,
    ) -> Self {
        Observer {
            recording: Recording::new(backend, strategy, kind, name),
        }
    }

    fn span(&self, name: &LockName, call: Call) -> tracing::Span {
        let recording = &self.recording;
        let (backend, strategy, kind) =
            (recording.backend(), recording.strategy(), recording.kind());
        match call {
            Call::Acquire => {
                tracing::debug_span!("distlock.acquire", lock = %name, backend, strategy, kind)
            }
            Call::TryAcquire => {
                tracing::debug_span!("distlock.try_acquire", lock = %name, backend, strategy, kind)
            }
        }
    }

    /// The backend's acquisition `inner`, a `call` on the lock `name`, observed; or, when
    /// nothing would take note (no recorder installed, the span disabled), `inner` untouched.
    fn observe<'a, T: Granted + Send + 'a>(
        &'a self,
        name: &LockName,
        call: Call,
        inner: Boxed<'a, T>,
    ) -> Boxed<'a, T> {
        match self.span_if_noted(name, call) {
            Some(span) => Box::pin(Observing::new(&self.recording, call, span, inner, Ok)),
            None => inner,
        }
    }

    /// A kit `attempt`, a `call` on the lock `name`, observed as the caller's acquisition
    /// whose result `answer` makes of the attempt's; or, when nothing would take note, that
    /// acquisition alone. Either way one future around the attempt, as the kit's own.
    fn observe_attempt<'a, I, T, F>(
        &'a self,
        name: &LockName,
        call: Call,
        attempt: Boxed<'a, I>,
        answer: F,
    ) -> Boxed<'a, T>
    where
        I: Send + 'a,
        T: Granted + Send + 'a,
        F: FnOnce(I) -> Result<T, LockError> + Send + Unpin + 'a,
    {
        match self.span_if_noted(name, call) {
            Some(span) => Box::pin(Observing::new(&self.recording, call, span, attempt, answer)),
            None => Box::pin(async move { answer(attempt.await?) }),
        }
    }

    /// The span of a `call` on `name`, unless nothing would take note of it (no recorder
    /// installed, the span disabled).
    fn span_if_noted(&self, name: &LockName, call: Call) -> Option<tracing::Span> {
        let span = self.span(name, call);
        match span.is_disabled() && !recorder_installed() {
            true => None,
            false => Some(span),
        }
    }
}

/// What an acquisition's future gives when it is granted: a grant ([`Grant`]) for a wait, and
/// perhaps one for a try.
trait Granted: Sized {
    fn guard(&self) -> Option<&Guard>;
    fn with_hold(self, hold: Hold) -> Self;
}

impl<G: Grant> Granted for G {
    fn guard(&self) -> Option<&Guard> {
        Some(Grant::guard(self))
    }
    fn with_hold(self, hold: Hold) -> Self {
        Grant::with_hold(self, hold)
    }
}

impl<G: Grant> Granted for Option<G> {
    fn guard(&self) -> Option<&Guard> {
        self.as_ref().map(Grant::guard)
    }
    fn with_hold(self, hold: Hold) -> Self {
        self.map(|grant| grant.with_hold(hold))
    }
}

/// An acquisition observed while it runs (one future, written out, in place of an `async`
/// block around `poll_fn` and `Instrument` around the backend's): polls the backend's future
/// inside the span, and records how and when it ended.
/// An `acquire` is counted as waiting once its future returns `Pending`, and as `cancelled`
/// if it is dropped before it ends.
struct Observing<'a, I, F> {
    recording: &'a Recording,
    call: Call,
    inner: Boxed<'a, I>,
    /// Makes the caller's result of the backend's answer; taken when it comes, so that
    /// `None` means the acquisition has ended.
    answer: Option<F>,
    span: tracing::Span,
    began: Tick,
    /// Whether the call has had to wait (its future returned `Pending`).
    suspended: bool,
    /// Whether the `waiting` gauge took it, as [`Hold::counted`].
    waiting_counted: bool,
}

impl<'a, I, F> Observing<'a, I, F> {
    /// `inner`, a `call` recorded in `recording`, polled in `span`; `answer` makes the
    /// caller's result of its answer.
    fn new(
        recording: &'a Recording,
        call: Call,
        span: tracing::Span,
        inner: Boxed<'a, I>,
        answer: F,
    ) -> Self {
        Observing {
            recording,
            call,
            inner,
            answer: Some(answer),
            span,
            began: Tick::now(),
            suspended: false,
            waiting_counted: false,
        }
    }
}

impl<I, T, F> Future for Observing<'_, I, F>
where
    T: Granted,
    F: FnOnce(I) -> Result<T, LockError> + Unpin,
{
    type Output = Result<T, LockError>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        let Some(answer) = this.answer.take() else {
            // Polled after its end, which the contract of `Future` leaves open: no panic.
            return std::task::Poll::Pending;
        };
        let _entered = this.span.enter();
        let std::task::Poll::Ready(answered) = this.inner.as_mut().poll(cx) else {
            this.answer = Some(answer);
            if this.call == Call::Acquire && !this.suspended {
                this.suspended = true;
                this.waiting_counted = this.recording.waiting(1.0);
            }
            return std::task::Poll::Pending;
        };
        let result = answered.and_then(answer);
        let ended = Tick::now();
        let outcome = match &result {
            Ok(granted) => match granted.guard() {
                Some(guard) => {
                    tracing::debug!(waited = ?this.began.until(ended), token = %guard.fencing_token(), "distlock: granted");
                    GRANTED
                }
                None => {
                    tracing::debug!(waited = ?this.began.until(ended), "distlock: busy");
                    BUSY
                }
            },
            Err(error) => {
                tracing::debug!(waited = ?this.began.until(ended), %error, "distlock: not granted");
                index(&OUTCOMES, error_kind(error))
            }
        };
        let waited = this.began.seconds_until(ended);
        let counted = this.recording.acquisition(this.call, outcome, waited);
        let recording = this.recording;
        std::task::Poll::Ready(
            result.map(|granted| granted.with_hold(Hold::start(recording.clone(), ended, counted))),
        )
    }
}

impl<I, F> Drop for Observing<'_, I, F> {
    fn drop(&mut self) {
        if self.waiting_counted {
            self.recording.waiting(-1.0);
        }
        if self.answer.is_some() && self.call == Call::Acquire {
            let ended = Tick::now();
            let waited = self.began.seconds_until(ended);
            self.recording.acquisition(Call::Acquire, CANCELLED, waited);
            let _entered = self.span.enter();
            tracing::debug!(waited = ?self.began.until(ended), "distlock: acquisition cancelled");
        }
    }
}

/// A backend's future of an acquisition, as `async_trait` boxes it.
type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, LockError>> + Send + 'a>>;

/// What a backend hands out (a lock, a semaphore, an election), with its acquisitions
/// observed: see [`observe_lock`] and its siblings.
#[derive(Debug)]
struct Observed<L: ?Sized> {
    inner: Arc<L>,
    observer: Observer,
}

impl<L: ?Sized> Observed<L> {
    fn new(inner: Arc<L>, observer: Observer) -> Arc<Self> {
        Arc::new(Observed { inner, observer })
    }
}

/// `lock` with its acquisitions, waits, holds and losses recorded (see the
/// [module docs](self)), labelled with `backend`, `strategy` and the kind `mutex`: what a
/// backend's [`LockProvider::lock`](crate::LockProvider::lock) hands out.
///
/// Any [`DistributedLock`] can be observed; a lock of the kit (a [`MutexAttempt`]) is
/// observed at its attempt, in the one future the kit would make around it, so that
/// observing it costs no allocation of its own (see [`ObservableLock`]).
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
pub fn observe_lock<L: ObservableLock + ?Sized>(
    lock: Arc<L>,
    backend: &'static str,
    strategy: &'static str,
) -> Arc<dyn DistributedLock> {
    L::observed(lock, backend, strategy)
}

/// What [`observe_lock`] observes: any `dyn` [`DistributedLock`], whose futures it wraps,
/// or a lock of the kit ([`MutexAttempt`]), whose attempts it observes directly.
pub trait ObservableLock: Send + Sync + 'static {
    /// `lock` observed: see [`observe_lock`].
    fn observed(
        lock: Arc<Self>,
        backend: &'static str,
        strategy: &'static str,
    ) -> Arc<dyn DistributedLock>;
}

impl ObservableLock for dyn DistributedLock {
    fn observed(
        lock: Arc<Self>,
        backend: &'static str,
        strategy: &'static str,
    ) -> Arc<dyn DistributedLock> {
        let observer = Observer::new(backend, strategy, "mutex", lock.name());
        Observed::new(lock, observer)
    }
}

impl<T: MutexAttempt + 'static> ObservableLock for T {
    fn observed(
        lock: Arc<Self>,
        backend: &'static str,
        strategy: &'static str,
    ) -> Arc<dyn DistributedLock> {
        let observer = Observer::new(backend, strategy, "mutex", MutexAttempt::name(&*lock));
        Observed::new(lock, observer)
    }
}

/// An observed lock's try (`$try`) and wait (`$wait`): the backend's, through `$observer`.
/// Written out as `async_trait` expands them, without `async`, so that an acquisition that
/// nothing takes note of returns the backend's own future.
macro_rules! observed {
    ($try:ident, $wait:ident, $observer:ident) => {
        fn $try<'life0, 'async_trait>(&'life0 self) -> Boxed<'async_trait, Option<Guard>>
        where
            'life0: 'async_trait,
            Self: 'async_trait,
        {
            self.$observer
                .observe(self.inner.name(), Call::TryAcquire, self.inner.$try())
        }

        fn $wait<'life0, 'async_trait>(
            &'life0 self,
            timeout: Option<Duration>,
        ) -> Boxed<'async_trait, Guard>
        where
            'life0: 'async_trait,
            Self: 'async_trait,
        {
            self.$observer
                .observe(self.inner.name(), Call::Acquire, self.inner.$wait(timeout))
        }
    };
}

#[async_trait]
impl DistributedLock for Observed<dyn DistributedLock> {
    fn name(&self) -> &LockName {
        self.inner.name()
    }

    observed!(try_acquire, acquire, observer);

    async fn queue(&self) -> Result<LockQueue, LockError> {
        self.inner.queue().await
    }
}

/// A kit lock observed at its attempt: as the kit derives [`DistributedLock`] (see
/// [`MutexAttempt`]), with the observation in the same future.
#[async_trait]
impl<T: MutexAttempt + 'static> DistributedLock for Observed<T> {
    fn name(&self) -> &LockName {
        MutexAttempt::name(&*self.inner)
    }

    fn try_acquire<'life0, 'async_trait>(&'life0 self) -> Boxed<'async_trait, Option<Guard>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let attempt = self.inner.attempt(Deadline::after(Some(Duration::ZERO)));
        self.observer
            .observe(DistributedLock::name(self), Call::TryAcquire, attempt)
    }

    fn acquire<'life0, 'async_trait>(
        &'life0 self,
        timeout: Option<Duration>,
    ) -> Boxed<'async_trait, Guard>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let attempt = self.inner.attempt(Deadline::after(timeout));
        let answer = crate::kit::granted_or_timed_out(&*self.inner, timeout);
        let name = DistributedLock::name(self);
        self.observer
            .observe_attempt(name, Call::Acquire, attempt, answer)
    }

    async fn queue(&self) -> Result<LockQueue, LockError> {
        MutexAttempt::queue(&*self.inner).await
    }
}

/// A backend's read-write lock with both sides observed: see [`observe_rw_lock`].
#[derive(Debug)]
struct ObservedRw {
    inner: Arc<dyn DistributedRwLock>,
    read: Observer,
    write: Observer,
}

/// `lock` observed as [`observe_lock`] observes a mutex, its sides labelled with the kinds
/// `read` and `write`: what a backend's
/// [`LockProvider::rw_lock`](crate::LockProvider::rw_lock) hands out.
///
/// ```
/// use std::sync::Arc;
/// use lock_core::DistributedRwLock;
///
/// fn hand_out(lock: Arc<dyn DistributedRwLock>) -> Arc<dyn DistributedRwLock> {
///     lock_core::observe::observe_rw_lock(lock, "my-backend", "queue")
/// }
/// ```
pub fn observe_rw_lock(
    lock: Arc<dyn DistributedRwLock>,
    backend: &'static str,
    strategy: &'static str,
) -> Arc<dyn DistributedRwLock> {
    let read = Observer::new(backend, strategy, "read", lock.name());
    let write = Observer::new(backend, strategy, "write", lock.name());
    Arc::new(ObservedRw {
        inner: lock,
        read,
        write,
    })
}

#[async_trait]
impl DistributedRwLock for ObservedRw {
    fn name(&self) -> &LockName {
        self.inner.name()
    }

    observed!(try_read, read, read);
    observed!(try_write, write, write);
}

/// `semaphore` observed as [`observe_lock`] observes a mutex, each permit labelled with the
/// kind `permit`: what a backend's
/// [`LockProvider::semaphore`](crate::LockProvider::semaphore) hands out.
///
/// ```
/// use std::sync::Arc;
/// use lock_core::DistributedSemaphore;
///
/// fn hand_out(semaphore: Arc<dyn DistributedSemaphore>) -> Arc<dyn DistributedSemaphore> {
///     lock_core::observe::observe_semaphore(semaphore, "my-backend", "queue")
/// }
/// ```
pub fn observe_semaphore(
    semaphore: Arc<dyn DistributedSemaphore>,
    backend: &'static str,
    strategy: &'static str,
) -> Arc<dyn DistributedSemaphore> {
    let observer = Observer::new(backend, strategy, "permit", semaphore.name());
    Observed::new(semaphore, observer)
}

#[async_trait]
impl DistributedSemaphore for Observed<dyn DistributedSemaphore> {
    fn name(&self) -> &LockName {
        self.inner.name()
    }

    fn permits(&self) -> u32 {
        self.inner.permits()
    }

    observed!(try_acquire, acquire, observer);
}

/// `election` with each campaign observed as [`observe_lock`] observes an `acquire` (the
/// wait for leadership, the term held), labelled with the kind `election`: what a
/// backend's [`LockProvider::election`](crate::LockProvider::election) hands out.
///
/// ```
/// use std::sync::Arc;
/// use lock_core::Election;
///
/// fn hand_out(election: Arc<dyn Election>) -> Arc<dyn Election> {
///     lock_core::observe::observe_election(election, "my-backend", "queue")
/// }
/// ```
pub fn observe_election(
    election: Arc<dyn Election>,
    backend: &'static str,
    strategy: &'static str,
) -> Arc<dyn Election> {
    let observer = Observer::new(backend, strategy, "election", election.name());
    Observed::new(election, observer)
}

#[async_trait]
impl Election for Observed<dyn Election> {
    fn name(&self) -> &LockName {
        self.inner.name()
    }

    fn campaign<'life0, 'life1, 'async_trait>(
        &'life0 self,
        value: &'life1 [u8],
        timeout: Option<Duration>,
    ) -> Boxed<'async_trait, Leadership>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        let campaign = self.inner.campaign(value, timeout);
        self.observer
            .observe(self.inner.name(), Call::Acquire, campaign)
    }

    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        self.inner.leader().await
    }

    async fn observe(self: Arc<Self>) -> Result<LeaderWatch, LockError> {
        Arc::clone(&self.inner).observe().await
    }
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;
    use crate::lost_signal;

    /// A catalog's keys are in the order of the series' slots.
    #[test]
    fn every_series_has_its_own_slot_in_order() {
        let slots: Vec<usize> = Series::all().map(Series::slot).collect();
        assert_eq!(slots, (0..slots.len()).collect::<Vec<_>>());
        assert_eq!(slots.len(), 2 * PER_CALL + 2 + ENDS.len() + REASONS.len());
    }

    /// A loss is counted once, whether it fires before or after the guard learns where to
    /// count it.
    #[test]
    fn a_loss_is_counted_once_whenever_it_fires() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let name = LockName::new("counted").expect("a valid name");
            let recording = || Recording::new("test", "none", "mutex", &name);
            let (early, early_signal) = lost_signal();
            early.fire(LossReason::Revoked);
            early_signal.count_loss_with(recording());
            early.fire(LossReason::Revoked);
            let (late, late_signal) = lost_signal();
            late_signal.count_loss_with(recording());
            late.fire(LossReason::LeaseExpired);
            late_signal.mark_lost(LossReason::LeaseExpired);
        });
        let losses: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == LOSSES)
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Counter(count) => {
                    let reason = key.key().labels().find(|l| l.key() == "reason")?;
                    Some((reason.value().to_owned(), count))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            losses.iter().map(|(_, count)| count).sum::<u64>(),
            2,
            "{losses:?}"
        );
        assert!(losses.contains(&("revoked".to_owned(), 1)), "{losses:?}");
        assert!(
            losses.contains(&("lease_expired".to_owned(), 1)),
            "{losses:?}"
        );
    }
}
