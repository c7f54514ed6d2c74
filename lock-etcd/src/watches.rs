//! One watch stream per session, shared by every wait, guard and observer of the session.
//!
//! Implementation details. etcd serves a new watch at once only when it starts after the
//! store's current revision, or has no start revision; a watch that starts at or before the
//! current revision joins the "unsynced" watchers, which a loop catches up every 100 ms
//! (`mvcc/watchable_store.go`, `syncWatchersLoop`). A waiter that looked at revision R and
//! then asked for the events from R + 1 met that loop whenever anything at all was written
//! between its look and its watch: under contention, nearly always. So every watch here is
//! opened without a start revision, and the header of its "created" reply gives the
//! revision it starts after: [`Watch::from`]. (Even so, a write applied while the server
//! makes the watch can leave it behind the store: a probe made right after tells, and the
//! watch is made again; see [`Open::ask`].) A caller that looked at revision R misses
//! nothing when `from ≤ R`; when `from > R`, something may have changed in between, and it
//! looks again (at a revision of at least `from`) while the watch stays open. Revisions are
//! the cluster's, so the look and the watch may be answered by different members.
//!
//! The stream is opened on the first watch, and opened again on the first watch after it
//! broke (a member down or cut off from its leader, a reset): a broken stream ends every
//! watch on it ([`Watch::next`] says `None`), and each owner looks again and watches anew.
//! etcd-client's `watch` opens a stream with one watch and keeps that watch's "created"
//! reply to itself, so a stream opens with an anchor watch that sees nothing. A stream's
//! requests are handled one by one, in order, so "created" replies come back in the order
//! the watches were asked for: that is how a reply finds its caller. Events and
//! cancellations carry their watch's id.
//!
//! The task that reads the stream never waits to send on it: requests go through a
//! forwarder task of their own. etcd-client's request queue holds 100; a reader that waits
//! for room in it stops reading, the server's send loop then waits for the reader (HTTP/2
//! flow control), its receive loop for the send loop, and the queue never drains. With
//! thousands of watches asked for at once, that stalled every watch of the session for
//! seconds and made the server count nearly all of them as slow watchers.
//!
//! A held key's watch is looked after by the stream's task itself ([`Held`]): a process may
//! hold many thousands of locks, and a task of their own each, to wait for a deletion that
//! seldom comes, was most of a held lock's memory.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use etcd_client::{
    Client, EventType, WatchFilterType, WatchOptions, WatchResponse, WatchStream, Watcher,
};
use futures_util::task::AtomicWaker;
use lock_core::{LockError, Metrics};
use tokio::sync::{mpsc, oneshot};

use crate::error::{BACKEND, connection, lock_error, timed_out};

