//! One ZooKeeper session: its client, its health, and the lost signals of its guards.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lock_core::kit::{Closed, LostSignals, Releasing, ServerSession, SessionSlot, unpoisoned};
use lock_core::{Deadline, LockError, LockName, LossReason, LostNotifier, Metrics};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use zookeeper_client::{Acls, Client, Error as ZkError, EventType, SessionState, WatchedEvent};

use crate::config::{AclPolicy, ZkConfig};
use crate::error::{BACKEND, lock_error, outcome_unknown};

/// How many times a request whose outcome was unknown is sent in all.
pub(crate) const SEND_ATTEMPTS: usize = 10;
/// Pause before sending again a request whose outcome was unknown (the client reconnects).
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A live session and what depends on it.
pub(crate) struct Session {
    pub(crate) client: Client,
    /// The session id, as servers record it in a node's `ephemeralOwner`.
    pub(crate) id: i64,
    health: Arc<Health>,
    /// The ACL of a lock's directory and nodes.
    pub(crate) acls: Acls<'static>,
    /// The ACL of the nodes above them (the chroot, the root, the directories between the
    /// root and a lock's), where other identities may make locks of their own.
    pub(crate) namespace_acls: Acls<'static>,
    /// Hands a held node's watch to the session's one task that keeps them all.
    held: mpsc::UnboundedSender<HeldWatch>,
}

/// The pause between two rounds of connection attempts in [`Session::open`].
const CONNECT_PAUSE: Duration = Duration::from_millis(100);

/// How many heartbeats [`keep_alive`] sends per session timeout.
const HEARTBEATS_PER_TIMEOUT: u32 = 10;

/// What the monitor task and the guards share.
struct Health {
    /// Disconnected, not yet expired: guards cannot be vouched for.
    suspect: AtomicBool,
    /// Expired, closed or failed: nothing more can be done with this session.
    over: AtomicBool,
    guards: LostSignals,
    /// When the latest request that the server answered was sent. The server heard from
    /// the session at that moment or later, so it cannot expire the session before this
    /// plus the session timeout.
    heard: Mutex<Instant>,
    /// Asks [`keep_alive`] for a heartbeat now: a guard was granted while `heard` was old
    /// (a waiter granted on an event, after a long wait, has made no request since it set
    /// its watches).
    heartbeat_now: tokio::sync::Notify,
}

impl Health {
    fn heard(&self) -> Instant {
        *unpoisoned(&self.heard)
    }

    /// Records that a request sent at `sent` was answered.
    fn heard_at(&self, sent: Instant) {
        let mut heard = unpoisoned(&self.heard);
        *heard = (*heard).max(sent);
    }

    fn fire_all(&self, reason: &LossReason) {
        let guards = self.guards.fire_all(reason);
        if guards > 0 {
            tracing::warn!(%reason, guards, "zookeeper: guards lost");
        }
    }
}

