//! One watch stream per session, shared by every wait, guard and observer of the session.
//!
//! Implementation details. etcd serves a new watch at once only when it starts after the
//! store's current revision, or has no start revision; a watch that starts at or before the
//! current revision joins the "unsynced" watchers, which a loop catches up every 100 ms
//! (`mvcc/watchable_store.go`, `syncWatchersLoop`). A waiter that looked at revision R and
//! then asked for the events from R + 1 met that loop whenever anything at all was written
//! between its look and its watch: under contention, nearly always. So every watch here is
//! opened without a start revision, and the header of its "created" reply gives the
//! revision it starts after: [`Watch::from`]. A caller that looked at revision R misses
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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, WatchFilterType, WatchOptions, WatchResponse, WatchStream, Watcher};
use lock_core::{LockError, Metrics};
use tokio::sync::{mpsc, oneshot};

use crate::error::{BACKEND, connection, lock_error, timed_out};

/// A session's watch stream: a task that owns it, and the way to ask it for watches.
pub(crate) struct Watches {
    commands: mpsc::UnboundedSender<Command>,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

/// One watch on the session's stream. Dropped, it is cancelled.
#[derive(Debug)]
pub(crate) struct Watch {
    /// The watch sees every event after this revision (the store's when it began).
    pub(crate) from: i64,
    id: i64,
    stream: u64,
    events: mpsc::UnboundedReceiver<WatchResponse>,
    commands: mpsc::UnboundedSender<Command>,
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
    pub(crate) async fn next(&mut self) -> Option<WatchResponse> {
        self.events.recv().await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
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

trait ForLock {
    fn for_lock(self, name: &str) -> LockError;
}

impl ForLock for LockError {
    /// The error, naming the lock when the stream's task could not.
    fn for_lock(self, name: &str) -> LockError {
        match self {
            LockError::Connection {
                backend,
                name: None,
                message,
                source,
            } => LockError::Connection {
                backend,
                name: Some(name.to_owned()),
                message,
                source,
            },
            other => other,
        }
    }
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
    watcher: Watcher,
    responses: WatchStream,
    /// Watches asked for and not yet made, in the order they were asked for.
    pending: VecDeque<oneshot::Sender<Result<Watch, LockError>>>,
    /// Each made watch's events go to its owner.
    routes: HashMap<i64, mpsc::UnboundedSender<WatchResponse>>,
}

impl Stream {
    async fn run(self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut opened = 0u64;
        let mut open: Option<Open> = None;
        loop {
            let Some(current) = open.as_mut() else {
                // No stream: the next watch asked for opens one.
                match commands.recv().await {
                    Some(Command::Add {
                        key,
                        options,
                        reply,
                    }) => match self.open(opened + 1).await {
                        Ok(mut fresh) => {
                            opened += 1;
                            fresh.ask(key, options, reply).await;
                            open = Some(fresh);
                        }
                        Err(error) => {
                            let _ = reply.send(Err(error));
                        }
                    },
                    Some(Command::Cancel { .. }) => {}
                    Some(Command::Stop) | None => return,
                }
                continue;
            };
            let step = tokio::select! {
                command = commands.recv() => Step::Command(command),
                response = current.responses.message() => Step::Answer(response),
            };
            match step {
                Step::Command(Some(Command::Add {
                    key,
                    options,
                    reply,
                })) => current.ask(key, options, reply).await,
                Step::Command(Some(Command::Cancel { stream, id })) => {
                    if stream == current.number && current.routes.remove(&id).is_some() {
                        self.metrics.record_server_requests(1);
                        if current.watcher.cancel_by_id(id).await.is_err() {
                            open = None;
                        }
                    }
                }
                Step::Command(Some(Command::Stop) | None) => return,
                Step::Answer(Ok(Some(response))) => current.deliver(response, &self.commands),
                Step::Answer(broken) => {
                    // Every watch on it ends (its owner looks again), and those not yet
                    // made fail, retryably: dropping the stream drops their channels.
                    tracing::debug!(?broken, "etcd: the watch stream broke");
                    open = None;
                }
            }
        }
    }

    /// Opens stream `number` with its anchor watch, within the request timeout.
    async fn open(&self, number: u64) -> Result<Open, LockError> {
        let mut watches = self.client.watch_client();
        let anchor =
            WatchOptions::new().with_filters([WatchFilterType::NoPut, WatchFilterType::NoDelete]);
        self.metrics.record_server_requests(1);
        let opening = watches.watch(self.anchor.as_str(), Some(anchor));
        let (watcher, responses) = match tokio::time::timeout(self.timeout, opening).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(error)) => return Err(lock_error(error, None)),
            Err(_) => return Err(timed_out(None, self.timeout)),
        };
        tracing::debug!(number, "etcd: a watch stream opened");
        Ok(Open {
            number,
            watcher,
            responses,
            pending: VecDeque::new(),
            routes: HashMap::new(),
        })
    }
}

impl Open {
    /// Sends a watch's create request; its reply will be the next unclaimed "created".
    async fn ask(
        &mut self,
        key: String,
        options: WatchOptions,
        reply: oneshot::Sender<Result<Watch, LockError>>,
    ) {
        match self.watcher.watch(key, Some(options)).await {
            Ok(()) => self.pending.push_back(reply),
            Err(error) => {
                let _ = reply.send(Err(lock_error(error, None)));
            }
        }
    }

    /// Hands `response` to the watch it is for: a "created" to the first watch waiting to
    /// be made, anything else by its watch id.
    fn deliver(&mut self, response: WatchResponse, commands: &mpsc::UnboundedSender<Command>) {
        let id = response.watch_id();
        if response.created() {
            let Some(reply) = self.pending.pop_front() else {
                tracing::debug!(id, "etcd: a watch made that nobody asked for");
                return;
            };
            if response.canceled() {
                let _ = reply.send(Err(refused(&response)));
                return;
            }
            let (events, received) = mpsc::unbounded_channel();
            self.routes.insert(id, events);
            let watch = Watch {
                from: response.header().map_or(0, |header| header.revision()),
                id,
                stream: self.number,
                events: received,
                commands: commands.clone(),
            };
            // An owner that gave up meanwhile drops the watch, which cancels it.
            let _ = reply.send(Ok(watch));
            return;
        }
        let canceled = response.canceled();
        if let Some(route) = self.routes.get(&id) {
            let _ = route.send(response);
        }
        if canceled {
            self.routes.remove(&id);
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
    LockError::Backend {
        backend: BACKEND,
        name: None,
        message: format!("a watch was refused: {reason}"),
        retryable: true,
        source: None,
    }
}