/// A session's watch stream: a task that owns it, and the way to ask it for watches.
pub(crate) struct Watches {
    commands: mpsc::UnboundedSender<Command>,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

/// A watch's answer as its mailbox keeps it: boxed, so that the room its queue keeps after
/// an answer is small (a waiter's mailboxes stay open while it waits).
type Delivered = Box<WatchResponse>;

/// Where a watch's answers wait for its owner: a queue, a wake-up and whether the stream
/// let go of it. About a tenth of a tokio channel, which gives each end a cache line of its
/// own and makes room for 32 answers as it is made, 800 bytes for each watch.
#[derive(Debug, Default)]
struct Mailbox {
    answers: Mutex<VecDeque<Delivered>>,
    /// The owner, its only waiter, woken whenever an answer came or the mailbox closed.
    /// One waker rather than a `Notify`: a wait then needs no waiter node of its own.
    arrived: AtomicWaker,
    closed: AtomicBool,
}

/// The stream's end of a watch's mailbox; dropped (the watch cancelled, or the stream
/// broke), it closes the mailbox.
#[derive(Debug)]
struct Outbox(Arc<Mailbox>);

impl Outbox {
    fn send(&self, answer: Delivered) {
        let mut answers = self
            .0
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        answers.push_back(answer);
        drop(answers);
        self.0.arrived.wake();
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.arrived.wake();
    }
}

impl Mailbox {
    /// The answers received and not yet taken.
    fn take_all(&self) -> VecDeque<Delivered> {
        std::mem::take(&mut *self.answers.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A held key's owner, told of its watch's answers by the stream's task, so that a held
/// lock needs no task of its own while nothing happens to its key. Its calls must not
/// wait: what takes a request is for a task of its own.
pub(crate) trait Held: Send + Sync {
    /// Whether `answer` (events) reports the held key deleted.
    fn is_deleted(&self, answer: &WatchResponse) -> bool;
    /// The held key was seen deleted; dropping `watch` cancels the watch on the server.
    fn deleted(self: Arc<Self>, watch: Watch);
    /// The watch ended with no deletion told: the stream broke, or a compaction cancelled
    /// it. The owner watches anew (and reads the key again).
    fn ended(self: Arc<Self>);
}

/// Where the stream hands a watch's answers.
enum Route {
    /// A wait's or an observer's mailbox; a held key's watch's too, until it is handed to
    /// the stream.
    Mailbox(Outbox),
    /// A held key's watch, whose answers the stream's task looks at itself.
    Held(Arc<dyn Held>),
    /// A held key seen deleted, while its owner asks why: its answers go nowhere, and its
    /// owner's cancel finds it.
    Settling,
}

/// One watch on the session's stream. Dropped, it is cancelled.
#[derive(Debug)]
pub(crate) struct Watch {
    /// The watch sees every event after this revision (the store's when it began).
    pub(crate) from: i64,
    id: i64,
    stream: u64,
    mailbox: Arc<Mailbox>,
    commands: mpsc::UnboundedSender<Command>,
    /// Whether dropping it cancels it: no longer once the stream holds it for a held key.
    cancels: bool,
}

enum Command {
    Add {
        key: String,
        options: WatchOptions,
        reply: oneshot::Sender<Result<Watch, LockError>>,
    },
    Cancel {
        stream: u64,
        id: i64,
    },
    /// A held key's watch, handed to the stream (see [`Held`]).
    Hold {
        stream: u64,
        id: i64,
        mailbox: Arc<Mailbox>,
        held: Arc<dyn Held>,
    },
    /// The session is over: close the stream and stop.
    Stop,
}

impl Watches {
    /// Starts the task that will keep `client`'s watch stream; `anchor` is a key no one
    /// writes, inside the keys the session may read.
    pub(crate) fn start(
        client: Client,
        anchor: String,
        metrics: Arc<Metrics>,
        timeout: Duration,
    ) -> Watches {
        let (commands, received) = mpsc::unbounded_channel();
        let stream = Stream {
            client,
            anchor,
            metrics: Arc::clone(&metrics),
            timeout,
            commands: commands.clone(),
        };
        tokio::spawn(stream.run(received));
        Watches {
            commands,
            timeout,
            metrics,
        }
    }

    /// Watches `key` (a key, or with `options` a prefix) from now on: once the server has
    /// made the watch, within the request timeout.
    pub(crate) async fn add(
        &self,
        name: &str,
        key: &str,
        options: WatchOptions,
    ) -> Result<Watch, LockError> {
        let (reply, answer) = oneshot::channel();
        self.metrics.record_server_requests(1);
        let command = Command::Add {
            key: key.to_owned(),
            options,
            reply,
        };
        if self.commands.send(command).is_err() {
            return Err(stream_ended(name));
        }
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(made)) => made.map_err(|error| error.for_lock(name)),
            Ok(Err(_)) => Err(stream_ended(name)),
            Err(_) => Err(timed_out(Some(name), self.timeout)),
        }
    }

    /// Closes the stream: the session is over.
    pub(crate) fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
    }
}

impl Watch {
    /// The watch's next answer: events, or its cancellation by the server (a compaction);
    /// `None` once the stream broke or the watch was cancelled.
    ///
    /// Cancel safety: cancel-safe, it only receives.
    pub(crate) fn next(&mut self) -> impl Future<Output = Option<WatchResponse>> + Send + '_ {
        std::future::poll_fn(move |cx| {
            if let Some(answer) = self.received() {
                return Poll::Ready(answer);
            }
            // Registered before the second look: an answer delivered in between wakes it.
            self.mailbox.arrived.register(cx.waker());
            match self.received() {
                Some(answer) => Poll::Ready(answer),
                None => Poll::Pending,
            }
        })
    }

