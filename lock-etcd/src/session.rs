//! One etcd session: a client, one lease kept alive at ttl/3, and the lost signals of the
//! guards whose keys hang on that lease.
//!
//! The server ends the lease `ttl` after it last renewed it, and it renewed it no earlier
//! than the keep-alive was sent. So the session counts itself over (and fires every guard's
//! lost signal) once `ttl − margin` has passed since the latest answered keep-alive was
//! sent, before the server can have freed the keys; or at once when the server says the
//! lease is gone.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, LeaseGrantResponse, LeaseKeepAliveStream, LeaseKeeper,
    TlsOptions, WatchFilterType, WatchOptions,
};
use lock_core::kit::{Closed, LostSignals, ServerSession, SessionSlot, unpoisoned};
use lock_core::{Deadline, LockError, LossReason, LostNotifier, Metrics};
use tokio::time::Instant;

use crate::channel::WideWindow;
use crate::config::EtcdConfig;
use crate::error::{BACKEND, connection, lock_error, timed_out};
use crate::key_reads::KeyReads;
use crate::watches::{Watch, Watches};

/// How often the connection is pinged while idle.
const KEEP_ALIVE_PING: Duration = Duration::from_secs(10);

/// A live session: the client and the lease every key of this provider hangs on.
pub(crate) struct Session {
    pub(crate) client: Client,
    /// The lease id; keys are named by it, in hex.
    pub(crate) lease: i64,
    /// Over: the lease ended, or was not renewed in time, or the provider closed.
    pub(crate) over: Closed,
    suspect: AtomicBool,
    /// When the latest answered keep-alive (or the grant) was sent.
    heard: Mutex<Instant>,
    guards: LostSignals,
    /// The key slots in use, per lock directory: see [`Slot`].
    slots: Mutex<HashMap<Arc<str>, TakenSlots>>,
    pub(crate) metrics: Arc<Metrics>,
    /// The session's one watch stream, shared by its waits, guards and observers.
    pub(crate) watches: Watches,
    /// Held keys read again after their watches began (see [`KeyReads`]).
    pub(crate) key_reads: KeyReads,
    pub(crate) timeout: Duration,
    ttl: Duration,
    /// The latest answer to "has the lease ended?" and when its question was sent: one
    /// answer serves every deletion seen before that.
    lease_asked: tokio::sync::Mutex<Option<(Instant, bool)>>,
}

