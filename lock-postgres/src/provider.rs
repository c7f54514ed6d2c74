//! The provider: the configuration, the connection pool, the fencing table's statements.

use std::fmt;
use std::sync::Arc;

use lock_core::kit::{Closed, SessionOwner, check_permits};
use lock_core::observe::{observe_election, observe_lock, observe_rw_lock, observe_semaphore};
use lock_core::{
    Capabilities, DistributedLock, DistributedRwLock, DistributedSemaphore, Election, Fencing,
    LockError, LockName, LockProvider, Metrics, MetricsSnapshot, WaitKind,
};
use tokio_postgres::error::SqlState;

use crate::config::{PostgresConfig, PostgresStrategy};
use crate::connection::{Conn, Pool};
use crate::election::PostgresElection;
use crate::error::{BACKEND, sql_state};
use crate::lock::{PostgresLock, PostgresRwLock};
use crate::semaphore::PostgresSemaphore;
use crate::shared::{
    FENCING_TABLE, LEADERS_TABLE, Mode, Shared, Statements, TransactionStatements,
};
use crate::transaction::TransactionLock;

/// The strategy the metrics name for the read-write locks, semaphores and elections: their
/// waiters always queue on the server, whatever the configured strategy.
const SERVER_QUEUE: &str = "advisory";

/// The most permits a semaphore may have: each is an advisory lock a taker may try.
const MAX_PERMITS: u32 = 10_000;

/// A distlock provider over a PostgreSQL server: its advisory locks, on connections its
/// holders share (a lock belongs to the connection that took it, and the server frees it
/// when that connection ends; a waiter in the server's queue has one of its own), fenced by
/// a counter row per name in the
/// table `distlock_fencing` of the configured schema; elections write their leaders in
/// `distlock_leaders` (both created at connect if missing).
///
/// Dropping the last handle closes every connection, which frees every lock it held and
/// fires their guards' lost signals.
///
/// ```no_run
/// use lock_core::LockProvider;
/// use lock_postgres::PostgresLockProvider;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locks = PostgresLockProvider::connect_url("postgres://locker@127.0.0.1/app").await?;
/// let mut guard = locks.lock("billing")?.acquire(None).await?;
/// // ... pass guard.fencing_token() with every write; watch guard.lost() ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresLockProvider {
    shared: Arc<Shared>,
    _owner: SessionOwner,
}

impl PostgresLockProvider {
    /// Connects (within the configured timeout) and makes sure the fencing table exists.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for an invalid configuration; [`LockError::Connection`]
    /// (retryable) when the server does not answer in time; [`LockError::Auth`] for refused
    /// credentials; [`LockError::PermissionDenied`] naming the statement an administrator
    /// must run when the role may not create the missing fencing table.
    pub async fn connect(config: PostgresConfig) -> Result<Self, LockError> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| LockError::Config {
            message: "a PostgreSQL provider is made inside a tokio runtime".to_owned(),
        })?;
        let metrics = Arc::new(Metrics::new());
        let pg = config.pg_config()?;
        let tls = crate::tls::connector(&config, &pg)?;
        let pool = Pool::new(pg, tls, config.timeout, Arc::clone(&metrics));
        let first = pool.for_wait().await?;
        let second = pool.for_wait().await?;
        refuse_shared_server_sessions(&first, &second).await?;
        let table = format!("{}.{FENCING_TABLE}", config.schema);
        let leaders = format!("{}.{LEADERS_TABLE}", config.schema);
        ensure_tables(&first, &[&table, &leaders]).await?;
        pool.share(first);
        pool.share(second);
        let shared = Arc::new(Shared {
            exclusive: Statements::new(&table, Mode::Exclusive),
            shared: Statements::new(&table, Mode::Shared),
            election: Statements::election(&table, &leaders),
            transaction: Arc::new(TransactionStatements::new(&table)),
            config,
            pool,
            table,
            closed: Closed::new(),
            metrics,
            runtime,
        });
        let closing = Arc::clone(&shared);
        Ok(PostgresLockProvider {
            _owner: SessionOwner::new(move || {
                closing.closed.close();
                closing.pool.clear();
            }),
            shared,
        })
    }

    /// Parses a `postgres://` URL (see [`PostgresConfig::from_url`]) and connects.
    ///
    /// # Errors
    ///
    /// As for [`PostgresConfig::from_url`] and [`connect`](Self::connect).
    pub async fn connect_url(url: &str) -> Result<Self, LockError> {
        Self::connect(PostgresConfig::from_url(url)?).await
    }

    /// The mutex `name` as a lock inside a transaction the caller owns (see
    /// [`TransactionLock`]): the same lock and fencing sequence as [`lock`](LockProvider::lock)'s.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidName`] for a name distlock does not accept.
    pub fn transaction_lock(&self, name: &str) -> Result<TransactionLock, LockError> {
        Ok(TransactionLock::of_provider(
            &self.shared,
            LockName::new(name)?,
        ))
    }

    /// The configuration the provider was made with.
    pub fn config(&self) -> &PostgresConfig {
        &self.shared.config
    }
}

