//! The ZooKeeper backend of distlock: the correctness-grade backend.
//!
//! ZooKeeper locks are built from ephemeral nodes, so a crashed client's locks are freed when
//! its session expires, and every grant carries a monotonic [fencing token](lock_core::FencingToken)
//! (the lock node's creation zxid). Three strategies are offered — the naive
//! [`SingleNode`](ZkStrategy::SingleNode) lock, the herd-prone
//! [`WholeQueue`](ZkStrategy::WholeQueue) recipe and the herd-free
//! [`SequentialPredecessor`](ZkStrategy::SequentialPredecessor) recipe (the default) — and
//! node names compatible with Curator or kazoo, so that those clients and distlock exclude
//! each other on one path: every child of a lock directory whose name ends in a sequence
//! number counts as a contender, ordered by that number.
//!
//! Besides the mutex, the provider hands out [read-write locks](ZkRwLock) (ZooKeeper's
//! shared-lock recipe, with Curator's `__READ__` / `__WRIT__` nodes) and
//! [semaphores](ZkSemaphore) (Curator's lease recipe). All three kinds share the session,
//! the protected create, the clean-up after cancels and timeouts, the lost signals and the
//! metrics; the mutex, the read-write lock and the semaphore called `N` are different
//! locks, in `{root}/N`, `{root}/N.rwlock` and `{root}/N.semaphore`. [Leader
//! elections](ZkElection) queue the same way in `{root}/N.election`, each candidate's node
//! holding its value and named as Curator's `LeaderLatch` names it; a candidate always
//! watches only its predecessor.
//!
//! ```no_run
//! use lock_core::LockProvider;
//! use lock_zookeeper::ZkLockProvider;
//!
//! # async fn demo() -> Result<(), lock_core::LockError> {
//! let locks = ZkLockProvider::connect_url("zk://127.0.0.1:2181/apps?session_timeout=6s").await?;
//! let mut guard = locks.lock("billing")?.acquire(None).await?;
//! // ... pass guard.fencing_token() with every write; watch guard.lost() ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Behaviour under faults
//!
//! - A create whose reply is lost is recovered by the uuid in the node's name: the node is
//!   adopted only if this session owns it.
//! - Dropping an `acquire` future, a timeout, or an error removes the contender's node, in
//!   the background if need be, retried until it succeeds or the session ends.
//! - While the connection is down, guards are [suspect](lock_core::Guard::is_suspect); once
//!   the negotiated session timeout has passed since the server last surely heard from the
//!   session (while the session holds guards, a light heartbeat, ten per session timeout,
//!   keeps that moment recent; waiters send none), or the session expires, or the guard's
//!   node is deleted by someone else, the guard's lost signal fires — never after the
//!   server could have expired the session and granted the lock to another client.
//! - A request whose answer does not come (the connection dropped, or the server stayed
//!   silent past the client's read timeout, two fifths of the session) is sent again once
//!   the client has connected again, as Curator's retry loop does, when it may safely
//!   arrive twice: reads and watches, the creates of directories, a release's delete. Only
//!   after the session timeout, or ten attempts, does the request fail (with a retryable
//!   `Connection` error).
//! - A release whose delete reply is lost is sent again and ends `Ok` when it finds the node
//!   gone — the delete was ours, as Curator's guaranteed delete assumes. A release that still
//!   fails (or whose future is dropped once the delete is sent) returns a retryable error;
//!   retried, it returns `Ok` when the node is gone, unless a loss was signalled before; the
//!   deletion does not fire the lost signal.
//! - A guard dropped without release sends its node's delete as it drops, so the delete goes
//!   ahead of the session's next request (a next acquisition of the same lock finds no node
//!   of its own ahead); only a delete whose outcome is unknown is retried in the background.
//! - A held guard never moves to a new session; the provider opens a new session only for
//!   new acquisitions.
//!
//! # Inside
//!
//! The modules are layers, each using only those before it: `node` (node names and order),
//! `tls` (the client's TLS options), `session` (the session, its heartbeat and the guards'
//! loss), `guard` (held nodes, and the clean-up of nodes nobody will use), `queue` (a lock's directory and its contenders'
//! nodes; `queue/turn.rs` is the wait for one's turn, the herd-free algorithm), then the
//! three kinds of lock (`lock`, `rwlock`, `semaphore`), the `election`, and the `provider`.
//!
//! # URL
//!
//! ```text
//! zk://[user:password@]host1:port1,host2:port2[/chroot]?session_timeout=10s&connect_timeout=5s
//!     &strategy=predecessor&root=/distlock&node_format=curator&acl=auto
//! zks://host1:2182,host2:2182?tls_ca=/etc/zk/ca.pem          # TLS to the secureClientPort
//! zks://host1:2182?tls_ca=/ca.pem&tls_cert=/app.crt&tls_key=/app.key   # mutual TLS
//! ```

mod config;
mod contenders;
mod election;
mod error;
mod guard;
mod lock;
mod node;
mod provider;
mod queue;
mod rwlock;
mod semaphore;
mod session;
mod tls;

pub use config::{AclPolicy, DigestAuth, NodeNameFormat, ZkConfig, ZkStrategy};
pub use contenders::Contender;
pub use election::ZkElection;
pub use lock::ZkLock;
pub use provider::ZkLockProvider;
pub use rwlock::ZkRwLock;
pub use semaphore::ZkSemaphore;