    /// Hands the watch to the stream, which tells `held` of its answers from now on (those
    /// received already first) and cancels it once `held` is done with it; see [`Held`].
    pub(crate) fn hold(mut self, held: Arc<dyn Held>) {
        self.cancels = false;
        let command = Command::Hold {
            stream: self.stream,
            id: self.id,
            mailbox: Arc::clone(&self.mailbox),
            held,
        };
        // Refused only once the session is over, whose end fires the held keys' signals.
        let _ = self.commands.send(command);
    }

    /// An answer already received, without waiting: `None` when there is none yet,
    /// `Some(None)` once the stream broke or the watch was cancelled.
    pub(crate) fn received(&mut self) -> Option<Option<WatchResponse>> {
        // Read before the queue: every answer sent before the close is in it by then.
        let closed = self.mailbox.closed.load(Ordering::Acquire);
        let mut answers = self
            .mailbox
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match answers.pop_front() {
            Some(answer) => Some(Some(*answer)),
            None => closed.then_some(None),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.cancels {
            return;
        }
        let _ = self.commands.send(Command::Cancel {
            stream: self.stream,
            id: self.id,
        });
    }
}

/// The error of a watch whose stream ended before it was made.
fn stream_ended(name: &str) -> LockError {
    connection(Some(name.to_owned()), "the watch stream ended", None)
}

/// What woke the stream's task.
enum Step {
    Command(Option<Command>),
    Answer(Result<Option<WatchResponse>, etcd_client::Error>),
}

/// The task's side: how to open the stream.
struct Stream {
    client: Client,
    anchor: String,
    metrics: Arc<Metrics>,
    timeout: Duration,
    commands: mpsc::UnboundedSender<Command>,
}

/// An open stream and what it serves.
struct Open {
    number: u64,
    /// To the forwarder task, which owns the stream's sending half.
    requests: mpsc::UnboundedSender<Request>,
    responses: WatchStream,
    /// The key of the stream's anchor, which probes watch too.
    anchor: String,
    /// What the "created" replies to come are for, in the order the creates were sent.
    expected: VecDeque<Expected>,
    /// The watches made, each waiting for the reply to the probe sent after it; `None` for
    /// one the server refused.
    probing: VecDeque<Option<Made>>,
    /// Each made watch's events go to its owner.
    routes: HashMap<i64, Route>,
    metrics: Arc<Metrics>,
}

/// A request on the stream, as the forwarder sends it.
enum Request {
    Watch { key: String, options: WatchOptions },
    Cancel(i64),
}

/// Sends `requests` on the stream in order, waiting for room as long as it takes, until
/// the stream breaks or its [`Open`] is dropped.
async fn forward(mut watcher: Watcher, mut requests: mpsc::UnboundedReceiver<Request>) {
    while let Some(request) = requests.recv().await {
        let sent = match request {
            Request::Watch { key, options } => watcher.watch(key, Some(options)).await,
            Request::Cancel(id) => watcher.cancel_by_id(id).await,
        };
        if let Err(error) = sent {
            // The stream broke; its end is the reader's next answer.
            tracing::debug!(%error, "etcd: a watch request could not be sent");
            return;
        }
    }
}

/// A watch asked for by an owner.
struct Asked {
    key: String,
    options: WatchOptions,
    reply: oneshot::Sender<Result<Watch, LockError>>,
    /// Creates sent for it so far.
    tries: u32,
}

/// What a "created" reply is for.
enum Expected {
    Watch(Asked),
    /// The probe sent right after a watch (see [`Open::ask`]).
    Probe,
}

/// A watch the server made, before its probe's reply.
struct Made {
    asked: Asked,
    id: i64,
    from: i64,
    mailbox: Arc<Mailbox>,
}

/// How many times a watch is made before it is handed over even though a probe could
/// not tell that it is synced.
const PROBE_TRIES: u32 = 4;

impl Stream {
    async fn run(self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut opened = 0u64;
        let mut open: Option<Open> = None;
        // A command taken from the queue early, while gathering a batch of watches.
        let mut taken: Option<Command> = None;
        loop {
            let Some(current) = open.as_mut() else {
                // No stream: the next watch asked for opens one.
                let command = match taken.take() {
                    Some(command) => Some(command),
                    None => commands.recv().await,
                };
                match command {
                    Some(Command::Add {
                        key,
                        options,
                        reply,
                    }) => match self.open(opened + 1).await {
                        Ok(mut fresh) => {
                            opened += 1;
                            let first = Asked::new(key, options, reply);
                            fresh.ask(batch(first, &mut commands, &mut taken));
                            open = Some(fresh);
                        }
                        Err(error) => {
                            let _ = reply.send(Err(error));
                        }
                    },
                    Some(Command::Cancel { .. }) => {}
                    // The stream it was on broke.
                    Some(Command::Hold { held, .. }) => held.ended(),
                    Some(Command::Stop) | None => return,
                }
                continue;
            };
            let step = match taken.take() {
                Some(command) => Step::Command(Some(command)),
                None => tokio::select! {
                    command = commands.recv() => Step::Command(command),
                    response = current.responses.message() => Step::Answer(response),
                },
            };
            match step {
                Step::Command(Some(Command::Add {
                    key,
                    options,
                    reply,
                })) => {
                    let first = Asked::new(key, options, reply);
                    current.ask(batch(first, &mut commands, &mut taken));
                }
                Step::Command(Some(Command::Cancel { stream, id })) => {
                    if stream == current.number && current.routes.remove(&id).is_some() {
                        self.metrics.record_server_requests(1);
                        if !current.send(Request::Cancel(id)) {
                            close(&mut open);
                        }
                    }
                }
                Step::Command(Some(Command::Hold {
                    stream,
                    id,
                    mailbox,
                    held,
                })) => {
                    if stream == current.number {
                        current.hold(id, &mailbox, held, &self.commands);
                    } else {
                        held.ended();
                    }
                }
                Step::Command(Some(Command::Stop) | None) => return,
                Step::Answer(Ok(Some(response))) => {
                    current.deliver(response, &self.commands);
                }
                Step::Answer(broken) => {
                    // Every watch on it ends (its owner looks again), and those not yet
                    // made fail, retryably: dropping the stream drops their replies and
                    // closes their mailboxes.
                    tracing::debug!(?broken, "etcd: the watch stream broke");
                    close(&mut open);
                }
            }
        }
    }

