//! PostgreSQL backend for distlock: the server's advisory locks, fenced by a counter row.
//!
//! - **Locks belong to connections, which holders share.** The server frees a session-level
//!   advisory lock when its connection ends (the client crashed, an administrator ran
//!   `pg_terminate_backend`, the server restarted), and the holder's guard then reports the
//!   loss. Tries and releases never wait for a lock, so a provider pipelines them on a few
//!   shared connections (up to 1 000 locks each); a waiter in the server's queue takes a
//!   connection of its own, shared once granted, and so does a `notify` waiter while it
//!   listens and holds, and a semaphore's taker. distlock locks are not re-entrant: a
//!   connection never takes one lock twice (the server would stack it), so two acquires of
//!   one name by one provider use two connections, and the second waits. Each connection
//!   that holds locks is checked every third of the
//!   [`keepalive`](PostgresConfig::keepalive), and the server probes it by TCP keepalives:
//!   a holder gone without a word frees its locks within 2 × keepalive + 1 s. Many held
//!   locks need room in the server's lock table, `max_locks_per_transaction ×
//!   (max_connections + max_prepared_transactions)` (6 400 by default).
//! - **Fencing.** The statement that takes the lock also raises the name's row in
//!   `{schema}.distlock_fencing` (`INSERT ... ON CONFLICT DO UPDATE ... RETURNING`): one round
//!   trip, and tokens that strictly increase across holders and survive restarts (the row
//!   is committed before the grant is answered).
//! - **Strategies** ([`PostgresStrategy`]): `advisory` waits in the server's own queue
//!   (FIFO, one waiter woken per release), `notify` on `LISTEN`/`NOTIFY` (every waiter woken:
//!   the herd), `polling` on a timer.
//! - **Cancel-safety.** A waiter queued on the server that gives up (timeout, dropped
//!   future) cancels its statement and closes its connection: nothing of it can be granted
//!   later. A try given up after it was sent is undone by an unlock sent behind it on its
//!   shared connection; a poller given up between tries has nothing on the server.
//! - **Interoperation.** The mutex `N` of schema `S` is the advisory lock
//!   `hashtextextended('S/N', 0)`, so `SELECT pg_advisory_lock(hashtextextended('public/N', 0))`
//!   in psql excludes distlock's holders of `N` (and the other way round); the read-write
//!   lock uses the key `hashtextextended('S/N', 1)`.
//! - **Semaphores** queue on the server too (`hashtextextended('S/N', 2)`); the head takes
//!   the first free permit (`hashtextextended('S/N/i', 3)`) and only it waits for a
//!   permit's release ([`PostgresSemaphore`]).
//! - **Elections** queue on the server (`hashtextextended('S/N', 4)`); the grant writes the
//!   leader's row in `S.distlock_leaders`, which observers read while its process holds the
//!   lock ([`PostgresElection`]).
//!
//! TLS goes through rustls when the connection string asks for it (`sslmode=require`, or
//! libpq's `verify-ca` / `verify-full` in a URL): the server's certificate is always
//! verified, against [`PostgresConfig::ssl_root_cert`] or the system's roots, and a failed
//! handshake is [`LockError::Auth`](lock_core::LockError::Auth).
//!
//! Connection poolers that hand a client's statements to any server connection (PgBouncer
//! in transaction or statement mode) break session locks: [`PostgresLockProvider::connect`]
//! refuses them (two connections that reach one server process, or one that reaches
//! several) with an error naming
//! `pool_mode=session`. Connect directly, or through a pool in session mode (PgBouncer with
//! `ignore_startup_parameters = options`). A lock inside the caller's own transaction
//! ([`TransactionLock`]) needs no session of its own.

mod config;
mod connection;
mod election;
mod error;
mod lock;
mod provider;
mod semaphore;
mod shared;
mod tls;
mod transaction;

pub use config::{PostgresConfig, PostgresStrategy};
pub use election::{OBSERVE_INTERVAL, PostgresElection};
pub use lock::{PostgresLock, PostgresRwLock};
pub use provider::PostgresLockProvider;
pub use semaphore::PostgresSemaphore;
pub use shared::{FENCING_TABLE, LEADERS_TABLE};
/// The PostgreSQL client whose transactions [`TransactionLock`] takes locks in.
pub use tokio_postgres;
pub use transaction::TransactionLock;
