//! Server connections: one per contender while it waits or holds (a PostgreSQL advisory
//! lock belongs to the connection that took it), and a few idle ones kept for the next.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::poll_fn;
use lock_core::kit::unpoisoned;
use lock_core::{LockError, Metrics};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls, Row, Socket};

use crate::error::{BACKEND, from_pg, no_answer};
use crate::tls::Tls;

/// How many idle connections a provider keeps.
const MAX_IDLE: usize = 16;

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

    /// Whether the connection is closed (by the server, the network, or [`close`](Self::close)).
    pub(crate) fn is_closed(&self) -> bool {
        *self.ended.borrow() || self.client.is_closed()
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

/// The idle connections of a provider, and how to open more.
#[derive(Debug)]
pub(crate) struct Pool {
    pg: tokio_postgres::Config,
    tls: Option<Tls>,
    timeout: Duration,
    metrics: Arc<Metrics>,
    idle: Mutex<Vec<Arc<Conn>>>,
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
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An idle connection that is still open, or a new one.
    pub(crate) async fn get(&self) -> Result<Arc<Conn>, LockError> {
        loop {
            let Some(conn) = unpoisoned(&self.idle).pop() else {
                break;
            };
            if !conn.is_closed() {
                conn.drain_notifications();
                return Ok(conn);
            }
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

    /// Keeps `conn` for the next contender; it must hold no lock and listen on no channel.
    pub(crate) fn put(&self, conn: Arc<Conn>) {
        let mut idle = unpoisoned(&self.idle);
        if !conn.is_closed() && idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// Closes every idle connection.
    pub(crate) fn clear(&self) {
        for conn in unpoisoned(&self.idle).drain(..) {
            conn.close();
        }
    }
}