impl Session {
    /// Connects and grants the lease, and starts the keep-alive. While no member answers,
    /// it tries again after a short pause until the configured timeout has passed (as
    /// ZooKeeper's clients do); the error then names the endpoints, the cause and the
    /// attempts made.
    pub(crate) async fn open(
        config: &EtcdConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Session>, LockError> {
        let timeout = config.timeout;
        let began = Instant::now();
        let mut attempts = 0u32;
        let (client, grant, granting) = loop {
            attempts += 1;
            let left = timeout.saturating_sub(began.elapsed());
            match connect_and_grant(config, &metrics, left).await {
                Ok(granted) => break granted,
                Err(error @ LockError::Connection { .. })
                    if began.elapsed() + CONNECT_AGAIN_PAUSE < timeout =>
                {
                    tracing::debug!(%error, attempts, "etcd: no member answers; trying again");
                    tokio::time::sleep(CONNECT_AGAIN_PAUSE).await;
                }
                Err(LockError::Connection { source, .. }) => {
                    let endpoints: Vec<&str> = config
                        .endpoints
                        .iter()
                        .map(|endpoint| {
                            endpoint
                                .split_once("://")
                                .map_or(endpoint.as_str(), |(_, address)| address)
                        })
                        .collect();
                    let endpoints = endpoints.join(",");
                    let took = began.elapsed();
                    return Err(LockError::Connection {
                        backend: BACKEND,
                        name: None,
                        message: format!(
                            "cannot reach {endpoints}: {} \
                             ({attempts} attempt(s) in {took:.1?}, connect timeout {timeout:?})",
                            cause(source.as_deref(), timeout)
                        ),
                        source,
                    });
                }
                Err(other) => return Err(other),
            }
        };
        if !grant.error().is_empty() {
            let message = format!("the lease was refused: {}", grant.error());
            return Err(LockError::other(BACKEND, message).retryable(true));
        }
        // The watch stream's anchor: `{prefix}/` itself, which is no lock's key.
        let anchor = format!("{}/", config.prefix);
        let watches = Watches::start(client.clone(), anchor, Arc::clone(&metrics), timeout);
        let key_reads = KeyReads::start(client.clone(), Arc::clone(&metrics), timeout);
        let session = Arc::new(Session {
            client,
            lease: grant.id(),
            over: Closed::new(),
            suspect: AtomicBool::new(false),
            heard: Mutex::new(granting),
            guards: LostSignals::new(),
            slots: Mutex::new(HashMap::new()),
            metrics,
            watches,
            key_reads,
            timeout,
            ttl: Duration::from_secs(grant.ttl().max(1) as u64),
            lease_asked: tokio::sync::Mutex::new(None),
        });
        tracing::debug!(
            lease = format_args!("{:x}", session.lease),
            ttl = ?config.lease_ttl,
            "etcd: session opened"
        );
        tokio::spawn(keep_alive(Arc::clone(&session)));
        Ok(session)
    }

    /// The lease the server granted.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether the session is over.
    pub(crate) fn is_over(&self) -> bool {
        self.over.is_closed()
    }

    /// Whether a keep-alive is overdue: the guards cannot be vouched for.
    pub(crate) fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Acquire)
    }

    /// The moment past which the server may have ended the lease, less a margin for the
    /// clocks' drift.
    fn lost_at(&self) -> Instant {
        let heard = *unpoisoned(&self.heard);
        heard + self.ttl - self.ttl / 10
    }

    /// Ends the session: no more grants, every guard lost.
    pub(crate) fn end(&self, reason: LossReason) {
        if !self.over.close() {
            return;
        }
        self.watches.stop();
        let guards = self.guards.fire_all(&reason);
        if guards > 0 {
            tracing::warn!(%reason, guards, lease = format_args!("{:x}", self.lease), "etcd: guards lost");
        }
    }

    /// Whether a held key seen deleted went because the session's lease ended on the
    /// server: then the session ends with [`LossReason::SessionExpired`], as when a
    /// keep-alive finds the lease gone (every guard of the lease lost, for that reason),
    /// rather than the key's guard alone for a removed entry. When the server cannot tell,
    /// the deletion stands as a removal. Also `true` once the session is over for another
    /// reason: its end fires the signals.
    ///
    /// A revoked or expired lease deletes every key on it at once: the holders ask one at
    /// a time, and an answer to a question sent after a deletion was seen serves that
    /// deletion, so the whole session's keys cost one question, not one each.
    pub(crate) async fn lease_ended(&self, key: &str) -> bool {
        let seen = Instant::now();
        let mut asked = self.lease_asked.lock().await;
        if self.is_over() {
            return true;
        }
        if let Some((sent, ended)) = *asked
            && sent >= seen
        {
            return ended;
        }
        let sent = Instant::now();
        let mut leases = self.client.lease_client();
        let answer = self.ask(key, leases.time_to_live(self.lease, None)).await;
        let ended = answer.is_ok_and(|answer| answer.ttl() <= 0);
        *asked = Some((sent, ended));
        if ended {
            self.end(LossReason::SessionExpired);
        }
        ended
    }

    /// Registers a guard's lost signal; `None` when the session is over already, or its
    /// lease may have ended on the server (the keep-alive task may be late to say so).
    pub(crate) fn register(&self, notifier: LostNotifier) -> Option<u64> {
        let id = self.guards.register(notifier);
        // Ended before the registration: `end` marks the session over before it fires.
        if self.is_over() || Instant::now() >= self.lost_at() {
            self.guards.unregister(id);
            return None;
        }
        Some(id)
    }

    /// Forgets a released guard.
    pub(crate) fn unregister(&self, id: u64) {
        self.guards.unregister(id);
    }

    /// Sends one request, counted, bounded by the request timeout.
    pub(crate) async fn ask<T>(
        &self,
        name: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, LockError> {
        self.metrics.record_server_requests(1);
        bounded(self.timeout, Some(name), request).await
    }
}

