//! The mutex and the read-write lock: PostgreSQL's session-level advisory locks, one
//! connection per contender, and a counter row per name for the fencing token.
//!
//! A contender takes a connection and sends one statement that takes the advisory lock
//! and raises the name's counter row (`INSERT ... ON CONFLICT DO UPDATE ... RETURNING`):
//! the lock is granted and the token known in one round trip, and the token is raised
//! only by a holder. The first statement only tries (`pg_try_advisory_lock`, which fails
//! while anyone waits, so a newcomer never passes the queue); a busy lock is then waited
//! for as the strategy says:
//!
//! - `advisory`: `pg_advisory_lock` blocks on the server, which queues the waiters in the
//!   order they asked and grants the next one at each release;
//! - `notify`: the waiter listens on the lock's channel, and tries again at each release's
//!   `pg_notify` (every waiter does: a herd), or after `keepalive` (a holder that died
//!   notifies nobody);
//! - `polling`: the waiter tries again every `poll_interval`, with jitter.
//!
//! A waiter given up (deadline, dropped future, error) cancels its statement on the
//! server and closes its connection, so nothing of it can be granted later; should the
//! cancel not arrive, the server finds the closed connection within a second
//! (`client_connection_check_interval`, set at connect). The read-write
//! lock is the same with `pg_advisory_lock_shared` for readers, and always waits in the
//! server's queue, whatever the strategy: the server makes a reader that comes after a
//! waiting writer wait too (a request conflicting with a waiter's joins the queue), so
//! writers are not starved; a writer waiting at home would be.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use lock_core::kit::{
    HeldEntry, MutexAttempt, Removal, RemovalError, RwAttempt, RwSide, Wakeups, entry_guard,
};
use lock_core::queue::{LockQueue, QueuedContender};
use lock_core::{
    Deadline, FencingToken, Guard, LockError, LockName, LossReason, LostNotifier, lost_signal,
};
use tokio::sync::watch;
use tokio_postgres::types::Type;

use crate::config::PostgresStrategy;
use crate::connection::Conn;
use crate::error::BACKEND;
use crate::shared::{Mode, Shared};

/// Which advisory lock of a name a kind of lock takes (the second argument of
/// `hashtextextended`): a mutex and a read-write lock of one name never exclude each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Mutex = 0,
    RwLock = 1,
    /// A semaphore's queue: its head looks for a free permit.
    SemaphoreQueue = 2,
    /// One of a semaphore's permits, `{schema}/{name}/{index}`.
    Permit = 3,
    /// An election: its holder leads.
    Election = 4,
}

/// One lock of a name: the key text its advisory lock is hashed from, and its channel.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) name: LockName,
    /// `{schema}/{name}`: the advisory lock's key is `hashtextextended(key, kind)`.
    pub(crate) key: String,
    pub(crate) kind: Kind,
    /// The channel a release notifies (`notify` strategy).
    pub(crate) channel: String,
}

impl Target {
    pub(crate) fn new(schema: &str, name: LockName, kind: Kind) -> Self {
        let key = format!("{schema}/{}", name.as_str());
        let channel = format!("distlock_{:016x}_{}", fnv1a(&key), kind as i64);
        Target {
            name,
            key,
            kind,
            channel,
        }
    }
}

/// FNV-1a, 64 bits: a channel name of fixed length for any key.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A contender's connection while it waits: given up (dropped) before the grant, it is
/// cancelled and closed, so that no request of it stays queued on the server.
pub(crate) struct Waiting {
    pub(crate) conn: Arc<Conn>,
    armed: bool,
}

impl Waiting {
    pub(crate) fn new(conn: Arc<Conn>) -> Self {
        Waiting { conn, armed: true }
    }

    /// The connection, no longer cancelled on drop.
    pub(crate) fn settle(mut self) -> Arc<Conn> {
        self.armed = false;
        Arc::clone(&self.conn)
    }

    /// Closes the connection, which runs no statement.
    pub(crate) fn discard(self) {
        self.settle().close();
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.armed {
            Arc::clone(&self.conn).cancel_and_close();
        }
    }
}