/// Refuses a pooler that hands one server session to several client connections (PgBouncer
/// in transaction or statement mode): a session lock would be taken on one server
/// connection and released on another. Each connection asked the server for its process at
/// connect, the second just after the first, so through such a pooler that reuses the
/// server connection freed last (PgBouncer's default) the second gets the first's: the same
/// process. One that hands them out in turn (`server_round_robin`) gives the first
/// connection, asked twice more, another process. Directly, or through a pool in session
/// mode, neither happens.
async fn refuse_shared_server_sessions(first: &Conn, second: &Conn) -> Result<(), LockError> {
    let shared = if second.pid == first.pid {
        Some(format!(
            "two connections reached the same server process ({})",
            first.pid
        ))
    } else {
        let mut moved = None;
        for _ in 0..2 {
            let now = first.server_pid().await?;
            if now != first.pid {
                moved = Some(format!(
                    "one connection reached several server processes ({} then {now})",
                    first.pid
                ));
                break;
            }
        }
        moved
    };
    match shared {
        None => Ok(()),
        Some(what) => Err(LockError::Config {
            message: format!(
                "{what}: a pooler hands server sessions to any client (PgBouncer in transaction \
                 or statement mode), which breaks session locks; connect to PostgreSQL \
                 directly, or through a pool with pool_mode=session"
            ),
        }),
    }
}

/// The statements that make the fencing table `tables[0]` and the leaders' table
/// `tables[1]`, each if missing.
fn create_tables(tables: &[&str]) -> String {
    let columns = [
        "name text PRIMARY KEY, token bigint NOT NULL",
        "name text PRIMARY KEY, term bigint NOT NULL, value bytea NOT NULL, pid integer NOT NULL",
    ];
    tables
        .iter()
        .zip(columns)
        .map(|(table, columns)| format!("CREATE TABLE IF NOT EXISTS {table} ({columns})"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Creates the fencing and leaders' tables if they are missing. A role that may not create
/// them can still lock once an administrator has: the server refuses `CREATE` before it
/// looks whether the table exists, so a refusal is followed by a look.
async fn ensure_tables(conn: &Conn, tables: &[&str]) -> Result<(), LockError> {
    let create = create_tables(tables);
    let mut tries = 0;
    loop {
        tries += 1;
        let error = match conn.run(&create).await {
            Ok(()) => return Ok(()),
            Err(error) => error,
        };
        // Two providers creating a table at once: one of them may meet the other's
        // half-made table or row type (a unique violation, or the type already there);
        // the next try finds the table.
        let concurrent = [
            SqlState::UNIQUE_VIOLATION,
            SqlState::DUPLICATE_OBJECT,
            SqlState::DUPLICATE_TABLE,
        ];
        if sql_state(&error).is_some_and(|state| concurrent.contains(&state)) && tries < 3 {
            continue;
        }
        if !matches!(error, LockError::PermissionDenied { .. }) {
            return Err(error);
        }
        let mut missing = Vec::new();
        for table in tables {
            let exists = conn
                .ask(
                    "SELECT to_regclass($1) IS NOT NULL",
                    &[(table, tokio_postgres::types::Type::TEXT)],
                )
                .await?
                .first()
                .and_then(|row| row.try_get::<_, bool>(0).ok())
                .unwrap_or(false);
            if !exists {
                missing.push(*table);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        return Err(LockError::PermissionDenied {
            backend: BACKEND,
            name: None,
            message: format!(
                "the tables {} are missing and could not be created ({error}); an \
                 administrator can run: {create}; GRANT SELECT, INSERT, UPDATE ON {} TO \
                 <the role>",
                missing.join(", "),
                tables.join(", ")
            ),
        });
    }
}

impl fmt::Debug for PostgresLockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockProvider")
            .field("schema", &self.shared.config.schema)
            .field("strategy", &self.shared.config.strategy)
            .finish_non_exhaustive()
    }
}

impl LockProvider for PostgresLockProvider {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let config = &self.shared.config;
        let (wait, fifo) = match config.strategy {
            PostgresStrategy::Advisory => (WaitKind::NotifyOne, true),
            PostgresStrategy::Notify => (WaitKind::NotifyAll, false),
            PostgresStrategy::Polling => (WaitKind::Poll, false),
        };
        Capabilities::new(wait)
            .with_fencing(Fencing::Monotonic)
            .with_lost_detection(true)
            .with_fifo(fifo)
            .with_reader_writer(true)
            .with_semaphore(true)
            .with_elections(true)
            .with_crash_release_bound(Some(config.crash_release_bound()))
    }

    /// The mutex `name`; see [`PostgresLock`].
    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let name = LockName::new(name)?;
        let lock = Arc::new(PostgresLock::new(Arc::clone(&self.shared), name));
        Ok(observe_lock(
            lock,
            BACKEND,
            self.shared.config.strategy.as_str(),
        ))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// The read-write lock `name`; see [`PostgresRwLock`].
    fn rw_lock(&self, name: &str) -> Result<Arc<dyn DistributedRwLock>, LockError> {
        let name = LockName::new(name)?;
        let lock = Arc::new(PostgresRwLock::new(Arc::clone(&self.shared), name));
        Ok(observe_rw_lock(lock, BACKEND, SERVER_QUEUE))
    }

    /// The election `name`; see [`PostgresElection`].
    fn election(&self, name: &str) -> Result<Arc<dyn Election>, LockError> {
        let name = LockName::new(name)?;
        let election = Arc::new(PostgresElection::new(Arc::clone(&self.shared), name));
        Ok(observe_election(election, BACKEND, SERVER_QUEUE))
    }

    /// The semaphore `name` with `permits` permits; see [`PostgresSemaphore`].
    fn semaphore(
        &self,
        name: &str,
        permits: u32,
    ) -> Result<Arc<dyn DistributedSemaphore>, LockError> {
        let name = LockName::new(name)?;
        check_permits(BACKEND, name.as_str(), permits, MAX_PERMITS)?;
        let semaphore = Arc::new(PostgresSemaphore::new(
            Arc::clone(&self.shared),
            name,
            permits,
        ));
        Ok(observe_semaphore(semaphore, BACKEND, SERVER_QUEUE))
    }
}
