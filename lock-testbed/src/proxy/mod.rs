//! A fault-injecting TCP proxy for tests: faults on the wire between a client and its server.
//!
//! [`FaultProxy`] listens on `127.0.0.1` (a free port) in front of one upstream server. A client
//! connects to [`FaultControl::address`] instead of the server, and the test switches faults on and
//! off at any time through the proxy (or a cloned [`FaultControl`]):
//!
//! | call | effect |
//! |---|---|
//! | [`pass`](FaultControl::pass) | forward both ways (the default) |
//! | [`cut`](FaultControl::cut) | close every connection now, refuse new ones until `pass` |
//! | [`black_hole`](FaultControl::black_hole) | keep connections open, drop every byte both ways |
//! | [`delay`](FaultControl::delay) | forward with an added latency per chunk, each way |
//! | [`swallow_next_reply`](FaultControl::swallow_next_reply) | drop one reply and cut that connection |
//!
//! [`ReplyKind::ZkCreate`] reads ZooKeeper's framing to make "the server created the node but the
//! client never heard" happen on purpose ([`ReplyKind::ZkDelete`] the same for a delete);
//! [`ReplyKind::PgStatement`] reads PostgreSQL's to do it to a statement (a lock granted,
//! never heard of); [`ReplyKind::AnyNextReply`] does the same for any request/response protocol
//! (Redis) by dropping the next chunk the server sends.
//!
//! ```no_run
//! # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
//! use lock_testbed::proxy::{FaultProxy, ReplyKind};
//! use std::time::Duration;
//!
//! let proxy = FaultProxy::start(server)?;
//! let client_target = proxy.address(); // point the client here
//!
//! proxy.delay(Duration::from_millis(50));
//! let swallow = proxy.swallow_next_reply(ReplyKind::ZkCreate);
//! // ... the client creates a node; the server creates it, the client sees a connection loss ...
//! let event = tokio::time::timeout(Duration::from_secs(5), swallow.wait()).await;
//! proxy.pass();
//! proxy.shutdown().await;
//! # let _ = (client_target, event);
//! # Ok(())
//! # }
//! ```

mod conn;
mod pg;
mod zk;

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

/// What the proxy currently does with connections and bytes.
///
/// ```
/// use lock_testbed::proxy::Mode;
/// use std::time::Duration;
///
/// assert_eq!(Mode::default(), Mode::Pass);
/// assert_ne!(Mode::Delay(Duration::from_millis(5)), Mode::Pass);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Forward both ways.
    #[default]
    Pass,
    /// Close every connection; accept and immediately close new ones.
    Cut,
    /// Keep connections open but drop every byte both ways. New connections are accepted but
    /// not connected upstream until the mode changes.
    BlackHole,
    /// Forward each chunk after this added latency, in each direction, keeping order.
    Delay(Duration),
}

/// Which reply [`FaultControl::swallow_next_reply`] drops.
///
/// ```
/// use lock_testbed::proxy::ReplyKind;
///
/// let kind = ReplyKind::ZkCreate;
/// assert_ne!(kind, ReplyKind::AnyNextReply);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReplyKind {
    /// The reply to the next ZooKeeper create request forwarded on any connection (ops create 1,
    /// multi 14, create2 15, createContainer 19, createTTL 21; the connect handshake, pings and
    /// watch notifications are never touched). The request reaches the server; when the reply
    /// with that request's xid comes back, the reply is dropped and that connection is cut.
    ZkCreate,
    /// The reply to the next ZooKeeper delete request (op 2) forwarded on any connection, in
    /// the same way: the server acts on the delete, the client sees its connection drop.
    ZkDelete,
    /// The next chunk the server sends on any connection: it is dropped and that connection is
    /// cut. Meant for request/response protocols such as Redis (arm it, then send one command).
    AnyNextReply,
    /// The reply to the next PostgreSQL statement whose text contains this one, sent on any
    /// connection (in a simple `Query`, or in the `Parse` that tokio-postgres sends with the
    /// statement's `Execute`; plain connections only): the server runs the statement, and
    /// what it sends next on that connection is dropped and the connection cut.
    PgStatement(&'static str),
}

/// What happened when a reply was swallowed.
///
/// ```
/// # fn show(event: lock_testbed::proxy::SwallowEvent) {
/// println!("connection {} lost the reply to xid {:?}", event.connection, event.xid);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SwallowEvent {
    /// Which kind of swallow this was.
    pub kind: ReplyKind,
    /// The connection that lost the reply (1 for the first connection the proxy accepted).
    pub connection: u64,
    /// The xid of the swallowed ZooKeeper reply (`None` for the other kinds).
    pub xid: Option<i32>,
    /// The zxid the server stamped on the swallowed reply.
    pub zxid: Option<i64>,
    /// The error code of the swallowed reply (0: the operation succeeded on the server).
    pub err: Option<i32>,
}

