//! Locks inside a transaction the caller owns: `pg_advisory_xact_lock` on the mutex's key,
//! with the name's fencing row raised in the same statement. The lock and the token are
//! the transaction's: both end with its commit or rollback, together with the writes the
//! lock protects.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{FencingToken, LockError, LockName, Metrics};
use tokio_postgres::Transaction;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use crate::config::check_schema;
use crate::error::{BACKEND, from_pg};
use crate::lock::{Kind, Target, token_of};
use crate::shared::{FENCING_TABLE, Shared, TransactionStatements};

/// The savepoint a timed wait runs in, so that a timeout leaves the transaction usable.
const SAVEPOINT: &str = "distlock_wait";

/// A mutex taken inside the caller's transaction: [`TransactionLock::new`], or
/// [`PostgresLockProvider::transaction_lock`](crate::PostgresLockProvider::transaction_lock)
/// (which counts its statements in the provider's metrics).
///
/// It needs no connection of its own, only the caller's transaction, so it also works
/// through a pooler in transaction mode (PgBouncer pins a server connection for a
/// transaction), where the provider's session locks are refused.
///
/// It is the same lock as the provider's [`PostgresLock`](crate::PostgresLock) of the name
/// (the advisory lock `hashtextextended('{schema}/{name}', 0)`, and the same fencing row):
/// a transaction's holder and a session's exclude each other, and their tokens share one
/// sequence. The transaction holds the lock until it commits or rolls back; there is no
/// release. The token is raised in the transaction, so it is committed with the writes the
/// lock protects, or rolled back with them (the next holder may then get the same token
/// again: hand the token only to what the transaction writes).
///
/// Take the lock in a transaction at `READ COMMITTED` (PostgreSQL's default): under
/// `REPEATABLE READ` or `SERIALIZABLE`, a transaction that waited for the previous holder
/// to commit fails when it raises the token (a serialization failure, retryable, as every
/// such transaction must be ready for).
///
/// ```no_run
/// # async fn demo(provider: lock_postgres::PostgresLockProvider) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let (mut client, connection) =
///     tokio_postgres::connect("postgres://app@localhost/app", tokio_postgres::NoTls).await?;
/// tokio::spawn(connection);
/// let lock = provider.transaction_lock("nightly-report")?;
/// let mut tx = client.transaction().await?;
/// let token = lock.lock(&mut tx, Some(Duration::from_secs(5))).await?;
/// let token = i64::try_from(token.0)?;
/// tx.execute("UPDATE reports SET token = $1 WHERE token < $1", &[&token]).await?;
/// tx.commit().await?; // the write and the lock's end, at once
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TransactionLock {
    target: Arc<Target>,
    statements: Arc<TransactionStatements>,
    /// The provider's, when it made the lock.
    metrics: Option<Arc<Metrics>>,
}

impl fmt::Debug for TransactionLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionLock")
            .field("key", &self.target.key)
            .finish()
    }
}

impl TransactionLock {
    /// The mutex `name` of `schema` (see [`PostgresConfig::schema`](crate::PostgresConfig::schema)), for transactions on
    /// any connection to the server. The fencing table `{schema}.distlock_fencing` must
    /// exist: a provider's [`connect`](crate::PostgresLockProvider::connect) creates it
    /// (or an administrator, with the statement a refused provider names).
    ///
    /// ```
    /// let lock = lock_postgres::TransactionLock::new("public", "nightly-report")?;
    /// assert_eq!(lock.name().as_str(), "nightly-report");
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a schema that is not a plain SQL identifier;
    /// [`LockError::InvalidName`] for a name distlock does not accept.
    pub fn new(schema: &str, name: &str) -> Result<Self, LockError> {
        check_schema(schema)?;
        let table = format!("{schema}.{FENCING_TABLE}");
        Ok(TransactionLock {
            target: Arc::new(Target::new(schema, LockName::new(name)?, Kind::Mutex)),
            statements: Arc::new(TransactionStatements::new(&table)),
            metrics: None,
        })
    }

