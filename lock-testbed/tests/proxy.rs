//! Tests of `lock_testbed::proxy::FaultProxy`: every fault mode against tiny in-test
//! servers (an echo server and a fake framed ZooKeeper server), plus one swallowed create
//! against a real ZooKeeper server started as a child process.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_testbed::proxy::{FaultProxy, Mode, ReplyKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

// ---------------------------------------------------------------------------------------------
// Helpers

/// What an in-test server saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    bytes: AtomicU64,
    /// (xid, op) of each request after the handshake (fake ZooKeeper only).
    requests: Mutex<Vec<(i32, i32)>>,
}

/// An echo server on a free port; runs on the test's runtime.
async fn echo_server() -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            s.connections.fetch_add(1, Ordering::SeqCst);
            let s = Arc::clone(&s);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            s.bytes.fetch_add(n as u64, Ordering::SeqCst);
                            if sock.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

async fn round_trip(stream: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    stream.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    timeout(Duration::from_secs(5), stream.read_exact(&mut back))
        .await
        .expect("round trip timed out")
        .expect("round trip failed");
    back
}

/// Asserts the peer closed the stream (EOF or reset) within `within`, with no data first.
async fn assert_closed(stream: &mut TcpStream, within: Duration) {
    let mut buf = [0u8; 64];
    match timeout(within, stream.read(&mut buf)).await {
        Err(_) => panic!("connection still open after {within:?}"),
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!(
            "expected a closed connection, got {n} bytes: {:?}",
            &buf[..n]
        ),
    }
}

/// Polls `cond` every 10 ms for up to `within`.
async fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ZooKeeper framing (just enough for the tests).

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as i32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

fn put_str(b: &mut Vec<u8>, s: &[u8]) {
    b.extend((s.len() as i32).to_be_bytes());
    b.extend_from_slice(s);
}