impl Session {
    /// Sends a read (a look at a queue, a watch), and sends it again while its answer is
    /// lost to a cause that may pass; see [`again`](Self::again). Reads only: asking twice
    /// changes nothing.
    pub(crate) async fn read<T, F, Fut>(
        &self,
        name: &str,
        deadline: &Deadline,
        mut request: F,
    ) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.again(name, deadline, || self.ask(name, request()))
            .await
    }

    /// Watches `key` (or, with `prefix`, every key under it) for deletions from now on
    /// (see [`Watch::from`]), asking again while the answer is lost to a cause that may
    /// pass, as [`read`](Self::read) does.
    pub(crate) async fn watch_deletions(
        &self,
        name: &str,
        key: &str,
        prefix: bool,
        deadline: &Deadline,
    ) -> Result<Watch, LockError> {
        let mut options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        if prefix {
            options = options.with_prefix();
        }
        self.again(name, deadline, || {
            self.watches.add(name, key, options.clone())
        })
        .await
    }

    /// Makes `attempt`, and makes it again after a short pause while it fails for a cause
    /// that may pass — a member down, a leader election — for as long as the session lives,
    /// the caller's `deadline` allows, and at most the session's ttl after the first
    /// failure: a waiter rides out a failover, as Curator's recipes ride out a connection
    /// loss, and a try (an immediate deadline) makes one attempt. Only for what is safe to
    /// do twice: a read, or a create that finds its own key if it was made already.
    pub(crate) async fn again<T, F, Fut>(
        &self,
        name: &str,
        deadline: &Deadline,
        mut attempt: F,
    ) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, LockError>>,
    {
        let began = Instant::now();
        loop {
            match attempt().await {
                Err(error)
                    if error.is_retryable()
                        && began.elapsed() < self.ttl
                        && !deadline.is_immediate()
                        && !deadline.has_passed() =>
                {
                    tracing::debug!(lock = name, %error, "etcd: no answer; asking again");
                    tokio::select! {
                        () = tokio::time::sleep(READ_AGAIN_PAUSE) => {}
                        () = self.over.wait() => return Err(LockError::SessionExpired {
                            backend: BACKEND,
                            name: Some(name.to_owned()),
                        }),
                    }
                }
                other => return other,
            }
        }
    }
}

/// How long a request whose answer was lost waits before it is sent again.
const READ_AGAIN_PAUSE: Duration = Duration::from_millis(100);

/// How long a connection that no member answered waits before it is tried again.
const CONNECT_AGAIN_PAUSE: Duration = Duration::from_millis(100);

/// One try at a session: a client of `config`'s endpoints and a lease, within `timeout`,
/// and when the grant was asked for.
async fn connect_and_grant(
    config: &EtcdConfig,
    metrics: &Metrics,
    timeout: Duration,
) -> Result<(Client, LeaseGrantResponse, Instant), LockError> {
    // HTTP/2 pings no more often than etcd accepts by default (every 5 s), and requests
    // only to a member that has a leader: a member cut off from the quorum would leave
    // watches silent.
    let mut options = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_keep_alive(KEEP_ALIVE_PING, config.timeout)
        .with_require_leader(true);
    if let Some((user, password)) = &config.user {
        options = options.with_user(user.clone(), password.clone());
    }
    if config.uses_tls() {
        options = options.with_tls(tls_options(config)?);
    }
    let connecting =
        Client::connect_with_balanced_channel(&config.endpoints, Some(options), WideWindow);
    let client = bounded(timeout, None, connecting).await?;
    let granting = Instant::now();
    let mut leases = client.lease_client();
    metrics.record_server_requests(1);
    let ttl = config.lease_ttl.as_secs() as i64;
    let left = timeout.saturating_sub(granting.elapsed());
    let grant = bounded(left, None, leases.grant(ttl, None)).await?;
    Ok((client, grant, granting))
}

/// Why a connection failed, in a few words: the operating system's reason when there is
/// one ("connection refused"), else the server's or the client's message.
fn cause(
    source: Option<&(dyn std::error::Error + Send + Sync + 'static)>,
    timeout: Duration,
) -> String {
    let Some(source) = source else {
        return format!("no answer within {timeout:?}");
    };
    // etcd-client's errors name no source: start from what they wrap.
    let wrapped = source.downcast_ref::<etcd_client::Error>();
    let mut next: Option<&(dyn std::error::Error + 'static)> = match wrapped {
        Some(etcd_client::Error::GRpcStatus(status)) => Some(status),
        Some(etcd_client::Error::TransportError(error)) => Some(error),
        Some(etcd_client::Error::IoError(error)) => Some(error),
        _ => Some(source),
    };
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return io.kind().to_string();
        }
        next = error.source();
    }
    match wrapped {
        Some(etcd_client::Error::GRpcStatus(status)) => status.message().to_owned(),
        _ => source.to_string(),
    }
}

