//! Server connections. A PostgreSQL advisory lock belongs to the connection that took it,
//! and the server stacks a lock taken twice by one connection, so a connection keeps the
//! set of locks it holds or is trying ([`Holdings`]) and never takes one twice. The
//! provider's [`Pool`] shares its connections between holders: tries, releases and looks
//! are statements that never wait for a lock, pipelined on whichever connection does not
//! hold the lock already; a wait in the server's queue blocks its connection, so it takes one that
//! holds nothing, which holds the lock once granted and is shared again.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::poll_fn;
use lock_core::kit::unpoisoned;
use lock_core::{LockError, LossReason, LostNotifier, Metrics};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls, Row, Socket};

use crate::error::{BACKEND, from_pg, no_answer};
use crate::tls::Tls;

/// How many connections that hold nothing a provider keeps open.
const MAX_IDLE: usize = 16;

/// The most locks one connection holds or tries. The server walks a connection's whole
/// table of locks at the end of each of its transactions (every statement), so a statement
/// on a connection holding many locks costs that much more: `SELECT 1` took 0.13, 0.2, 1
/// and 14 ms on a connection holding 0, 1 000, 10 000 and 100 000 (PostgreSQL 15).
const MAX_HELD: usize = 1_000;

/// One server connection: its client, the server process serving it, and its driver's
/// news (closed, notifications).
#[derive(Debug)]
pub(crate) struct Conn {
    client: Client,
    /// The TLS connector it was opened with, for its cancel requests.
    tls: Option<Tls>,
    /// The server process's id (`pg_backend_pid()`), as `pg_locks` names it.
    pub(crate) pid: i32,
    /// Set when the driver ended: the connection is closed.
    ended: watch::Receiver<bool>,
    /// Set to close the connection at once, whoever still holds the client.
    close: watch::Sender<bool>,
    /// One message per notification of a channel the connection listens on.
    notified: tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>,
    /// The bound on a request that does not wait for a lock.
    pub(crate) timeout: Duration,
    /// Counts every statement sent, as the provider's server requests.
    metrics: Arc<Metrics>,
    /// The locks held or tried on the connection.
    holdings: Mutex<Holdings>,
}

/// The locks of one connection: a slot per lock held or being tried (by the lock's slot
/// number, see [`Target`](crate::lock::Target)), with the holder's lost signal once
/// granted; whether the connection's watch runs (while anything is held or tried); how
/// many times it was taken for a wait; and, once its locks were lost, why.
#[derive(Debug, Default)]
struct Holdings {
    slots: HashMap<u64, Option<LostNotifier>>,
    watched: bool,
    waits: u64,
    lost: Option<LossReason>,
}

