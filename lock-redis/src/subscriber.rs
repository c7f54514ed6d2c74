//! One subscription connection per server, shared by every pub/sub waiter of a provider
//! (as Redisson shares its): a waiter joins a lock's release channel; the first to join
//! sends `SUBSCRIBE`, the last to leave `UNSUBSCRIBE`; every release message reaches every
//! waiter joined to the channel.
//!
//! One task owns the connection and the channel table, and handles joins and leaves in the
//! order they were made, so an `UNSUBSCRIBE` can never overtake a later `SUBSCRIBE` of the
//! same channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use lock_core::{LockError, Metrics};
use redis::Client;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::error::{connection, lock_error, timed_out_request};

/// Release messages a slow waiter may fall behind by before they merge into one.
const BACKLOG: usize = 16;

/// The shared subscription connection of one server.
pub(crate) struct Subscriber {
    link: Arc<Link>,
    /// Requests to the task that owns the connection; started on first use.
    requests: Mutex<Option<mpsc::UnboundedSender<Request>>>,
    /// Closed for good (its server is no longer the primary): no task is started again.
    closed: std::sync::atomic::AtomicBool,
}

/// What the connection task needs to connect and report.
struct Link {
    client: Client,
    timeout: Duration,
    backend: &'static str,
    metrics: Arc<Metrics>,
}

enum Request {
    Join {
        channel: String,
        name: String,
        /// For the subscription's leave: a join whose reply is never received leaves too.
        requests: mpsc::UnboundedSender<Request>,
        reply: oneshot::Sender<Result<Subscription, LockError>>,
    },
    Leave {
        channel: String,
        generation: u64,
    },
    /// Drop the connection and end: every subscription ends, and its waiter joins again
    /// (on another server).
    Close,
}

struct Joined {
    receiver: broadcast::Receiver<()>,
    generation: u64,
}

/// One waiter's place on a release channel; leaves it when dropped.
pub(crate) struct Subscription {
    receiver: broadcast::Receiver<()>,
    channel: String,
    /// The connection this place belongs to: a leave for an older connection is void.
    generation: u64,
    requests: mpsc::UnboundedSender<Request>,
}

/// What a waiter heard on its channel.
pub(crate) enum Heard {
    /// A release (or several, merged).
    Release,
    /// The subscription connection ended: join again.
    Ended,
}

