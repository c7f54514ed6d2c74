//! What a provider's locks share: the configuration, the connection pool, and the
//! statements over the fencing table.

use std::sync::Arc;

use lock_core::Metrics;
use lock_core::kit::Closed;

use crate::config::PostgresConfig;
use crate::connection::Pool;

/// The fencing table's name within its schema.
pub const FENCING_TABLE: &str = "distlock_fencing";

/// The table of elections' leaders (name, term, value, server process), within the schema.
pub const LEADERS_TABLE: &str = "distlock_leaders";

/// What a provider's locks share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: PostgresConfig,
    pub(crate) pool: Pool,
    pub(crate) closed: Closed,
    /// Grants, wake-ups, and every statement sent (the server requests).
    pub(crate) metrics: Arc<Metrics>,
    /// The fencing table, `{schema}.distlock_fencing`.
    pub(crate) table: String,
    pub(crate) exclusive: Statements,
    pub(crate) shared: Statements,
    /// A campaign's: the grant also writes the leader's row.
    pub(crate) election: Statements,
    /// A lock's inside the caller's transaction.
    pub(crate) transaction: Arc<TransactionStatements>,
    /// The runtime the provider was made on: what a guard dropped anywhere leaves to the
    /// background runs there.
    pub(crate) runtime: tokio::runtime::Handle,
}

impl Shared {
    /// The statements of `mode`.
    pub(crate) fn statements(&self, mode: Mode) -> &Statements {
        match mode {
            Mode::Exclusive => &self.exclusive,
            Mode::Shared => &self.shared,
        }
    }
}

/// Exclusive, or shared with other shared holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Exclusive,
    Shared,
}

impl Mode {
    /// The suffix of the advisory lock functions for this mode.
    fn suffix(self) -> &'static str {
        match self {
            Mode::Exclusive => "",
            Mode::Shared => "_shared",
        }
    }
}

/// The statements of one mode, for the fencing table of one schema. Parameters: `$1` the
/// lock's key text, `$2` its kind (the hash's seed), `$3` the counter row's name (grants)
/// or the channel to notify (`unlock_and_notify`). `try_grant` returns the token if it took
/// the lock; `grant` takes it, queueing on the server if it is busy, and returns the token
/// and whether it waited.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) try_grant: String,
    pub(crate) grant: String,
    pub(crate) unlock: String,
    pub(crate) unlock_and_notify: String,
    /// The holders and waiters (pid, granted, application, the holder's token), the
    /// holders first, then the waiters in the order they began to wait.
    pub(crate) queue: String,
}

/// The start of a statement that raises the counter row `$3` of the fencing table `table`
/// (inserted at 1), [`RAISE_ROW`] its end.
fn insert_row(table: &str) -> String {
    format!("INSERT INTO {table} AS f (name, token)")
}

/// The end of a statement that raises a counter row, returning the token.
const RAISE_ROW: &str = "ON CONFLICT (name) DO UPDATE SET token = f.token + 1 RETURNING token";

/// The statements of a lock inside the caller's transaction (`pg_advisory_xact_lock`), with
/// the parameters of [`Statements`]'s grants: `try_grant` returns the token if it took the
/// lock, `grant` waits for it in the server's queue.
#[derive(Debug)]
pub(crate) struct TransactionStatements {
    pub(crate) try_grant: String,
    pub(crate) grant: String,
}

impl TransactionStatements {
    pub(crate) fn new(table: &str) -> Self {
        let insert = insert_row(table);
        TransactionStatements {
            try_grant: format!(
                "{insert} SELECT $3, 1 WHERE pg_try_advisory_xact_lock(hashtextextended($1, \
                 $2)) {RAISE_ROW}"
            ),
            grant: format!(
                "{insert} SELECT $3, 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, \
                 $2))) AS granted {RAISE_ROW}"
            ),
        }
    }
}

/// `pg_locks`' condition for the advisory lock `hashtextextended($1, $2)`, its rows as `k`.
pub(crate) const HELD_KEY: &str = "k.locktype = 'advisory' AND k.objsubid = 1 \
     AND k.classid = ((hashtextextended($1, $2) >> 32) & 4294967295)::oid \
     AND k.objid = (hashtextextended($1, $2) & 4294967295)::oid";

impl Statements {
    /// An election's statements over the fencing table `table` and the leaders' table
    /// `leaders`: as the mutex's, but the grant also writes the leader's row (its term, the
    /// value `$4`, and the server process holding the lock), in the same statement.
    pub(crate) fn election(table: &str, leaders: &str) -> Self {
        let mutex = Statements::new(table, Mode::Exclusive);
        let proclaim = |waited: &str| {
            format!(
                "INSERT INTO {leaders} AS l (name, term, value, pid) \
                 SELECT $3, token, $4, pg_backend_pid() FROM raised \
                 ON CONFLICT (name) DO UPDATE SET term = EXCLUDED.term, value = EXCLUDED.value, \
                 pid = EXCLUDED.pid RETURNING term{waited}"
            )
        };
        Statements {
            try_grant: format!("WITH raised AS ({}) {}", mutex.try_grant, proclaim("")),
            grant: format!(
                "WITH raised AS ({}) {}",
                mutex.grant,
                proclaim(", (SELECT waited FROM raised)")
            ),
            ..mutex
        }
    }

    pub(crate) fn new(table: &str, mode: Mode) -> Self {
        let suffix = mode.suffix();
        let (insert, raise) = (insert_row(table), RAISE_ROW);
        Statements {
            try_grant: format!(
                "{insert} SELECT $3, 1 WHERE pg_try_advisory_lock{suffix}(hashtextextended($1, \
                 $2)) {raise}"
            ),
            grant: format!(
                "WITH granted AS MATERIALIZED (SELECT CASE WHEN \
                 pg_try_advisory_lock{suffix}(hashtextextended($1, $2)) THEN false ELSE \
                 (SELECT true FROM (SELECT pg_advisory_lock{suffix}(hashtextextended($1, $2))) \
                 AS queued) END AS waited) \
                 {insert} SELECT $3, 1 FROM granted {raise}, (SELECT waited FROM granted)"
            ),
            unlock: format!("SELECT pg_advisory_unlock{suffix}(hashtextextended($1, $2))"),
            queue: format!(
                "SELECT l.pid, l.granted, a.application_name, \
                 CASE WHEN l.granted THEN (SELECT token FROM {table} WHERE name = $3) END \
                 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND l.objsubid = 1 \
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND l.classid = ((hashtextextended($1, $2) >> 32) & 4294967295)::oid \
                 AND l.objid = (hashtextextended($1, $2) & 4294967295)::oid \
                 ORDER BY l.granted DESC, l.waitstart NULLS LAST, l.pid"
            ),
            unlock_and_notify: format!(
                "SELECT pg_advisory_unlock{suffix}(hashtextextended($1, $2)), pg_notify($3, '')"
            ),
        }
    }
}
