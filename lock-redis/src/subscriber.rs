//! One subscription connection per provider, shared by every pub/sub waiter of it (as
//! Redisson shares its): a waiter joins a lock's release channel; the first to join sends
//! `SUBSCRIBE`, the last to leave `UNSUBSCRIBE`; every release message reaches every waiter
//! joined to the channel. On a Redis Cluster the connection is a cluster connection (one
//! connection per node inside) and the channels are sharded (`SSUBSCRIBE`, Redis 7): each
//! on the primary serving its slot, which is the lock's.
//!
//! One task owns the connection and the channel table, and handles joins and leaves in the
//! order they were made, so an `UNSUBSCRIBE` can never overtake a later `SUBSCRIBE` of the
//! same channel. Whatever ends a channel's subscription ends its waiters' places, and they
//! try the lock and join again: the end of the connection (on a cluster, of any node's
//! connection: then a new cluster connection learns the slots afresh), and on a cluster the
//! server's own `SUNSUBSCRIBE` when the channel's slot moves to another primary. Releases
//! published while nobody listened are caught by that try, or by the waiters' refresh.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use lock_core::LockError;
use lock_core::kit::unpoisoned;
use redis::aio::{PubSubSink, PubSubStream};
use redis::cluster_async::ClusterConnection;
use redis::{Client, PushInfo, PushKind, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::connection::{ClusterClients, Settings};
use crate::error::{connection, lock_error, timed_out_request};

/// Release messages a slow waiter may fall behind by before they merge into one.
const BACKLOG: usize = 16;

/// The shared subscription connection of one server.
pub(crate) struct Subscriber {
    link: Arc<Link>,
    /// Requests to the task that owns the connection; started on first use.
    requests: Mutex<Option<mpsc::UnboundedSender<Request>>>,
    /// Closed for good (its server is no longer the primary): no task is started again.
    closed: AtomicBool,
}

/// Where the subscription connection goes.
pub(crate) enum Source {
    /// One server: `SUBSCRIBE`.
    Server(Client),
    /// A cluster: `SSUBSCRIBE`.
    Cluster(ClusterClients),
}

/// What the connection task needs to connect and report.
struct Link {
    source: Source,
    settings: Settings,
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
        place: u64,
    },
    /// Drop the connection and end: every subscription ends, and its waiter joins again
    /// (on another server).
    Close,
}

/// One waiter's place on a release channel; leaves it when dropped.
pub(crate) struct Subscription {
    receiver: broadcast::Receiver<()>,
    channel: String,
    /// The channel's subscription this place belongs to: a leave of one that ended (and
    /// was perhaps made again since) is void.
    place: u64,
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
            place: self.place,
        });
    }
}

