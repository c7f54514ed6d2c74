//! What a provider can promise, so that callers and the conformance suite can rely on it.

use std::time::Duration;

/// How strong a backend's [fencing tokens](crate::FencingToken) are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// No tokens worth using (every guard reports the same token).
    None,
    /// Tokens increase in normal operation but a failover or restart can roll them back
    /// (Redis).
    BestEffort,
    /// Tokens strictly increase across all holders of one name, across restarts and
    /// failovers (ZooKeeper's zxid, the in-memory server's counter).
    Monotonic,
}

/// How waiters learn that a lock may be free, which decides the herd cost of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitKind {
    /// A release wakes exactly one waiter, the next in line (herd-free).
    NotifyOne,
    /// A release wakes every waiter, and all but one go back to waiting (herd).
    NotifyAll,
    /// Waiters poll: a release wakes nobody, and each waiter tries again on its own clock.
    ///
    /// Count every retry as a wake-up ([`Metrics::record_wakeup`](crate::Metrics::record_wakeup))
    /// and every retry that finds the lock held as a futile one: the herd measurements
    /// compare these counts, and the conformance suite's cancellation case (B6) takes a
    /// polling waiter to have settled in its wait once its provider has counted two
    /// retries (or once it stays silent for the harness's operation slack). A waiter that
    /// retries faster without counting never settles there and fails the case.
    Poll,
}

/// What a [`LockProvider`](crate::LockProvider) declares about itself.
///
/// Built with [`Capabilities::new`] and the `with_*` methods, so that the struct can grow
/// without breaking backends:
///
/// ```
/// use std::time::Duration;
/// use lock_core::{Capabilities, Fencing, WaitKind};
///
/// let caps = Capabilities::new(WaitKind::NotifyOne)
///     .with_fencing(Fencing::Monotonic)
///     .with_lost_detection(true)
///     .with_fifo(true)
///     .with_crash_release_bound(Some(Duration::from_secs(10)));
/// assert!(caps.fifo);
/// assert!(!caps.semaphore);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Strength of the fencing tokens.
    pub fencing: Fencing,
    /// Whether the [lost signal](crate::LostSignal) fires for a loss that is not the
    /// holder's own doing: the session expired, the lease lapsed, the node or key was
    /// removed by someone else, the connection was down for longer than the session
    /// allows. Without it such losses go unnoticed, and callers must rely on fencing or
    /// timeouts. Either way, closing the provider (dropping its last handle) fires its
    /// guards' signals: that loss is the holder's own doing, and every backend knows of it.
    pub lost_detection: bool,
    /// Whether waiters are granted the lock in the order they started waiting.
    pub fifo: bool,
    /// How waiters are woken.
    pub wait: WaitKind,
    /// Whether the provider offers read-write locks.
    pub reader_writer: bool,
    /// Whether the provider offers counting semaphores.
    pub semaphore: bool,
    /// Whether the provider offers [leader elections](crate::Election).
    pub elections: bool,
    /// Whether guards hold a lease with a [`valid_until`](crate::Guard::valid_until) deadline.
    /// A lease backend declares its lease length as
    /// [`crash_release_bound`](Capabilities::crash_release_bound) (a crashed holder's lease
    /// runs out within it): the conformance suite's lease cases take the length from there.
    pub leases: bool,
    /// How long after a holder dies (process killed, connection gone) the lock is free again
    /// at the latest: the session timeout or the lease TTL. `None` when unbounded or unknown.
    /// The backend's promise; a conformance harness waits for its own bound, which must be
    /// at least this.
    pub crash_release_bound: Option<Duration>,
}

impl Capabilities {
    /// The weakest set of capabilities with the given wait kind: no fencing, no loss
    /// detection, no FIFO, no read-write, no semaphore, no elections, no leases, no crash-release bound.
    pub fn new(wait: WaitKind) -> Self {
        Capabilities {
            fencing: Fencing::None,
            lost_detection: false,
            fifo: false,
            wait,
            reader_writer: false,
            semaphore: false,
            elections: false,
            leases: false,
            crash_release_bound: None,
        }
    }

    /// Sets [`fencing`](Capabilities::fencing).
    pub fn with_fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// Sets [`lost_detection`](Capabilities::lost_detection).
    pub fn with_lost_detection(mut self, lost_detection: bool) -> Self {
        self.lost_detection = lost_detection;
        self
    }

    /// Sets [`fifo`](Capabilities::fifo).
    pub fn with_fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// Sets [`reader_writer`](Capabilities::reader_writer).
    pub fn with_reader_writer(mut self, reader_writer: bool) -> Self {
        self.reader_writer = reader_writer;
        self
    }

    /// Sets [`semaphore`](Capabilities::semaphore).
    pub fn with_semaphore(mut self, semaphore: bool) -> Self {
        self.semaphore = semaphore;
        self
    }

    /// Sets [`elections`](Capabilities::elections).
    pub fn with_elections(mut self, elections: bool) -> Self {
        self.elections = elections;
        self
    }

    /// Sets [`leases`](Capabilities::leases).
    pub fn with_leases(mut self, leases: bool) -> Self {
        self.leases = leases;
        self
    }

    /// Sets [`crash_release_bound`](Capabilities::crash_release_bound).
    pub fn with_crash_release_bound(mut self, bound: Option<Duration>) -> Self {
        self.crash_release_bound = bound;
        self
    }
}
