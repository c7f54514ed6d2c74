//! What one run of the herd scenario measured.

use serde::{Deserialize, Serialize};

/// The figures of one (strategy, contenders) run: one object of the JSON array.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Measurement {
    /// The strategy's name, e.g. `zk-predecessor`.
    pub strategy: String,
    /// `zookeeper` or `redis`.
    pub backend: String,
    /// Contenders, each its own client (session or connection).
    pub contenders: usize,
    /// Handoffs measured: grants after the first.
    pub handoffs: u64,
    /// Grants per second over the run.
    pub throughput_per_s: f64,
    /// Median time from a release to the next grant, in microseconds.
    pub handoff_p50_us: f64,
    /// 99th percentile of the same.
    pub handoff_p99_us: f64,
    /// Median of the floor, the same chain of raw client operations without lock logic
    /// (ZooKeeper: delete → watch event → list children; Redis: as the physical floor),
    /// measured next to the run, in microseconds.
    pub floor_p50_us: f64,
    /// `handoff_p50_us / floor_p50_us`.
    pub handoff_to_floor: f64,
    /// Median of the physical floor, what must happen between a release and the next grant
    /// on warmed connections (ZooKeeper: delete → the watch event on that node; Redis: a
    /// script that pushes onto a list → the blocked pop of another connection returns),
    /// measured next to the run, in microseconds.
    pub physical_floor_p50_us: f64,
    /// `handoff_p50_us / physical_floor_p50_us`.
    pub handoff_to_physical_floor: f64,
    /// Median time a holder held the lock (from its grant to its release), in microseconds:
    /// what throughput is compared at.
    pub hold_p50_us: f64,
    /// Wake-ups the contenders counted, per handoff; `None` where the client keeps no count
    /// (the peer recipe).
    pub wakeups_per_handoff: Option<f64>,
    /// Wake-ups that did not end in a grant, per handoff.
    pub futile_wakeups_per_handoff: Option<f64>,
    /// Requests the server handled, per handoff (ZooKeeper `mntr` packets received;
    /// Redis `INFO commandstats` calls).
    pub server_requests_per_handoff: Option<f64>,
    /// Fewest grants one contender got.
    pub min_grants: u64,
    /// Most grants one contender got.
    pub max_grants: u64,
    /// Grants that went to a contender while another had been waiting longer (by more than
    /// [`FIFO_TOLERANCE`](crate::scenario::FIFO_TOLERANCE)).
    pub fifo_violations: u64,
    /// Wall time of the measured part of the run, in seconds.
    pub elapsed_s: f64,
}

impl Measurement {
    /// An all-zero measurement of `strategy` on `backend` with `contenders`, for building
    /// one field by field.
    pub fn new(strategy: &str, backend: &str, contenders: usize) -> Self {
        Measurement {
            strategy: strategy.to_owned(),
            backend: backend.to_owned(),
            contenders,
            handoffs: 0,
            throughput_per_s: 0.0,
            handoff_p50_us: 0.0,
            handoff_p99_us: 0.0,
            floor_p50_us: 0.0,
            handoff_to_floor: 0.0,
            physical_floor_p50_us: 0.0,
            handoff_to_physical_floor: 0.0,
            hold_p50_us: 0.0,
            wakeups_per_handoff: None,
            futile_wakeups_per_handoff: None,
            server_requests_per_handoff: None,
            min_grants: 0,
            max_grants: 0,
            fifo_violations: 0,
            elapsed_s: 0.0,
        }
    }
}

/// What a scale run (one provider holding many locks) measured. It reads back from its
/// JSON: `herd` runs each scale run in a fresh process of its own and gathers their
/// figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ScaleMeasurement {
    /// `zookeeper` or `redis`, and the strategy.
    pub strategy: String,
    /// Locks held at once.
    pub locks: usize,
    /// Acquisitions per second while taking them all.
    pub acquire_per_s: f64,
    /// Releases per second while letting them all go.
    pub release_per_s: f64,
    /// Client resident memory growth per held lock, in bytes, measured on a second round:
    /// what holding costs once the allocator has served the acquisitions in flight.
    pub rss_bytes_per_lock: f64,
    /// The same over the first round, from a fresh process: an upper bound that includes
    /// what the allocator keeps from the acquisitions in flight.
    pub rss_bytes_per_lock_first_round: f64,
    /// The server's own memory growth per held lock, in bytes, where the server reports
    /// its memory: ZooKeeper's data tree (`mntr`'s `zk_approximate_data_size`), etcd's heap
    /// in use (`go_memstats_heap_inuse_bytes` of its metrics), Redis's `used_memory`
    /// (every server of a cluster). `None` for PostgreSQL, whose lock table has a fixed
    /// size in shared memory.
    pub server_bytes_per_lock: Option<f64>,
    /// Nodes or keys of the locks left on the server afterwards (must be 0).
    pub leftovers: u64,
    /// Milliseconds from closing the provider, every lock held again, until the lost
    /// signal of the last of them fired (every one must fire).
    #[serde(default)]
    pub all_lost_ms: f64,
    /// Milliseconds from the server's end of a fresh client's session, every lock held,
    /// until the last lost signal fired: ZooKeeper's session closed, etcd's lease revoked,
    /// PostgreSQL's connections terminated. `None` where the server keeps no session
    /// (Redis's locks are leases).
    #[serde(default)]
    pub server_end_lost_ms: Option<f64>,
    /// Milliseconds the server itself took to end that session: from the request until
    /// the server said it was over (ZooKeeper: a takeover found the session expired; etcd:
    /// the revoke answered; PostgreSQL: the terminations answered). A lost signal cannot
    /// fire much before; what [`server_end_lost_ms`](Self::server_end_lost_ms) adds to it
    /// is the client's.
    #[serde(default)]
    pub server_end_ms: Option<f64>,
    /// The requests that client sent from the session's end until its last lost signal:
    /// a question per lock would be a herd.
    #[serde(default)]
    pub server_end_requests: Option<u64>,
}