impl Subscriber {
    /// A subscriber for `source`; connects on the first join.
    pub(crate) fn new(source: Source, settings: Settings) -> Self {
        Subscriber {
            link: Arc::new(Link { source, settings }),
            requests: Mutex::new(None),
            closed: AtomicBool::new(false),
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
        match tokio::time::timeout(self.link.settings.timeout, joined).await {
            Ok(Ok(joined)) => joined,
            Ok(Err(_)) => Err(self.task_gone(name)),
            Err(_) => Err(timed_out_request(self.link.settings.backend, Some(name))),
        }
    }

    /// The running task's request queue, starting the task if there is none (and the
    /// subscriber is not closed: then a queue whose requests go nowhere, so that joins fail
    /// as with a task gone).
    fn requests(&self) -> mpsc::UnboundedSender<Request> {
        let mut requests = unpoisoned(&self.requests);
        match requests.as_ref() {
            Some(running) if !running.is_closed() => running.clone(),
            _ if self.closed.load(Ordering::Acquire) => mpsc::unbounded_channel().0,
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
        let requests = unpoisoned(&self.requests);
        self.closed.store(true, Ordering::Release);
        if let Some(running) = requests.as_ref() {
            let _ = running.send(Request::Close);
        }
    }

    fn task_gone(&self, name: &str) -> LockError {
        let backend = self.link.settings.backend;
        connection(backend, Some(name), "the subscription task ended")
    }
}

/// A place on a channel: its receiver, and its subscription's place.
type Joined = (broadcast::Receiver<()>, u64);

/// A channel's waiters on the current connection.
struct Channel {
    sender: broadcast::Sender<()>,
    waiters: usize,
    /// Tells this subscription from the channel's earlier and later ones.
    place: u64,
}

/// A live subscription connection.
enum Live {
    Server(PubSubSink, PubSubStream),
    /// A cluster connection, and what its connections hear.
    Cluster(ClusterConnection, mpsc::UnboundedReceiver<PushInfo>),
}

/// What the connection heard.
enum Event {
    /// A message on a channel.
    Message(String),
    /// A channel's subscription ended: this task's own leave confirmed, or the server
    /// ended it (its slot moved).
    Unsubscribed(String),
    /// The connection ended.
    Ended,
}

/// The connection and what is subscribed on it.
#[derive(Default)]
struct Connection {
    live: Option<Live>,
    /// Per channel, how many of this task's own unsubscriptions are yet to be heard
    /// confirmed on a cluster connection (the confirmation comes with these pushes too).
    leaving: HashMap<String, usize>,
    /// The last subscription's place.
    places: u64,
    channels: HashMap<String, Channel>,
}

impl Connection {
    /// Forgets the connection: every waiter's subscription ends and it joins again.
    fn drop_connection(&mut self) {
        self.live = None;
        self.channels.clear();
        self.leaving.clear();
    }

    /// What the connection hears next; pending forever without a connection.
    async fn next(&mut self) -> Event {
        match self.live.as_mut() {
            Some(Live::Server(_, stream)) => match stream.next().await {
                Some(message) => Event::Message(message.get_channel_name().to_owned()),
                None => Event::Ended,
            },
            Some(Live::Cluster(_, pushes)) => loop {
                let Some(push) = pushes.recv().await else {
                    return Event::Ended;
                };
                let channel = match push.data.first() {
                    Some(Value::BulkString(name)) => String::from_utf8_lossy(name).into_owned(),
                    _ => String::new(),
                };
                match push.kind {
                    PushKind::SMessage => return Event::Message(channel),
                    PushKind::SUnsubscribe => return Event::Unsubscribed(channel),
                    PushKind::Disconnection => return Event::Ended,
                    // Subscriptions confirmed, and anything else.
                    _ => {}
                }
            },
            None => std::future::pending().await,
        }
    }

    /// Joins `channel`; a subscription that fails on a server's connection made earlier (it
    /// may have died unnoticed) is tried once more on a new one. (A cluster connection
    /// mends its nodes' connections itself, and one shard's trouble is not the others'.)
    async fn join(&mut self, link: &Link, channel: &str) -> redis::RedisResult<Joined> {
        let earlier_server_connection = matches!(self.live, Some(Live::Server(..)));
        match self.join_once(link, channel).await {
            Err(error) if earlier_server_connection => {
                tracing::debug!(%error, channel, "subscribe failed; on a new connection again");
                self.join_once(link, channel).await
            }
            joined => joined,
        }
    }

    async fn join_once(&mut self, link: &Link, channel: &str) -> redis::RedisResult<Joined> {
        let live = match &mut self.live {
            Some(live) => live,
            None => {
                link.settings.metrics.record_server_requests(1);
                self.live.insert(link.connect().await?)
            }
        };
        if let Some(joined) = self.channels.get_mut(channel) {
            joined.waiters += 1;
            return Ok((joined.sender.subscribe(), joined.place));
        }
        link.settings.metrics.record_server_requests(1);
        if let Err(error) = within(link.settings.timeout, live.subscribe(channel)).await {
            if matches!(live, Live::Server(..)) {
                self.drop_connection();
            }
            return Err(error);
        }
        let (sender, receiver) = broadcast::channel(BACKLOG);
        self.places += 1;
        let place = self.places;
        let joined = Channel {
            sender,
            waiters: 1,
            place,
        };
        self.channels.insert(channel.to_owned(), joined);
        Ok((receiver, place))
    }

    /// A subscription to `channel` ended: this task's own leave confirmed, or the server
    /// ended it (the channel's slot moved), and then its waiters join again, on the
    /// primary that serves the slot now.
    fn unsubscribed(&mut self, channel: String) {
        if let Some(own) = self.leaving.get_mut(&channel) {
            *own -= 1;
            if *own == 0 {
                self.leaving.remove(&channel);
            }
            return;
        }
        tracing::debug!(channel, "the server ended a subscription");
        self.channels.remove(&channel);
    }

    async fn leave(&mut self, link: &Link, channel: &str, place: u64) {
        let Some(joined) = self.channels.get_mut(channel).filter(|j| j.place == place) else {
            return;
        };
        joined.waiters -= 1;
        if joined.waiters > 0 {
            return;
        }
        self.channels.remove(channel);
        let Some(live) = self.live.as_mut() else {
            return;
        };
        link.settings.metrics.record_server_requests(1);
        let leaving = within(link.settings.timeout, live.unsubscribe(channel)).await;
        if leaving.is_ok() && matches!(live, Live::Cluster(..)) {
            *self.leaving.entry(channel.to_owned()).or_default() += 1;
        }
        if let Err(error) = leaving {
            tracing::debug!(%error, channel, "unsubscribe failed; dropping the connection");
            self.drop_connection();
        }
    }
}

impl Live {
    /// `SUBSCRIBE`, or on a cluster `SSUBSCRIBE`, to `channel`.
    async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Live::Server(sink, _) => sink.subscribe(channel).await,
            Live::Cluster(cluster, _) => cluster.ssubscribe(channel).await,
        }
    }