/// TLS towards `config`'s endpoints: trusting the authorities of its `tls_ca` file, or the
/// system's.
fn tls_options(config: &EtcdConfig) -> Result<TlsOptions, LockError> {
    let tls = TlsOptions::new();
    let Some(path) = &config.tls_ca else {
        return Ok(tls.with_native_roots());
    };
    let pem = std::fs::read(path).map_err(|error| {
        LockError::config(format!(
            "etcd: cannot read tls_ca {}: {error}",
            path.display()
        ))
    })?;
    Ok(tls.ca_certificate(Certificate::from_pem(pem)))
}

/// `request`, or a retryable connection error after `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    name: Option<&str>,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(lock_error(error, name)),
        Err(_) => Err(timed_out(name, timeout)),
    }
}

/// Renews the lease every ttl/3 (every 100 ms to 500 ms while renewals fail), until the
/// session is over (every way to drop a session ends it first).
async fn keep_alive(session: Arc<Session>) {
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let period = session.ttl / 3;
    while !session.is_over() {
        let sent = Instant::now();
        let bound = session
            .lost_at()
            .saturating_duration_since(sent)
            .min(session.timeout);
        let renewed = tokio::select! {
            renewed = tokio::time::timeout(bound, renew(&session, &mut stream)) => renewed,
            () = session.over.wait() => return,
        };
        let outcome = match &renewed {
            Ok(Ok(ttl)) if *ttl > 0 => "renewed",
            Ok(Ok(_)) | Ok(Err(LockError::SessionExpired { .. })) => "refused",
            _ => "failed",
        };
        lock_core::observe::record_renewal(BACKEND, outcome);
        let pause = match renewed {
            Ok(Ok(ttl)) if ttl > 0 => {
                let mut heard = unpoisoned(&session.heard);
                *heard = (*heard).max(sent);
                session.suspect.store(false, Ordering::Release);
                period
            }
            Ok(Ok(_)) | Ok(Err(LockError::SessionExpired { .. })) => {
                tracing::warn!(
                    lease = format_args!("{:x}", session.lease),
                    "etcd: the server ended the session's lease"
                );
                session.end(LossReason::SessionExpired);
                return;
            }
            failed => {
                let error = match failed {
                    Ok(Err(error)) => error,
                    _ => timed_out(None, bound),
                };
                stream = None;
                session.suspect.store(true, Ordering::Release);
                if Instant::now() >= session.lost_at() {
                    tracing::warn!(%error, "etcd: the lease was not renewed in time");
                    // A keep-alive that timed out here may still have reached the server:
                    // revoke, so that the keys do not outlive the session by a ttl.
                    session.close();
                    return;
                }
                tracing::debug!(%error, "etcd: a keep-alive failed; trying again");
                (period / 4).clamp(Duration::from_millis(100), Duration::from_millis(500))
            }
        };
        let wake = (Instant::now() + pause).min(session.lost_at());
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = session.over.wait() => return,
        }
    }
}

