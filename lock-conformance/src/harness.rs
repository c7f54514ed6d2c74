//! What a backend gives the suite: clients whose sessions it can end, timing, and optionally
//! more faults and introspection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{LockError, LockProvider};

/// How a backend plugs into the suite.
///
/// Only [`client`](Harness::client) is required: a provider, and a way to end its session
/// ([`SessionExpiry`]), with which the cases make a stale holder. Everything else has a
/// default: generous [`Timing`], no further faults, no introspection. A case that needs what
/// the harness does not offer is skipped with the reason (see [`Outcome`](crate::Outcome)).
///
/// Each call of `client` stands for a separate process: a new provider with its own
/// session or connections, never a clone of an earlier one.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A new, independent client of the backend under test.
    async fn client(&self) -> Result<Client, LockError>;

    /// The time bounds the cases hold the backend to.
    fn timing(&self) -> Timing {
        Timing::default()
    }

    /// Server-side fault injection, if the harness offers any.
    fn faults(&self) -> Option<&dyn Faults> {
        None
    }

    /// A look at the server's record of a lock, for leak checks. Without one the cases
    /// cannot check what they leave on the server: such a case passes on the rest "with
    /// checks not made", which its test prints and the verdict counts, and fails under
    /// `LOCK_CONFORMANCE_STRICT=1`.
    fn inspector(&self) -> Option<&dyn Inspector> {
        None
    }

    /// A new client whose locks live in another namespace (another ZooKeeper root, Redis
    /// key prefix, …): it must never see the locks of [`client`](Harness::client)'s clients.
    async fn client_in_other_namespace(&self) -> Option<Result<Client, LockError>> {
        None
    }

    /// The properties of declared capabilities that this harness cannot prove, each with
    /// why (see [`Property`]). Without a declaration, a case that cannot prove a property of
    /// a declared capability for lack of a hook fails under `LOCK_CONFORMANCE_STRICT=1`;
    /// with one, it is reported as "not proven (declared by the harness)", never as passed.
    /// Offer the hook instead wherever the server allows it.
    fn unproven(&self) -> Vec<Unproven> {
        Vec::new()
    }
}

/// A property of a declared capability that only a fault hook can show. A backend that
/// declares the capability has to prove each of its properties, or its harness says in
/// [`Harness::unproven`] which one it cannot prove and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Property {
    /// D4, of lost detection: a holder's lost signal fires while the server does not answer
    /// (by its `valid_until`, where it has one). Needs [`Faults::pause_server`].
    LossOnServerPause,
    /// E4, of monotonic fencing: tokens keep increasing across a restart of the server or a
    /// failover. Needs [`Faults::restart_server`] or [`Faults::kill_leader`].
    TokensSurviveRestart,
    /// F3, of leases: an acquire slower than the lease never returns an expired guard.
    /// Needs [`ClientFaults::delay_connection`].
    NoExpiredGrant,
}

impl Property {
    /// The capability the property belongs to, as the verdict names it.
    pub fn capability(self) -> &'static str {
        match self {
            Property::LossOnServerPause => "lost_detection",
            Property::TokensSurviveRestart => "monotonic fencing",
            Property::NoExpiredGrant => "leases",
        }
    }

    /// The hooks that can prove it, as the verdict names them.
    pub fn hooks(self) -> &'static str {
        match self {
            Property::LossOnServerPause => "pause_server",
            Property::TokensSurviveRestart => "restart_server or kill_leader",
            Property::NoExpiredGrant => "delay_connection",
        }
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Property::LossOnServerPause => "loss while the server does not answer",
            Property::TokensSurviveRestart => "tokens that survive a restart",
            Property::NoExpiredGrant => "no expired grant",
        })
    }
}

/// A property the harness declares it cannot prove, and why: see [`Harness::unproven`].
///
/// ```
/// use lock_conformance::{Property, Unproven};
///
/// let unproven = Unproven::new(
///     Property::TokensSurviveRestart,
///     "the server is shared by the cases that run side by side; the cluster harness restarts its own",
/// );
/// assert_eq!(unproven.property, Property::TokensSurviveRestart);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unproven {
    /// The property not proven.
    pub property: Property,
    /// Why the harness cannot prove it, printed with the verdict.
    pub why: String,
}

impl Unproven {
    /// `property`, not proven because of `why`.
    pub fn new(property: Property, why: impl Into<String>) -> Self {
        Unproven {
            property,
            why: why.into(),
        }
    }
}

/// One client of the backend: a provider, the way to end its session, and the faults that
/// act on this client alone.
#[derive(Clone)]
pub struct Client {
    /// The provider, standing for one process.
    pub provider: Arc<dyn LockProvider>,
    /// Ends this client's session behind its back: how the cases make a stale holder.
    pub session: Arc<dyn SessionExpiry>,
    /// Faults on this client's connection, if the harness offers any.
    pub faults: Option<Arc<dyn ClientFaults>>,
}