    /// `UNSUBSCRIBE`, or on a cluster `SUNSUBSCRIBE`, from `channel`.
    async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Live::Server(sink, _) => sink.unsubscribe(channel).await,
            Live::Cluster(cluster, _) => cluster.sunsubscribe(channel).await,
        }
    }
}

impl Link {
    /// A new connection, within the request timeout (a cluster's: twice that, as it first
    /// asks a node for the slots, then connects to the others).
    async fn connect(&self) -> redis::RedisResult<Live> {
        match &self.source {
            Source::Server(client) => {
                let connecting = client.get_async_pubsub();
                let (sink, stream) = within(self.settings.timeout, connecting).await?.split();
                Ok(Live::Server(sink, stream))
            }
            Source::Cluster(clients) => {
                let (pushes, heard) = mpsc::unbounded_channel();
                let client = clients.subscriber(pushes)?;
                let connection =
                    within(self.settings.timeout * 2, client.get_async_connection()).await?;
                Ok(Live::Cluster(connection, heard))
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
                        Ok((receiver, place)) => Ok(Subscription {
                            receiver,
                            channel,
                            place,
                            requests,
                        }),
                        Err(error) => Err(lock_error(link.settings.backend, error, Some(&name))),
                    };
                    // A waiter that gave up drops the subscription, which leaves.
                    let _ = reply.send(joined);
                }
                Some(Request::Leave { channel, place }) => {
                    connection.leave(&link, &channel, place).await;
                }
                Some(Request::Close) => return,
            },
            event = connection.next() => match event {
                Event::Message(channel) => {
                    if let Some(joined) = connection.channels.get(&channel) {
                        // No receiver left is fine: its leave is on the way.
                        let _ = joined.sender.send(());
                    }
                }
                Event::Unsubscribed(channel) => connection.unsubscribed(channel),
                Event::Ended => {
                    tracing::debug!("the subscription connection ended");
                    connection.drop_connection();
                }
            },
        }
    }
}
