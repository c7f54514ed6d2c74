//! One proxied connection: two pumps (client→server, server→client) and the fault logic.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;
use tokio::time::Instant;

use super::pg::PgRequests;
use super::zk::{FrameHead, FrameParser, REPLY_HEAD, REQUEST_HEAD, is_create_op, is_delete_op};
use super::{Mode, ReplyKind, Shared, Slot, SwallowEvent};

/// Read buffer size per direction.
const CHUNK: usize = 16 * 1024;
/// Chunks a pump holds (delayed) before it stops reading.
const MAX_QUEUED: usize = 64;

/// Why a connection ended early.
enum Stop {
    /// A socket failed.
    Io(io::Error),
    /// A reply was swallowed; report it once the sockets are closed.
    Swallowed(Fire),
}

/// A swallow that happened, to be reported.
struct Fire {
    slot: Arc<Slot>,
    event: SwallowEvent,
}

/// The request whose reply this connection will swallow: a ZooKeeper request's xid, or
/// (`None`) whatever the server sends next.
struct Target {
    xid: Option<i32>,
    slot: Arc<Slot>,
}

/// Per-connection state shared by its two pumps.
struct Conn {
    id: u64,
    shared: Arc<Shared>,
    target: Mutex<Option<Target>>,
}

impl Conn {
    fn target(&self) -> MutexGuard<'_, Option<Target>> {
        self.target.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(target) = self.target().take() {
            tracing::debug!(
                id = self.id,
                xid = target.xid,
                "connection ended before the reply; swallow re-armed"
            );
            self.shared.rearm(target.slot);
        }
    }
}

/// Decrements the open-connection counter however the task ends (including abort).
struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs one accepted connection until it ends, is cut, or the proxy stops.
pub(super) async fn run(id: u64, client: TcpStream, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::AcqRel);
    let _open = OpenGuard(Arc::clone(&shared));
    let conn = Arc::new(Conn {
        id,
        shared: Arc::clone(&shared),
        target: Mutex::new(None),
    });
    let mut cut = shared.mode.subscribe();
    let outcome = tokio::select! {
        outcome = forward(Arc::clone(&conn), client) => outcome,
        _ = cut.wait_for(|m| *m == Mode::Cut) => {
            tracing::debug!(id, "connection cut");
            Ok(())
        }
    };
    // Every socket of this connection is closed by now.
    match outcome {
        Ok(()) => tracing::debug!(id, "connection closed"),
        Err(Stop::Io(error)) => tracing::debug!(id, %error, "connection failed"),
        Err(Stop::Swallowed(fire)) => {
            shared.swallowed.fetch_add(1, Ordering::AcqRel);
            tracing::debug!(id, event = ?fire.event, "reply swallowed, connection cut");
            fire.slot.done.send_replace(Some(fire.event));
        }
    }
}

/// Connects upstream (after any black hole) and pumps both ways.
async fn forward(conn: Arc<Conn>, mut client: TcpStream) -> Result<(), Stop> {
    let shared = Arc::clone(&conn.shared);
    let mut mode = shared.mode.subscribe();
    if !wait_out_black_hole(&mut client, &mut mode, &shared).await {
        return Ok(());
    }
    let server = TcpStream::connect(shared.upstream).await.map_err(|error| {
        tracing::debug!(id = conn.id, upstream = %shared.upstream, %error, "upstream connect failed");
        Stop::Io(error)
    })?;
    // Small request/response frames: do not let Nagle add latency of its own.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = Pump::new(
        Dir::ToUpstream,
        client_read,
        server_write,
        &conn,
        mode.clone(),
    );
    let down = Pump::new(Dir::ToClient, server_read, client_write, &conn, mode);
    tokio::try_join!(up.run(), down.run())?;
    Ok(())
}