    /// Opens stream `number` with its anchor watch, within the request timeout.
    async fn open(&self, number: u64) -> Result<Open, LockError> {
        let mut watches = self.client.watch_client();
        let anchor = sees_nothing();
        self.metrics.record_server_requests(1);
        let opening = watches.watch(self.anchor.as_str(), Some(anchor));
        let (watcher, responses) = match tokio::time::timeout(self.timeout, opening).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(error)) => return Err(lock_error(error, None)),
            Err(_) => return Err(timed_out(None, self.timeout)),
        };
        tracing::debug!(number, "etcd: a watch stream opened");
        let (requests, to_send) = mpsc::unbounded_channel();
        tokio::spawn(forward(watcher, to_send));
        Ok(Open {
            number,
            requests,
            responses,
            anchor: self.anchor.clone(),
            expected: VecDeque::new(),
            probing: VecDeque::new(),
            routes: HashMap::new(),
            metrics: Arc::clone(&self.metrics),
        })
    }
}

/// Drops the stream: every watch on it ends, a wait's or an observer's as its mailbox
/// closes, a held key's as it is told to watch anew.
fn close(open: &mut Option<Open>) {
    let Some(mut broken) = open.take() else {
        return;
    };
    for (_, route) in broken.routes.drain() {
        if let Route::Held(held) = route {
            held.ended();
        }
    }
}