/// One keep-alive on the session's stream (opened first if need be): the ttl the server
/// gave, 0 when the lease is gone.
async fn renew(
    session: &Session,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Result<i64, LockError> {
    let error = |e| lock_error(e, None);
    if stream.is_none() {
        let mut leases = session.client.lease_client();
        *stream = Some(leases.keep_alive(session.lease).await.map_err(error)?);
    }
    let Some((keeper, answers)) = stream.as_mut() else {
        return Err(connection(None, "no keep-alive stream", None));
    };
    session.metrics.record_server_requests(1);
    keeper.keep_alive().await.map_err(error)?;
    match answers.message().await.map_err(error)? {
        Some(answer) => Ok(answer.ttl()),
        None => Err(connection(None, "the keep-alive stream ended", None)),
    }
}

/// A contender's key slot: the number that makes its key unique among this session's keys
/// on one lock (`{lease}` for slot 0, `{lease}_{n}` after). A slot is taken until its key is
/// surely gone (released, cleaned up, or the session over), so that a new contender never
/// adopts a key that a clean-up is about to delete.
///
/// Kept for as long as a lock is held, so it names its key rather than keeping it, and
/// shares its directory with the lock's handle and the session's record of the slots.
#[derive(Debug)]
pub(crate) struct Slot {
    session: Weak<Session>,
    lease: i64,
    dir: Arc<str>,
    number: u32,
}

/// The slots taken in one directory: one for each of the session's contenders there, so
/// nearly always just slot 0, which takes no allocation of its own.
#[derive(Debug, Default)]
struct TakenSlots {
    /// Slots 0 to 63, a bit each.
    low: u64,
    /// Slots from 64 on.
    high: BTreeSet<u32>,
}

impl TakenSlots {
    /// Takes the smallest free slot.
    fn take(&mut self) -> u32 {
        if self.low != u64::MAX {
            let number = self.low.trailing_ones();
            self.low |= 1 << number;
            return number;
        }
        let number = (64..).find(|n| !self.high.contains(n)).unwrap_or_default();
        self.high.insert(number);
        number
    }

    fn free(&mut self, number: u32) {
        match number {
            0..64 => self.low &= !(1 << number),
            _ => {
                self.high.remove(&number);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.low == 0 && self.high.is_empty()
    }
}

impl Slot {
    /// The smallest free slot of `dir` (a lock's directory, ending in `/`).
    pub(crate) fn take(session: &Arc<Session>, dir: &Arc<str>) -> Slot {
        let mut slots = unpoisoned(&session.slots);
        let number = slots.entry(Arc::clone(dir)).or_default().take();
        Slot {
            session: Arc::downgrade(session),
            lease: session.lease,
            dir: Arc::clone(dir),
            number,
        }
    }

    /// `{lease}` or `{lease}_{n}`: the last segment of the contender's keys.
    pub(crate) fn id(&self) -> String {
        match self.number {
            0 => format!("{:x}", self.lease),
            n => format!("{:x}_{n}", self.lease),
        }
    }

    /// `{dir}{id}`.
    pub(crate) fn key(&self) -> String {
        format!("{}{}", self.dir, self.id())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(session) = self.session.upgrade() {
            let mut slots = unpoisoned(&session.slots);
            if let Some(taken) = slots.get_mut(&self.dir) {
                taken.free(self.number);
                if taken.is_empty() {
                    slots.remove(&self.dir);
                }
            }
        }
    }
}

/// What the provider and its locks share: the configuration, the metrics, and the current
/// session (a new one is opened for new acquisitions once the current one is over).
pub(crate) struct Shared {
    pub(crate) config: EtcdConfig,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) closed: Closed,
    pub(crate) sessions: SessionSlot<Session>,
}

impl Shared {
    /// Opens the first session.
    pub(crate) async fn open(config: EtcdConfig) -> Result<Shared, LockError> {
        let metrics = Arc::new(Metrics::new());
        let session = Session::open(&config, Arc::clone(&metrics)).await?;
        Ok(Shared {
            config,
            metrics,
            closed: Closed::new(),
            sessions: SessionSlot::new(session),
        })
    }

    /// The current session, if it is not over.
    pub(crate) fn current(&self) -> Option<Arc<Session>> {
        self.sessions.latest().filter(|session| !session.is_over())
    }

    /// A live session for an acquisition of `name`: the current one, or a new one.
    pub(crate) async fn session(
        &self,
        name: &lock_core::LockName,
    ) -> Result<Arc<Session>, LockError> {
        let open = || Session::open(&self.config, Arc::clone(&self.metrics));
        self.sessions.live(&self.closed, BACKEND, name, open).await
    }
}

impl ServerSession for Session {
    fn is_over(&self) -> bool {
        Session::is_over(self)
    }

    /// Ends the session and revokes its lease in the background (the lease's ttl is the
    /// backstop when that fails or no runtime is left), which frees every key on it.
    fn close(&self) {
        self.end(LossReason::SessionExpired);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut leases, lease, timeout) = (self.client.lease_client(), self.lease, self.timeout);
        self.metrics.record_server_requests(1);
        runtime.spawn(async move {
            if let Err(error) = bounded(timeout, None, leases.revoke(lease)).await {
                tracing::debug!(%error, "etcd: the lease was not revoked; it will expire");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::TakenSlots;

    #[test]
    fn a_slot_taken_is_the_smallest_free_one_past_the_first_64_too() {
        let mut taken = TakenSlots::default();
        let first: Vec<u32> = (0..70).map(|_| taken.take()).collect();
        assert_eq!(first, (0..70).collect::<Vec<u32>>());
        taken.free(3);
        taken.free(65);
        assert_eq!(taken.take(), 3);
        assert_eq!(taken.take(), 65);
        assert_eq!(taken.take(), 70);
        for number in 0..71 {
            taken.free(number);
        }
        assert!(taken.is_empty());
    }
}
