//! Tests of `lock_testbed::servers` against real processes: ZooKeeper (standalone and
//! a 3-member ensemble), Redis (plain, with a password and an ACL user), etcd.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_testbed::servers::{
    ETCD_ENV, EtcdOptions, EtcdServer, REDIS_ENV, RedisClusterOptions, RedisClusterSet,
    RedisOptions, RedisSentinelOptions, RedisSentinelSet, RedisServer, RedisTarget, SERVERS_ENV,
    ServerError, ServerMode, ZK_ENV, ZkEnsemble, ZkOptions, ZkServer, ZkTarget, shared_etcd,
    shared_redis, shared_zk,
};

/// Set in the child test process that starts shared servers and then exits without
/// dropping anything; its value says how the child ends.
const HELPER_ENV: &str = "LOCK_SERVERS_TEST_HELPER";
const HELPER_TEST: &str = "helper_start_shared_servers_then_die";

fn fast_zk() -> ZkOptions {
    ZkOptions::default().with_tick_time(Duration::from_millis(500))
}

/// True when `pid` no longer runs: no such process, or a zombie (an orphan whose new
/// parent does not reap it; it holds no resources).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
            .unwrap_or(false),
    }
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Waits up to `bound` for `cond`.
fn eventually(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A server handle was dropped: its process is gone and reaped (not even a zombie, since
/// we are its parent) and its port can be bound again.
fn assert_stopped(what: &str, pid: u32, ports: &[u16]) {
    assert!(
        eventually(Duration::from_secs(2), || !std::path::Path::new(&format!(
            "/proc/{pid}"
        ))
        .exists()),
        "{what}: pid {pid} still exists (or was not reaped) after drop"
    );
    for &port in ports {
        assert!(
            eventually(Duration::from_secs(2), || port_free(port)),
            "{what}: port {port} still in use after drop"
        );
    }
}

/// Runs `future` on a fresh multi-threaded runtime, as `#[tokio::test]` would.
fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

/// Whether `LOCK_CONFORMANCE_STRICT` is set to a true value: what is only skipped here
/// otherwise (no container engine, no image) must then work.
#[cfg(feature = "testcontainers")]
fn strict() -> bool {
    std::env::var("LOCK_CONFORMANCE_STRICT")
        .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes" | "on"))
}

/// Polls `observe` until `done` accepts what it returns, for at most `bound`, and returns
/// that observation; past `bound`, an error naming `what` and the last observation.
#[cfg(feature = "testcontainers")]
async fn observe_until<T, F, Fut>(
    bound: Duration,
    what: &str,
    mut observe: F,
    done: impl Fn(&T) -> bool,
) -> Result<T, String>
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + bound;
    let mut pause = Duration::from_millis(2);
    loop {
        let observed = observe().await;
        if done(&observed) {
            return Ok(observed);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "{what}: not so within {bound:?}; last seen: {observed:?}"
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Less than `bound` has passed since `began`.
fn assert_within(began: Instant, bound: Duration) {
    let took = began.elapsed();
    assert!(took < bound, "took {took:?} (bound {bound:?})");
}

/// The package and detail of a [`ServerError::NotInstalled`]; any other error fails.
fn not_installed(err: &ServerError) -> (&str, &str) {
    match err {
        ServerError::NotInstalled { package, detail } => (package, detail),
        other => panic!("expected NotInstalled, got {other:?}"),
    }
}

/// The server, detail and log tail of a [`ServerError::Startup`]; any other error fails.
fn startup_error(err: &ServerError) -> (&str, &str, &str) {
    match err {
        ServerError::Startup {
            server,
            detail,
            log_tail,
        } => (server, detail, log_tail),
        other => panic!("expected Startup, got {other:?}"),
    }
}

// ---- raw RESP -------------------------------------------------------------------------

struct Resp(BufReader<TcpStream>);

impl Resp {
    fn connect(port: u16) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        Self(BufReader::new(stream))
    }

    /// Sends a command; returns the reply's first line, plus the bulk payload for `$n`.
    fn call(&mut self, args: &[&str]) -> String {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.0.get_mut().write_all(out.as_bytes()).unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        let line = line.trim_end().to_owned();
        if let Some(len) = line.strip_prefix('$')
            && let Ok(len) = len.parse::<usize>()
        {
            let mut payload = vec![0; len + 2];
            self.0.read_exact(&mut payload).unwrap();
            payload.truncate(len);
            return String::from_utf8(payload).unwrap();
        }
        line
    }
}

fn http_get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

// ---- ZooKeeper ------------------------------------------------------------------------

#[tokio::test]
async fn zk_standalone_starts_serves_and_stops() {
    let began = Instant::now();
    let zk = ZkServer::start(fast_zk()).await.unwrap();
    eprintln!(
        "startup: ZooKeeper standalone ready in {:?}",
        began.elapsed()
    );
    assert_eq!(zk.connect_string(), format!("127.0.0.1:{}", zk.port()));
    assert_eq!(zk.address(), zk.connect_string());
    assert_eq!(zk.four_letter("ruok").await.unwrap(), "imok");
    let srvr = zk.four_letter("srvr").await.unwrap();
    assert!(srvr.contains("Mode: standalone"), "srvr: {srvr}");
    let mntr = zk.four_letter("mntr").await.unwrap();
    assert!(mntr.contains("zk_packets_sent"), "mntr: {mntr}");
    assert!(zk.log_path().exists());

    let pid = zk.pid().unwrap();
    let port = zk.port();
    let dir = zk.dir().to_path_buf();
    drop(zk);
    assert_stopped("ZooKeeper", pid, &[port]);
    assert!(!dir.exists(), "the temporary directory must be removed");
}

#[tokio::test]
async fn zk_pause_resume_kill_restart() {
    let mut zk = ZkServer::start(fast_zk()).await.unwrap();
    let port = zk.port();

    zk.pause().unwrap();
    let paused = zk
        .four_letter_with_timeout("srvr", Duration::from_secs(1))
        .await;
    assert!(
        matches!(paused, Err(ServerError::Timeout { .. })),
        "a paused server must not answer within 1 s: {paused:?}"
    );
    zk.resume().unwrap();
    let srvr = zk.four_letter("srvr").await.unwrap();
    assert!(srvr.contains("Mode:"), "after resume: {srvr}");

    let old_pid = zk.pid().unwrap();
    zk.kill();
    assert!(zk.pid().is_none());
    assert!(!std::path::Path::new(&format!("/proc/{old_pid}")).exists());
    assert!(matches!(zk.pause(), Err(ServerError::NotRunning { .. })));
    assert!(zk.four_letter("ruok").await.is_err());

    let began = Instant::now();
    zk.restart().await.unwrap();
    eprintln!("startup: ZooKeeper restart ready in {:?}", began.elapsed());
    assert_eq!(zk.port(), port, "restart keeps the port");
    assert_ne!(zk.pid(), Some(old_pid));
    assert!(zk.four_letter("srvr").await.unwrap().contains("Mode:"));
}

#[tokio::test]
async fn zk_ensemble_elects_fails_over_and_rejoins() {
    let began = Instant::now();
    let mut ensemble = ZkEnsemble::start(3, fast_zk()).await.unwrap();
    eprintln!(
        "startup: ZooKeeper 3-member ensemble serving in {:?}",
        began.elapsed()
    );
    assert_eq!(ensemble.len(), 3);
    let connect = ensemble.connect_string();
    assert_eq!(connect.split(',').count(), 3, "{connect}");
    for i in 0..3 {
        assert!(connect.contains(&format!("127.0.0.1:{}", ensemble.port(i).unwrap())));
    }
    assert!(matches!(
        ensemble.port(3),
        Err(ServerError::NoSuchMember { index: 3, len: 3 })
    ));

    let leader = ensemble
        .wait_for_leader(Duration::from_secs(10))
        .await
        .unwrap();
    let followers = {
        let mut n = 0;
        for i in 0..3 {
            if ensemble.mode(i).await.unwrap().as_deref() == Some("follower") {
                n += 1;
            }
        }
        n
    };
    assert_eq!(followers, 2, "one leader ({leader}) and two followers");

    let killed_at = Instant::now();
    ensemble.kill(leader).await.unwrap();
    assert!(ensemble.pid(leader).unwrap().is_none());
    assert!(!ensemble.is_running(leader).await.unwrap());
    assert!(matches!(
        ensemble.partition(leader).await,
        Err(ServerError::Unsupported { .. })
    ));
    let new_leader = ensemble
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    eprintln!(
        "failover: new leader {new_leader} (was {leader}) after {:?}",
        killed_at.elapsed()
    );
    assert_ne!(new_leader, leader);

    let began = Instant::now();
    ensemble.restart(leader).await.unwrap();
    eprintln!("startup: ensemble member rejoined in {:?}", began.elapsed());
    assert_eq!(
        ensemble.mode(leader).await.unwrap().as_deref(),
        Some("follower"),
        "the restarted member rejoins as a follower"
    );
    assert_eq!(ensemble.leader().await, Some(new_leader));

    let pids: Vec<u32> = (0..3).map(|i| ensemble.pid(i).unwrap().unwrap()).collect();
    let ports: Vec<u16> = (0..3).map(|i| ensemble.port(i).unwrap()).collect();
    drop(ensemble);
    for pid in pids {
        assert_stopped("ensemble member", pid, &ports);
    }
}

// ---- Redis ----------------------------------------------------------------------------

#[tokio::test]
async fn redis_plain_starts_serves_and_stops() {
    let began = Instant::now();
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    eprintln!("startup: Redis ready in {:?}", began.elapsed());
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
    assert_eq!(redis.acl_url(), None);
    let mut conn = Resp::connect(redis.port());
    assert_eq!(conn.call(&["PING"]), "+PONG");
    assert_eq!(conn.call(&["SET", "k", "v"]), "+OK");
    assert_eq!(conn.call(&["GET", "k"]), "v");
    drop(conn);

    let pid = redis.pid().unwrap();
    let port = redis.port();
    drop(redis);
    assert_stopped("Redis", pid, &[port]);
}

#[tokio::test]
async fn redis_password_and_acl_user() {
    let opts = RedisOptions::default()
        .with_password("s3cret/:@")
        .with_acl_user("locker", "lockerpw", "lock:*");
    let redis = RedisServer::start(opts).await.unwrap();
    let port = redis.port();
    assert_eq!(
        redis.url(),
        format!("redis://:s3cret%2F%3A%40@127.0.0.1:{port}")
    );
    assert_eq!(
        redis.acl_url().unwrap(),
        format!("redis://locker:lockerpw@127.0.0.1:{port}")
    );
    assert_eq!(
        redis.url_without_auth(),
        format!("redis://127.0.0.1:{port}")
    );

    // Without credentials: the connection is accepted, the first command fails.
    let mut anon = Resp::connect(port);
    let reply = anon.call(&["PING"]);
    assert!(reply.starts_with("-NOAUTH"), "{reply}");

    let mut default_user = Resp::connect(port);
    assert_eq!(default_user.call(&["AUTH", "s3cret/:@"]), "+OK");
    assert_eq!(default_user.call(&["PING"]), "+PONG");
    assert_eq!(default_user.call(&["SET", "other:x", "1"]), "+OK");

    let mut locker = Resp::connect(port);
    assert!(
        locker
            .call(&["AUTH", "locker", "wrong"])
            .starts_with("-WRONGPASS")
    );
    assert_eq!(locker.call(&["AUTH", "locker", "lockerpw"]), "+OK");
    assert_eq!(locker.call(&["SET", "lock:x", "1"]), "+OK");
    let denied = locker.call(&["SET", "other:x", "2"]);
    assert!(denied.starts_with("-NOPERM"), "{denied}");
    assert_eq!(locker.call(&["GET", "lock:x"]), "1");
}

#[tokio::test]
async fn redis_restart_same_port_no_data() {
    let mut redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let port = redis.port();
    let old_pid = redis.pid().unwrap();
    assert_eq!(Resp::connect(port).call(&["SET", "k", "v"]), "+OK");

    redis.pause().unwrap();
    {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut conn = Resp(BufReader::new(stream));
        conn.0.get_mut().write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let mut line = String::new();
        assert!(
            conn.0.read_line(&mut line).is_err(),
            "a paused Redis must not answer: {line:?}"
        );
    }
    redis.resume().unwrap();

    let began = Instant::now();
    redis.restart().await.unwrap();
    eprintln!("startup: Redis restart ready in {:?}", began.elapsed());
    assert_eq!(redis.port(), port);
    assert_ne!(redis.pid().unwrap(), old_pid);
    assert!(process_gone(old_pid));
    let mut conn = Resp::connect(port);
    assert_eq!(conn.call(&["PING"]), "+PONG");
    assert_eq!(
        conn.call(&["GET", "k"]),
        "$-1",
        "no persistence: data is gone"
    );
}

#[tokio::test]
async fn redis_sentinel_fails_over_on_demand_and_after_a_kill() {
    sentinel_fails_over(ServerMode::Processes).await;
}

/// The same with every server and sentinel in a container (on the host's network).
#[cfg(feature = "testcontainers")]
#[tokio::test]
async fn redis_sentinel_in_containers_fails_over_on_demand_and_after_a_kill() {
    if let Err(err) = lock_testbed::servers::containers::check_ready().await {
        assert!(!strict(), "containers are required under STRICT: {err}");
        eprintln!("skip reason: {err}");
        return;
    }
    sentinel_fails_over(ServerMode::Containers).await;
}

/// A Sentinel set where `mode` says: the first data server is primary; `SENTINEL FAILOVER`
/// promotes a replica that has the primary's writes; a killed primary is replaced.
async fn sentinel_fails_over(mode: ServerMode) {
    let options = RedisSentinelOptions::default()
        .with_server(RedisOptions::default().with_password("admin"))
        .with_service("jobs")
        .with_servers(mode);
    let began = Instant::now();
    let mut set = RedisSentinelSet::start(options).await.unwrap();
    eprintln!(
        "startup: Redis Sentinel set ({mode:?}) ready in {:?}",
        began.elapsed()
    );
    let first = set.data_addresses()[0];
    assert_eq!(set.primary().await.unwrap(), first);
    assert_eq!(set.sentinel_addresses().len(), 3);
    assert_eq!(
        set.data_servers()[0].is_container(),
        mode == ServerMode::Containers
    );
    assert!(
        set.url(Some(("locker", "p w")))
            .starts_with("redis+sentinel://locker:p%20w@127.0.0.1:")
    );
    assert!(set.url(None).ends_with("/jobs"));
    let mut primary = Resp::connect(first.port());
    assert_eq!(primary.call(&["AUTH", "admin"]), "+OK");
    assert_eq!(primary.call(&["SET", "k", "v"]), "+OK");
    // Replication is asynchronous: a failover may lose what no replica has yet.
    assert_eq!(primary.call(&["WAIT", "2", "5000"]), ":2");

    let promoted = set.failover().await.unwrap();
    assert_ne!(promoted, first);
    assert_eq!(set.primary().await.unwrap(), promoted);
    let mut conn = Resp::connect(promoted.port());
    assert_eq!(conn.call(&["AUTH", "admin"]), "+OK");
    assert_eq!(conn.call(&["GET", "k"]), "v", "the replica had the write");

    let (killed, after) = set.kill_primary().await.unwrap();
    assert_eq!(set.data_addresses()[killed], promoted);
    assert!(
        TcpStream::connect(promoted).is_err(),
        "the killed primary still answers"
    );
    assert_ne!(after, promoted);
    assert_eq!(set.primary().await.unwrap(), after);
    // It comes back as a replica of the new primary.
    set.rejoin(killed).await.unwrap();
    assert_eq!(set.primary().await.unwrap(), after);
}

/// A three-primary cluster with a replica each: a key lands on the primary that serves its
/// slot; a slot moves to another primary with its keys (redirections meanwhile); a replica
/// takes over its primary's slots.
#[tokio::test]
async fn redis_cluster_migrates_a_slot_and_fails_over() {
    let options =
        RedisClusterOptions::default().with_server(RedisOptions::default().with_password("admin"));
    let began = Instant::now();
    let set = RedisClusterSet::start(options).await.unwrap();
    eprintln!("startup: Redis Cluster ready in {:?}", began.elapsed());
    assert_eq!(set.nodes().len(), 6);
    assert!(set.url(None).starts_with("redis+cluster://127.0.0.1:"));
    let key = "{jobs}:owner";
    let slot = set.slot_of(key).await.unwrap();
    let owner = set.owner_of(slot).await.unwrap();
    assert!(owner < 3, "a primary as made: {owner}");
    let mut conn = Resp::connect(set.nodes()[owner].port());
    assert_eq!(conn.call(&["AUTH", "admin"]), "+OK");
    assert_eq!(conn.call(&["SET", key, "v"]), "+OK");
    assert_eq!(conn.call(&["SET", "{jobs}:fence", "7"]), "+OK");
    let other = (owner + 1) % 3;
    let mut elsewhere = Resp::connect(set.nodes()[other].port());
    assert_eq!(elsewhere.call(&["AUTH", "admin"]), "+OK");
    assert!(elsewhere.call(&["GET", key]).starts_with("-MOVED"));

    let migrating = set.migrate_slot(slot, other, Duration::from_millis(500));
    let probing = async {
        tokio::time::sleep(Duration::from_millis(250)).await;
        // Halfway: one key moved, one not. The old owner answers for the one it has and
        // redirects for the other.
        let mut old = Resp::connect(set.nodes()[owner].port());
        assert_eq!(old.call(&["AUTH", "admin"]), "+OK");
        let answers = [old.call(&["GET", key]), old.call(&["GET", "{jobs}:fence"])];
        assert!(
            answers.iter().any(|answer| answer.starts_with("-ASK")),
            "one key already moved: {answers:?}"
        );
    };
    let (migrated, ()) = tokio::join!(migrating, probing);
    migrated.unwrap();
    assert_eq!(set.owner_of(slot).await.unwrap(), other);
    assert_eq!(
        elsewhere.call(&["GET", key]),
        "v",
        "the key moved with its slot"
    );
    assert!(conn.call(&["GET", key]).starts_with("-MOVED"));

    // The replica of `other` as the cluster's table names it. (Asking replicas for the key
    // could pick one of the old owner's: until gossip and replication catch up, it may still
    // think its primary serves the slot and still hold the key.)
    let replica = set.replica_of(other).await.unwrap();
    set.failover(replica).await.unwrap();
    assert_eq!(set.owner_of(slot).await.unwrap(), replica);
    let mut promoted = Resp::connect(set.nodes()[replica].port());
    assert_eq!(promoted.call(&["AUTH", "admin"]), "+OK");
    assert_eq!(promoted.call(&["GET", key]), "v");
}

// ---- etcd -----------------------------------------------------------------------------

#[tokio::test]
async fn etcd_starts_serves_and_stops() {
    let began = Instant::now();
    let etcd = EtcdServer::start(EtcdOptions::default()).await.unwrap();
    eprintln!("startup: etcd ready in {:?}", began.elapsed());
    assert_eq!(etcd.endpoint(), format!("http://127.0.0.1:{}", etcd.port()));
    let health = http_get(etcd.port(), "/health");
    assert!(health.contains("\"health\":\"true\""), "{health}");
    let version = http_get(etcd.port(), "/version");
    assert!(version.contains("etcdserver"), "{version}");

    let pid = etcd.pid().unwrap();
    let ports = [etcd.port(), etcd.peer_port()];
    drop(etcd);
    assert_stopped("etcd", pid, &ports);
}

// ---- missing installations ------------------------------------------------------------

#[tokio::test]
async fn missing_binaries_are_reported_promptly() {
    let began = Instant::now();

    let err = ZkServer::start(fast_zk().with_jar("/nonexistent/zookeeper.jar"))
        .await
        .unwrap_err();
    let (package, detail) = not_installed(&err);
    assert_eq!(package, "zookeeper");
    assert!(detail.contains("/nonexistent/zookeeper.jar"), "{detail}");
    let text = err.to_string();
    assert!(
        text.contains("ZooKeeper not found") && text.contains("`zookeeper`"),
        "{text}"
    );

    let err = ZkEnsemble::start(3, fast_zk().with_java("/nonexistent/bin/java"))
        .await
        .unwrap_err();
    assert_eq!(not_installed(&err).0, "default-jre-headless");

    let err = RedisServer::start(RedisOptions::default().with_binary("/nonexistent/redis-server"))
        .await
        .unwrap_err();
    assert_eq!(not_installed(&err).0, "redis-server");

    let err =
        RedisServer::start(RedisOptions::default().with_binary("no-such-redis-server-binary"))
            .await
            .unwrap_err();
    assert!(err.to_string().contains("in PATH"), "{err}");

    let err = EtcdServer::start(EtcdOptions::default().with_binary("/nonexistent/etcd"))
        .await
        .unwrap_err();
    assert_eq!(not_installed(&err).0, "etcd-server");

    assert_within(began, Duration::from_secs(1));
}

#[tokio::test]
async fn startup_failure_quotes_the_log() {
    // An invalid option makes redis-server exit at once: the error says so and quotes the log.
    let began = Instant::now();
    let err = RedisServer::start(RedisOptions::default().with_arg("--no-such-option"))
        .await
        .unwrap_err();
    assert_within(began, Duration::from_secs(5));
    let (server, detail, log_tail) = startup_error(&err);
    assert_eq!(server, "Redis");
    assert!(detail.contains("exited"), "{detail}");
    assert!(log_tail.contains("no-such-option"), "{log_tail}");
}

#[tokio::test]
async fn taken_port_is_reported_after_bounded_retries() {
    // Force the clash: the last `--port` wins, and a listener holds that port. The start is
    // retried on fresh ports (the override keeps clashing) and then reported.
    let holder = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let taken = holder.local_addr().unwrap().port();
    let began = Instant::now();
    let err = RedisServer::start(
        RedisOptions::default()
            .with_arg("--port")
            .with_arg(taken.to_string()),
    )
    .await
    .unwrap_err();
    assert_within(began, Duration::from_secs(10));
    let (_, _, log_tail) = startup_error(&err);
    assert!(log_tail.contains("already in use"), "{log_tail}");
}

// ---- targets and shared servers -------------------------------------------------------

/// A target's condition, for failure messages, says whether its process runs, is stopped
/// or is gone, with the last lines of its log.
#[tokio::test]
async fn a_process_targets_condition_follows_its_process() {
    let mut redis = RedisTarget::from(RedisServer::start(RedisOptions::default()).await.unwrap());
    let pid = redis.server().and_then(RedisServer::pid).unwrap();
    let condition = redis.condition().await;
    assert!(
        condition.contains(&format!("(pid {pid}) runs"))
            && condition.contains("Ready to accept connections"),
        "{condition}"
    );
    redis.pause().await.unwrap();
    let condition = redis.condition().await;
    assert!(
        condition.contains(&format!("(pid {pid}) is stopped")),
        "{condition}"
    );
    redis.resume().await.unwrap();
    redis.kill().await.unwrap();
    let condition = redis.condition().await;
    assert!(condition.contains("does not run"), "{condition}");
    let external = RedisTarget::external("redis://127.0.0.1:1")
        .condition()
        .await;
    assert!(
        external.contains("redis://127.0.0.1:1 is external"),
        "{external}"
    );
}

#[tokio::test]
async fn external_targets_refuse_faults() {
    let mut zk = ZkTarget::external("127.0.0.1:1");
    assert!(zk.is_external());
    assert_eq!(zk.connect_string(), "127.0.0.1:1");
    assert!(zk.server().is_none());
    for result in [zk.pause().await, zk.resume().await, zk.kill().await] {
        let err = result.unwrap_err();
        assert!(matches!(err, ServerError::Unsupported { .. }), "{err:?}");
        assert!(err.to_string().contains("external server"), "{err}");
    }
    assert!(matches!(
        zk.restart().await,
        Err(ServerError::Unsupported { .. })
    ));

    let mut redis = RedisTarget::external("redis://127.0.0.1:1");
    assert_eq!(redis.url(), "redis://127.0.0.1:1");
    assert!(matches!(
        redis.pause().await,
        Err(ServerError::Unsupported { .. })
    ));
    assert!(matches!(
        redis.restart().await,
        Err(ServerError::Unsupported { .. })
    ));
}

#[test]
fn shared_servers_are_one_per_process_across_runtimes() {
    if std::env::var_os(ZK_ENV).is_some() || std::env::var_os(REDIS_ENV).is_some() {
        return;
    }
    let pids: Vec<(u32, u32)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        let zk = shared_zk().unwrap();
                        assert_eq!(zk.four_letter("ruok").await.unwrap(), "imok");
                        let redis = shared_redis().unwrap();
                        assert_eq!(
                            Resp::connect(redis.server().unwrap().port()).call(&["PING"]),
                            "+PONG"
                        );
                        (
                            zk.server().unwrap().pid().unwrap(),
                            redis.server().unwrap().pid().unwrap(),
                        )
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        pids[0], pids[1],
        "one shared server of each kind per process"
    );
}

/// Not a test of its own: does nothing unless [`HELPER_ENV`] is set. Then it starts the
/// shared servers, prints their pids and ports, and ends without dropping anything: by
/// `std::process::exit` (`exit`), or by waiting to be `SIGKILL`ed (`hang`). With `external`
/// it reports what the shared targets are (the parent sets the env overrides).
#[test]
fn helper_start_shared_servers_then_die() {
    let Ok(mode) = std::env::var(HELPER_ENV) else {
        return;
    };
    let zk = shared_zk().unwrap();
    let redis = shared_redis().unwrap();
    let mut out = std::io::stdout().lock();
    if mode == "external" {
        writeln!(
            out,
            "EXTERNAL zk={} zk_external={} zk_pause={} redis={} redis_external={}",
            zk.connect_string(),
            zk.is_external(),
            block_on(zk.pause()).unwrap_err(),
            redis.url(),
            redis.is_external()
        )
        .unwrap();
        out.flush().unwrap();
        return;
    }
    if mode == "containers" {
        writeln!(
            out,
            "CONTAINERS {} {}",
            zk.container_id().unwrap(),
            redis.container_id().unwrap()
        )
        .unwrap();
        out.flush().unwrap();
        drop(out);
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).unwrap();
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let etcd = shared_etcd().unwrap().server().unwrap();
    let zk = zk.server().unwrap();
    let redis = redis.server().unwrap();
    write!(out, "SERVERS").unwrap();
    for (pid, port, dir) in [
        (zk.pid(), zk.port(), zk.dir()),
        (redis.pid(), redis.port(), redis.dir()),
        (etcd.pid(), etcd.port(), etcd.dir()),
    ] {
        write!(out, " {} {} {}", pid.unwrap(), port, dir.display()).unwrap();
    }
    writeln!(out).unwrap();
    out.flush().unwrap();
    drop(out);
    // Wait for the parent to have seen the servers alive; exiting at once would race it.
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    match mode.as_str() {
        "exit" => std::process::exit(0),
        _ => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
    }
}

/// Runs [`helper_start_shared_servers_then_die`] in a child test process.
fn helper(mode: &str, env: &[(&str, &str)]) -> (std::process::Child, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([HELPER_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, mode)
        .env_remove(ZK_ENV)
        .env_remove(REDIS_ENV)
        .env_remove(ETCD_ENV)
        .env_remove(SERVERS_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(
            n > 0,
            "the helper printed no SERVERS/EXTERNAL/CONTAINERS line (did the servers start?)"
        );
        // libtest may print `test <name> ... ` on the same line first.
        if let Some(at) = ["SERVERS ", "EXTERNAL ", "CONTAINERS "]
            .iter()
            .find_map(|tag| line.find(tag))
        {
            line = line[at..].trim_end().to_owned();
            break;
        }
    }
    // Keep draining the helper's output so that it never writes into a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    (child, line)
}

fn assert_no_leftovers(mode: &str) {
    let (mut child, line) = helper(mode, &[]);
    let fields: Vec<&str> = line.split_whitespace().skip(1).collect();
    let servers: Vec<(&str, u32, u16, PathBuf)> = ["ZooKeeper", "Redis", "etcd"]
        .into_iter()
        .zip(fields.chunks(3))
        .map(|(what, server)| match server {
            [pid, port, dir] => (
                what,
                pid.parse().unwrap(),
                port.parse().unwrap(),
                dir.into(),
            ),
            _ => panic!("bad helper line {line:?}"),
        })
        .collect();
    assert_eq!(servers.len(), 3, "bad helper line {line:?}");
    for (what, pid, _, dir) in &servers {
        assert!(!process_gone(*pid), "{what} is not running");
        assert!(
            dir.is_dir(),
            "{what}'s directory {} is missing",
            dir.display()
        );
    }
    // The go-ahead: `exit` ends now; `hang` keeps waiting and is killed.
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    if mode == "hang" {
        child.kill().unwrap(); // SIGKILL: no destructor, no atexit.
    }
    let status = child.wait().unwrap();
    eprintln!("helper ({mode}) ended: {status}");
    let began = Instant::now();
    for (what, pid, port, dir) in servers {
        assert!(
            eventually(Duration::from_secs(5), || process_gone(pid)),
            "{what} pid {pid} outlived the test process ({mode})"
        );
        assert!(
            eventually(Duration::from_secs(5), || port_free(port)),
            "{what} port {port} still bound after the test process ended ({mode})"
        );
        // etcd preallocates 64 MB of write-ahead log: a leaked directory fills disks.
        assert!(
            eventually(Duration::from_secs(5), || !dir.exists()),
            "{what}'s directory {} outlived the test process ({mode})",
            dir.display()
        );
    }
    eprintln!(
        "leftovers ({mode}): servers gone {:?} after the helper ended",
        began.elapsed()
    );
}

#[test]
fn no_leftover_servers_after_process_exit() {
    assert_no_leftovers("exit");
}

#[test]
fn no_leftover_servers_after_sigkill() {
    assert_no_leftovers("hang");
}

#[test]
fn env_overrides_select_external_servers() {
    let (mut child, line) = helper(
        "external",
        &[
            (ZK_ENV, "127.0.0.1:1,127.0.0.1:2/chroot"),
            (REDIS_ENV, "redis://:pw@127.0.0.1:1"),
        ],
    );
    child.wait().unwrap();
    assert!(
        line.contains("zk=127.0.0.1:1,127.0.0.1:2/chroot zk_external=true"),
        "{line}"
    );
    assert!(
        line.contains("unsupported with an external server"),
        "{line}"
    );
    assert!(
        line.contains("redis=redis://:pw@127.0.0.1:1 redis_external=true"),
        "{line}"
    );
}

// ---- containers -----------------------------------------------------------------------

/// An engine address where nothing listens is "no container engine", quickly, whatever
/// the machine runs.
#[cfg(feature = "testcontainers")]
#[tokio::test]
async fn containers_no_engine_is_a_quick_clear_error() {
    use lock_testbed::servers::containers::ContainerEngine;

    let dir = tempfile::tempdir().unwrap();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // the listener is dropped here: nothing listens on it
    for host in [
        format!("unix://{}", dir.path().join("absent.sock").display()),
        format!("tcp://127.0.0.1:{closed_port}"),
    ] {
        let began = Instant::now();
        let engine = ContainerEngine::at(&host);
        let err = engine.check().await.unwrap_err();
        assert!(err.is_no_container_engine(), "{host}: {err:?}");
        assert!(
            err.to_string().starts_with("no container engine: "),
            "{err}"
        );
        let err = engine.has_image("redis", "7").await.unwrap_err();
        assert!(err.is_no_container_engine(), "{host}: {err:?}");
        assert_within(began, Duration::from_secs(10));
    }
}

/// An engine that answers but lacks the image says so: not "no engine". The engine here is
/// a stand-in answering the two requests the module makes before testcontainers is asked
/// for anything, so the outcome does not depend on the machine running a daemon.
#[cfg(feature = "testcontainers")]
#[tokio::test]
async fn containers_engine_without_the_image_is_told_apart() {
    use lock_testbed::servers::containers::ContainerEngine;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("engine.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let engine_task = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 1024];
            let n = stream.read(&mut request).await.unwrap();
            let line = String::from_utf8_lossy(&request[..n]).into_owned();
            let answer = if line.starts_with("GET /_ping ") {
                "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nOK"
            } else if line.starts_with("GET /images/present:1/json ") {
                "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"
            } else {
                "HTTP/1.0 404 Not Found\r\n\r\n{\"message\":\"No such image\"}"
            };
            stream.write_all(answer.as_bytes()).await.unwrap();
        }
    });
    let engine = ContainerEngine::at(&format!("unix://{}", socket.display()));
    engine.check().await.unwrap();
    assert!(engine.has_image("present", "1").await.unwrap());
    assert!(
        !engine
            .has_image("distlock-test/absent", "none")
            .await
            .unwrap()
    );
    engine_task.abort();
}

/// With the machine's own engine: a container starts, serves, and is removed when dropped;
/// where the engine lacks the image, the error names it; with no engine, a quick skip
/// reason. Under `LOCK_CONFORMANCE_STRICT` the containers must start.
#[cfg(feature = "testcontainers")]
#[tokio::test]
async fn containers_start_or_say_what_is_missing() {
    use lock_testbed::servers::containers::{RedisContainer, ZkContainer, check_engine};

    let strict = strict();
    let began = Instant::now();
    if let Err(err) = check_engine().await {
        assert!(!strict, "containers are required under STRICT: {err}");
        assert!(err.is_no_container_engine(), "{err:?}");
        let zk = ZkContainer::start(&fast_zk()).await.unwrap_err();
        assert!(zk.is_no_container_engine(), "{zk:?}");
        let redis = RedisContainer::start(&RedisOptions::default())
            .await
            .unwrap_err();
        assert!(redis.is_no_container_engine(), "{redis:?}");
        eprintln!("skip reason: {zk}");
        assert_within(began, Duration::from_secs(10));
        return;
    }
    let zk_began = Instant::now();
    match ZkContainer::start(&fast_zk()).await {
        Ok(zk) => {
            eprintln!(
                "startup: ZooKeeper container ready in {:?}",
                zk_began.elapsed()
            );
            assert_eq!(zk.four_letter("ruok").await.unwrap(), "imok");
            assert!(
                zk.client_address().starts_with("127.0.0.1:"),
                "{}",
                zk.client_address()
            );
        }
        Err(err) => {
            assert!(!strict, "containers are required under STRICT: {err}");
            assert!(err.is_missing_image(), "{err:?}");
            assert!(err.to_string().contains("LOCK_TEST_ZK_IMAGE"), "{err}");
            eprintln!("skip reason: {err}");
        }
    }
    let redis_began = Instant::now();
    match RedisContainer::start(&RedisOptions::default()).await {
        Ok(redis) => {
            eprintln!(
                "startup: Redis container ready in {:?}",
                redis_began.elapsed()
            );
            let id = redis.id().to_owned();
            assert!(
                redis.client_address().starts_with("redis://127.0.0.1:"),
                "{}",
                redis.client_address()
            );
            drop(redis);
            assert!(!container_exists(&id), "container {id} outlived its handle");
        }
        Err(err) => {
            assert!(!strict, "containers are required under STRICT: {err}");
            assert!(err.is_missing_image(), "{err:?}");
            eprintln!("skip reason: {err}");
        }
    }
}

/// Whether the engine still has the container `id` (asked with the `docker` command, which
/// must answer: a failure to ask is not an answer).
#[cfg(feature = "testcontainers")]
fn container_exists(id: &str) -> bool {
    let inspected = Command::new("docker")
        .args(["container", "inspect", id])
        .output()
        .expect("the docker command");
    let stderr = String::from_utf8_lossy(&inspected.stderr);
    assert!(
        inspected.status.success() || stderr.contains("No such"),
        "docker container inspect {id}: {stderr}"
    );
    inspected.status.success()
}

/// Whether containers can run here; a skip (with the reason) where they cannot, except
/// under `LOCK_CONFORMANCE_STRICT`, where they must.
#[cfg(feature = "testcontainers")]
async fn containers_available() -> bool {
    match lock_testbed::servers::containers::check_ready().await {
        Ok(()) => true,
        Err(why) => {
            assert!(!strict(), "containers are required under STRICT: {why}");
            eprintln!("skip reason: {why}");
            false
        }
    }
}

/// Through a [`RedisTarget`], a container is paused, resumed, killed and restarted by the
/// engine, on the same loopback port.
#[cfg(feature = "testcontainers")]
#[tokio::test]
async fn container_target_faults_go_through_the_engine() {
    if !containers_available().await {
        return;
    }
    let mut redis = RedisTarget::start_in(ServerMode::Containers, RedisOptions::default())
        .await
        .unwrap();
    assert!(redis.is_container() && !redis.is_external());
    assert!(redis.server().is_none());
    let addr = redis.socket_addr().unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
    let port = addr.port();
    assert_eq!(Resp::connect(port).call(&["SET", "k", "v"]), "+OK");
    let condition = redis.condition().await;
    assert!(
        condition.contains(" runs;") && condition.contains("Ready to accept connections"),
        "{condition}"
    );

    redis.pause().await.unwrap();
    assert!(
        !answers_ping(port),
        "a paused Redis container must not answer"
    );
    redis.resume().await.unwrap();
    assert!(answers_ping(port));

    redis.kill().await.unwrap();
    assert!(
        !answers_ping(port),
        "a killed Redis container must not answer"
    );
    let condition = redis.condition().await;
    assert!(condition.contains(" has exited with code "), "{condition}");
    let began = Instant::now();
    redis.restart().await.unwrap();
    eprintln!(
        "startup: Redis container restart ready in {:?}",
        began.elapsed()
    );
    assert_eq!(redis.socket_addr().unwrap().port(), port);
    let mut conn = Resp::connect(port);
    assert_eq!(conn.call(&["PING"]), "+PONG");
    assert_eq!(
        conn.call(&["GET", "k"]),
        "$-1",
        "no persistence: a restart loses data"
    );
}

/// Whether Redis at `port` answers `PING` within 500 ms.
#[cfg(feature = "testcontainers")]
fn answers_ping(port: u16) -> bool {
    let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut conn = BufReader::new(stream);
    if conn.get_mut().write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    matches!(conn.read_line(&mut line), Ok(n) if n > 0) && line.starts_with("+PONG")
}

/// A test that panics while holding a container still removes it: the handle is dropped
/// while the panic unwinds.
#[cfg(feature = "testcontainers")]
#[test]
fn a_panicking_test_leaves_no_container() {
    use lock_testbed::servers::containers::RedisContainer;

    let (started, id) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        block_on(async move {
            if !containers_available().await {
                started.send(None).unwrap();
                return;
            }
            let redis = RedisContainer::start(&RedisOptions::default())
                .await
                .unwrap();
            started.send(Some(redis.id().to_owned())).unwrap();
            panic!("a failing test holding a container (expected)");
        });
    })
    .join();
    if let Some(id) = id.recv().unwrap() {
        assert!(outcome.is_err(), "the test thread should have panicked");
        assert!(!container_exists(&id), "container {id} outlived a panic");
    }
}