impl Client {
    /// A client whose session `session` ends, without further fault hooks.
    pub fn new(provider: Arc<dyn LockProvider>, session: Arc<dyn SessionExpiry>) -> Self {
        Client {
            provider,
            session,
            faults: None,
        }
    }

    /// Adds fault hooks for this client.
    pub fn with_faults(mut self, faults: Arc<dyn ClientFaults>) -> Self {
        self.faults = Some(faults);
        self
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("provider", &self.provider)
            .field("faults", &self.faults.is_some())
            .finish()
    }
}

/// The time bounds of a backend: every wait in a case is derived from these, never from a
/// constant in the case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timing {
    /// How long a single operation (a try, a release, one round trip) may take, and how
    /// late a timeout may fire after its deadline.
    pub operation_slack: Duration,
    /// From a release to the next waiter's grant.
    pub handoff_bound: Duration,
    /// From a revoke or expiry to the holder's lost signal.
    pub loss_bound: Duration,
    /// From a client's death to the lock being free for others: what the cases wait for.
    /// It must be at least the provider's declared
    /// [`Capabilities::crash_release_bound`](lock_core::Capabilities::crash_release_bound)
    /// (the backend's promise; add slack for the machine): the crash-release cases fail a
    /// harness whose bound is shorter, naming both.
    pub crash_release_bound: Duration,
    /// The timeout the timeout cases wait for; long enough to measure, short enough to run
    /// many times.
    pub short_timeout: Duration,
}

impl Default for Timing {
    /// Bounds for a server on the same machine with some load: slack 1 s, handoff 2 s,
    /// loss 10 s, crash release 30 s, short timeout 300 ms.
    fn default() -> Self {
        Timing {
            operation_slack: Duration::from_secs(1),
            handoff_bound: Duration::from_secs(2),
            loss_bound: Duration::from_secs(10),
            crash_release_bound: Duration::from_secs(30),
            short_timeout: Duration::from_millis(300),
        }
    }
}

impl Timing {
    /// Sets [`operation_slack`](Timing::operation_slack).
    pub fn with_operation_slack(mut self, slack: Duration) -> Self {
        self.operation_slack = slack;
        self
    }

    /// Sets [`handoff_bound`](Timing::handoff_bound).
    pub fn with_handoff_bound(mut self, bound: Duration) -> Self {
        self.handoff_bound = bound;
        self
    }

    /// Sets [`loss_bound`](Timing::loss_bound).
    pub fn with_loss_bound(mut self, bound: Duration) -> Self {
        self.loss_bound = bound;
        self
    }

    /// Sets [`crash_release_bound`](Timing::crash_release_bound).
    pub fn with_crash_release_bound(mut self, bound: Duration) -> Self {
        self.crash_release_bound = bound;
        self
    }

    /// Sets [`short_timeout`](Timing::short_timeout).
    pub fn with_short_timeout(mut self, timeout: Duration) -> Self {
        self.short_timeout = timeout;
        self
    }
}

/// Why a fault could not be injected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FaultError {
    /// The harness does not offer this fault; the case is skipped.
    #[error("the harness does not offer this fault")]
    Unsupported,
    /// The fault was attempted and failed; the case fails.
    #[error("fault injection failed: {0}")]
    Failed(String),
}

/// The result of a fault hook.
pub type FaultResult<T = ()> = Result<T, FaultError>;

/// Server-side faults. Every method defaults to [`FaultError::Unsupported`].
#[async_trait]
pub trait Faults: Send + Sync {
    /// Takes the lock `name` away from its holder, as an operator deleting the holder's node
    /// or key would. Returns whether there was a holder.
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        let _ = name;
        Err(FaultError::Unsupported)
    }

    /// Deletes the entry of the first waiter of `name` (not the holder), as a foreign
    /// client or an operator might.
    async fn delete_first_waiter(&self, name: &str) -> FaultResult {
        let _ = name;
        Err(FaultError::Unsupported)
    }

    /// Stops the server answering (SIGSTOP) for `duration`, then lets it go on (SIGCONT).
    async fn pause_server(&self, duration: Duration) -> FaultResult {
        let _ = duration;
        Err(FaultError::Unsupported)
    }

    /// Restarts the server (or the whole ensemble) and waits until it serves again.
    async fn restart_server(&self) -> FaultResult {
        Err(FaultError::Unsupported)
    }

    /// Kills the ensemble's leader and waits for a new one.
    async fn kill_leader(&self) -> FaultResult {
        Err(FaultError::Unsupported)
    }

    /// A provider pointed at an address where no server listens. Constructing it may itself
    /// fail: the case accepts that as the connection error it is looking for.
    async fn unreachable_provider(&self) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        Err(FaultError::Unsupported)
    }

    /// A provider with wrong credentials. Constructing it may itself fail with an auth error.
    async fn wrong_credentials_provider(
        &self,
    ) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        Err(FaultError::Unsupported)
    }
}