impl Session {
    /// Connects, within the configured connect timeout, and starts watching the session.
    ///
    /// A round that reaches no server (refused, or closed during the handshake, as a server
    /// under load may do) is tried again after a pause, as ZooKeeper's own clients do,
    /// until the connect timeout runs out or `deadline` (an acquisition's) passes; the
    /// first round is always made. Failed authentication ends it at once.
    pub(crate) async fn open(
        config: &ZkConfig,
        deadline: Deadline,
    ) -> Result<Arc<Session>, LockError> {
        let mut connector = Client::connector()
            .with_session_timeout(config.session_timeout)
            .with_connection_timeout(config.connect_timeout)
            .with_fail_eagerly();
        if let Some(auth) = &config.auth {
            connector = connector.with_auth(
                "digest",
                format!("{}:{}", auth.user, auth.password).as_bytes(),
            );
        }
        if config.tls {
            connector = connector.with_tls(crate::tls::client_options(config)?);
        }
        // The session connects at the top and is rooted once its chroot stands (below).
        let hosts = config.hosts.join(",");
        let budget = Deadline::after(Some(config.connect_timeout));
        let began = Instant::now();
        let mut rounds = 0;
        let (client, connecting) = loop {
            rounds += 1;
            // The server creates the session after this moment.
            let connecting = Instant::now();
            let round = {
                let (connector, hosts) = (connector.clone(), hosts.as_str());
                async move {
                    match config.tls {
                        true => connector.secure_connect(hosts).await,
                        false => connector.connect(hosts).await,
                    }
                }
            };
            let mut error =
                match tokio::time::timeout(budget.cap(config.connect_timeout), round).await {
                    Ok(Ok(client)) => break (client, connecting),
                    Ok(Err(error)) => lock_error(error, None),
                    Err(_) => lock_error(ZkError::Timeout, None),
                };
            let pause = deadline.cap(budget.cap(CONNECT_PAUSE));
            if error.is_retryable() && pause == CONNECT_PAUSE {
                tracing::debug!(%error, %hosts, "zookeeper: no session yet; trying again");
                tokio::time::sleep(pause).await;
                continue;
            }
            if let LockError::Connection { message, .. } = &mut error {
                let (took, timeout) = (began.elapsed(), config.connect_timeout);
                *message = format!(
                    "cannot reach {hosts}: {message} \
                     ({rounds} attempt(s) in {took:.1?}, connect timeout {timeout:?})"
                );
                // Within the caller's deadline, one handshake of our own says why.
                let bound = deadline.cap(crate::tls::PROBE_TIMEOUT);
                if config.tls && !bound.is_zero() {
                    let first = config.hosts.first().map_or("", String::as_str);
                    if let Some(why) = crate::tls::handshake_failure(config, first, bound).await {
                        message.push_str(&format!("; {why}"));
                    }
                }
            }
            return Err(error);
        };
        let (namespace_acls, acls) = session_acls(config);
        let client = match &config.chroot {
            Some(chroot) => {
                let rooting = rooted(client, chroot, namespace_acls);
                match tokio::time::timeout(config.connect_timeout, rooting).await {
                    Ok(rooted) => rooted?,
                    Err(_) => return Err(lock_error(ZkError::Timeout, None)),
                }
            }
            None => client,
        };
        let health = Arc::new(Health {
            suspect: AtomicBool::new(false),
            over: AtomicBool::new(false),
            guards: LostSignals::new(),
            heard: Mutex::new(connecting),
            heartbeat_now: tokio::sync::Notify::new(),
        });
        let timeout = client.session_timeout();
        tokio::spawn(monitor(
            client.state_watcher(),
            Arc::clone(&health),
            timeout,
        ));
        let id = client.session_id().0;
        tracing::debug!(session = %client.session_id(), ?timeout, "zookeeper: session established");
        let (held, watches) = mpsc::unbounded_channel();
        tokio::spawn(keep_held_watches(watches));
        let session = Arc::new(Session {
            client,
            id,
            health,
            acls,
            namespace_acls,
            held,
        });
        tokio::spawn(keep_alive(
            Arc::downgrade(&session),
            Arc::clone(&session.health),
            session.heartbeat_interval(),
        ));
        Ok(session)
    }

    /// Registers a grant's lost notifier; it fires when the session is lost.
    ///
    /// `asked` is when the request that confirmed the grant was sent: the server heard from
    /// the session then, which matters when no heartbeat ran before (none runs while the
    /// session holds no guard).
    pub(crate) fn register(&self, notifier: LostNotifier, asked: Instant) -> u64 {
        self.health.heard_at(asked);
        let id = self.health.guards.register(notifier);
        // Registered first: the heartbeat is sent only for a session that holds something.
        if self.health.heard().elapsed() > self.heartbeat_interval() {
            self.health.heartbeat_now.notify_one();
        }
        if self.is_over() {
            // Lost before it was registered: fire now rather than never.
            self.health.fire_all(&LossReason::SessionExpired);
        }
        id
    }

    /// Keeps `watch` until it ends: the node's deletion, the session's end.
    pub(crate) fn watch_held(&self, watch: HeldWatch) {
        // The task ends only after every sender is gone: a send while the session lives
        // always arrives.
        let _ = self.held.send(watch);
    }

    pub(crate) fn unregister(&self, registration: u64) {
        self.health.guards.unregister(registration);
    }