/// `first` and the watches asked for right after it, already queued (a waiter asks for
/// two at once): they share one probe. A command of another kind ends the batch and is
/// kept in `taken`, to be handled next.
fn batch(
    first: Asked,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    taken: &mut Option<Command>,
) -> Vec<Asked> {
    let mut batch = vec![first];
    while let Ok(command) = commands.try_recv() {
        match command {
            Command::Add {
                key,
                options,
                reply,
            } => batch.push(Asked::new(key, options, reply)),
            other => {
                *taken = Some(other);
                break;
            }
        }
    }
    batch
}

impl Asked {
    fn new(
        key: String,
        options: WatchOptions,
        reply: oneshot::Sender<Result<Watch, LockError>>,
    ) -> Self {
        Asked {
            key,
            options,
            reply,
            tries: 0,
        }
    }
}

/// A watch that no event matches.
fn sees_nothing() -> WatchOptions {
    WatchOptions::new().with_filters([WatchFilterType::NoPut, WatchFilterType::NoDelete])
}

impl Open {
    /// Sends the creates of `batch`'s watches and of one probe after them.
    ///
    /// The server makes a watch without a start revision from just after the revision it
    /// reads first; if a write is applied between that read and the watch's insertion, the
    /// watch starts behind the store and joins the unsynced watchers after all (a race
    /// whose window is a write's notification of the watchers, which holds the store's
    /// lock: a few percent of the watches made under a steady stream of writes). The
    /// probe, an anchor watch made right after on the same stream, reads the store's
    /// revision after the watches' insertion: the same revision as a watch's means no
    /// write came in between, and that watch is synced; a later one, and the watch is made
    /// again (up to [`PROBE_TRIES`] times).
    fn ask(&mut self, batch: Vec<Asked>) {
        // The probe's create and its cancel.
        self.metrics.record_server_requests(2);
        for mut asked in batch {
            asked.tries += 1;
            if asked.tries > 1 {
                self.metrics.record_server_requests(1);
            }
            let request = Request::Watch {
                key: asked.key.clone(),
                options: asked.options.clone(),
            };
            if !self.send(request) {
                // The stream is broken, and its end is the next answer: the watches asked
                // for fail (retryably) as their replies are dropped, those sent already
                // end with the stream.
                return;
            }
            self.expected.push_back(Expected::Watch(asked));
        }
        let probe = Request::Watch {
            key: self.anchor.clone(),
            options: sees_nothing(),
        };
        if self.send(probe) {
            self.expected.push_back(Expected::Probe);
        }
    }

    /// Takes over watch `id` for the held key `held` from its owner (see [`Watch::hold`]),
    /// with the answers its mailbox kept: a deletion among them is told at once.
    fn hold(
        &mut self,
        id: i64,
        mailbox: &Mailbox,
        held: Arc<dyn Held>,
        commands: &mpsc::UnboundedSender<Command>,
    ) {
        for answer in mailbox.take_all() {
            if answer.canceled() {
                self.routes.remove(&id);
                held.ended();
                return;
            }
            if held.is_deleted(&answer) {
                self.routes.insert(id, Route::Settling);
                held.deleted(self.cancelling(id, commands));
                return;
            }
        }
        match self.routes.get_mut(&id) {
            Some(route @ Route::Mailbox(_)) => *route = Route::Held(held),
            // Cancelled by the server, its answer taken above.
            _ => held.ended(),
        }
    }

