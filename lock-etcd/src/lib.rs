//! The etcd backend of distlock: herd-free by revision, fenced by revision.
//!
//! A provider is an etcd session: one lease, kept alive at a third of its ttl, on which
//! every contender's key is written, so that a crashed client's locks are freed when its
//! lease ends. Contenders of a lock are ordered by their keys' create revisions — etcd's
//! one logical clock, which survives a leader's failover — and the holder's create revision
//! is its [fencing token](lock_core::FencingToken). Three strategies: the herd-free
//! [`Predecessor`](EtcdStrategy::Predecessor) (the default; the layout of etcd's own
//! `concurrency.Mutex`, so that `etcdctl lock` and distlock exclude each other), the herd
//! [`WholeQueue`](EtcdStrategy::WholeQueue), and the naive [`Single`](EtcdStrategy::Single). The
//! [read-write lock](EtcdRwLock) and the [semaphore](EtcdSemaphore) queue the same way, and
//! so does the [leader election](EtcdElection), in the layout of etcd's own
//! `concurrency.Election` (`etcdctl elect`), always herd-free.
//!
//! ```no_run
//! use lock_core::LockProvider;
//! use lock_etcd::EtcdLockProvider;
//!
//! # async fn demo() -> Result<(), lock_core::LockError> {
//! let locks = EtcdLockProvider::connect_url("etcd://127.0.0.1:2379?lease_ttl=10s").await?;
//! let mut guard = locks.lock("billing")?.acquire(None).await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Behaviour under faults
//!
//! - A create is a transaction that writes the key only if it is absent, and the key is
//!   named by the lease: a create sent twice makes one key. A create whose reply is lost
//!   is sent again (see below); when that cannot be, the attempt ends with a retryable
//!   error and its key is deleted in the background. A delete of a key whose create
//!   revision is known takes that key only.
//! - Dropping an `acquire` future, a timeout, or an error deletes the contender's key, in
//!   the background if need be, retried until it succeeds or the session ends.
//! - While keep-alives fail, guards are [suspect](lock_core::Guard::is_suspect); once the
//!   lease's ttl (less a tenth) has passed since the latest answered keep-alive was sent,
//!   or the server says the lease is gone, every guard's lost signal fires and waiters fail
//!   with `SessionExpired` — never after the server could have freed the keys. A guard's
//!   key deleted by someone else fires its signal too.
//! - A contender rides out a member's failure or a leader election: a create, a look at
//!   the queue or a watch whose answer is lost is sent again while the session lives, for
//!   at most the lease's ttl and never past the acquire's timeout (a `try_acquire` makes
//!   one attempt).
//! - New acquisitions after a session's end get a new session (a new lease).
//!
//! # Inside
//!
//! `session` (the lease, its keep-alive, the guards' loss), `watches` (the session's one
//! watch stream, shared by every wait, guard and observer; its watches never wait for the
//! server's 100 ms catch-up loop), `guard` (held keys, and the clean-up of keys nobody will
//! use), `queue` (the herd-free wait by create revision, under every lock kind), `lock` (the
//! mutex's three strategies), `rwlock`, `semaphore`, `election`, `provider`.
//!
//! # URL
//!
//! ```text
//! etcd://[user:password@]h1:2379,h2:2379[/prefix]?lease_ttl=10s&strategy=predecessor&timeout=5s
//! etcds://h1:2379?tls_ca=/etc/etcd/ca.pem    # TLS; without tls_ca, the system's authorities
//! ```

mod channel;
mod config;
mod contenders;
mod election;
mod error;
mod guard;
mod key_reads;
mod lock;
mod provider;
mod queue;
mod rwlock;
mod semaphore;
mod session;
mod watches;

pub use config::{EtcdConfig, EtcdStrategy};
pub use contenders::EtcdContender;
pub use election::EtcdElection;
pub use lock::EtcdLock;
pub use provider::EtcdLockProvider;
pub use rwlock::EtcdRwLock;
pub use semaphore::EtcdSemaphore;