/// A snapshot of the proxy's counters.
///
/// ```
/// # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
/// let proxy = lock_testbed::proxy::FaultProxy::start(server)?;
/// let stats = proxy.stats();
/// assert_eq!(stats.accepted, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ProxyStats {
    /// Connections accepted, including those refused while cut.
    pub accepted: u64,
    /// Connections accepted while cut and closed at once.
    pub refused: u64,
    /// Connections currently open (client side).
    pub open: u64,
    /// Bytes written to the upstream server.
    pub bytes_to_upstream: u64,
    /// Bytes written to clients.
    pub bytes_to_client: u64,
    /// Bytes read but dropped (black hole, swallowed replies, data behind a swallowed reply).
    pub bytes_dropped: u64,
    /// Replies swallowed.
    pub swallowed: u64,
}

/// State shared by the proxy, its control handles, and its tasks.
struct Shared {
    address: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    armed: Mutex<VecDeque<Arc<Slot>>>,
    accepted: AtomicU64,
    refused: AtomicU64,
    open: AtomicU64,
    to_upstream: AtomicU64,
    to_client: AtomicU64,
    dropped: AtomicU64,
    swallowed: AtomicU64,
}

impl Shared {
    fn armed(&self) -> MutexGuard<'_, VecDeque<Arc<Slot>>> {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the first armed swallow of this kind, if any.
    fn claim(&self, kind: ReplyKind) -> Option<Arc<Slot>> {
        self.claim_where(|armed| armed == kind)
    }

    /// Takes the first armed swallow whose kind `wanted` accepts, if any.
    fn claim_where(&self, wanted: impl Fn(ReplyKind) -> bool) -> Option<Arc<Slot>> {
        let mut armed = self.armed();
        let at = armed.iter().position(|s| wanted(s.kind))?;
        armed.remove(at)
    }

    /// Puts back a claimed swallow whose connection ended before the reply came.
    fn rearm(&self, slot: Arc<Slot>) {
        if !slot.disarmed.load(Ordering::Acquire) && slot.done.borrow().is_none() {
            self.armed().push_front(slot);
        }
    }

    fn mode(&self) -> Mode {
        *self.mode.borrow()
    }
}

/// One armed swallow.
struct Slot {
    kind: ReplyKind,
    disarmed: AtomicBool,
    done: watch::Sender<Option<SwallowEvent>>,
}

/// Cheap, cloneable control of a running [`FaultProxy`]: switch modes, arm swallows, read
/// counters. It stays usable (doing nothing) after the proxy is gone.
///
/// ```no_run
/// # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
/// let proxy = lock_testbed::proxy::FaultProxy::start(server)?;
/// let control = proxy.control();
/// tokio::spawn(async move {
///     tokio::time::sleep(std::time::Duration::from_millis(100)).await;
///     control.cut();
/// });
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct FaultControl {
    shared: Arc<Shared>,
}

impl fmt::Debug for FaultControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultControl")
            .field("address", &self.shared.address)
            .field("upstream", &self.shared.upstream)
            .field("mode", &self.shared.mode())
            .finish_non_exhaustive()
    }
}

impl FaultControl {
    /// The address clients connect to (the proxy's listener).
    pub fn address(&self) -> SocketAddr {
        self.shared.address
    }

    /// The upstream server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// Switches to `mode`; it applies at once to current and new connections.
    pub fn set_mode(&self, mode: Mode) {
        let old = self.shared.mode.send_replace(mode);
        if old != mode {
            tracing::debug!(proxy = %self.shared.address, ?old, new = ?mode, "proxy mode");
        }
    }

    /// Forwards both ways (the default; ends any other mode).
    pub fn pass(&self) {
        self.set_mode(Mode::Pass);
    }

    /// Closes every current connection at once (both the client's and the upstream one), and
    /// accepts then immediately closes new connections until another mode is set.
    pub fn cut(&self) {
        self.set_mode(Mode::Cut);
    }

    /// Keeps accepting and keeps connections open, but drops every byte both ways, so clients
    /// see a silent server and their own timeouts must fire. A connection the server closes
    /// meanwhile stays open on the client side until the mode changes. New connections are not
    /// connected upstream until the mode changes. Bytes dropped are gone: after
    /// [`pass`](Self::pass) the stream resumes with a gap.
    pub fn black_hole(&self) {
        self.set_mode(Mode::BlackHole);
    }

    /// Forwards every chunk `latency` after it was read, in each direction, keeping order (a
    /// request/response round trip therefore takes at least twice `latency`). Chunks already
    /// read keep the due time they got when read.
    pub fn delay(&self, latency: Duration) {
        self.set_mode(Mode::Delay(latency));
    }