    /// The provider's lock `name`, its statements counted in the provider's metrics.
    pub(crate) fn of_provider(shared: &Shared, name: LockName) -> Self {
        TransactionLock {
            target: Arc::new(Target::new(&shared.config.schema, name, Kind::Mutex)),
            statements: Arc::clone(&shared.transaction),
            metrics: Some(Arc::clone(&shared.metrics)),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.target.name
    }

    /// Takes the lock in `tx`, waiting in the server's queue for at most `timeout` (`None`:
    /// as long as it takes), and returns the fencing token.
    ///
    /// A timed wait runs in a savepoint with the server's `lock_timeout`: when it passes,
    /// the savepoint is rolled back and `tx` stays usable. Dropping the future does not
    /// stop the statement the server is running in `tx`: roll the transaction back to give
    /// the lock up for sure.
    ///
    /// # Errors
    ///
    /// [`LockError::Timeout`] when the lock stayed busy for `timeout`; the server's errors
    /// otherwise (after which `tx` is aborted, as for any failed statement), such as
    /// [`LockError::Connection`] for a broken connection.
    pub async fn lock(
        &self,
        tx: &mut Transaction<'_>,
        timeout: Option<Duration>,
    ) -> Result<FencingToken, LockError> {
        let not_granted = || LockError::timed_out(BACKEND, &self.target.name, timeout);
        let Some(timeout) = timeout else {
            return self
                .granted(tx, &self.statements.grant)
                .await?
                .ok_or_else(not_granted);
        };
        if timeout.is_zero() {
            return self.try_lock(tx).await?.ok_or_else(not_granted);
        }
        // Whole milliseconds, at least one; beyond the setting's range, no limit (0).
        let millis = timeout.as_millis().max(1);
        let setting = i32::try_from(millis).map_or(0, |millis| millis).to_string();
        let waiting = tx
            .savepoint(SAVEPOINT)
            .await
            .map_err(|e| from_pg(e, "SAVEPOINT"))?;
        // Local to the savepoint: rolled back with it, and set back once granted.
        let previous = waiting
            .query_one(
                "SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)",
                &[&setting],
            )
            .await
            .map_err(|e| from_pg(e, "SELECT set_config"))?
            .get::<_, String>(0);
        let granted = self.granted(&waiting, &self.statements.grant).await;
        let granted = match granted {
            Ok(granted) => granted.ok_or_else(not_granted)?,
            Err(error) => {
                waiting
                    .rollback()
                    .await
                    .map_err(|e| from_pg(e, "ROLLBACK TO SAVEPOINT"))?;
                return Err(match crate::error::sql_state(&error) {
                    Some(SqlState::LOCK_NOT_AVAILABLE) => not_granted(),
                    _ => error,
                });
            }
        };
        waiting
            .execute("SELECT set_config('lock_timeout', $1, true)", &[&previous])
            .await
            .map_err(|e| from_pg(e, "SELECT set_config"))?;
        waiting
            .commit()
            .await
            .map_err(|e| from_pg(e, "RELEASE SAVEPOINT"))?;
        Ok(granted)
    }

    /// Takes the lock in `tx` if it is free, and returns the fencing token; `None` when it
    /// is busy (`tx` stays usable).
    ///
    /// # Errors
    ///
    /// The server's errors (after which `tx` is aborted), such as [`LockError::Connection`]
    /// for a broken connection.
    pub async fn try_lock(
        &self,
        tx: &mut Transaction<'_>,
    ) -> Result<Option<FencingToken>, LockError> {
        self.granted(tx, &self.statements.try_grant).await
    }

    /// Runs a granting statement in `tx`: its token, or `None` when it granted nothing.
    async fn granted(
        &self,
        tx: &Transaction<'_>,
        statement: &str,
    ) -> Result<Option<FencingToken>, LockError> {
        let (key, kind, row) = (
            self.target.key.as_str(),
            self.target.seed,
            self.target.name.as_str(),
        );
        let params: [(&(dyn ToSql + Sync), Type); 3] =
            [(&key, Type::TEXT), (&kind, Type::INT8), (&row, Type::TEXT)];
        if let Some(metrics) = &self.metrics {
            metrics.record_server_requests(1);
        }
        let what = statement.split_whitespace().next().unwrap_or("a statement");
        let rows = tx
            .query_typed(statement, &params)
            .await
            .map_err(|e| from_pg(e, what))?;
        let Some(token) = token_of(&rows) else {
            return Ok(None);
        };
        if let Some(metrics) = &self.metrics {
            metrics.record_grant();
        }
        Ok(Some(FencingToken(u64::try_from(token).unwrap_or_default())))
    }
}