    pub(crate) fn is_suspect(&self) -> bool {
        self.health.suspect.load(Ordering::Acquire)
    }

    /// The negotiated session timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.client.session_timeout()
    }

    /// Sends `request` again while its outcome is unknown: the connection dropped or went
    /// silent (a server that stalls for longer than the client's read timeout), and the
    /// session, which outlives a connection, may well be fine. Only for a request that may
    /// safely arrive twice: a read, a watch, a create that takes `NodeExists` as success,
    /// a delete that takes `NoNode` as done. Bounded by [`SEND_ATTEMPTS`] and by the session
    /// timeout, past which a session without answers is over for the server too: then the
    /// last error is returned.
    pub(crate) async fn resend<'s, T, F, Fut>(&'s self, mut request: F) -> Result<T, ZkError>
    where
        F: FnMut(&'s Client) -> Fut,
        Fut: Future<Output = Result<T, ZkError>>,
    {
        let began = Instant::now();
        let mut attempt = 1;
        loop {
            match request(&self.client).await {
                Err(error)
                    if outcome_unknown(&error)
                        && attempt < SEND_ATTEMPTS
                        && began.elapsed() < self.timeout() =>
                {
                    tracing::debug!(%error, attempt, "zookeeper: no answer; asking again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// How often [`keep_alive`] asks the server something while guards are held.
    fn heartbeat_interval(&self) -> Duration {
        (self.timeout() / HEARTBEATS_PER_TIMEOUT).max(Duration::from_millis(10))
    }
}

impl ServerSession for Session {
    fn is_over(&self) -> bool {
        self.health.over.load(Ordering::Acquire)
    }

    /// Ends the session on this side at once: its guards are lost and nothing more is done
    /// with it. Dropping the last client closes it on the server (in-flight calls first).
    fn close(&self) {
        self.health.over.store(true, Ordering::Release);
        self.health.fire_all(&LossReason::Other(
            "the provider was closed, ending its session".into(),
        ));
    }
}

/// Asks the server a trivial question (`exists /`) every `interval` while the session lives,
/// and records when each answered one was sent: [`monitor`] measures a disconnection from
/// the last moment the server surely heard from the session, and at once when a guard is
/// granted long after the session's last answered request. (The client's own pings would
/// do, but their replies are not visible here.) Heartbeats are not lock operations and are
/// not counted in the metrics.
async fn keep_alive(session: Weak<Session>, health: Arc<Health>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = health.heartbeat_now.notified() => {}
        }
        let (request, sent) = {
            let Some(session) = session.upgrade().filter(|session| !session.is_over()) else {
                return;
            };
            // Only held guards depend on how recently the server heard from the session;
            // a session of waiters stays quiet (its client pings keep it alive).
            if health.guards.is_empty() {
                continue;
            }
            // Taken before the request is handed to the client, so it is no later than the
            // moment the server receives it.
            let sent = Instant::now();
            (session.client.check_stat("/"), sent)
        };
        // Awaited without holding the session, so that dropping the provider closes it at once.
        if request.await.is_ok() {
            health.heard_at(sent);
        }
    }
}

/// Follows the session's states: suspect while disconnected, every guard lost once the
/// session timeout has passed since the server last surely heard from the session, or once
/// the session ends.
async fn monitor(
    mut states: zookeeper_client::StateWatcher,
    health: Arc<Health>,
    timeout: Duration,
) {
    let mut lost_at: Option<tokio::time::Instant> = None;
    loop {
        let state = match lost_at {
            Some(at) => tokio::select! {
                state = states.changed() => state,
                () = tokio::time::sleep_until(at) => {
                    // The server may have expired the session by now, whatever the client
                    // hears later: the guards cannot be vouched for.
                    health.fire_all(&LossReason::Disconnected);
                    lost_at = None;
                    continue;
                }
            },
            None => states.changed().await,
        };
        match state {
            SessionState::Disconnected => {
                health.suspect.store(true, Ordering::Release);
                // The server may expire the session once the timeout has passed since it
                // last heard from it, which can be well before the client notices the
                // disconnection: a silent network is noticed only when the client's read
                // timeout (2/5 of the session) runs out, and the last exchange may be a
                // heartbeat interval older still. Counting from the notice would let another
                // client hold the lock while this one's guards still vouch for it.
                lost_at.get_or_insert_with(|| health.heard() + timeout);
                tracing::debug!("zookeeper: disconnected; guards are suspect");
            }
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                health.suspect.store(false, Ordering::Release);
                lost_at = None;
                lock_core::observe::record_reconnect(BACKEND, "connection");
                tracing::debug!("zookeeper: reconnected");
            }
            terminal => {
                health.over.store(true, Ordering::Release);
                health.suspect.store(false, Ordering::Release);
                let reason = match terminal {
                    SessionState::Expired => LossReason::SessionExpired,
                    SessionState::AuthFailed => {
                        LossReason::Other("the session failed authentication".into())
                    }
                    _ => LossReason::Other("the session was closed".into()),
                };
                health.fire_all(&reason);
                tracing::debug!(?terminal, "zookeeper: session over");
                return;
            }
        }
    }
}

/// A watch on a waiter's own node, set while it queues and handed on to its guard.
pub(crate) type OwnNodeWatch = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// A held node's watch: tells its guard when another client deletes the node.
///
/// A session keeps the watches of all its held nodes in one task ([`keep_held_watches`])
/// rather than a task per held lock: a tokio task's cell is cache-line aligned, and with
/// its state it cost each held lock 384 B.
pub(crate) struct HeldWatch {
    phase: Phase,
    session: Weak<Session>,
    metrics: Arc<Metrics>,
    path: Arc<str>,
    releasing: Releasing,
    notifier: LostNotifier,
}

/// What a [`HeldWatch`] waits for.
enum Phase {
    /// The server's answer to a request that sets the watch: the watch, or whether the
    /// node was found gone (`Err(true)`) rather than the session (`Err(false)`). Boxed
    /// apart from the watch, which stays for as long as the lock is held: the request's
    /// future is larger.
    Setting(Pin<Box<dyn Future<Output = Result<OwnNodeWatch, bool>> + Send>>),
    /// The watch's event.
    Watching(OwnNodeWatch),
}

impl HeldWatch {
    /// The watch on the held node at `path`: `set` when the waiter set it while it queued,
    /// otherwise set by a request of its own.
    pub(crate) fn new(
        session: &Arc<Session>,
        metrics: &Arc<Metrics>,
        path: Arc<str>,
        set: Option<OwnNodeWatch>,
        (releasing, notifier): (Releasing, LostNotifier),
    ) -> Self {
        let session = Arc::downgrade(session);
        let phase = match set {
            Some(watch) => Phase::Watching(watch),
            None => Self::setting(&session, metrics, &path),
        };
        HeldWatch {
            phase,
            session,
            metrics: Arc::clone(metrics),
            path,
            releasing,
            notifier,
        }
    }

    fn setting(session: &Weak<Session>, metrics: &Metrics, path: &Arc<str>) -> Phase {
        let Some(session) = session.upgrade() else {
            return Phase::Setting(Box::pin(std::future::ready(Err(false))));
        };
        metrics.record_server_requests(1);
        let path = Arc::clone(path);
        Phase::Setting(Box::pin(async move {
            match session.client.get_and_watch_data(&path).await {
                Ok((_, _, watcher)) => Ok(Box::pin(watcher.changed()) as OwnNodeWatch),
                Err(ZkError::NoNode) => Err(true),
                Err(_) => Err(false),
            }
        }))
    }
}

impl Future for HeldWatch {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let deleted = loop {
            match &mut this.phase {
                Phase::Setting(setting) => match ready!(setting.as_mut().poll(cx)) {
                    Ok(watch) => this.phase = Phase::Watching(watch),
                    Err(deleted) => break deleted,
                },
                Phase::Watching(watch) => match ready!(watch.as_mut().poll(cx)).event_type {
                    EventType::NodeDeleted => break true,
                    // The session's end: its monitor fires every guard's signal.
                    EventType::Session => break false,
                    // Data or children changed: watch again.
                    _ => this.phase = Self::setting(&this.session, &this.metrics, &this.path),
                },
            }
        };
        // The guard's own release deletes the node too.
        if deleted && !this.releasing.is_set() {
            this.notifier.fire(LossReason::EntryRemoved);
        }
        Poll::Ready(())
    }
}

/// Keeps the held nodes' watches that `added` brings until each ends, and the task until
/// the session is gone and the last of them ended.
async fn keep_held_watches(mut added: mpsc::UnboundedReceiver<HeldWatch>) {
    let mut watches = FuturesUnordered::new();
    loop {
        tokio::select! {
            watch = added.recv() => match watch {
                Some(watch) => watches.push(watch),
                None => break,
            },
            Some(()) = watches.next(), if !watches.is_empty() => {}
        }
    }
    // The session is gone: the client ends every watch it set.
    while watches.next().await.is_some() {}
}

/// What the provider's lock handles share.
pub(crate) struct Shared {
    pub(crate) config: ZkConfig,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) sessions: SessionSlot<Session>,
    pub(crate) closed: Closed,
}