    /// Arms one swallow of the next reply of `kind` (see [`ReplyKind`]): the reply is dropped
    /// and its connection is cut at that moment. Each call arms one more. The returned handle
    /// tells when it happened; dropping the handle does not disarm it. If the connection that
    /// claimed it ends before the reply arrives, the swallow is armed again.
    ///
    /// ```no_run
    /// # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
    /// use lock_testbed::proxy::{FaultProxy, ReplyKind};
    /// use std::time::Duration;
    /// let proxy = FaultProxy::start(server)?;
    /// let swallow = proxy.swallow_next_reply(ReplyKind::AnyNextReply);
    /// // ... send one command through the proxy ...
    /// let happened = tokio::time::timeout(Duration::from_secs(2), swallow.wait()).await.is_ok();
    /// # let _ = happened;
    /// # Ok(())
    /// # }
    /// ```
    pub fn swallow_next_reply(&self, kind: ReplyKind) -> SwallowHandle {
        let (done, _) = watch::channel(None);
        let slot = Arc::new(Slot {
            kind,
            disarmed: AtomicBool::new(false),
            done,
        });
        self.shared.armed().push_back(Arc::clone(&slot));
        tracing::debug!(proxy = %self.shared.address, ?kind, "swallow armed");
        SwallowHandle {
            slot,
            shared: Arc::clone(&self.shared),
        }
    }

    /// Disarms every swallow not yet claimed by a connection; returns how many.
    pub fn disarm_all(&self) -> usize {
        let mut armed = self.shared.armed();
        for slot in armed.iter() {
            slot.disarmed.store(true, Ordering::Release);
        }
        let n = armed.len();
        armed.clear();
        n
    }

    /// A snapshot of all counters.
    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            accepted: s.accepted.load(Ordering::Acquire),
            refused: s.refused.load(Ordering::Acquire),
            open: s.open.load(Ordering::Acquire),
            bytes_to_upstream: s.to_upstream.load(Ordering::Acquire),
            bytes_to_client: s.to_client.load(Ordering::Acquire),
            bytes_dropped: s.dropped.load(Ordering::Acquire),
            swallowed: s.swallowed.load(Ordering::Acquire),
        }
    }
}

/// Tells when an armed swallow (from [`FaultControl::swallow_next_reply`]) happened.
///
/// ```no_run
/// # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
/// use lock_testbed::proxy::{FaultProxy, ReplyKind};
/// use std::time::Duration;
/// let proxy = FaultProxy::start(server)?;
/// let swallow = proxy.swallow_next_reply(ReplyKind::ZkCreate);
/// assert!(swallow.event().is_none());
/// if let Ok(event) = tokio::time::timeout(Duration::from_secs(5), swallow.wait()).await {
///     assert_eq!(event.err, Some(0)); // the server did create the node
/// }
/// # Ok(())
/// # }
/// ```
pub struct SwallowHandle {
    slot: Arc<Slot>,
    shared: Arc<Shared>,
}

impl fmt::Debug for SwallowHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SwallowHandle")
            .field("kind", &self.slot.kind)
            .field("event", &self.event())
            .finish_non_exhaustive()
    }
}

impl SwallowHandle {
    /// The kind this handle was armed with.
    pub fn kind(&self) -> ReplyKind {
        self.slot.kind
    }

    /// The event, if the swallow already happened.
    pub fn event(&self) -> Option<SwallowEvent> {
        *self.slot.done.borrow()
    }

    /// Waits until the reply was swallowed and its connection closed. It never resolves if no
    /// such reply comes: bound it with `tokio::time::timeout`.
    pub async fn wait(&self) -> SwallowEvent {
        let mut rx = self.slot.done.subscribe();
        let event = match rx.wait_for(Option::is_some).await {
            Ok(event) => *event,
            // Unreachable: the sender lives in the slot this handle holds.
            Err(_) => None,
        };
        match event {
            Some(event) => event,
            None => std::future::pending().await,
        }
    }

    /// Disarms this swallow if no connection has claimed it yet; returns whether it did.
    pub fn disarm(&self) -> bool {
        self.slot.disarmed.store(true, Ordering::Release);
        let mut armed = self.shared.armed();
        match armed.iter().position(|s| Arc::ptr_eq(s, &self.slot)) {
            Some(at) => {
                armed.remove(at);
                true
            }
            None => false,
        }
    }
}