/// Takes `target` in `mode`, or gives up at `deadline` with `Ok(None)`. A campaign gives
/// its `value`, which the grant writes as the leader's.
pub(crate) async fn contend(
    shared: &Arc<Shared>,
    target: &Target,
    mode: Mode,
    value: Option<&[u8]>,
    deadline: Deadline,
) -> Result<Option<Guard>, LockError> {
    shared.closed.check(BACKEND, &target.name)?;
    let statements = match value {
        Some(_) => &shared.election,
        None => shared.statements(mode),
    };
    // A read-write lock's waiters always queue on the server: a waiting writer holds back
    // the readers that come after it only there.
    let strategy = match target.kind {
        Kind::Mutex => shared.config.strategy,
        Kind::RwLock | Kind::SemaphoreQueue | Kind::Permit | Kind::Election => {
            PostgresStrategy::Advisory
        }
    };
    let waiting = Waiting::new(shared.pool.get().await?);
    let conn = Arc::clone(&waiting.conn);
    let key: &str = &target.key;
    let kind = target.kind as i64;
    let row: &str = target.name.as_str();
    let mut grant_params = vec![
        (
            &key as &(dyn tokio_postgres::types::ToSql + Sync),
            Type::TEXT,
        ),
        (&kind, Type::INT8),
        (&row, Type::TEXT),
    ];
    if let Some(value) = &value {
        grant_params.push((value, Type::BYTEA));
    }
    let notifies = strategy == PostgresStrategy::Notify;
    let listening = notifies && !deadline.is_immediate();
    let granted = |rows: &[tokio_postgres::Row], waiting: Waiting| {
        let token = token_of(rows)?;
        let conn = waiting.settle();
        Some(grant(
            shared,
            target,
            mode,
            conn,
            token,
            (listening, notifies),
        ))
    };
    let mut wakeups = Wakeups::new(&shared.metrics);
    if strategy == PostgresStrategy::Advisory && !deadline.is_immediate() {
        // One statement that tries, and queues on the server only if the lock is busy:
        // waiters are granted in the order their one statement arrived.
        let queued = conn.wait(&statements.grant, &grant_params);
        let rows = match deadline.remaining() {
            None => queued.await?,
            Some(left) => match tokio::time::timeout(left, queued).await {
                Ok(rows) => rows?,
                // Cancelled and closed as `waiting` drops.
                Err(_) => return Ok(None),
            },
        };
        if rows.first().and_then(|row| row.try_get::<_, bool>(1).ok()) == Some(true) {
            wakeups.woke();
        }
        return Ok(granted(&rows, waiting));
    }
    let first = if listening {
        // Listening before the first try: a release in between is not missed.
        let listen = format!("LISTEN {}", target.channel);
        let (listened, tried) = tokio::join!(
            conn.run(&listen),
            conn.ask(&statements.try_grant, &grant_params)
        );
        listened?;
        tried?
    } else {
        conn.ask(&statements.try_grant, &grant_params).await?
    };
    if token_of(&first).is_some() {
        return Ok(granted(&first, waiting));
    }
    loop {
        wakeups.busy();
        if deadline.is_immediate() || deadline.has_passed() {
            if listening {
                // The connection listens: it goes, rather than back to the pool.
                waiting.discard();
            } else {
                shared.pool.put(waiting.settle());
            }
            return Ok(None);
        }
        if strategy == PostgresStrategy::Notify {
            conn.notification(deadline.cap(shared.config.keepalive))
                .await;
        } else {
            let interval = shared.config.poll_interval;
            let jitter = interval.mul_f64(fastrand::f64() / 2.0);
            tokio::time::sleep(deadline.cap(interval + jitter)).await;
        }
        wakeups.woke();
        let rows = conn.ask(&statements.try_grant, &grant_params).await?;
        if token_of(&rows).is_some() {
            return Ok(granted(&rows, waiting));
        }
    }
}

/// The token a granting statement returned, if it granted.
pub(crate) fn token_of(rows: &[tokio_postgres::Row]) -> Option<i64> {
    rows.first().and_then(|row| row.try_get::<_, i64>(0).ok())
}

/// The guard of a lock granted on `conn`: released by unlocking on that connection, lost
/// when the connection ends or stops answering.
pub(crate) fn grant(
    shared: &Arc<Shared>,
    target: &Target,
    mode: Mode,
    conn: Arc<Conn>,
    token: i64,
    (listening, notifies): (bool, bool),
) -> Guard {
    shared.metrics.record_grant();
    let (notifier, lost) = lost_signal();
    let (done, released) = watch::channel(false);
    let watched = watch_holder(
        Arc::clone(&conn),
        Arc::clone(shared),
        released,
        notifier.clone(),
    );
    let held = HeldLock {
        conn: Some(conn),
        shared: Arc::clone(shared),
        target: target.clone(),
        mode,
        listening,
        notifies,
        done,
    };
    let token = FencingToken(u64::try_from(token).unwrap_or_default());
    entry_guard(&target.name, token, held, (notifier, lost), watched)
}