async fn read_frame(s: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await?;
    Ok(body)
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// A ConnectRequest frame: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd, readOnly.
fn connect_request(session: i64, passwd: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(0i32.to_be_bytes());
    b.extend(0i64.to_be_bytes());
    b.extend(4000i32.to_be_bytes());
    b.extend(session.to_be_bytes());
    put_str(&mut b, passwd);
    b.push(0);
    frame(&b)
}

/// (timeOut, sessionId, passwd) of a ConnectResponse body.
fn connect_response(b: &[u8]) -> (i32, i64, Vec<u8>) {
    let len = i32_at(b, 16) as usize;
    (i32_at(b, 4), i64_at(b, 8), b[20..20 + len].to_vec())
}

fn request(xid: i32, op: i32, payload: &[u8]) -> Vec<u8> {
    let mut b = xid.to_be_bytes().to_vec();
    b.extend(op.to_be_bytes());
    b.extend_from_slice(payload);
    frame(&b)
}

/// A create (op 1) of a persistent node with OPEN_ACL_UNSAFE.
fn create_request(xid: i32, path: &str) -> Vec<u8> {
    let mut p = Vec::new();
    put_str(&mut p, path.as_bytes());
    put_str(&mut p, b"data");
    p.extend(1i32.to_be_bytes()); // one ACL
    p.extend(31i32.to_be_bytes()); // perms: all
    put_str(&mut p, b"world");
    put_str(&mut p, b"anyone");
    p.extend(0i32.to_be_bytes()); // flags: persistent
    request(xid, 1, &p)
}

/// A delete (op 2) of any version.
fn delete_request(xid: i32, path: &str) -> Vec<u8> {
    let mut p = Vec::new();
    put_str(&mut p, path.as_bytes());
    p.extend((-1i32).to_be_bytes());
    request(xid, 2, &p)
}

/// An exists (op 3) without a watch.
fn exists_request(xid: i32, path: &str) -> Vec<u8> {
    let mut p = Vec::new();
    put_str(&mut p, path.as_bytes());
    p.push(0);
    request(xid, 3, &p)
}

/// getData (op 4) without a watch.
fn get_data_request(xid: i32, path: &str) -> Vec<u8> {
    let mut p = Vec::new();
    put_str(&mut p, path.as_bytes());
    p.push(0);
    request(xid, 4, &p)
}

fn reply(xid: i32, zxid: i64, err: i32, payload: &[u8]) -> Vec<u8> {
    let mut b = xid.to_be_bytes().to_vec();
    b.extend(zxid.to_be_bytes());
    b.extend(err.to_be_bytes());
    b.extend_from_slice(payload);
    frame(&b)
}

/// (xid, zxid, err) of a reply body.
fn reply_header(b: &[u8]) -> (i32, i64, i32) {
    (i32_at(b, 0), i64_at(b, 4), i32_at(b, 12))
}

/// A fake ZooKeeper server speaking just the framing: a handshake, then one reply per request.
/// getData is answered with a watch notification first, and its reply is split over two writes
/// so the proxy sees a header cut in the middle.
async fn fake_zk_server() -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let session = s.connections.fetch_add(1, Ordering::SeqCst) as i64 + 100;
            let s = Arc::clone(&s);
            tokio::spawn(async move {
                let Ok(_connect) = read_frame(&mut sock).await else {
                    return;
                };
                let mut body = 0i32.to_be_bytes().to_vec();
                body.extend(4000i32.to_be_bytes());
                body.extend(session.to_be_bytes());
                put_str(&mut body, &[7u8; 16]);
                body.push(0);
                if sock.write_all(&frame(&body)).await.is_err() {
                    return;
                }
                let mut zxid = 10i64;
                while let Ok(req) = read_frame(&mut sock).await {
                    let (xid, op) = (i32_at(&req, 0), i32_at(&req, 4));
                    s.requests.lock().unwrap().push((xid, op));
                    zxid += 1;
                    let out = match op {
                        4 => {
                            let mut event = Vec::new();
                            event.extend(3i32.to_be_bytes()); // NodeDataChanged
                            event.extend(3i32.to_be_bytes()); // SyncConnected
                            put_str(&mut event, b"/watched");
                            let mut out = reply(-1, -1, 0, &event);
                            let mut data = Vec::new();
                            put_str(&mut data, b"hello");
                            let r = reply(xid, zxid, 0, &data);
                            let cut = out.len() + 6;
                            out.extend(r);
                            if sock.write_all(&out[..cut]).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(30)).await;
                            out.split_off(cut)
                        }
                        1 => {
                            let mut path = Vec::new();
                            put_str(&mut path, b"/created");
                            reply(xid, zxid, 0, &path)
                        }
                        _ => reply(xid, zxid, 0, &[]),
                    };
                    if sock.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

// ---------------------------------------------------------------------------------------------
// Modes

#[tokio::test]
async fn pass_forwards_both_ways_and_counts() {
    let (echo, seen) = echo_server().await;
    let proxy = FaultProxy::start(echo).unwrap();
    assert_eq!(proxy.mode(), Mode::Pass);
    assert_eq!(proxy.upstream(), echo);
    assert!(proxy.address().ip().is_loopback());

    let mut c = TcpStream::connect(proxy.address()).await.unwrap();
    assert_eq!(round_trip(&mut c, b"hello").await, b"hello");
    assert_eq!(round_trip(&mut c, b"again!").await, b"again!");

    let stats = proxy.stats();
    assert_eq!(stats.accepted, 1);
    assert_eq!(stats.open, 1);
    assert_eq!(stats.bytes_to_upstream, 11);
    assert_eq!(stats.bytes_to_client, 11);
    assert_eq!(stats.bytes_dropped, 0);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);

    // A client half-close passes through: the echo server sees EOF and closes, so do we.
    c.shutdown().await.unwrap();
    assert_closed(&mut c, Duration::from_secs(2)).await;
    eventually(Duration::from_secs(2), "connection closed", || {
        proxy.stats().open == 0
    })
    .await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_closes_current_connections_and_refuses_new_ones_until_pass() {
    let (echo, seen) = echo_server().await;
    let proxy = FaultProxy::start(echo).unwrap();
    let mut first = TcpStream::connect(proxy.address()).await.unwrap();
    let mut second = TcpStream::connect(proxy.address()).await.unwrap();
    assert_eq!(round_trip(&mut first, b"one").await, b"one");
    assert_eq!(round_trip(&mut second, b"two").await, b"two");

    // Switch from a cloned control handle in another task.
    let control = proxy.control();
    tokio::spawn(async move { control.cut() }).await.unwrap();
    let cut_at = Instant::now();
    assert_closed(&mut first, Duration::from_millis(500)).await;
    assert_closed(&mut second, Duration::from_millis(500)).await;
    println!(
        "existing connections closed {:?} after cut",
        cut_at.elapsed()
    );

    // New connections are accepted and closed at once, never reaching the server.
    let mut refused = TcpStream::connect(proxy.address()).await.unwrap();
    assert_closed(&mut refused, Duration::from_millis(500)).await;
    eventually(Duration::from_secs(1), "no open connections", || {
        proxy.stats().open == 0
    })
    .await;
    let stats = proxy.stats();
    assert_eq!(stats.accepted, 3);
    assert_eq!(stats.refused, 1);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 2);

    proxy.pass();
    let mut again = TcpStream::connect(proxy.address()).await.unwrap();
    assert_eq!(round_trip(&mut again, b"back").await, b"back");
    proxy.shutdown().await;
}

#[tokio::test]
async fn black_hole_keeps_connections_open_but_silent() {
    let (echo, seen) = echo_server().await;
    let proxy = FaultProxy::start(echo).unwrap();
    let mut c = TcpStream::connect(proxy.address()).await.unwrap();
    assert_eq!(round_trip(&mut c, b"before").await, b"before");

    proxy.black_hole();
    c.write_all(b"lost").await.unwrap();
    let mut buf = [0u8; 16];
    let started = Instant::now();
    let read = timeout(Duration::from_millis(300), c.read(&mut buf)).await;
    assert!(read.is_err(), "expected a silent server, got {read:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(proxy.stats().open, 1);

    // A new connection is accepted, stays open and silent, and is not connected upstream.
    let mut late = TcpStream::connect(proxy.address()).await.unwrap();
    late.write_all(b"also lost").await.unwrap();
    let read = timeout(Duration::from_millis(300), late.read(&mut buf)).await;
    assert!(read.is_err(), "expected a silent server, got {read:?}");
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
    assert_eq!(proxy.stats().open, 2);

    // Both connections were open all along: they work again after pass(); what was sent
    // into the black hole is gone.
    proxy.pass();
    assert_eq!(round_trip(&mut c, b"after").await, b"after");
    assert_eq!(round_trip(&mut late, b"late").await, b"late");
    assert_eq!(seen.bytes.load(Ordering::SeqCst), (6 + 5 + 4) as u64);
    assert_eq!(proxy.stats().bytes_dropped, (4 + 9) as u64);
    proxy.shutdown().await;
}

#[tokio::test]
async fn delay_adds_latency_per_chunk_each_way_in_order() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).unwrap();
    let mut c = TcpStream::connect(proxy.address()).await.unwrap();
    assert_eq!(round_trip(&mut c, b"warm").await, b"warm");

    let latency = Duration::from_millis(150);
    let slack = Duration::from_millis(250);
    proxy.delay(latency);
    assert_eq!(proxy.mode(), Mode::Delay(latency));

    // One round trip crosses the proxy twice.
    let started = Instant::now();
    assert_eq!(round_trip(&mut c, b"slow").await, b"slow");
    let took = started.elapsed();
    println!("delayed round trip: {took:?} (latency {latency:?} each way)");
    assert!(took >= 2 * latency, "{took:?}");
    assert!(took <= 2 * latency + slack, "{took:?}");

    // Latency is per chunk, not cumulative, and order is kept.
    let started = Instant::now();
    for part in [&b"a"[..], b"b", b"c"] {
        c.write_all(part).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut back = [0u8; 3];
    timeout(Duration::from_secs(5), c.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    println!("three pipelined chunks: {took:?}");
    assert_eq!(&back, b"abc");
    assert!(took >= 2 * latency + Duration::from_millis(60), "{took:?}");
    assert!(
        took <= 2 * latency + Duration::from_millis(60) + slack,
        "{took:?}"
    );

    proxy.pass();
    let started = Instant::now();
    assert_eq!(round_trip(&mut c, b"fast").await, b"fast");
    assert!(started.elapsed() < Duration::from_millis(100));
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Swallowing replies

#[tokio::test]
async fn swallow_zk_create_reply_with_fake_server() {
    let (server, seen) = fake_zk_server().await;
    let proxy = FaultProxy::start(server).unwrap();
    let swallow = proxy.swallow_next_reply(ReplyKind::ZkCreate);
    assert_eq!(swallow.kind(), ReplyKind::ZkCreate);
    assert!(swallow.event().is_none());

    let mut c = TcpStream::connect(proxy.address()).await.unwrap();
    // Handshake, written in two pieces.
    let hello = connect_request(0, &[0u8; 16]);
    c.write_all(&hello[..7]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.write_all(&hello[7..]).await.unwrap();
    let (_, session, _) = connect_response(&read_frame(&mut c).await.unwrap());
    assert_eq!(session, 100);

    // A ping and a getData in one write; the getData reply comes after a notification and is
    // split over two server writes. All pass untouched.
    let mut two = request(-2, 11, &[]);
    two.extend(get_data_request(1, "/watched"));
    c.write_all(&two).await.unwrap();
    assert_eq!(reply_header(&read_frame(&mut c).await.unwrap()).0, -2);
    let note = read_frame(&mut c).await.unwrap();
    assert_eq!(reply_header(&note), (-1, -1, 0));
    let data = read_frame(&mut c).await.unwrap();
    assert_eq!(reply_header(&data), (1, 12, 0));
    assert_eq!(&data[20..], b"hello");
    assert!(swallow.event().is_none());

    // The create, split mid-header: the server gets it, the client gets no reply and its
    // connection closes.
    let create = create_request(2, "/created");
    c.write_all(&create[..5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.write_all(&create[5..]).await.unwrap();
    let event = timeout(Duration::from_secs(2), swallow.wait())
        .await
        .unwrap();
    assert_eq!(event.kind, ReplyKind::ZkCreate);
    assert_eq!(event.connection, 1);
    assert_eq!(event.xid, Some(2));
    assert_eq!(event.zxid, Some(13));
    assert_eq!(event.err, Some(0));
    assert_closed(&mut c, Duration::from_secs(1)).await;
    assert_eq!(
        *seen.requests.lock().unwrap(),
        vec![(-2, 11), (1, 4), (2, 1)]
    );
    assert_eq!(proxy.stats().swallowed, 1);

    // The next connection works normally: its create reply arrives.
    let mut next = TcpStream::connect(proxy.address()).await.unwrap();
    next.write_all(&connect_request(0, &[0u8; 16]))
        .await
        .unwrap();
    let (_, session, _) = connect_response(&read_frame(&mut next).await.unwrap());
    assert_eq!(session, 101);
    next.write_all(&create_request(1, "/created"))
        .await
        .unwrap();
    let r = read_frame(&mut next).await.unwrap();
    assert_eq!(reply_header(&r), (1, 11, 0));
    assert_eq!(proxy.stats().swallowed, 1);
    proxy.shutdown().await;
}

#[tokio::test]
async fn swallow_zk_delete_reply_with_fake_server() {
    let (server, seen) = fake_zk_server().await;
    let proxy = FaultProxy::start(server).unwrap();
    let swallow = proxy.swallow_next_reply(ReplyKind::ZkDelete);
    let mut c = TcpStream::connect(proxy.address()).await.unwrap();
    c.write_all(&connect_request(0, &[0u8; 16])).await.unwrap();
    let _ = connect_response(&read_frame(&mut c).await.unwrap());

    // A create passes untouched: only a delete's reply is swallowed.
    c.write_all(&create_request(1, "/created")).await.unwrap();
    assert_eq!(reply_header(&read_frame(&mut c).await.unwrap()), (1, 11, 0));
    assert!(swallow.event().is_none());

    c.write_all(&delete_request(2, "/created")).await.unwrap();
    let event = timeout(Duration::from_secs(2), swallow.wait())
        .await
        .unwrap();
    assert_eq!(event.kind, ReplyKind::ZkDelete);
    assert_eq!(event.xid, Some(2));
    assert_eq!(event.zxid, Some(12));
    assert_eq!(event.err, Some(0));
    assert_closed(&mut c, Duration::from_secs(1)).await;
    assert_eq!(*seen.requests.lock().unwrap(), vec![(1, 1), (2, 2)]);
    assert_eq!(proxy.stats().swallowed, 1);
    proxy.shutdown().await;
}

#[tokio::test]
async fn swallow_any_next_reply_cuts_after_the_request_arrived() {
    let (echo, seen) = echo_server().await;
    let proxy = FaultProxy::start(echo).unwrap();
    let mut c = TcpStream::connect(proxy.address()).await.unwrap();
    assert_eq!(round_trip(&mut c, b"PING\r\n").await, b"PING\r\n");

    let swallow = proxy.swallow_next_reply(ReplyKind::AnyNextReply);
    c.write_all(b"SET k v\r\n").await.unwrap();
    let event = timeout(Duration::from_secs(2), swallow.wait())
        .await
        .unwrap();
    assert_eq!(event.kind, ReplyKind::AnyNextReply);
    assert_eq!(event.xid, None);
    assert_closed(&mut c, Duration::from_secs(1)).await;
    assert_eq!(seen.bytes.load(Ordering::SeqCst), 6 + 9);

    let mut next = TcpStream::connect(proxy.address()).await.unwrap();
    assert_eq!(round_trip(&mut next, b"GET k\r\n").await, b"GET k\r\n");
    assert_eq!(proxy.stats().swallowed, 1);
    proxy.shutdown().await;
}

#[tokio::test]
async fn disarmed_swallow_does_nothing() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).unwrap();
    let swallow = proxy.swallow_next_reply(ReplyKind::AnyNextReply);
    assert!(swallow.disarm());
    assert!(!swallow.disarm());
    let _other = proxy.swallow_next_reply(ReplyKind::AnyNextReply);
    assert_eq!(proxy.disarm_all(), 1);
    let mut c = TcpStream::connect(proxy.address()).await.unwrap();
    assert_eq!(round_trip(&mut c, b"x").await, b"x");
    assert_eq!(proxy.stats().swallowed, 0);
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

#[tokio::test]
async fn shutdown_closes_listener_and_connections() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).unwrap();
    let address = proxy.address();
    let control = proxy.control();
    let mut c = TcpStream::connect(address).await.unwrap();
    assert_eq!(round_trip(&mut c, b"hi").await, b"hi");

    proxy.shutdown().await;
    // Every task has ended: no connection is left open, and nothing listens any more.
    assert_eq!(control.stats().open, 0);
    assert!(TcpStream::connect(address).await.is_err());
    assert_closed(&mut c, Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_aborts_the_proxy() {
    let (echo, _) = echo_server().await;
    let proxy = FaultProxy::start(echo).unwrap();
    let address = proxy.address();
    let mut c = TcpStream::connect(address).await.unwrap();
    assert_eq!(round_trip(&mut c, b"hi").await, b"hi");
    drop(proxy);
    assert_closed(&mut c, Duration::from_secs(1)).await;
    let start = Instant::now();
    while TcpStream::connect(address).await.is_ok() {
        assert!(start.elapsed() < Duration::from_secs(1), "still listening");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn start_outside_a_runtime_is_an_error() {
    let err = FaultProxy::start("127.0.0.1:9".parse().unwrap()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::Other);
}

#[tokio::test]
async fn upstream_down_closes_the_client() {
    // A port nothing listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = FaultProxy::start(dead).unwrap();
    let mut c = TcpStream::connect(proxy.address()).await.unwrap();
    assert_closed(&mut c, Duration::from_secs(2)).await;
}

// ---------------------------------------------------------------------------------------------
// A real ZooKeeper server

const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
const SLF4J_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// A ZooKeeper 3.8 server in its own process group and temp dir; killed and reaped on drop.
struct ZkServer {
    child: std::process::Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ZkServer {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("zk.log")).unwrap_or_default()
    }
}

fn on_path(binary: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(binary).is_file()))
}

/// Starts ZooKeeper, or says why it cannot (skip unless LOCK_CONFORMANCE_STRICT=1).
async fn start_zookeeper() -> Option<ZkServer> {
    let missing = if !on_path("java") {
        Some("`java` is not on PATH (apt-get install zookeeper pulls in a JRE)")
    } else if !Path::new(ZK_JAR).is_file() {
        Some("/usr/share/java/zookeeper.jar is missing (apt-get install zookeeper)")
    } else {
        None
    };
    if let Some(why) = missing {
        assert!(
            std::env::var("LOCK_CONFORMANCE_STRICT").as_deref() != Ok("1"),
            "cannot start ZooKeeper: {why}"
        );
        eprintln!("SKIPPED: cannot start ZooKeeper: {why}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let cfg = dir.path().join("zoo.cfg");
    std::fs::write(
        &cfg,
        format!(
            "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={port}\n\
             clientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr\n",
            data.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("zk.log")).unwrap();
    use std::os::unix::process::CommandExt;
    let child = std::process::Command::new("java")
        .args([
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            &format!("{ZK_JAR}:{SLF4J_JAR}"),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
        ])
        .arg(&cfg)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .unwrap();
    let mut zk = ZkServer {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        dir,
    };
    // Ready when `srvr` reports a Mode (ruok answers before requests are served).
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = zk.child.try_wait() {
            panic!("ZooKeeper exited early ({status}):\n{}", zk.log());
        }
        if let Ok(mut s) = TcpStream::connect(zk.addr).await
            && s.write_all(b"srvr").await.is_ok()
        {
            let mut out = String::new();
            if let Ok(Ok(_)) = timeout(Duration::from_secs(2), s.read_to_string(&mut out)).await
                && out.contains("Mode:")
            {
                println!("ZooKeeper ready after {:?}", started.elapsed());
                return Some(zk);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ZooKeeper not ready after 30 s:\n{}",
            zk.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn swallow_zk_create_reply_with_real_zookeeper() {
    let Some(zk) = start_zookeeper().await else {
        return;
    };
    let proxy = FaultProxy::start(zk.addr).unwrap();
    let swallow = proxy.swallow_next_reply(ReplyKind::ZkCreate);
    let path = "/proxy-swallowed";

    // A raw client: handshake, then one create.
    let mut c = TcpStream::connect(proxy.address()).await.unwrap();
    c.write_all(&connect_request(0, &[0u8; 16])).await.unwrap();
    let hello = timeout(Duration::from_secs(10), read_frame(&mut c))
        .await
        .unwrap()
        .unwrap();
    let (negotiated, session, passwd) = connect_response(&hello);
    assert!(negotiated > 0 && session != 0, "{negotiated} {session:#x}");
    c.write_all(&create_request(1, path)).await.unwrap();

    let event = timeout(Duration::from_secs(10), swallow.wait())
        .await
        .expect("the create reply was not swallowed");
    println!("swallowed: {event:?}");
    assert_eq!(event.xid, Some(1));
    assert_eq!(event.err, Some(0), "the server created the node");
    assert_closed(&mut c, Duration::from_secs(2)).await;

    // The session lives on: re-attach to it through the proxy and find the node there, and a
    // naive retry of the create fails with NodeExists (-110).
    let mut again = TcpStream::connect(proxy.address()).await.unwrap();
    again
        .write_all(&connect_request(session, &passwd))
        .await
        .unwrap();
    let hello = timeout(Duration::from_secs(10), read_frame(&mut again))
        .await
        .unwrap()
        .unwrap();
    let (negotiated, resumed, _) = connect_response(&hello);
    assert_eq!(resumed, session, "session was not kept");
    assert!(negotiated > 0);
    again.write_all(&exists_request(1, path)).await.unwrap();
    let r = timeout(Duration::from_secs(10), read_frame(&mut again))
        .await
        .unwrap()
        .unwrap();
    let (xid, zxid, err) = reply_header(&r);
    assert_eq!(
        (xid, err),
        (1, 0),
        "node missing after the swallowed create"
    );
    assert!(zxid >= event.zxid.unwrap());
    again.write_all(&create_request(2, path)).await.unwrap();
    let r = timeout(Duration::from_secs(10), read_frame(&mut again))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply_header(&r).2, -110);
    assert_eq!(proxy.stats().swallowed, 1);
    proxy.shutdown().await;
    drop(zk);
}