/// The proxies in front of a server that several clients share, as one: what that server
/// is to those clients. A test that may not stop a shared server (other tests use it) makes
/// it stop answering its own clients instead, which is all that they can see of a paused
/// server: their connections stay open and nothing comes back.
///
/// ```no_run
/// # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
/// use lock_testbed::proxy::{FaultProxy, ProxyGroup};
///
/// let group = ProxyGroup::default();
/// let proxy = FaultProxy::start(server)?;
/// group.add(proxy.control());
/// group.pause(std::time::Duration::from_secs(5)).await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ProxyGroup {
    members: Arc<Mutex<Vec<FaultControl>>>,
}

impl ProxyGroup {
    /// Adds the proxy `control` acts on.
    pub fn add(&self, control: FaultControl) {
        self.members().push(control);
    }

    /// Answers nothing for `duration` on every proxy of the group, connections kept open
    /// and new ones held ([`black_hole`](FaultControl::black_hole)), then forwards again
    /// ([`pass`](FaultControl::pass)).
    pub async fn pause(&self, duration: Duration) {
        let members = self.members().clone();
        members.iter().for_each(FaultControl::black_hole);
        tokio::time::sleep(duration).await;
        members.iter().for_each(FaultControl::pass);
    }

    fn members(&self) -> MutexGuard<'_, Vec<FaultControl>> {
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A fault-injecting TCP proxy in front of one upstream server; see the [module docs](self).
///
/// It derefs to [`FaultControl`], so every control method is available on the proxy itself.
/// Dropping it aborts its tasks (closing the listener and every connection);
/// [`shutdown`](Self::shutdown) does the same and waits until they have ended.
///
/// ```no_run
/// # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
/// use lock_testbed::proxy::FaultProxy;
/// let proxy = FaultProxy::start(server)?;
/// let mut stream = tokio::net::TcpStream::connect(proxy.address()).await?;
/// proxy.cut();
/// proxy.shutdown().await;
/// # let _ = &mut stream;
/// # Ok(())
/// # }
/// ```
pub struct FaultProxy {
    control: FaultControl,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("control", &self.control)
            .finish_non_exhaustive()
    }
}

impl Deref for FaultProxy {
    type Target = FaultControl;

    fn deref(&self) -> &FaultControl {
        &self.control
    }
}

impl FaultProxy {
    /// Binds `127.0.0.1` on a free port and spawns the accept loop on the current tokio
    /// runtime, forwarding to `upstream` in [`Mode::Pass`].
    ///
    /// # Errors
    ///
    /// Fails when called outside a tokio runtime, or when the listener cannot be bound.
    ///
    /// ```no_run
    /// # async fn demo() -> std::io::Result<()> {
    /// let server: std::net::SocketAddr = "127.0.0.1:2181".parse().map_err(std::io::Error::other)?;
    /// let proxy = lock_testbed::proxy::FaultProxy::start(server)?;
    /// println!("connect to {}", proxy.address());
    /// # Ok(())
    /// # }
    /// ```
    pub fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        std_listener.set_nonblocking(true)?;
        let address = std_listener.local_addr()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(std_listener)?
        };
        let (mode, _) = watch::channel(Mode::Pass);
        let shared = Arc::new(Shared {
            address,
            upstream,
            mode,
            armed: Mutex::new(VecDeque::new()),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            open: AtomicU64::new(0),
            to_upstream: AtomicU64::new(0),
            to_client: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            swallowed: AtomicU64::new(0),
        });
        let (stop, stopped) = oneshot::channel();
        let task = runtime.spawn(accept_loop(listener, Arc::clone(&shared), stopped));
        tracing::debug!(%address, %upstream, "fault proxy started");
        Ok(FaultProxy {
            control: FaultControl { shared },
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// A cloneable control handle (the same methods the proxy derefs to).
    pub fn control(&self) -> FaultControl {
        self.control.clone()
    }

    /// Closes the listener and every connection, and waits until all the proxy's tasks have
    /// ended. Afterwards connecting to [`address`](FaultControl::address) fails.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            // The loop may already have ended; nothing to tell it then.
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::warn!(proxy = %self.control.shared.address, %error, "proxy task failed");
        }
        tracing::debug!(proxy = %self.control.shared.address, "fault proxy shut down");
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Accepts connections until told to stop, then closes the listener and ends every
/// connection task before returning.
async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    let id = shared.accepted.fetch_add(1, Ordering::AcqRel) + 1;
                    if shared.mode() == Mode::Cut {
                        shared.refused.fetch_add(1, Ordering::AcqRel);
                        tracing::debug!(proxy = %shared.address, %peer, id, "refused (cut)");
                        drop(client);
                        continue;
                    }
                    tracing::debug!(proxy = %shared.address, %peer, id, "accepted");
                    connections.spawn(conn::run(id, client, Arc::clone(&shared)));
                }
                Err(error) => {
                    tracing::warn!(proxy = %shared.address, %error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
}