/// Watches a holder's connection until the grant ends (`released`): fires the lost signal
/// when the connection ends (its server process was terminated, the server restarted), when
/// a check (`SELECT pg_backend_pid()` every third of the keepalive) has no answer within the
/// keepalive or names another server process (a pooler moved the session), or
/// when the provider is closed; the connection is then closed, which frees the lock on the
/// server. Resolves to `false`: the signal is fired here, with its reason.
async fn watch_holder(
    conn: Arc<Conn>,
    shared: Arc<Shared>,
    mut released: watch::Receiver<bool>,
    notifier: LostNotifier,
) -> bool {
    let keepalive = shared.config.keepalive;
    let reason = loop {
        tokio::select! {
            () = conn.closed() => break LossReason::SessionExpired,
            _ = async { released.wait_for(|released| *released).await.map(drop) } => return false,
            () = shared.closed.wait() => break LossReason::SessionExpired,
            () = tokio::time::sleep(keepalive / 3) => {
                match conn.within(keepalive, "SELECT pg_backend_pid()", &[]).await {
                    Err(_) => break LossReason::Disconnected,
                    // A pooler handed the connection another server session: the lock
                    // stays with the one that took it.
                    Ok(Ok(rows)) if backend_pid(&rows).is_some_and(|pid| pid != conn.pid) => {
                        break LossReason::Other(MOVED_SESSION.to_owned());
                    }
                    Ok(_) => {}
                }
            }
        }
    };
    conn.close();
    if !*released.borrow() {
        tracing::debug!(pid = conn.pid, %reason, "postgres: a held lock is lost");
        notifier.fire(reason);
    }
    false
}

/// The loss of a holder whose statements a pooler sent to another server session.
const MOVED_SESSION: &str = "the holder's statements reached another server process: a \
     pooler in transaction or statement mode (PgBouncer) holds the lock on a server \
     connection of its own; use pool_mode=session";

/// The server process a `SELECT pg_backend_pid()` named.
fn backend_pid(rows: &[tokio_postgres::Row]) -> Option<i32> {
    rows.first().and_then(|row| row.try_get::<_, i32>(0).ok())
}

/// A granted lock, as its guard releases it.
struct HeldLock {
    /// The holder's connection, until the release hands it back.
    conn: Option<Arc<Conn>>,
    shared: Arc<Shared>,
    target: Target,
    mode: Mode,
    /// Whether the connection listens on the lock's channel (`notify`).
    listening: bool,
    /// Whether its release notifies the lock's channel (a `notify` mutex, a permit).
    notifies: bool,
    /// Set once the grant is over: the holder's watch stops.
    done: watch::Sender<bool>,
}

impl fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLock")
            .field("key", &self.target.key)
            .field("mode", &self.mode)
            .field("pid", &self.conn.as_ref().map(|conn| conn.pid))
            .finish()
    }
}

impl HeldLock {
    /// Hands the holder's connection back to the pool, unlistening first if it listens.
    fn give_back(&self, conn: Arc<Conn>) {
        let shared = Arc::clone(&self.shared);
        if !self.listening {
            shared.pool.put(conn);
            return;
        }
        tokio::spawn(async move {
            if conn.run("UNLISTEN *").await.is_ok() {
                shared.pool.put(conn);
            } else {
                conn.close();
            }
        });
    }
}

#[async_trait]
impl HeldEntry for HeldLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn remove(&mut self, sent: &AtomicBool) -> Result<Removal, RemovalError> {
        let Some(conn) = self.conn.clone().filter(|conn| !conn.is_closed()) else {
            // The server frees a closed connection's locks.
            return Err(RemovalError::SessionOver);
        };
        let statements = self.shared.statements(self.mode);
        let key: &str = &self.target.key;
        let kind = self.target.kind as i64;
        let channel: &str = &self.target.channel;
        sent.store(true, Ordering::Release);
        let answer = if self.notifies {
            let params = [
                (
                    &key as &(dyn tokio_postgres::types::ToSql + Sync),
                    Type::TEXT,
                ),
                (&kind, Type::INT8),
                (&channel, Type::TEXT),
            ];
            conn.ask(&statements.unlock_and_notify, &params).await
        } else {
            let params = [
                (
                    &key as &(dyn tokio_postgres::types::ToSql + Sync),
                    Type::TEXT,
                ),
                (&kind, Type::INT8),
            ];
            conn.ask(&statements.unlock, &params).await
        };
        match answer {
            Ok(rows) => {
                self.done.send_replace(true);
                self.conn = None;
                let unlocked = rows.first().and_then(|row| row.try_get::<_, bool>(0).ok());
                if unlocked == Some(true) {
                    self.give_back(conn);
                    Ok(Removal::Removed)
                } else {
                    conn.close();
                    Ok(Removal::Gone)
                }
            }
            Err(_) if conn.is_closed() => Err(RemovalError::SessionOver),
            Err(error @ LockError::Connection { .. }) => Err(RemovalError::Unknown(error)),
            Err(error) => Err(RemovalError::Failed(error)),
        }
    }

    fn forget(&self) {}

    /// Closes the holder's connection: the server ends its process, which frees the lock.
    fn abandon(self: Box<Self>) {
        self.done.send_replace(true);
        if let Some(conn) = &self.conn {
            conn.close();
        }
    }

    fn is_suspect(&self) -> bool {
        false
    }
}