/// While the mode is black hole, reads and drops what the client sends without connecting
/// upstream. Returns false when the client went away (or the proxy did) meanwhile.
async fn wait_out_black_hole(
    client: &mut TcpStream,
    mode: &mut watch::Receiver<Mode>,
    shared: &Shared,
) -> bool {
    let mut buf = vec![0u8; CHUNK];
    loop {
        if *mode.borrow_and_update() != Mode::BlackHole {
            return true;
        }
        tokio::select! {
            read = client.read(&mut buf) => match read {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    shared.dropped.fetch_add(n as u64, Ordering::AcqRel);
                }
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return false;
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToUpstream,
    ToClient,
}

/// Bytes due for writing at a given time, possibly followed by the swallow cut.
struct Chunk {
    due: Instant,
    data: Vec<u8>,
    then_cut: Option<Fire>,
}

/// Copies one direction, applying the mode chunk by chunk.
struct Pump {
    dir: Dir,
    src: OwnedReadHalf,
    dst: OwnedWriteHalf,
    conn: Arc<Conn>,
    mode: watch::Receiver<Mode>,
    parser: FrameParser,
    heads: Vec<FrameHead>,
    /// Towards the server: PostgreSQL's messages.
    pg: PgRequests,
    /// The PostgreSQL statements sent in the chunk just read.
    statements: Vec<String>,
    queue: VecDeque<Chunk>,
    /// Bytes read but not yet queued (towards the client: a reply header still incomplete
    /// while a swallow target is set).
    held: Vec<u8>,
    /// Absolute stream offset of `held[0]`.
    held_start: u64,
    /// Bytes read so far.
    read_total: u64,
    /// A swallow is queued: read nothing more.
    stopping: bool,
}

impl Pump {
    fn new(
        dir: Dir,
        src: OwnedReadHalf,
        dst: OwnedWriteHalf,
        conn: &Arc<Conn>,
        mode: watch::Receiver<Mode>,
    ) -> Self {
        let want = match dir {
            Dir::ToUpstream => REQUEST_HEAD,
            Dir::ToClient => REPLY_HEAD,
        };
        Self {
            dir,
            src,
            dst,
            conn: Arc::clone(conn),
            mode,
            parser: FrameParser::new(want),
            heads: Vec::new(),
            pg: PgRequests::default(),
            statements: Vec::new(),
            queue: VecDeque::new(),
            held: Vec::new(),
            held_start: 0,
            read_total: 0,
            stopping: false,
        }
    }

    fn shared(&self) -> &Shared {
        &self.conn.shared
    }

    fn current_mode(&self) -> Mode {
        *self.mode.borrow()
    }

    async fn run(mut self) -> Result<(), Stop> {
        let mut buf = vec![0u8; CHUNK];
        let mut eof = false;
        let mut read_error = None;
        loop {
            if (eof || self.stopping) && self.queue.is_empty() {
                break;
            }
            let due = self.queue.front().map(|c| c.due);
            let can_read = !eof && !self.stopping && self.queue.len() < MAX_QUEUED;
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    self.deliver_front().await?;
                }
                read = self.src.read(&mut buf), if can_read => match read {
                    Ok(0) => eof = true,
                    Ok(n) => self.ingest(&buf[..n]),
                    Err(error) => {
                        eof = true;
                        read_error = Some(error);
                    }
                },
                else => break,
            }
        }
        // The source ended. In a black hole, nobody hears about it until the mode changes.
        let _ = self.mode.wait_for(|m| *m != Mode::BlackHole).await;
        if !self.held.is_empty() && self.current_mode() != Mode::Cut {
            let held = std::mem::take(&mut self.held);
            self.write(&held).await?;
        }
        if let Some(error) = read_error {
            return Err(Stop::Io(error));
        }
        // Pass the half-close on; the other direction keeps going.
        let _ = self.dst.shutdown().await;
        Ok(())
    }

    async fn write(&mut self, data: &[u8]) -> Result<(), Stop> {
        self.dst.write_all(data).await.map_err(Stop::Io)?;
        let counter = match self.dir {
            Dir::ToUpstream => &self.conn.shared.to_upstream,
            Dir::ToClient => &self.conn.shared.to_client,
        };
        counter.fetch_add(data.len() as u64, Ordering::AcqRel);
        Ok(())
    }

    async fn deliver_front(&mut self) -> Result<(), Stop> {
        let Some(chunk) = self.queue.pop_front() else {
            return Ok(());
        };
        if !chunk.data.is_empty() {
            if self.current_mode() == Mode::BlackHole {
                self.drop_bytes(chunk.data.len());
            } else {
                self.write(&chunk.data).await?;
            }
        }
        match chunk.then_cut {
            Some(fire) => Err(Stop::Swallowed(fire)),
            None => Ok(()),
        }
    }

    fn drop_bytes(&self, n: usize) {
        self.shared().dropped.fetch_add(n as u64, Ordering::AcqRel);
    }

    fn push(&mut self, due: Instant, data: Vec<u8>, then_cut: Option<Fire>) {
        if data.is_empty() && then_cut.is_none() {
            return;
        }
        self.queue.push_back(Chunk {
            due,
            data,
            then_cut,
        });
    }

    /// Takes in one chunk read from the source.
    fn ingest(&mut self, data: &[u8]) {
        // Parse everything read, so the parser stays in step with the sender's framing.
        self.heads.clear();
        self.parser.feed(data, &mut self.heads);
        if self.dir == Dir::ToUpstream {
            self.statements.clear();
            self.pg.feed(data, &mut self.statements);
        }
        self.read_total += data.len() as u64;
        let latency = match self.current_mode() {
            Mode::Pass => Duration::ZERO,
            Mode::Delay(latency) => latency,
            Mode::BlackHole | Mode::Cut => {
                let dropped = data.len() + self.held.len();
                self.drop_bytes(dropped);
                self.held.clear();
                self.held_start = self.read_total;
                return;
            }
        };
        let due = due_after(latency);
        match self.dir {
            Dir::ToUpstream => {
                self.claim_requests();
                self.push(due, data.to_vec(), None);
            }
            Dir::ToClient => {
                self.held.extend_from_slice(data);
                self.queue_for_client(due);
            }
        }
    }

    /// Towards the server: the first create (delete) forwarded claims an armed `ZkCreate`
    /// (`ZkDelete`) swallow, the first PostgreSQL statement containing a `PgStatement`'s
    /// text that one; one per connection at a time.
    fn claim_requests(&mut self) {
        let conn = Arc::clone(&self.conn);
        if !self.statements.is_empty() {
            let mut target = conn.target();
            let sent = |kind: ReplyKind| match kind {
                ReplyKind::PgStatement(text) => self.statements.iter().any(|s| s.contains(text)),
                _ => false,
            };
            if target.is_none()
                && let Some(slot) = conn.shared.claim_where(sent)
            {
                tracing::debug!(
                    id = conn.id,
                    "statement forwarded; its reply will be swallowed"
                );
                *target = Some(Target { xid: None, slot });
                return;
            }
        }
        for head in &self.heads {
            let (xid, op) = head.request();
            let kind = if is_create_op(op) {
                ReplyKind::ZkCreate
            } else if is_delete_op(op) {
                ReplyKind::ZkDelete
            } else {
                continue;
            };
            let mut target = conn.target();
            if target.is_some() {
                return;
            }
            if let Some(slot) = conn.shared.claim(kind) {
                tracing::debug!(
                    id = conn.id,
                    xid,
                    op,
                    "request forwarded; its reply will be swallowed"
                );
                *target = Some(Target {
                    xid: Some(xid),
                    slot,
                });
                return;
            }
        }
    }

    /// Towards the client: queue what may go, swallowing a reply when one is due.
    fn queue_for_client(&mut self, due: Instant) {
        let conn = Arc::clone(&self.conn);
        let next_reply = {
            let mut target = conn.target();
            match target.as_ref() {
                Some(Target { xid: None, .. }) => target.take().map(|t| t.slot),
                _ => None,
            }
        };
        if let Some(slot) = next_reply.or_else(|| conn.shared.claim(ReplyKind::AnyNextReply)) {
            self.drop_bytes(self.held.len());
            self.held.clear();
            self.held_start = self.read_total;
            let event = SwallowEvent {
                kind: slot.kind,
                connection: conn.id,
                xid: None,
                zxid: None,
                err: None,
            };
            self.push(due, Vec::new(), Some(Fire { slot, event }));
            self.stopping = true;
            return;
        }
        let target_xid = conn.target().as_ref().and_then(|t| t.xid);
        if let Some(target_xid) = target_xid {
            let hit = self
                .heads
                .iter()
                .find(|h| h.reply().0 == target_xid)
                .copied();
            if let Some(head) = hit
                && let Some(target) = conn.target().take()
            {
                let (xid, zxid, err) = head.reply();
                let split = offset_in(&self.held, self.held_start, head.start);
                let mut before = std::mem::take(&mut self.held);
                self.drop_bytes(before.len() - split);
                before.truncate(split);
                self.held_start = self.read_total;
                let event = SwallowEvent {
                    kind: target.slot.kind,
                    connection: conn.id,
                    xid: Some(xid),
                    zxid: Some(zxid),
                    err: Some(err),
                };
                let fire = Fire {
                    slot: target.slot,
                    event,
                };
                self.push(due, before, Some(fire));
                self.stopping = true;
                return;
            }
        }
        // While a reply is awaited, hold back a frame whose header is still incomplete, so no
        // byte of the reply to swallow reaches the client.
        let boundary = match (target_xid, self.parser.partial_head_start()) {
            (Some(_), Some(start)) => offset_in(&self.held, self.held_start, start),
            _ => self.held.len(),
        };
        let rest = self.held.split_off(boundary);
        let ready = std::mem::replace(&mut self.held, rest);
        self.held_start += ready.len() as u64;
        self.push(due, ready, None);
    }
}

/// Index in `buf` (starting at stream offset `buf_start`) of stream offset `at`, clamped.
fn offset_in(buf: &[u8], buf_start: u64, at: u64) -> usize {
    usize::try_from(at.saturating_sub(buf_start))
        .unwrap_or(usize::MAX)
        .min(buf.len())
}

/// Now plus `latency`, saturating at about a year for absurd latencies.
fn due_after(latency: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(latency)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}