impl Conn {
    /// Connects within `timeout` (through `tls` when given) and learns the server
    /// process's id. The connection's driver runs in a task of its own until the server or
    /// [`close`](Self::close) ends it.
    pub(crate) async fn open(
        pg: &tokio_postgres::Config,
        tls: Option<&Tls>,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Conn, LockError> {
        let (ended_tx, ended) = watch::channel(false);
        let (close, closing) = watch::channel(false);
        let (notify, notified) = mpsc::unbounded_channel();
        let driven = Driven {
            ended: ended_tx,
            closing,
            notify,
        };
        let client = match tls {
            None => connect(pg, NoTls, timeout, driven).await?,
            Some(tls) => connect(pg, tls.0.clone(), timeout, driven).await?,
        };
        let mut conn = Conn {
            client,
            tls: tls.cloned(),
            pid: 0,
            ended,
            close,
            notified: tokio::sync::Mutex::new(notified),
            timeout,
            metrics,
            holdings: Mutex::new(Holdings::default()),
        };
        conn.pid = conn.session_setup().await?;
        Ok(conn)
    }

    /// Learns the server process's id and, in the same statement (one turn of a pooler
    /// that hands statements out in turn, as its checks expect), asks a Linux server of
    /// version 14 or later to look for a closed connection every second while a statement
    /// runs: a waiter whose connection was closed (a killed process, a reset) and whose
    /// cancel request never arrived then leaves the lock's queue at once, rather than when
    /// the lock is free and granted to nobody. (Servers elsewhere may refuse the setting,
    /// which would fail the statement: they are not asked.)
    async fn session_setup(&self) -> Result<i32, LockError> {
        const SETUP: &str = "SELECT pg_backend_pid(), CASE \
             WHEN current_setting('server_version_num')::int >= 140000 \
             AND version() ILIKE '%linux%' \
             THEN set_config('client_connection_check_interval', '1s', false) END";
        Self::pid_of(self.ask(SETUP, &[]).await?)
    }

    /// The server process serving the connection's next statement (`pg_backend_pid()`):
    /// always [`pid`](Self::pid) on a connection of its own, another through a pooler that
    /// shares server sessions.
    pub(crate) async fn server_pid(&self) -> Result<i32, LockError> {
        Self::pid_of(self.ask("SELECT pg_backend_pid()", &[]).await?)
    }

    /// The process id in the first column of `rows`.
    fn pid_of(rows: Vec<Row>) -> Result<i32, LockError> {
        let pid = rows.first().and_then(|row| row.try_get::<_, i32>(0).ok());
        pid.ok_or_else(|| LockError::Backend {
            backend: BACKEND,
            name: None,
            message: "pg_backend_pid() answered no process id".to_owned(),
            retryable: true,
            source: None,
        })
    }

    /// Sends one statement (unnamed, one round trip) and waits for its rows at most the
    /// connection's timeout.
    pub(crate) async fn ask(
        &self,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, LockError> {
        self.within(self.timeout, statement, params).await?
    }

    /// Sends one statement and waits for its rows at most `bound`; `Ok(Err(..))` when the
    /// server answered with an error, `Err(..)` when it did not answer in time.
    pub(crate) async fn within(
        &self,
        bound: Duration,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Result<Vec<Row>, LockError>, LockError> {
        let what = statement.split_whitespace().next().unwrap_or("a statement");
        self.metrics.record_server_requests(1);
        match tokio::time::timeout(bound, self.client.query_typed(statement, params)).await {
            Ok(answer) => Ok(answer.map_err(|error| from_pg(error, what))),
            Err(_) => Err(no_answer(what, bound)),
        }
    }

    /// Sends one statement and waits for its rows as long as it takes (a wait for a lock).
    pub(crate) fn wait<'a>(
        &'a self,
        statement: &'a str,
        params: &'a [(&'a (dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, LockError>> + Send + 'a {
        let what = statement.split_whitespace().next().unwrap_or("a statement");
        self.metrics.record_server_requests(1);
        async move {
            self.client
                .query_typed(statement, params)
                .await
                .map_err(|error| from_pg(error, what))
        }
    }

    /// Runs `statements` (no parameters), as `LISTEN` and `UNLISTEN` need.
    pub(crate) async fn run(&self, statements: &str) -> Result<(), LockError> {
        self.metrics.record_server_requests(1);
        match tokio::time::timeout(self.timeout, self.client.batch_execute(statements)).await {
            Ok(done) => done.map_err(|error| from_pg(error, "a statement")),
            Err(_) => Err(no_answer("a statement", self.timeout)),
        }
    }

    /// Waits for a notification of a channel the connection listens on, or `bound`;
    /// `true` when one came.
    pub(crate) async fn notification(&self, bound: Duration) -> bool {
        let mut notified = self.notified.lock().await;
        matches!(
            tokio::time::timeout(bound, notified.recv()).await,
            Ok(Some(()))
        )
    }

    /// Forgets the notifications received so far.
    pub(crate) fn drain_notifications(&self) {
        if let Ok(mut notified) = self.notified.try_lock() {
            while notified.try_recv().is_ok() {}
        }
    }

    /// Whether the connection is closed (by the server, the network, or [`close`](Self::close),
    /// whose driver may not have ended yet).
    pub(crate) fn is_closed(&self) -> bool {
        *self.close.borrow() || *self.ended.borrow() || self.client.is_closed()
    }

    /// Resolves once the connection is closed.
    pub(crate) async fn closed(&self) {
        let mut ended = self.ended.clone();
        let _ = ended.wait_for(|ended| *ended).await;
    }

    /// Closes the connection now: the server ends its process, which frees every lock the
    /// connection held.
    pub(crate) fn close(&self) {
        self.close.send_replace(true);
    }

    /// Takes the slot `slot` for a try of its lock; `false` when the connection holds that
    /// lock or tries it already, or holds [`MAX_HELD`] locks.
    pub(crate) fn reserve(&self, slot: u64) -> bool {
        let mut holdings = unpoisoned(&self.holdings);
        if holdings.lost.is_some()
            || holdings.slots.len() >= MAX_HELD
            || holdings.slots.contains_key(&slot)
        {
            return false;
        }
        holdings.slots.insert(slot, None);
        true
    }

    /// Gives the slot `slot` up: its lock is not held (the try failed, or the lock was
    /// released).
    pub(crate) fn vacate(&self, slot: u64) {
        unpoisoned(&self.holdings).slots.remove(&slot);
    }

    /// Records the lock of `slot` as held, with its holder's `notifier`; `true` when the
    /// connection's watch must be started (nothing was held). A grant answered after the
    /// connection's locks were lost is lost at once.
    pub(crate) fn hold(&self, slot: u64, notifier: LostNotifier) -> bool {
        let mut holdings = unpoisoned(&self.holdings);
        if let Some(reason) = holdings.lost.clone() {
            drop(holdings);
            notifier.fire(reason);
            return false;
        }
        holdings.slots.insert(slot, Some(notifier));
        !std::mem::replace(&mut holdings.watched, true)
    }

    /// How many times the connection was taken for a wait: a check sent before a wait
    /// began may go unanswered until the wait ends.
    pub(crate) fn waits(&self) -> u64 {
        unpoisoned(&self.holdings).waits
    }

    /// Whether the connection's watch should go on: `false` (and the watch is over) once
    /// nothing is held or tried.
    pub(crate) fn keep_watching(&self) -> bool {
        let mut holdings = unpoisoned(&self.holdings);
        holdings.watched = !holdings.slots.is_empty();
        holdings.watched
    }

    /// Whether the connection holds or tries nothing.
    pub(crate) fn is_empty(&self) -> bool {
        unpoisoned(&self.holdings).slots.is_empty()
    }

    /// Closes the connection and fires the lost signal of every lock it held, for `reason`.
    pub(crate) fn lose_all(&self, reason: &LossReason) {
        self.close();
        // A grant answered after this is lost at once (see `hold`), and no try starts.
        let slots = {
            let mut holdings = unpoisoned(&self.holdings);
            holdings.lost.get_or_insert_with(|| reason.clone());
            std::mem::take(&mut holdings.slots)
        };
        let fired = slots
            .into_values()
            .flatten()
            .filter(|notifier| notifier.fire(reason.clone()))
            .count();
        if fired > 0 {
            tracing::debug!(pid = self.pid, fired, %reason, "postgres: the locks of a connection are lost");
        }
    }

    /// Cancels the statement the connection is running (a wait for a lock), then closes
    /// it: a waiter given up leaves no request behind that the server could grant later.
    /// Runs in the background; without a runtime (the process is ending), only closes.
    pub(crate) fn cancel_and_close(self: Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.close();
            return;
        };
        let cancel = self.client.cancel_token();
        runtime.spawn(async move {
            let cancelled = match self.tls.clone() {
                None => tokio::time::timeout(self.timeout, cancel.cancel_query(NoTls)).await,
                Some(tls) => tokio::time::timeout(self.timeout, cancel.cancel_query(tls.0)).await,
            };
            if !matches!(cancelled, Ok(Ok(()))) {
                tracing::debug!(pid = self.pid, "postgres: a cancel went unanswered");
            }
            self.close();
        });
    }
}

/// What a connection's driver tells, and listens to.
struct Driven {
    /// Set when the driver ended.
    ended: watch::Sender<bool>,
    /// Set to close the connection.
    closing: watch::Receiver<bool>,
    /// One message per notification.
    notify: mpsc::UnboundedSender<()>,
}

/// Connects within `timeout` through `tls`, and spawns the connection's driver.
async fn connect<T>(
    pg: &tokio_postgres::Config,
    tls: T,
    timeout: Duration,
    driven: Driven,
) -> Result<Client, LockError>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = tokio::time::timeout(timeout, pg.connect(tls))
        .await
        .map_err(|_| no_answer("connecting", timeout))?
        .map_err(|error| from_pg(error, "connecting"))?;
    tokio::spawn(drive(connection, driven));
    Ok(client)
}

/// Drives `connection` until the server ends it or it is closed: passes notifications on,
/// and says when it ended.
async fn drive<S, T>(mut connection: Connection<S, T>, driven: Driven)
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let Driven {
        ended: ended_tx,
        mut closing,
        notify,
    } = driven;
    loop {
        let message = tokio::select! {
            message = poll_fn(|cx| connection.poll_message(cx)) => message,
            _ = closing.wait_for(|close| *close) => break,
        };
        match message {
            Some(Ok(AsyncMessage::Notification(_))) => {
                let _ = notify.send(());
            }
            Some(Ok(_)) => {}
            Some(Err(error)) => {
                tracing::debug!(%error, "postgres: the connection ended");
                break;
            }
            None => break,
        }
    }
    ended_tx.send_replace(true);
}