impl Shared {
    /// The live session, opening a new one if the last one is over (retrying no longer than
    /// `deadline`, an acquisition's, allows).
    pub(crate) async fn session(
        &self,
        name: &LockName,
        deadline: Deadline,
    ) -> Result<Arc<Session>, LockError> {
        let open = || Session::open(&self.config, deadline);
        self.sessions.live(&self.closed, BACKEND, name, open).await
    }
}

/// The ACLs of a session's nodes: (above the locks, the locks' own). With credentials and
/// [`AclPolicy::Auto`], the locks are the creator's and the nodes above them open, so that
/// another identity can neither touch a lock nor be kept from making its own; with
/// [`AclPolicy::CreatorAll`] every node is the creator's (a namespace of one identity).
fn session_acls(config: &ZkConfig) -> (Acls<'static>, Acls<'static>) {
    let acls = |policy| match policy {
        AclPolicy::CreatorAll => Acls::creator_all(),
        AclPolicy::Open | AclPolicy::Auto => Acls::anyone_all(),
    };
    // Above the locks, `Auto` is open; the locks' own nodes follow `node_acl`.
    (acls(config.acl), acls(config.node_acl()))
}

/// `client` rooted at `chroot`, made first where it is missing (persistent, with `acls`),
/// as Curator makes its namespace: ZooKeeper refuses every path under a chroot that does
/// not exist. One look when it stands; its missing levels are created in one flight.
async fn rooted(client: Client, chroot: &str, acls: Acls<'static>) -> Result<Client, LockError> {
    let refused = |error: ZkError| {
        let mut error = lock_error(error, None);
        if let LockError::Backend { message, .. }
        | LockError::PermissionDenied { message, .. }
        | LockError::Connection { message, .. } = &mut error
        {
            *message = format!("cannot make the chroot {chroot}: {message}");
        }
        error
    };
    if client.check_stat(chroot).await.map_err(refused)?.is_none() {
        let mode = zookeeper_client::CreateMode::Persistent.with_acls(acls);
        let levels: Vec<&str> = chroot
            .match_indices('/')
            .skip(1)
            .map(|(end, _)| &chroot[..end])
            .chain([chroot])
            .collect();
        // Sent in order as they are made (the client sends on the call): one round trip.
        let creates: Vec<_> = levels
            .iter()
            .map(|level| client.create(level, &[], &mode))
            .collect();
        for created in creates {
            match created.await {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(error) => return Err(refused(error)),
            }
        }
        tracing::debug!(%chroot, "zookeeper: chroot made");
    }
    client
        .chroot(chroot.to_owned())
        .map_err(|_| LockError::config(format!("invalid ZooKeeper chroot {chroot:?}")))
}

#[cfg(test)]
mod tests {
    /// Every held lock keeps one of these in its session's watching task for as long as it
    /// is held: at many locks per process, it is much of a lock's client memory.
    #[test]
    fn a_held_nodes_watch_stays_small() {
        let size = std::mem::size_of::<super::HeldWatch>();
        assert!(size <= 80, "a held node's watch takes {size} bytes");
    }
}