/// The one fault every harness offers: ending a client's session behind its back.
///
/// Every backend can lose a client abruptly — a process dies, a partition outlasts the
/// session or lease — and the safety cases need that to make a stale holder: a client that
/// still has its [`Guard`](lock_core::Guard) while the lock is free for others. With it C3
/// (conditional release), E2 and E3 (fencing), B8 (a waiter whose session ends), and for
/// backends that declare lost detection D1, D2 and J3 (the lost signal) run against every
/// backend.
///
/// How, by the kind of backend:
/// - a server session (ZooKeeper): have the server expire it, e.g. by cutting the client's
///   connection through a fault proxy (e.g. `lock_testbed::proxy::FaultProxy`) for longer
///   than the session timeout;
/// - a lease (Redis): cut the connection for longer than the lease, so that the key expires,
///   and than a waiter's place in the queue, if the backend keeps one; the client's waiters
///   must then fail rather than win later (B8), so a lease backend treats a cut that long as
///   the end of its session (with the kit, it closes its [`Closed`](lock_core::kit::Closed));
/// - a lock owned by an open handle or connection (a file lock, a database session lock):
///   close that handle or connection behind the provider's back, as the operating system or
///   the server does when the process dies.
///
/// The provider has to find out as it would in production. An in-process backend may offer
/// a hook that stands for the crash (the memory backend's
/// [`expire_session`](lock_core::memory::MemoryLockProvider::expire_session)), as long as the
/// hook does not tell the guards: their lost signals fire only if the backend would notice
/// the loss in production (its declared lost detection).
#[async_trait]
pub trait SessionExpiry: Send + Sync {
    /// Ends the client's session on the server side, and returns once the server has freed
    /// the client's locks or will free them within the harness's
    /// [`crash_release_bound`](Timing::crash_release_bound). An error fails the case:
    /// [`FaultError::Unsupported`] is not an answer here.
    async fn expire_session(&self) -> FaultResult;
}

/// Faults on one client's connection. Every method defaults to
/// [`FaultError::Unsupported`].
#[async_trait]
pub trait ClientFaults: Send + Sync {
    /// Cuts the client's connections and refuses new ones until [`restore`](ClientFaults::restore).
    async fn cut_connection(&self) -> FaultResult {
        Err(FaultError::Unsupported)
    }

    /// Lets the client connect again after a cut.
    async fn restore(&self) -> FaultResult {
        Err(FaultError::Unsupported)
    }

    /// Adds `latency` to every exchange of the client with the server, until
    /// [`restore`](ClientFaults::restore).
    async fn delay_connection(&self, latency: Duration) -> FaultResult {
        let _ = latency;
        Err(FaultError::Unsupported)
    }

    /// Makes the server's reply to the client's next create request go missing (the server
    /// acts on it; the client sees a connection loss).
    async fn lose_next_create_reply(&self) -> FaultResult {
        Err(FaultError::Unsupported)
    }
}

/// What the server records for one lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entries {
    /// Holders recorded (0 or 1 for a mutex).
    pub holders: usize,
    /// Waiters queued.
    pub waiters: usize,
}

impl Entries {
    /// An entry count.
    pub fn new(holders: usize, waiters: usize) -> Self {
        Entries { holders, waiters }
    }

    /// Holders and waiters together.
    pub fn total(&self) -> usize {
        self.holders + self.waiters
    }
}

/// The kinds of lock a backend may offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// [`LockProvider::lock`](lock_core::LockProvider::lock).
    Mutex,
    /// [`LockProvider::rw_lock`](lock_core::LockProvider::rw_lock).
    ReadWrite,
    /// [`LockProvider::semaphore`](lock_core::LockProvider::semaphore).
    Semaphore,
    /// [`LockProvider::election`](lock_core::LockProvider::election).
    Election,
}

/// Looks at the server's records, for residue checks.
#[async_trait]
pub trait Inspector: Send + Sync {
    /// The holder and waiter entries the server keeps for `name`, of every kind of lock and
    /// the election of that name (ZooKeeper: children of the lock directory; Redis: owner
    /// key and queue; memory: the lock's state). An election's leader is a holder, its
    /// other candidates waiters. A lease whose time has run out on the server is no holder,
    /// even where its record stays until someone cleans it up: report it only while it is
    /// still valid.
    async fn entries(&self, name: &str) -> Result<Entries, LockError>;

    /// Whether waiters of `kind` leave entries on the server. A backend whose waiters only
    /// watch (ZooKeeper's single-node mutex) or poll keeps none: its
    /// [`entries`](Inspector::entries) report zero waiters, and the cases wait the operation
    /// slack where they would wait for a waiter to be queued.
    fn records_waiters(&self, kind: LockKind) -> bool {
        let _ = kind;
        true
    }
}