/// The shared servers in containers (`LOCK_TEST_SERVERS=containers`) are removed when the
/// test process is killed (`SIGKILL`: nothing is dropped), by their watchdogs.
#[cfg(feature = "testcontainers")]
#[test]
fn no_leftover_containers_after_sigkill() {
    if !block_on(containers_available()) {
        return;
    }
    let (mut child, line) = helper("containers", &[(SERVERS_ENV, "containers")]);
    let ids: Vec<String> = line.split_whitespace().skip(1).map(String::from).collect();
    assert_eq!(ids.len(), 2, "bad helper line {line:?}");
    assert!(ids.iter().all(|id| container_exists(id)), "{ids:?}");
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let began = Instant::now();
    for id in &ids {
        assert!(
            eventually(Duration::from_secs(15), || !container_exists(id)),
            "container {id} outlived the killed test process"
        );
    }
    eprintln!(
        "leftovers (containers): removed {:?} after the kill",
        began.elapsed()
    );
}

/// A member cut off from the ensemble's network stops serving while the others elect a new
/// leader; healed, it rejoins as a follower. The network goes with the ensemble.
#[cfg(feature = "testcontainers")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_ensemble_partitions_and_heals() {
    if !containers_available().await {
        return;
    }
    let began = Instant::now();
    let ensemble = ZkEnsemble::start_in(ServerMode::Containers, 3, fast_zk())
        .await
        .unwrap();
    eprintln!("startup: ensemble of 3 containers in {:?}", began.elapsed());
    let network = ensemble.network().expect("a network of its own").to_owned();
    let old = ensemble
        .wait_for_leader(Duration::from_secs(30))
        .await
        .unwrap();

    let cut = Instant::now();
    ensemble.partition(old).await.unwrap();
    let others: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    let new_leader = observe_until(
        Duration::from_secs(30),
        "a new leader on the majority side",
        || async {
            for &i in &others {
                if ensemble.mode(i).await.unwrap().as_deref() == Some("leader") {
                    return Some(i);
                }
            }
            None
        },
        Option::is_some,
    )
    .await
    .unwrap()
    .unwrap();
    assert_ne!(new_leader, old);
    let elected = cut.elapsed();
    // The old leader notices it has lost its quorum on its own clock (its followers' acks stop
    // for syncLimit ticks), which may be after the majority has elected a new leader.
    observe_until(
        Duration::from_secs(30),
        "the cut-off member to stop serving",
        || async { ensemble.mode(old).await.unwrap() },
        Option::is_none,
    )
    .await
    .unwrap();
    eprintln!(
        "partition: new leader after {elected:?}, the old one stopped serving after {:?}",
        cut.elapsed()
    );

    let healed = Instant::now();
    ensemble.heal(old).await.unwrap();
    let mode = observe_until(
        Duration::from_secs(30),
        "the healed member serving",
        || async { ensemble.mode(old).await.unwrap() },
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(mode.as_deref(), Some("follower"));
    eprintln!("heal: old leader serves again after {:?}", healed.elapsed());

    drop(ensemble);
    let networks = Command::new("docker")
        .args(["network", "ls", "--quiet", "--filter"])
        .arg(format!("name={network}"))
        .output()
        .unwrap();
    assert!(networks.status.success(), "docker network ls failed");
    assert!(
        networks.stdout.is_empty(),
        "network {network} outlived the ensemble"
    );
}