/// A mutex from a [`PostgresLockProvider`](crate::PostgresLockProvider): the advisory lock
/// `hashtextextended('{schema}/{name}', 0)`.
pub struct PostgresLock {
    shared: Arc<Shared>,
    target: Target,
}

impl PostgresLock {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        let target = Target::new(&shared.config.schema, name, Kind::Mutex);
        PostgresLock { shared, target }
    }
}

impl fmt::Debug for PostgresLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLock")
            .field("name", &self.target.name)
            .field("key", &self.target.key)
            .field("strategy", &self.shared.config.strategy)
            .finish()
    }
}

#[async_trait]
impl MutexAttempt for PostgresLock {
    fn name(&self) -> &LockName {
        &self.target.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        contend(&self.shared, &self.target, Mode::Exclusive, None, deadline)
            .await
            .map_err(|error| error.for_lock(&self.target.name))
    }

    /// The holder and the waiters from `pg_locks` (with `pg_stat_activity`'s
    /// `application_name` as the session): the waiters in the order they began to wait,
    /// which is the order the server grants them in. Only `advisory` waiters wait on the
    /// server; the other strategies' are not seen.
    async fn queue(&self) -> Result<LockQueue, LockError> {
        let conn = self.shared.pool.get().await?;
        let key: &str = &self.target.key;
        let kind = self.target.kind as i64;
        let row: &str = self.target.name.as_str();
        let params = [
            (
                &key as &(dyn tokio_postgres::types::ToSql + Sync),
                Type::TEXT,
            ),
            (&kind, Type::INT8),
            (&row, Type::TEXT),
        ];
        let rows = conn
            .ask(&self.shared.statements(Mode::Exclusive).queue, &params)
            .await
            .map_err(|error| error.for_lock(&self.target.name))?;
        self.shared.pool.put(conn);
        let contenders = rows
            .iter()
            .map(|row| {
                let pid: i32 = row.get(0);
                let granted: bool = row.get(1);
                let place = format!("pid {pid}");
                let mut contender = if granted {
                    QueuedContender::holder(place)
                } else {
                    QueuedContender::waiter(place)
                };
                if let Ok(Some(application)) = row.try_get::<_, Option<String>>(2) {
                    contender = contender.with_session(application);
                }
                if let (true, Ok(Some(token))) = (granted, row.try_get::<_, Option<i64>>(3)) {
                    contender = contender
                        .with_fencing_token(FencingToken(u64::try_from(token).unwrap_or(0)));
                }
                contender.with_detail("pid", pid)
            })
            .collect();
        let queue = LockQueue::new(contenders).at(format!(
            "advisory lock hashtextextended('{}', {kind})",
            self.target.key
        ));
        Ok(match self.shared.config.strategy {
            PostgresStrategy::Advisory => queue,
            _ => queue.without_recorded_waiters(),
        })
    }
}

/// A read-write lock from a [`PostgresLockProvider`](crate::PostgresLockProvider): the
/// advisory lock `hashtextextended('{schema}/{name}', 1)`, shared by readers, exclusive for
/// the writer.
pub struct PostgresRwLock {
    shared: Arc<Shared>,
    target: Target,
}

impl PostgresRwLock {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        let target = Target::new(&shared.config.schema, name, Kind::RwLock);
        PostgresRwLock { shared, target }
    }
}

impl fmt::Debug for PostgresRwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresRwLock")
            .field("name", &self.target.name)
            .field("key", &self.target.key)
            .finish()
    }
}

#[async_trait]
impl RwAttempt for PostgresRwLock {
    fn name(&self) -> &LockName {
        &self.target.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, side: RwSide, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let mode = match side {
            RwSide::Read => Mode::Shared,
            RwSide::Write => Mode::Exclusive,
        };
        contend(&self.shared, &self.target, mode, None, deadline)
            .await
            .map_err(|error| error.for_lock(&self.target.name))
    }
}
