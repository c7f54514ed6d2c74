//! Counters for the herd measurements.

use std::sync::atomic::{AtomicU64, Ordering};

/// A provider's counters, updated by the backend as it works.
///
/// Part of the backend SPI: a backend keeps one per provider and returns
/// [`snapshot`](Metrics::snapshot) from [`LockProvider::metrics`](crate::LockProvider::metrics).
/// Updates are relaxed atomic increments, cheap enough for the hot path.
///
/// ```
/// use lock_core::Metrics;
/// let metrics = Metrics::new();
/// metrics.record_wakeup();
/// metrics.record_futile_wakeup();
/// metrics.record_server_requests(3);
/// let snap = metrics.snapshot();
/// assert_eq!((snap.wakeups, snap.futile_wakeups, snap.server_requests), (1, 1, 3));
/// ```
#[derive(Debug, Default)]
pub struct Metrics {
    wakeups: AtomicU64,
    futile_wakeups: AtomicU64,
    server_requests: AtomicU64,
    grants: AtomicU64,
}

impl Metrics {
    /// All counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A waiter was woken: by a watch event, a pub/sub message or a handoff, or, for a
    /// polling backend ([`WaitKind::Poll`](crate::WaitKind::Poll)), by its own clock for
    /// another attempt.
    pub fn record_wakeup(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
    }

    /// A wake-up that did not end in a grant (the waiter went back to waiting). Record it in
    /// addition to [`record_wakeup`](Metrics::record_wakeup).
    pub fn record_futile_wakeup(&self) {
        self.futile_wakeups.fetch_add(1, Ordering::Relaxed);
    }

    /// `count` round trips to the server.
    pub fn record_server_requests(&self, count: u64) {
        self.server_requests.fetch_add(count, Ordering::Relaxed);
    }

    /// A lock was granted to a caller of this provider.
    pub fn record_grant(&self) {
        self.grants.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            wakeups: self.wakeups.load(Ordering::Relaxed),
            futile_wakeups: self.futile_wakeups.load(Ordering::Relaxed),
            server_requests: self.server_requests.load(Ordering::Relaxed),
            grants: self.grants.load(Ordering::Relaxed),
        }
    }
}

/// A provider's counters at one moment; see [`LockProvider::metrics`](crate::LockProvider::metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Wake-ups delivered to this provider's waiters (watch events, pub/sub messages,
    /// handoffs, poll attempts).
    pub wakeups: u64,
    /// Wake-ups that did not end in a grant.
    pub futile_wakeups: u64,
    /// Round trips to the server.
    pub server_requests: u64,
    /// Locks granted to this provider's callers.
    pub grants: u64,
}

impl MetricsSnapshot {
    /// What happened between `earlier` and `self`.
    ///
    /// ```
    /// # use lock_core::Metrics;
    /// let metrics = Metrics::new();
    /// let before = metrics.snapshot();
    /// metrics.record_grant();
    /// assert_eq!(metrics.snapshot().since(&before).grants, 1);
    /// ```
    pub fn since(&self, earlier: &MetricsSnapshot) -> MetricsSnapshot {
        MetricsSnapshot {
            wakeups: self.wakeups.saturating_sub(earlier.wakeups),
            futile_wakeups: self.futile_wakeups.saturating_sub(earlier.futile_wakeups),
            server_requests: self.server_requests.saturating_sub(earlier.server_requests),
            grants: self.grants.saturating_sub(earlier.grants),
        }
    }

    /// The sum of two snapshots, e.g. over all clients of a benchmark.
    pub fn plus(&self, other: &MetricsSnapshot) -> MetricsSnapshot {
        MetricsSnapshot {
            wakeups: self.wakeups + other.wakeups,
            futile_wakeups: self.futile_wakeups + other.futile_wakeups,
            server_requests: self.server_requests + other.server_requests,
            grants: self.grants + other.grants,
        }
    }
}
