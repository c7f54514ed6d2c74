//! The mutex and the read-write lock: PostgreSQL's session-level advisory locks, on
//! connections the provider's holders share, and a counter row per name for the fencing
//! token.
//!
//! A contender sends one statement that tries the advisory lock and, if it took it, raises
//! the name's counter row (`INSERT ... ON CONFLICT DO UPDATE ... RETURNING`): the lock is
//! granted and the token known in one round trip, and the token is raised only by a
//! holder. The try (`pg_try_advisory_lock`, which fails while anyone waits, so a newcomer
//! never passes the queue) runs on a shared connection that does not hold the lock yet,
//! pipelined with the other holders' statements; a busy lock is then waited for as the
//! strategy says:
//!
//! - `advisory`: on a connection of its own (a waiting statement blocks its connection),
//!   `pg_advisory_lock` waits in the server's queue, which grants the waiters in the order
//!   they asked, one per release; the connection is shared again once granted;
//! - `notify`: the waiter listens on the lock's channel on a connection of its own, and
//!   tries again at each release's `pg_notify` (every waiter does: a herd), or after
//!   `keepalive` (a holder that died notifies nobody);
//! - `polling`: the waiter tries again every `poll_interval`, with jitter.
//!
//! A waiter given up (deadline, dropped future, error) cancels its statement on the
//! server and closes its connection, so nothing of it can be granted later; should the
//! cancel not arrive, the server finds the closed connection within a second
//! (`client_connection_check_interval`, set at connect). A try given up after it was sent
//! is undone by an unlock on its connection, sent behind it. Each connection that holds
//! locks is watched by one task (not one per lock), which fires the lost signal of every
//! lock on it when the connection ends or stops answering. The read-write lock is the same
//! with `pg_advisory_lock_shared` for readers, and always waits in the server's queue,
//! whatever the strategy: the server makes a reader that comes after a waiting writer wait
//! too (a request conflicting with a waiter's joins the queue), so writers are not
//! starved; a writer waiting at home would be.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use lock_core::kit::{
    HeldEntry, MutexAttempt, Removal, RemovalError, RwAttempt, RwSide, Wakeups,
    entry_guard_signalled,
};
use lock_core::queue::{LockQueue, QueuedContender};
use lock_core::{Deadline, FencingToken, Guard, LockError, LockName, LossReason, lost_signal};
use tokio_postgres::types::{ToSql, Type};

use crate::config::PostgresStrategy;
use crate::connection::{Conn, LOOKS, Reserved};
use crate::error::BACKEND;
use crate::shared::{Mode, Shared, Statements};

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

/// One lock of a name: the key text its advisory lock is hashed from, its channel, and its
/// slot on the connections that take it.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) name: LockName,
    /// `{schema}/{name}`: the advisory lock's key is `hashtextextended(key, kind)`.
    pub(crate) key: String,
    pub(crate) kind: Kind,
    /// The channel a release notifies (`notify` strategy).
    pub(crate) channel: String,
    /// The lock's number among a connection's holdings: a hash of the key and the kind
    /// (two locks whose numbers collide only never share a connection).
    pub(crate) slot: u64,
    /// `kind` as the statements' parameter.
    pub(crate) seed: i64,
}

impl Target {
    pub(crate) fn new(schema: &str, name: LockName, kind: Kind) -> Self {
        let key = format!("{schema}/{}", name.as_str());
        let channel = format!("distlock_{:016x}_{}", fnv1a(&key), kind as i64);
        Target::with_key(name, key, kind, channel)
    }