impl Subscription {
    /// The next release on the channel, or the end of the connection.
    pub(crate) async fn next(&mut self) -> Heard {
        match self.receiver.recv().await {
            Ok(()) | Err(RecvError::Lagged(_)) => Heard::Release,
            Err(RecvError::Closed) => Heard::Ended,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // The task is gone only once every subscription is: nothing left to leave then.
        let _ = self.requests.send(Request::Leave {
            channel: std::mem::take(&mut self.channel),
            generation: self.generation,
        });
    }
}

impl Subscriber {
    /// A subscriber for `client`'s server; connects on the first join.
    pub(crate) fn new(
        client: Client,
        timeout: Duration,
        backend: &'static str,
        metrics: Arc<Metrics>,
    ) -> Self {
        Subscriber {
            link: Arc::new(Link {
                client,
                timeout,
                backend,
                metrics,
            }),
            requests: Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Joins `channel`; returns once the server has confirmed the subscription, so that a
    /// release published after this returns is heard. Bounded by the request timeout.
    pub(crate) async fn join(&self, channel: &str, name: &str) -> Result<Subscription, LockError> {
        let (reply, joined) = oneshot::channel();
        let requests = self.requests();
        let request = Request::Join {
            channel: channel.to_owned(),
            name: name.to_owned(),
            requests: requests.clone(),
            reply,
        };
        if requests.send(request).is_err() {
            return Err(self.task_gone(name));
        }
        // A join abandoned here leaves again: the subscription in the unreceived reply is
        // dropped with it.
        match tokio::time::timeout(self.link.timeout, joined).await {
            Ok(Ok(joined)) => joined,
            Ok(Err(_)) => Err(self.task_gone(name)),
            Err(_) => Err(timed_out_request(self.link.backend, Some(name))),
        }
    }

    /// The running task's request queue, starting the task if there is none (and the
    /// subscriber is not closed: then a queue whose requests go nowhere, so that joins fail
    /// as with a task gone).
    fn requests(&self) -> mpsc::UnboundedSender<Request> {
        let mut requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        match requests.as_ref() {
            Some(running) if !running.is_closed() => running.clone(),
            _ if self.closed.load(std::sync::atomic::Ordering::Acquire) => {
                mpsc::unbounded_channel().0
            }
            _ => {
                let (sender, receiver) = mpsc::unbounded_channel();
                tokio::spawn(serve(Arc::clone(&self.link), receiver));
                *requests = Some(sender.clone());
                sender
            }
        }
    }

    /// Ends the connection and every subscription on it.
    pub(crate) fn close(&self) {
        let requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(running) = requests.as_ref() {
            let _ = running.send(Request::Close);
        }
    }

    fn task_gone(&self, name: &str) -> LockError {
        connection(self.link.backend, Some(name), "the subscription task ended")
    }
}

/// A channel's waiters on the current connection.
struct Channel {
    sender: broadcast::Sender<()>,
    waiters: usize,
}

/// The connection and what is subscribed on it.
#[derive(Default)]
struct Connection {
    live: Option<(PubSubSink, PubSubStream)>,
    generation: u64,
    channels: HashMap<String, Channel>,
}

impl Connection {
    /// Forgets the connection: every waiter's subscription ends and it joins again.
    fn drop_connection(&mut self) {
        self.live = None;
        self.channels.clear();
    }

    /// The next message's channel; pending forever without a connection; `None` when the
    /// connection ended.
    async fn next_channel(&mut self) -> Option<String> {
        match self.live.as_mut() {
            Some((_, stream)) => stream
                .next()
                .await
                .map(|message| message.get_channel_name().to_owned()),
            None => std::future::pending().await,
        }
    }

    /// Joins `channel`; a `SUBSCRIBE` that fails on a connection made earlier (it may have
    /// died unnoticed) is tried once more on a new one.
    async fn join(&mut self, link: &Link, channel: &str) -> Result<Joined, redis::RedisError> {
        let fresh = self.live.is_none();
        match self.join_once(link, channel).await {
            Err(error) if !fresh => {
                tracing::debug!(%error, channel, "subscribe failed; on a new connection again");
                self.join_once(link, channel).await
            }
            joined => joined,
        }
    }

    async fn join_once(&mut self, link: &Link, channel: &str) -> Result<Joined, redis::RedisError> {
        let sink = match &mut self.live {
            Some((sink, _)) => sink,
            None => {
                link.metrics.record_server_requests(1);
                let pubsub = within(link.timeout, link.client.get_async_pubsub()).await?;
                self.generation += 1;
                let (sink, _) = self.live.insert(pubsub.split());
                sink
            }
        };
        if let Some(joined) = self.channels.get_mut(channel) {
            joined.waiters += 1;
            return Ok(Joined {
                receiver: joined.sender.subscribe(),
                generation: self.generation,
            });
        }
        link.metrics.record_server_requests(1);
        if let Err(error) = within(link.timeout, sink.subscribe(channel)).await {
            self.drop_connection();
            return Err(error);
        }
        let (sender, receiver) = broadcast::channel(BACKLOG);
        self.channels
            .insert(channel.to_owned(), Channel { sender, waiters: 1 });
        Ok(Joined {
            receiver,
            generation: self.generation,
        })
    }

    async fn leave(&mut self, link: &Link, channel: &str, generation: u64) {
        if generation != self.generation {
            return;
        }
        let Some(joined) = self.channels.get_mut(channel) else {
            return;
        };
        joined.waiters -= 1;
        if joined.waiters > 0 {
            return;
        }
        self.channels.remove(channel);
        if let Some((sink, _)) = self.live.as_mut() {
            link.metrics.record_server_requests(1);
            if let Err(error) = within(link.timeout, sink.unsubscribe(channel)).await {
                tracing::debug!(%error, channel, "unsubscribe failed; dropping the connection");
                self.drop_connection();
            }
        }
    }
}

/// `request` within `timeout`, a timeout turned into an I/O error.
async fn within<T>(
    timeout: Duration,
    request: impl Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::time::timeout(timeout, request)
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no reply within the request timeout",
            )))
        })
}

/// The task owning the connection: handles joins and leaves in order, and passes each
/// release message to the waiters on its channel. Ends when every sender is gone.
async fn serve(link: Arc<Link>, mut requests: mpsc::UnboundedReceiver<Request>) {
    let mut connection = Connection::default();
    loop {
        tokio::select! {
            request = requests.recv() => match request {
                None => return,
                Some(Request::Join { channel, name, requests, reply }) => {
                    let joined = match connection.join(&link, &channel).await {
                        Ok(joined) => Ok(Subscription {
                            receiver: joined.receiver,
                            channel,
                            generation: joined.generation,
                            requests,
                        }),
                        Err(error) => Err(lock_error(link.backend, error, Some(&name))),
                    };
                    // A waiter that gave up drops the subscription, which leaves.
                    let _ = reply.send(joined);
                }
                Some(Request::Leave { channel, generation }) => {
                    connection.leave(&link, &channel, generation).await;
                }
                Some(Request::Close) => return,
            },
            channel = connection.next_channel() => match channel {
                Some(channel) => {
                    if let Some(joined) = connection.channels.get(&channel) {
                        // No receiver left is fine: its leave is on the way.
                        let _ = joined.sender.send(());
                    }
                }
                None => {
                    tracing::debug!("the subscription connection ended");
                    connection.drop_connection();
                }
            },
        }
    }
}