/// A provider's connections that run no wait: they serve tries, releases and looks, and
/// hold the locks granted on them. A connection taken for a wait
/// ([`for_wait`](Pool::for_wait)) is out of the pool until it is shared again.
#[derive(Debug)]
pub(crate) struct Pool {
    pg: tokio_postgres::Config,
    tls: Option<Tls>,
    timeout: Duration,
    metrics: Arc<Metrics>,
    open: Mutex<Vec<Arc<Conn>>>,
    /// Held while a connection for tries is opened.
    connecting: tokio::sync::Mutex<()>,
    /// Numbers the looks' slots.
    looks: AtomicU64,
    /// Set when the provider is closed.
    cleared: AtomicBool,
}

/// The bit that sets a look's slot apart from a lock's.
pub(crate) const LOOKS: u64 = 1 << 63;

/// A slot taken on a shared connection: given up when dropped, unless
/// [`kept`](Reserved::kept) for a grant.
#[derive(Debug)]
pub(crate) struct Reserved {
    pub(crate) conn: Arc<Conn>,
    slot: u64,
    armed: bool,
}

impl Reserved {
    /// The slot `slot` of `conn`, taken for a try or held by a grant.
    pub(crate) fn new(conn: Arc<Conn>, slot: u64) -> Self {
        Reserved {
            conn,
            slot,
            armed: true,
        }
    }