    /// The lock of `name` whose key text is `key`, released with a notification of
    /// `channel`.
    pub(crate) fn with_key(name: LockName, key: String, kind: Kind, channel: String) -> Self {
        let slot = (fnv1a(&key) ^ (kind as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) & !LOOKS;
        Target {
            name,
            key,
            kind,
            channel,
            slot,
            seed: kind as i64,
        }
    }

    /// The statement that unlocks this lock from `statements`, notifying its channel when
    /// `notifies`, and its parameters.
    fn unlock<'a>(
        &'a self,
        statements: &'a Statements,
        notifies: bool,
    ) -> (&'a str, Vec<(&'a (dyn ToSql + Sync), Type)>) {
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> =
            vec![(&self.key, Type::TEXT), (&self.seed, Type::INT8)];
        if !notifies {
            return (&statements.unlock, params);
        }
        params.push((&self.channel, Type::TEXT));
        (&statements.unlock_and_notify, params)
    }
}

/// FNV-1a, 64 bits: a channel name of fixed length for any key.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A contender's connection of its own while it waits: given up (dropped) before the
/// grant, it is cancelled and closed, so that no request of it stays queued on the server.
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

/// A try of a lock on a shared connection, its slot there reserved: given up once its
/// statement may have been sent (dropped, or no answer in time), the lock it may have taken
/// is unlocked by a statement sent behind it, and only then is the slot given up.
struct Trying<'a> {
    reserved: &'a mut Reserved,
    shared: &'a Arc<Shared>,
    target: &'a Arc<Target>,
    mode: Mode,
    /// Whether a release of the lock notifies its channel.
    notifies: bool,
    unanswered: bool,
}

impl Trying<'_> {
    /// The try's answer is known: nothing to undo.
    fn answered(mut self) {
        self.unanswered = false;
    }
}

impl Drop for Trying<'_> {
    fn drop(&mut self) {
        if self.unanswered {
            unlock_in_background(
                Arc::clone(self.shared),
                Arc::clone(self.target),
                (self.mode, self.notifies),
                self.reserved.hand_over(),
            );
        }
    }
}

/// Unlocks `target` on the connection of `reserved` (a try given up, a guard dropped),
/// notifying its channel when its releases do (`notifies`), then gives its slot up. A
/// connection that does not answer within the keepalive, or refuses the unlock, is closed,
/// which frees whatever it held (and fires its holders' signals): a lock it may still hold
/// must not be left to nobody. Runs on the provider's runtime, so a guard dropped on a
/// thread of its own is unlocked too.
fn unlock_in_background(
    shared: Arc<Shared>,
    target: Arc<Target>,
    (mode, notifies): (Mode, bool),
    reserved: Reserved,
) {
    let runtime = shared.runtime.clone();
    runtime.spawn(async move {
        let (unlock, params) = target.unlock(shared.statements(mode), notifies);
        let keepalive = shared.config.keepalive;
        if !matches!(
            reserved.conn.within(keepalive, unlock, &params).await,
            Ok(Ok(_))
        ) {
            reserved.conn.lose_all(&LossReason::Disconnected);
        }
        let conn = Arc::clone(&reserved.conn);
        drop(reserved);
        if conn.is_empty() {
            shared.pool.trim();
        }
    });
}

/// Takes `target` in `mode`, or gives up at `deadline` with `Ok(None)`. A campaign gives
/// its `value`, which the grant writes as the leader's.
pub(crate) async fn contend(
    shared: &Arc<Shared>,
    target: &Arc<Target>,
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
    let key: &str = &target.key;
    let row: &str = target.name.as_str();
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
        (&key, Type::TEXT),
        (&target.seed, Type::INT8),
        (&row, Type::TEXT),
    ];
    if let Some(value) = &value {
        params.push((value, Type::BYTEA));
    }
    if strategy == PostgresStrategy::Notify && !deadline.is_immediate() {
        // A try on a shared connection first; only a busy lock is listened for, on a
        // connection of its own, whose first try after its `LISTEN` sees a release made
        // in between.
        let attempt = (target, mode, statements.try_grant.as_str(), strategy);
        let once = Deadline::after(Some(std::time::Duration::ZERO));
        if let Some(Some(guard)) = try_until_queued(shared, attempt, &params, once).await? {
            return Ok(Some(guard));
        }
        return listen_and_wait(shared, target, &statements.try_grant, &params, deadline).await;
    }
    // A waiter that finds a connection free queues on it at once (its statement tries
    // first): one round trip. Without one, it tries on a shared connection before it opens
    // one, so that holders taken by `acquire` share connections too.
    let free = (strategy == PostgresStrategy::Advisory && !deadline.is_immediate())
        .then(|| shared.pool.free_now())
        .flatten();
    let conn = match free {
        Some(conn) => conn,
        None => {
            let attempt = (target, mode, statements.try_grant.as_str(), strategy);
            if let Some(tried) = try_until_queued(shared, attempt, &params, deadline).await? {
                return Ok(tried);
            }
            shared.pool.for_wait().await?
        }
    };
    queue_on(
        shared,
        target,
        mode,
        conn,
        &statements.grant,
        &params,
        deadline,
    )
    .await
}