    /// A handle on watch `id` whose drop cancels it.
    fn cancelling(&self, id: i64, commands: &mpsc::UnboundedSender<Command>) -> Watch {
        Watch {
            from: 0,
            id,
            stream: self.number,
            mailbox: Arc::default(),
            commands: commands.clone(),
            cancels: true,
        }
    }

    /// Hands `request` to the forwarder; `false` once the stream broke.
    fn send(&self, request: Request) -> bool {
        self.requests.send(request).is_ok()
    }

    /// Hands `response` to the watch it is for: a "created" to the watch or probe its
    /// create was for, anything else by its watch id.
    fn deliver(&mut self, response: WatchResponse, commands: &mpsc::UnboundedSender<Command>) {
        let id = response.watch_id();
        if !response.created() {
            let canceled = response.canceled();
            let held = match self.routes.get(&id) {
                Some(Route::Held(held)) => Arc::clone(held),
                Some(Route::Mailbox(outbox)) => {
                    outbox.send(Box::new(response));
                    if canceled {
                        self.routes.remove(&id);
                    }
                    return;
                }
                Some(Route::Settling) | None => {
                    if canceled {
                        self.routes.remove(&id);
                    }
                    return;
                }
            };
            if canceled {
                self.routes.remove(&id);
                held.ended();
            } else if held.is_deleted(&response) {
                self.routes.insert(id, Route::Settling);
                held.deleted(self.cancelling(id, commands));
            }
            return;
        }
        let revision = response.header().map_or(0, |header| header.revision());
        match self.expected.pop_front() {
            None => tracing::debug!(id, "etcd: a watch made that nobody asked for"),
            Some(Expected::Watch(asked)) if response.canceled() => {
                let _ = asked.reply.send(Err(refused(&response)));
                self.probing.push_back(None);
            }
            Some(Expected::Watch(asked)) => {
                let mailbox = Arc::new(Mailbox::default());
                self.routes
                    .insert(id, Route::Mailbox(Outbox(Arc::clone(&mailbox))));
                self.probing.push_back(Some(Made {
                    asked,
                    id,
                    from: revision,
                    mailbox,
                }));
            }
            Some(Expected::Probe) => {
                if !response.canceled() {
                    self.send(Request::Cancel(id));
                }
                // The probe tells about every watch made since the one before it.
                let mut again = Vec::new();
                for made in self.probing.drain(..).flatten() {
                    if revision > made.from && made.asked.tries < PROBE_TRIES {
                        tracing::trace!(made.from, revision, "etcd: a watch made again");
                        self.routes.remove(&made.id);
                        self.metrics.record_server_requests(1);
                        let _ = self.requests.send(Request::Cancel(made.id));
                        again.push(made.asked);
                        continue;
                    }
                    let watch = Watch {
                        from: made.from,
                        id: made.id,
                        stream: self.number,
                        mailbox: made.mailbox,
                        commands: commands.clone(),
                        cancels: true,
                    };
                    // An owner that gave up meanwhile drops the watch, which cancels it.
                    let _ = made.asked.reply.send(Ok(watch));
                }
                if !again.is_empty() {
                    self.ask(again);
                }
            }
        }
    }
}

/// The error of a watch the server refused to make.
fn refused(response: &WatchResponse) -> LockError {
    let reason = response.cancel_reason();
    if reason.contains("permission denied") {
        return LockError::PermissionDenied {
            backend: BACKEND,
            name: None,
            message: format!("a watch was refused: {reason}"),
        };
    }
    LockError::other(BACKEND, format!("a watch was refused: {reason}")).retryable(true)
}

/// The newest deletion after `revision` that `answer` reports.
pub(crate) fn deleted_after(answer: &WatchResponse, revision: i64) -> Option<i64> {
    answer
        .events()
        .iter()
        .filter(|event| event.event_type() == EventType::Delete)
        .filter_map(|event| event.kv().map(|kv| kv.mod_revision()))
        .filter(|&at| at > revision)
        .max()
}