    /// The slot, handed to a new owner: this one no longer gives it up.
    pub(crate) fn hand_over(&mut self) -> Reserved {
        self.armed = false;
        Reserved::new(Arc::clone(&self.conn), self.slot)
    }

    /// The connection, its slot kept (the try granted: [`Conn::hold`] fills it).
    pub(crate) fn kept(mut self) -> Arc<Conn> {
        self.armed = false;
        Arc::clone(&self.conn)
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.armed {
            self.conn.vacate(self.slot);
        }
    }
}

impl Pool {
    pub(crate) fn new(
        pg: tokio_postgres::Config,
        tls: Option<Tls>,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Pool {
            pg,
            tls,
            timeout,
            metrics,
            open: Mutex::new(Vec::new()),
            connecting: tokio::sync::Mutex::new(()),
            looks: AtomicU64::new(0),
            cleared: AtomicBool::new(false),
        }
    }

    /// A new connection; none once the provider is closed.
    async fn connect(&self) -> Result<Arc<Conn>, LockError> {
        if self.cleared.load(Ordering::Acquire) {
            return Err(LockError::SessionExpired {
                backend: BACKEND,
                name: None,
            });
        }
        Conn::open(
            &self.pg,
            self.tls.as_ref(),
            self.timeout,
            Arc::clone(&self.metrics),
        )
        .await
        .map(Arc::new)
    }