/// Tries on a shared connection: the tries' outcome (`Some(None)` when the lock stayed
/// busy until the deadline), or `None` when an `advisory` waiter must now queue on the
/// server. A poller tries again after each `poll_interval`; its slot stays reserved while
/// it sleeps, so its tries go to one connection, whose end ends the wait with an error, as
/// a waiter's own connection would.
async fn try_until_queued(
    shared: &Arc<Shared>,
    (target, mode, try_grant, strategy): (&Arc<Target>, Mode, &str, PostgresStrategy),
    params: &[(&(dyn ToSql + Sync), Type)],
    deadline: Deadline,
) -> Result<Option<Option<Guard>>, LockError> {
    let notifies = strategy == PostgresStrategy::Notify;
    let mut reserved = shared.pool.reserve(target.slot).await?;
    let mut wakeups = Wakeups::new(&shared.metrics);
    loop {
        let conn = Arc::clone(&reserved.conn);
        let trying = Trying {
            reserved: &mut reserved,
            shared,
            target,
            mode,
            notifies,
            unanswered: true,
        };
        let rows = conn.ask(try_grant, params).await?;
        trying.answered();
        if let Some(token) = token_of(&rows) {
            let conn = reserved.kept();
            let guard = grant(shared, target, mode, conn, token, (false, notifies));
            return Ok(Some(Some(guard)));
        }
        wakeups.busy();
        if deadline.is_immediate() || deadline.has_passed() {
            return Ok(Some(None));
        }
        if strategy != PostgresStrategy::Polling {
            return Ok(None);
        }
        let interval = shared.config.poll_interval;
        let jitter = interval.mul_f64(fastrand::f64() / 2.0);
        tokio::time::sleep(deadline.cap(interval + jitter)).await;
        wakeups.woke();
    }
}

/// Waits in the server's queue on `conn`, a connection of its own (the wait blocks it):
/// waiters are granted in the order their statement, which tries once more first, arrived.
/// Shares the connection again once granted.
async fn queue_on(
    shared: &Arc<Shared>,
    target: &Arc<Target>,
    mode: Mode,
    conn: Arc<Conn>,
    grant_statement: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
    deadline: Deadline,
) -> Result<Option<Guard>, LockError> {
    let waiting = Waiting::new(conn);
    let queued = waiting.conn.wait(grant_statement, params);
    let rows = match deadline.remaining() {
        None => queued.await?,
        Some(left) => match tokio::time::timeout(left, queued).await {
            Ok(rows) => rows?,
            // Cancelled and closed as `waiting` drops.
            Err(_) => return Ok(None),
        },
    };
    if rows.first().and_then(|row| row.try_get::<_, bool>(1).ok()) == Some(true) {
        Wakeups::new(&shared.metrics).woke();
    }
    let Some(token) = token_of(&rows) else {
        return Ok(None);
    };
    let conn = waiting.settle();
    let guard = grant(
        shared,
        target,
        mode,
        Arc::clone(&conn),
        token,
        (false, false),
    );
    shared.pool.share(conn);
    Ok(Some(guard))
}

/// The `notify` strategy's wait, on a connection of its own that listens on the lock's
/// channel (before its first try: a release in between is not missed) and tries again at
/// each notification, or after the keepalive.
async fn listen_and_wait(
    shared: &Arc<Shared>,
    target: &Arc<Target>,
    try_grant: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
    deadline: Deadline,
) -> Result<Option<Guard>, LockError> {
    let waiting = Waiting::new(shared.pool.for_wait().await?);
    let conn = Arc::clone(&waiting.conn);
    let listen = format!("LISTEN {}", target.channel);
    let (listened, tried) = tokio::join!(conn.run(&listen), conn.ask(try_grant, params));
    listened?;
    let mut rows = tried?;
    let mut wakeups = Wakeups::new(&shared.metrics);
    loop {
        if let Some(token) = token_of(&rows) {
            let conn = waiting.settle();
            return Ok(Some(grant(
                shared,
                target,
                Mode::Exclusive,
                conn,
                token,
                (true, true),
            )));
        }
        wakeups.busy();
        if deadline.has_passed() {
            // The connection listens: it goes, rather than back to the pool.
            waiting.discard();
            return Ok(None);
        }
        conn.notification(deadline.cap(shared.config.keepalive))
            .await;
        wakeups.woke();
        rows = conn.ask(try_grant, params).await?;
    }
}

/// The token a granting statement returned, if it granted.
pub(crate) fn token_of(rows: &[tokio_postgres::Row]) -> Option<i64> {
    rows.first().and_then(|row| row.try_get::<_, i64>(0).ok())
}

/// The guard of a lock granted on `conn`: released by unlocking on that connection, lost
/// when the connection ends or stops answering (its watch, started with its first lock,
/// fires the signal). `listening`: the connection listens on the lock's channel (it is the
/// holder's own until the release stops that); `notifies`: its release notifies the
/// channel.
pub(crate) fn grant(
    shared: &Arc<Shared>,
    target: &Arc<Target>,
    mode: Mode,
    conn: Arc<Conn>,
    token: i64,
    (listening, notifies): (bool, bool),
) -> Guard {
    shared.metrics.record_grant();
    let (notifier, lost) = lost_signal();
    if conn.hold(target.slot, notifier) {
        tokio::spawn(watch_connection(Arc::clone(&conn), Arc::clone(shared)));
    }
    let held = HeldLock {
        conn: Some(conn),
        shared: Arc::clone(shared),
        target: Arc::clone(target),
        mode,
        listening,
        notifies,
    };
    let token = FencingToken(u64::try_from(token).unwrap_or_default());
    entry_guard_signalled(&target.name, token, held, lost)
}