    /// A shared connection with the slot `slot` taken for a try (the first that does not
    /// hold that lock and has room, so that the locks gather on few connections), or a new
    /// one.
    pub(crate) async fn reserve(&self, slot: u64) -> Result<Reserved, LockError> {
        if let Some(reserved) = self.reserve_open(slot) {
            return Ok(reserved);
        }
        // One connection opened at a time: the tries that found no room wait for it (as
        // long as one connection may take), rather than each opening one.
        let _connecting = tokio::time::timeout(self.timeout, self.connecting.lock())
            .await
            .map_err(|_| no_answer("connecting", self.timeout))?;
        if let Some(reserved) = self.reserve_open(slot) {
            return Ok(reserved);
        }
        let conn = self.connect().await?;
        conn.reserve(slot);
        unpoisoned(&self.open).push(Arc::clone(&conn));
        Ok(Reserved::new(conn, slot))
    }

    /// [`reserve`](Self::reserve) on the connections open now. Closed ones are skipped here
    /// and dropped by the next [`trim`](Self::trim) (a release that empties a connection).
    fn reserve_open(&self, slot: u64) -> Option<Reserved> {
        let open = unpoisoned(&self.open);
        let conn = open
            .iter()
            .find(|conn| !conn.is_closed() && conn.reserve(slot))?;
        Some(Reserved::new(Arc::clone(conn), slot))
    }

    /// A shared connection for a look (a slot of its own keeps it from being taken for a
    /// wait meanwhile), or a new one.
    pub(crate) async fn look(&self) -> Result<Reserved, LockError> {
        let slot = LOOKS | self.looks.fetch_add(1, Ordering::Relaxed);
        self.reserve(slot).await
    }

    /// A connection of its own for a wait: one of the pool's that holds and tries nothing,
    /// taken out of it, or a new one.
    pub(crate) async fn for_wait(&self) -> Result<Arc<Conn>, LockError> {
        match self.free_now() {
            Some(conn) => Ok(conn),
            None => self.connect().await,
        }
    }

    /// One of the pool's connections that holds and tries nothing, taken out of it for a
    /// wait, if there is one.
    pub(crate) fn free_now(&self) -> Option<Arc<Conn>> {
        let conn = {
            let mut open = unpoisoned(&self.open);
            open.retain(|conn| !conn.is_closed());
            let at = open.iter().rposition(|conn| conn.is_empty())?;
            open.swap_remove(at)
        };
        unpoisoned(&conn.holdings).waits += 1;
        conn.drain_notifications();
        Some(conn)
    }

    /// Shares `conn` again (its wait is over; it may hold the lock it waited for), closing
    /// connections that hold nothing beyond [`MAX_IDLE`]; it must listen on no channel.
    pub(crate) fn share(&self, conn: Arc<Conn>) {
        if self.cleared.load(Ordering::Acquire) {
            conn.close();
        }
        if conn.is_closed() {
            return;
        }
        unpoisoned(&self.open).push(conn);
        self.trim();
    }

    /// Drops the closed connections, and closes the shared connections that hold nothing
    /// beyond [`MAX_IDLE`] of them.
    pub(crate) fn trim(&self) {
        let mut open = unpoisoned(&self.open);
        let mut idle = 0;
        open.retain(|conn| {
            if conn.is_closed() {
                return false;
            }
            if !conn.is_empty() {
                return true;
            }
            idle += 1;
            if idle <= MAX_IDLE {
                return true;
            }
            conn.close();
            false
        });
    }

    /// Closes every shared connection (their watches then fire their holders' signals),
    /// and every one shared or asked for later.
    pub(crate) fn clear(&self) {
        self.cleared.store(true, Ordering::Release);
        for conn in unpoisoned(&self.open).drain(..) {
            conn.close();
        }
    }
}