/// Watches a connection while it holds locks: fires the lost signal of every lock on it
/// when the connection ends (its server process was terminated, the server restarted),
/// when a check (`SELECT pg_backend_pid()` every third of the keepalive) has no answer
/// within the keepalive or names another server process (a pooler moved the session), or
/// when the provider is closed; the connection is then closed, which frees its locks on the
/// server. Ends once the connection holds nothing.
async fn watch_connection(conn: Arc<Conn>, shared: Arc<Shared>) {
    let keepalive = shared.config.keepalive;
    let reason = loop {
        tokio::select! {
            () = conn.closed() => break LossReason::SessionExpired,
            () = shared.closed.wait() => break LossReason::SessionExpired,
            () = tokio::time::sleep(keepalive / 3) => {
                if !conn.keep_watching() {
                    return;
                }
                let waits = conn.waits();
                match conn.within(keepalive, "SELECT pg_backend_pid()", &[]).await {
                    // A check queued behind a wait that took the connection once it held
                    // nothing: not an answer missed.
                    Err(_) if conn.is_empty() || conn.waits() != waits => {}
                    Err(_) => break LossReason::Disconnected,
                    // A pooler handed the connection another server session: the locks
                    // stay with the one that took them.
                    Ok(Ok(rows)) if backend_pid(&rows).is_some_and(|pid| pid != conn.pid) => {
                        break LossReason::Other(MOVED_SESSION.to_owned());
                    }
                    Ok(_) => {}
                }
            }
        }
    };
    conn.lose_all(&reason);
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
    /// The holder's connection, until the release.
    conn: Option<Arc<Conn>>,
    shared: Arc<Shared>,
    target: Arc<Target>,
    mode: Mode,
    /// Whether the connection listens on the lock's channel (`notify`, a semaphore's
    /// permit): the holder's own connection, out of the pool until it stops listening.
    listening: bool,
    /// Whether its release notifies the lock's channel (a `notify` mutex, a permit).
    notifies: bool,
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
    /// After the release: a listening connection stops listening and is shared again; a
    /// shared one that now holds nothing may be closed.
    fn give_back(&self, conn: Arc<Conn>) {
        let shared = Arc::clone(&self.shared);
        if !self.listening {
            if conn.is_empty() {
                shared.pool.trim();
            }
            return;
        }
        tokio::spawn(async move {
            if conn.run("UNLISTEN *").await.is_ok() {
                shared.pool.share(conn);
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
        // An unlock of ours sent before may have been applied: an unlock that finds the
        // lock not held then means that one did.
        let in_doubt = sent.load(Ordering::Acquire);
        let statements = self.shared.statements(self.mode);
        let (unlock, params) = self.target.unlock(statements, self.notifies);
        sent.store(true, Ordering::Release);
        match conn.ask(unlock, &params).await {
            Ok(rows) => {
                self.conn = None;
                conn.vacate(self.target.slot);
                let unlocked = rows.first().and_then(|row| row.try_get::<_, bool>(0).ok());
                if unlocked == Some(true) || in_doubt {
                    self.give_back(conn);
                    Ok(if unlocked == Some(true) {
                        Removal::Removed
                    } else {
                        Removal::Gone
                    })
                } else {
                    // Not held by the session the connection reaches: neither are the
                    // other locks taken on it.
                    conn.lose_all(&LossReason::Other(MOVED_SESSION.to_owned()));
                    Ok(Removal::Gone)
                }
            }
            Err(_) if conn.is_closed() => Err(RemovalError::SessionOver),
            Err(error @ LockError::Connection { .. }) => Err(RemovalError::Unknown(error)),
            Err(error) => Err(RemovalError::Failed(error)),
        }
    }

    fn forget(&self) {}

    /// Unlocks in the background, on the holder's connection; a listening connection (the
    /// holder's own) is closed instead, which frees the lock.
    fn abandon(self: Box<Self>) {
        let Some(conn) = self.conn else {
            return;
        };
        if self.listening {
            conn.close();
            return;
        }
        let reserved = Reserved::new(conn, self.target.slot);
        let mode = (self.mode, self.notifies);
        unlock_in_background(self.shared, self.target, mode, reserved);
    }

    fn is_suspect(&self) -> bool {
        false
    }
}

/// A mutex from a [`PostgresLockProvider`](crate::PostgresLockProvider): the advisory lock
/// `hashtextextended('{schema}/{name}', 0)`.
pub struct PostgresLock {
    shared: Arc<Shared>,
    target: Arc<Target>,
}

impl PostgresLock {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        let target = Arc::new(Target::new(&shared.config.schema, name, Kind::Mutex));
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
        let look = self.shared.pool.look().await?;
        let key: &str = &self.target.key;
        let row: &str = self.target.name.as_str();
        let params = [
            (
                &key as &(dyn tokio_postgres::types::ToSql + Sync),
                Type::TEXT,
            ),
            (&self.target.seed, Type::INT8),
            (&row, Type::TEXT),
        ];
        let rows = look
            .conn
            .ask(&self.shared.statements(Mode::Exclusive).queue, &params)
            .await
            .map_err(|error| error.for_lock(&self.target.name))?;
        drop(look);
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
            "advisory lock hashtextextended('{}', {})",
            self.target.key, self.target.seed
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
    target: Arc<Target>,
}

impl PostgresRwLock {
    pub(crate) fn new(shared: Arc<Shared>, name: LockName) -> Self {
        let target = Arc::new(Target::new(&shared.config.schema, name, Kind::RwLock));
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
