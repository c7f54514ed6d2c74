//! The `distlock` command line, process against process, on real ZooKeeper and Redis
//! servers (the test binary's shared ones, or servers of a test's own): exclusion between
//! `distlock run` processes, timeouts and `try`, exit statuses, a holder cut off past its
//! session or lease, signals, `holders`, configuration and connection errors, and
//! exclusion with kazoo's lock recipe.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test fixtures: a failed set-up must fail the test, and skips say why"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_conformance::runner::strict;
use lock_conformance::{eventually, unique_name};
use lock_testbed::proxy::FaultProxy;
use lock_testbed::servers::{
    RedisClusterOptions, RedisClusterSet, RedisOptions, RedisSentinelOptions, RedisSentinelSet,
    RedisServer, free_port, shared_etcd, shared_postgres, shared_redis, shared_zk,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tempfile::TempDir;
use tokio::process::{Child, Command};
use tokio::time::sleep;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// Exit statuses of the tool.
const USAGE: i32 = 2;
const UNAVAILABLE: i32 = 69;
const BUSY: i32 = 75;
const LOST: i32 = 76;

/// The longest any single distlock process may take in these tests.
const BOUND: Duration = Duration::from_secs(60);

/// The command of the exclusion tests: a critical section of 300 ms, logged.
const SECTION: &str =
    "echo start $DISTLOCK_FENCING_TOKEN >> \"$LOG\"; sleep 0.3; echo end >> \"$LOG\"";

// ---------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------

fn zk_url() -> String {
    let server = shared_zk().expect("a ZooKeeper server for the tests");
    format!("zk://{}", server.connect_string())
}

fn zk_addr() -> SocketAddr {
    let server = shared_zk().expect("a ZooKeeper server for the tests");
    let connect_string = server.connect_string();
    let first = connect_string.split(',').next().unwrap();
    first
        .split('/')
        .next()
        .unwrap()
        .parse()
        .expect("the shared ZooKeeper listens on an IP address")
}

fn redis_url() -> String {
    shared_redis().expect("a Redis server for the tests").url()
}

fn redis_addr() -> SocketAddr {
    let url = redis_url();
    let rest = url.split_once("://").unwrap().1;
    let authority = rest.split(['/', '?']).next().unwrap();
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    host_port
        .parse()
        .expect("the shared Redis listens on an IP address")
}

/// The shared etcd, with short leases so that a killed client's lock frees quickly.
fn etcd_url() -> String {
    let endpoint = shared_etcd()
        .expect("an etcd server for the tests")
        .client_address();
    let address = endpoint.trim_start_matches("http://");
    format!("etcd://{address}?lease_ttl=3s")
}

/// The shared PostgreSQL, with a short keepalive so that a holder cut off is noticed soon.
fn postgres_url() -> String {
    let url = shared_postgres()
        .expect("a PostgreSQL server for the tests")
        .url();
    format!("{url}?keepalive=1s")
}

/// `url` with one more query parameter.
fn with_param(url: &str, param: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{param}")
}

/// A temporary directory for one test's files.
struct Scratch {
    dir: TempDir,
    next: AtomicU32,
}

impl Scratch {
    fn new() -> Self {
        Scratch {
            dir: tempfile::tempdir().expect("a temporary directory"),
            next: AtomicU32::new(0),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A command line that waits (at most 20 s) for `file` to exist.
    fn wait_for(&self, file: &str) -> String {
        let file = self.path(file);
        format!(
            "i=0; while [ ! -e '{}' ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done",
            file.display()
        )
    }

    fn touch(&self, file: &str) {
        std::fs::write(self.path(file), b"").unwrap();
    }

    /// Starts `distlock ARGS`, its stdout and stderr going to files of their own; `log`
    /// is the `$LOG` of its command.
    fn spawn(&self, args: &[&str]) -> Proc {
        self.spawn_with(args, &[])
    }

    /// [`spawn`](Self::spawn) with more environment variables.
    fn spawn_with(&self, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let stdout = self.path(&format!("stdout-{n}"));
        let stderr = self.path(&format!("stderr-{n}"));
        let child = Command::new(BIN)
            .args(args)
            .env_remove("DISTLOCK_URL")
            .env_remove("DISTLOCK_PASSWORD")
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .env("LOG", self.path("log"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("the distlock binary runs");
        Proc {
            child,
            started: Instant::now(),
            stdout,
            stderr,
            args: args.join(" "),
        }
    }

    /// Runs `distlock ARGS` to the end.
    async fn run(&self, args: &[&str]) -> Finished {
        self.spawn(args).finish(BOUND).await
    }

    /// [`run`](Self::run) with more environment variables.
    async fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Finished {
        self.spawn_with(args, env).finish(BOUND).await
    }

    /// The lines of `$LOG`.
    fn log(&self) -> Vec<String> {
        read_lines(&self.path("log"))
    }

    /// Waits (bounded) until `$LOG` has a line starting with `prefix`.
    async fn wait_for_log(&self, prefix: &str) {
        self.wait_for_lines(prefix, 1).await;
    }

    /// Waits (bounded) until `$LOG` has `count` lines starting with `prefix`.
    async fn wait_for_lines(&self, prefix: &str, count: usize) {
        wait_until(&format!("{count} lines {prefix:?} in the log"), || {
            self.log().iter().filter(|l| l.starts_with(prefix)).count() >= count
        })
        .await;
    }
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Now on the wall clock, since the epoch: what `date +%s.%N` in a command prints.
fn wall_clock() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// A `date +%s.%N` stamp from a command's log line, since the epoch.
fn parse_stamp(stamp: &str) -> Duration {
    let (seconds, nanos) = stamp
        .split_once('.')
        .unwrap_or_else(|| panic!("a `date +%s.%N` stamp: {stamp:?}"));
    Duration::new(seconds.parse().unwrap(), nanos.parse().unwrap())
}

/// Whether process `pid` has ended: there is no such process, or it is a zombie (dead, its
/// status not yet collected by whoever inherited it).
fn has_ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        // `PID (COMM) STATE ...`; COMM may hold spaces and parentheses.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| matches!(state, "Z" | "X" | "x"))
    })
}

/// Waits (bounded) until `check` holds.
async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    eventually(
        Duration::from_secs(30),
        what,
        || std::future::ready(check()),
    )
    .await
    .unwrap_or_else(|failure| panic!("{failure}"));
}

/// A running distlock process.
struct Proc {
    child: Child,
    started: Instant,
    stdout: PathBuf,
    stderr: PathBuf,
    args: String,
}

/// How a distlock process ended.
#[derive(Debug)]
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// From its start to its exit.
    took: Duration,
    /// When it exited.
    at: Instant,
}

impl Proc {
    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id().expect("running")).unwrap())
    }

    async fn finish(mut self, bound: Duration) -> Finished {
        let status = match tokio::time::timeout(bound, self.child.wait()).await {
            Ok(status) => status.expect("waiting for distlock"),
            Err(_) => {
                let _ = self.child.kill().await;
                panic!(
                    "`distlock {}` did not exit within {bound:?}; stderr: {}",
                    self.args,
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                );
            }
        };
        let at = Instant::now();
        Finished {
            code: status.code(),
            stdout: std::fs::read_to_string(&self.stdout).unwrap_or_default(),
            stderr: std::fs::read_to_string(&self.stderr).unwrap_or_default(),
            took: at - self.started,
            at,
        }
    }
}

impl Finished {
    /// Asserts the exit status and that stderr is exactly one line starting `distlock:`.
    fn expect_error(&self, code: i32) -> &str {
        assert_eq!(
            self.code,
            Some(code),
            "exit status; stderr: {}",
            self.stderr
        );
        let lines: Vec<_> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {:?}", self.stderr);
        assert!(lines[0].starts_with("distlock: "), "{:?}", lines[0]);
        lines[0]
    }
}

/// `distlock holders --json` for `name`.
async fn holders(scratch: &Scratch, url: &str, name: &str) -> Value {
    let done = scratch
        .run(&["holders", "--url", url, "--name", name, "--json"])
        .await;
    assert_eq!(done.code, Some(0), "holders: {}", done.stderr);
    serde_json::from_str(&done.stdout).expect("holders --json prints JSON")
}

/// Waits (bounded) until `holders` shows `waiters` waiters behind a holder.
async fn wait_for_waiters(scratch: &Scratch, url: &str, name: &str, waiters: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = holders(scratch, url, name).await;
        let queued = view["waiters"].as_array().map_or(0, Vec::len);
        if !view["holder"].is_null() && queued == waiters {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {waiters} waiters: {view}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// Checks that the log of [`SECTION`]s shows `sections` critical sections that never
/// overlapped (strictly alternating start and end) with strictly increasing tokens.
fn assert_sections(log: &[String], sections: usize) -> Vec<u64> {
    assert_eq!(
        log.len(),
        sections * 2,
        "every section logged twice: {log:?}"
    );
    let mut tokens = Vec::new();
    for pair in log.chunks(2) {
        let token = pair[0]
            .strip_prefix("start ")
            .unwrap_or_else(|| panic!("a section starts after the last ended: {log:?}"));
        assert_eq!(
            pair[1], "end",
            "a section ends before the next starts: {log:?}"
        );
        tokens.push(token.parse::<u64>().expect("a numeric token"));
    }
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "fencing tokens increase from holder to holder: {tokens:?}"
    );
    tokens
}

// ---------------------------------------------------------------------------------------
// Exclusion
// ---------------------------------------------------------------------------------------

async fn runs_never_overlap(url: &str) {
    let scratch = Scratch::new();
    let name = unique_name("cli-overlap");
    let processes: Vec<_> = (0..3)
        .map(|_| {
            scratch.spawn(&[
                "run",
                "--url",
                url,
                "--name",
                &name,
                "--timeout",
                "30s",
                "--",
                "sh",
                "-c",
                SECTION,
            ])
        })
        .collect();
    for process in processes {
        let done = process.finish(BOUND).await;
        assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
        assert!(done.stderr.is_empty(), "quiet on success: {}", done.stderr);
    }
    let tokens = assert_sections(&scratch.log(), 3);
    eprintln!("{url}: three runs, tokens {tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_runs_never_overlap() {
    runs_never_overlap(&zk_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_runs_never_overlap() {
    runs_never_overlap(&redis_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_runs_never_overlap() {
    runs_never_overlap(&etcd_url()).await;
}

// ---------------------------------------------------------------------------------------
// Several locks at once
// ---------------------------------------------------------------------------------------

/// Four runs naming two locks, two in each order: none waits on another for ever (each
/// exits 0 within its timeout), their commands never overlap, each gets both tokens in the
/// order of its names, and both tokens grow from run to run. A `try` while one of the two
/// is held exits 75 and leaves the other free.
async fn sets_in_opposite_orders(url: &str) {
    let scratch = Scratch::new();
    let (a, b) = (unique_name("cli-set-a"), unique_name("cli-set-b"));
    let orders = [[&a, &b], [&b, &a], [&a, &b], [&b, &a]];
    let section = "echo start $DISTLOCK_FENCING_TOKEN $DISTLOCK_LOCK_NAME >> \"$LOG\"; \
                   sleep 0.2; echo end >> \"$LOG\"";
    let processes: Vec<_> = orders
        .iter()
        .map(|[first, second]| {
            scratch.spawn(&[
                "run",
                "--url",
                url,
                "--name",
                first,
                "--name",
                second,
                "--timeout",
                "30s",
                "--",
                "sh",
                "-c",
                section,
            ])
        })
        .collect();
    for process in processes {
        let done = process.finish(BOUND).await;
        assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
    }
    let log = scratch.log();
    assert_eq!(log.len(), 8, "every section logged twice: {log:?}");
    let mut last: Option<(u64, u64)> = None;
    for pair in log.chunks(2) {
        assert_eq!(
            pair[1], "end",
            "a section ends before the next starts: {log:?}"
        );
        let fields: Vec<&str> = pair[0].split(' ').collect();
        let ["start", tokens, names] = fields[..] else {
            panic!("a section starts after the last ended: {log:?}");
        };
        let tokens: Vec<u64> = tokens.split(',').map(|t| t.parse().unwrap()).collect();
        let names: Vec<&str> = names.split(',').collect();
        assert_eq!(names.len(), 2, "{log:?}");
        // Each run's tokens in the order of its own names: a's and b's, whichever first.
        let by_name = if names[0] == a.as_str() {
            (tokens[0], tokens[1])
        } else {
            (tokens[1], tokens[0])
        };
        if let Some(before) = last {
            assert!(
                by_name.0 > before.0 && by_name.1 > before.1,
                "tokens grow: {log:?}"
            );
        }
        last = Some(by_name);
    }
    // One of the two held: a try of both exits 75, and leaves the other free.
    let holder = scratch.spawn(&[
        "run",
        "--url",
        url,
        "--name",
        &b,
        "--",
        "sh",
        "-c",
        &scratch.wait_for("release"),
    ]);
    wait_for_waiters(&scratch, url, &b, 0).await;
    let busy = scratch
        .run(&[
            "try", "--url", url, "--name", &a, "--name", &b, "--", "true",
        ])
        .await;
    busy.expect_error(75);
    let free = scratch
        .run(&["try", "--url", url, "--name", &a, "--", "true"])
        .await;
    assert_eq!(
        free.code,
        Some(0),
        "the first lock was given back: {}",
        free.stderr
    );
    scratch.touch("release");
    assert_eq!(holder.finish(BOUND).await.code, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_sets_in_opposite_orders() {
    sets_in_opposite_orders(&zk_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_sets_in_opposite_orders() {
    sets_in_opposite_orders(&etcd_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sets_in_opposite_orders() {
    sets_in_opposite_orders(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_only_where_one_lock_is_meant_and_never_a_name_twice() {
    let scratch = Scratch::new();
    for command in [
        &[
            "holders",
            "--url",
            "memory://",
            "--name",
            "a",
            "--name",
            "b",
        ][..],
        &["leader", "--url", "memory://", "--name", "a", "--name", "b"],
        &[
            "elect",
            "--url",
            "memory://",
            "--name",
            "a",
            "--name",
            "b",
            "--",
            "true",
        ],
    ] {
        let done = scratch.run(command).await;
        assert!(
            done.expect_error(2).contains("takes one --name"),
            "{command:?}"
        );
    }
    let twice = [
        "run",
        "--url",
        "memory://",
        "--name",
        "a",
        "--name",
        "a",
        "--",
        "true",
    ];
    let done = scratch.run(&twice).await;
    assert!(
        done.expect_error(2).contains("named twice"),
        "{}",
        done.stderr
    );
}

// ---------------------------------------------------------------------------------------
// Timeouts and try
// ---------------------------------------------------------------------------------------

async fn busy_lock_exits_75(url: &str) {
    let scratch = Scratch::new();
    let name = unique_name("cli-busy");
    let hold = format!("echo held >> \"$LOG\"; {}", scratch.wait_for("stop"));
    let holder = scratch.spawn(&[
        "run", "--url", url, "--name", &name, "--", "sh", "-c", &hold,
    ]);
    scratch.wait_for_log("held").await;

    let timed_out = scratch
        .run(&[
            "run",
            "--url",
            url,
            "--name",
            &name,
            "--timeout",
            "500ms",
            "--",
            "sh",
            "-c",
            "echo ran >> \"$LOG\"",
        ])
        .await;
    let line = timed_out.expect_error(BUSY);
    assert!(
        line.contains(&format!("{name:?}")),
        "names the lock: {line}"
    );
    assert!(line.contains("500ms"), "names the wait: {line}");
    assert!(
        timed_out.took >= Duration::from_millis(500),
        "no earlier than the timeout: {:?}",
        timed_out.took
    );
    assert!(
        timed_out.took < Duration::from_secs(5),
        "soon after the timeout: {:?}",
        timed_out.took
    );

    let tried = scratch
        .run(&[
            "try",
            "--url",
            url,
            "--name",
            &name,
            "--",
            "sh",
            "-c",
            "echo ran >> \"$LOG\"",
        ])
        .await;
    let line = tried.expect_error(BUSY);
    assert!(
        line.contains(&format!("{name:?}")),
        "names the lock: {line}"
    );
    // Process start and a session opened and closed, on a machine that may be slow; the
    // holder holds until `stop` (20 s at most), which a `try` that waited would outlast.
    assert!(
        tried.took < Duration::from_secs(5),
        "try gives up at once, without waiting for the holder: {:?}",
        tried.took
    );

    scratch.touch("stop");
    let held = holder.finish(BOUND).await;
    assert_eq!(held.code, Some(0), "stderr: {}", held.stderr);
    assert_eq!(
        scratch.log(),
        ["held"],
        "the busy runs never ran their command"
    );
    // Nothing was left behind by the two that gave up: the lock is free.
    let view = holders(&scratch, url, &name).await;
    assert!(view["holder"].is_null(), "free: {view}");
    assert_eq!(view["waiters"].as_array().map(Vec::len), Some(0), "{view}");
    eprintln!(
        "{url}: --timeout 500ms exited 75 after {:?}; try exited 75 after {:?}",
        timed_out.took, tried.took
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_busy_lock_exits_75() {
    busy_lock_exits_75(&zk_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_busy_lock_exits_75() {
    busy_lock_exits_75(&redis_url()).await;
}

/// A primary with two replicas under three sentinels, for `redis+sentinel://` URLs.
async fn sentinel_set() -> RedisSentinelSet {
    RedisSentinelSet::start(RedisSentinelOptions::default())
        .await
        .expect("a Redis Sentinel set for the test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_runs_never_overlap() {
    runs_never_overlap(&sentinel_set().await.url(None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_busy_lock_exits_75() {
    busy_lock_exits_75(&sentinel_set().await.url(None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_runs_never_overlap() {
    let cluster = RedisClusterSet::start(RedisClusterOptions::default())
        .await
        .expect("a Redis Cluster for the test");
    runs_never_overlap(&cluster.url(None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_busy_lock_exits_75() {
    let cluster = RedisClusterSet::start(RedisClusterOptions::default())
        .await
        .expect("a Redis Cluster for the test");
    busy_lock_exits_75(&cluster.url(None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_busy_lock_exits_75() {
    busy_lock_exits_75(&etcd_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_runs_never_overlap() {
    runs_never_overlap(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_busy_lock_exits_75() {
    busy_lock_exits_75(&postgres_url()).await;
}

// ---------------------------------------------------------------------------------------
// Exit statuses and the command's environment
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_status_and_environment_pass_through() {
    let scratch = Scratch::new();
    let memory = ["run", "--url", "memory://", "--name", "jobs/nightly", "--"];
    let with = |command: &[&'static str]| -> Vec<&str> {
        memory.iter().chain(command).copied().collect::<Vec<_>>()
    };

    let done = scratch.run(&with(&["sh", "-c", "exit 7"])).await;
    assert_eq!(done.code, Some(7), "the command's status: {}", done.stderr);
    assert!(done.stderr.is_empty(), "{}", done.stderr);

    let done = scratch.run(&with(&["sh", "-c", "kill -TERM $$"])).await;
    assert_eq!(
        done.code,
        Some(128 + 15),
        "128 + the signal: {}",
        done.stderr
    );

    let done = scratch
        .run(&with(&[
            "sh",
            "-c",
            "test \"$DISTLOCK_LOCK_NAME\" = jobs/nightly && test \"$DISTLOCK_FENCING_TOKEN\" -ge 1",
        ]))
        .await;
    assert_eq!(done.code, Some(0), "the environment: {}", done.stderr);

    let done = scratch
        .run(&with(&["distlock-test-no-such-command", "--flag"]))
        .await;
    let line = done.expect_error(127);
    assert!(line.contains("distlock-test-no-such-command"), "{line}");

    // The URL from the environment.
    let child = Command::new(BIN)
        .args(["try", "--name", "x", "--", "sh", "-c", "exit 4"])
        .env("DISTLOCK_URL", "memory://")
        .stdin(Stdio::null())
        .output();
    let output = tokio::time::timeout(BOUND, child).await.unwrap().unwrap();
    assert_eq!(output.status.code(), Some(4), "DISTLOCK_URL is read");
}

// ---------------------------------------------------------------------------------------
// A holder cut off past its session or lease
// ---------------------------------------------------------------------------------------

/// The holder talks to the server through `proxy` (`holder` is its `--url` and any other
/// options) with a short session or lease; the proxy cuts it off; its command must get
/// SIGTERM, distlock must exit 76, and a waiter with a direct connection must get the lock.
/// `term_before_next`: assert that the old holder's command got SIGTERM before the next
/// holder's started. Redis has a structural margin (the drift, and the waiter's refresh
/// period, as a lease that runs out is announced to nobody); ZooKeeper's can be as small as
/// the server's expiry rounding, less than a loaded machine's scheduling delay of the
/// command's own stamp, so there it is only reported.
async fn cut_holder_stops_its_command(
    proxy: &FaultProxy,
    options: &[&str],
    waiter_url: &str,
    term_before_next: bool,
) {
    let scratch = Scratch::new();
    let name = unique_name("cli-cut");
    let hold = format!(
        "exec 2>/dev/null; trap 'echo term $(date +%s.%N) >> \"$LOG\"; exit 143' TERM; echo start $DISTLOCK_FENCING_TOKEN >> \"$LOG\"; {}",
        scratch.wait_for("never")
    );
    let mut args = vec!["run", "--name", &name, "--grace", "5s"];
    args.extend(options);
    args.extend(["--", "sh", "-c", &hold]);
    let holder = scratch.spawn(&args);
    scratch.wait_for_log("start").await;
    let waiter = scratch.spawn(&[
        "run",
        "--url",
        waiter_url,
        "--name",
        &name,
        "--timeout",
        "30s",
        "--",
        "sh",
        "-c",
        "echo got $DISTLOCK_FENCING_TOKEN $(date +%s.%N) >> \"$LOG\"",
    ]);
    wait_for_waiters(&scratch, waiter_url, &name, 1).await;

    let cut = Instant::now();
    let cut_clock = wall_clock();
    proxy.cut();
    let held = holder.finish(Duration::from_secs(20)).await;
    let line = held.expect_error(LOST);
    assert!(line.contains("lost"), "says the lock was lost: {line}");
    assert!(
        line.contains(&format!("{name:?}")),
        "names the lock: {line}"
    );
    let waited = waiter.finish(Duration::from_secs(30)).await;
    assert_eq!(waited.code, Some(0), "the waiter ran: {}", waited.stderr);

    let log = scratch.log();
    let fields = |tag: &str| -> Vec<&str> {
        log.iter()
            .find_map(|line| line.strip_prefix(tag))
            .unwrap_or_else(|| panic!("{tag:?} in {log:?}"))
            .split(' ')
            .collect()
    };
    // When a line's `date +%s.%N` was, after the cut.
    let since_cut = |stamp: &str| parse_stamp(stamp).saturating_sub(cut_clock);
    let holder_token: u64 = fields("start ")[0].parse().unwrap();
    let termed = since_cut(fields("term ")[0]);
    let got = fields("got ");
    let waiter_token: u64 = got[0].parse().unwrap();
    let granted = since_cut(got[1]);
    assert!(
        waiter_token > holder_token,
        "the next holder's token is larger: {log:?}"
    );
    let stopped = held.at - cut;
    assert!(
        stopped >= Duration::from_millis(500),
        "not before the session or lease could have ended: {stopped:?}"
    );
    assert!(
        stopped < Duration::from_secs(6),
        "soon after the session (2 s) or lease (1 s) ended: {stopped:?}"
    );
    // The holder gives the lock up once the session timeout or the lease has passed since
    // it sent the last request the server answered, no later than the server can end it:
    // its command is told to stop before the next holder's starts. (Both stamps are taken
    // just after the fact: `termed` after the signal arrived, `granted` as the command began.
    // The margin is tens to hundreds of milliseconds; a holder starved of CPU for longer acts
    // late, which is what the fencing token is for.)
    assert!(
        !term_before_next || termed < granted,
        "the old holder's command should get SIGTERM ({termed:?} after the cut) before the \
         next holder's command starts ({granted:?}): {log:?}"
    );
    eprintln!(
        "{}: after the cut, the command got SIGTERM at {termed:?}, distlock exited 76 at \
         {stopped:?}, the waiter's command ran at {granted:?} ({:+.3} s after the SIGTERM)",
        options.join(" "),
        granted.as_secs_f64() - termed.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_holder_cut_past_its_session_exits_76() {
    let proxy = FaultProxy::start(zk_addr()).expect("a fault proxy");
    // `--ttl 2s` replaces the URL's `session_timeout=10s`: were it ignored, the holder would
    // keep its session for 10 s and the bounds would fail.
    let holder_url = format!("zk://{}?session_timeout=10s", proxy.address());
    cut_holder_stops_its_command(
        &proxy,
        &["--url", &holder_url, "--ttl", "2s"],
        &zk_url(),
        false,
    )
    .await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holder_cut_past_its_lease_exits_76() {
    let proxy = FaultProxy::start(redis_addr()).expect("a fault proxy");
    // `--ttl 1s` replaces the URL's `ttl=30s`: were it ignored, the holder would keep its
    // lease for 30 s and the bounds would fail.
    let holder_url = format!("redis://{}?ttl=30s", proxy.address());
    let waiter_url = with_param(&redis_url(), "ttl=1s");
    cut_holder_stops_its_command(
        &proxy,
        &["--url", &holder_url, "--ttl", "1s"],
        &waiter_url,
        true,
    )
    .await;
    proxy.shutdown().await;
}

/// A command that survives SIGTERM, cut off past its lease: `--grace` after the SIGTERM,
/// distlock sends its process group SIGKILL (the shell and a background child that ignores
/// SIGTERM both die) and exits 76, soon after the grace and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_command_surviving_sigterm_is_killed_after_the_grace() {
    const GRACE: Duration = Duration::from_secs(1);
    let proxy = FaultProxy::start(redis_addr()).expect("a fault proxy");
    let scratch = Scratch::new();
    let name = unique_name("cli-grace");
    // The shell logs SIGTERM and carries on; its background child ignores SIGTERM.
    let stubborn = "exec 2>/dev/null; trap 'echo term $(date +%s.%N) >> \"$LOG\"' TERM; \
                    (trap '' TERM; exec sleep 60) & echo start $$ $! >> \"$LOG\"; \
                    while :; do sleep 0.05; done";
    let holder_url = format!("redis://{}", proxy.address());
    let holder = scratch.spawn(&[
        "run",
        "--url",
        &holder_url,
        "--name",
        &name,
        "--ttl",
        "1s",
        "--grace",
        "1s",
        "--",
        "sh",
        "-c",
        stubborn,
    ]);
    scratch.wait_for_log("start").await;
    let started = scratch.log();
    let pids: Vec<u32> = started[0]
        .strip_prefix("start ")
        .unwrap()
        .split(' ')
        .map(|pid| pid.parse().unwrap())
        .collect();
    let (shell, background) = (pids[0], pids[1]);
    assert!(
        !has_ended(shell) && !has_ended(background),
        "the command and its background child run: {started:?}"
    );

    let cut = Instant::now();
    let cut_clock = wall_clock();
    proxy.cut();
    let held = holder.finish(Duration::from_secs(20)).await;
    assert_eq!(
        held.code,
        Some(LOST),
        "exit status; stderr: {}",
        held.stderr
    );
    assert!(
        held.stderr.contains("lost") && held.stderr.contains(&format!("{name:?}")),
        "says the lock was lost: {}",
        held.stderr
    );
    assert!(
        held.stderr.contains("sending SIGKILL"),
        "says it sent SIGKILL: {}",
        held.stderr
    );
    // The whole group was killed: the shell, and the background child that outlived it.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !(has_ended(shell) && has_ended(background)) {
        assert!(
            Instant::now() < deadline,
            "the command ({shell}: ended {}) and its background child ({background}: ended {}) \
             were killed with distlock's exit",
            has_ended(shell),
            has_ended(background)
        );
        sleep(Duration::from_millis(10)).await;
    }

    let log = scratch.log();
    let terms: Vec<_> = log
        .iter()
        .filter_map(|line| line.strip_prefix("term "))
        .collect();
    assert_eq!(terms.len(), 1, "one SIGTERM, survived: {log:?}");
    let termed = parse_stamp(terms[0]).saturating_sub(cut_clock);
    let stopped = held.at - cut;
    let killed = stopped.saturating_sub(termed);
    // The stamp comes after the signal arrived (the shell's `sleep` ends, the trap runs
    // `date`), later still on a busy machine: slack below the grace, which still tells a
    // SIGKILL after the grace from one with the SIGTERM.
    assert!(
        killed >= GRACE - Duration::from_millis(500),
        "SIGKILL no earlier than the grace after SIGTERM: SIGTERM at {termed:?} after the \
         cut, exit at {stopped:?}"
    );
    assert!(
        killed < GRACE + Duration::from_secs(5),
        "SIGKILL soon after the grace: SIGTERM at {termed:?} after the cut, exit at {stopped:?}"
    );
    eprintln!(
        "--grace 1s: after the cut, the command got SIGTERM at {termed:?} and survived it; \
         distlock killed its group and exited 76 at {stopped:?}, {killed:?} after the SIGTERM"
    );
    proxy.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Signals
// ---------------------------------------------------------------------------------------

/// `signal` (SIGTERM or SIGINT) to a waiting distlock ends it without leaving a waiter
/// behind; to the holding distlock, it reaches the command, whose status distlock exits
/// with, and the lock is released at once (long before the session or lease would end).
async fn signal_is_passed_on_and_the_lock_released(url: &str, signal: Signal) {
    let scratch = Scratch::new();
    // TERM, INT: the shell's name for it, and what the command logs when it arrives.
    let short = signal.as_str().trim_start_matches("SIG");
    let name = unique_name(&format!("cli-sig{}", short.to_lowercase()));
    let hold = format!(
        "exec 2>/dev/null; trap 'echo {short} >> \"$LOG\"; exit 3' {short}; echo start >> \"$LOG\"; {}",
        scratch.wait_for("never")
    );
    let holder = scratch.spawn(&[
        "run", "--url", url, "--name", &name, "--", "sh", "-c", &hold,
    ]);
    scratch.wait_for_log("start").await;
    let first = scratch.spawn(&[
        "run",
        "--url",
        url,
        "--name",
        &name,
        "--timeout",
        "30s",
        "--",
        "sh",
        "-c",
        "echo first >> \"$LOG\"",
    ]);
    wait_for_waiters(&scratch, url, &name, 1).await;
    let second = scratch.spawn(&[
        "run",
        "--url",
        url,
        "--name",
        &name,
        "--timeout",
        "30s",
        "--",
        "sh",
        "-c",
        "echo second >> \"$LOG\"",
    ]);
    wait_for_waiters(&scratch, url, &name, 2).await;

    // A waiter stopped by the signal: status 128 + its number, one line, and its place is
    // gone.
    kill(second.pid(), signal).unwrap();
    let stopped = second.finish(Duration::from_secs(10)).await;
    let line = stopped.expect_error(128 + signal as i32);
    assert!(
        line.contains(&format!("{name:?}")),
        "names the lock: {line}"
    );
    let view = holders(&scratch, url, &name).await;
    assert_eq!(
        view["waiters"].as_array().map(Vec::len),
        Some(1),
        "the stopped waiter left the queue: {view}"
    );

    let signalled = Instant::now();
    kill(holder.pid(), signal).unwrap();
    let held = holder.finish(Duration::from_secs(10)).await;
    assert_eq!(held.code, Some(3), "the command's status: {}", held.stderr);
    assert!(held.stderr.is_empty(), "{}", held.stderr);
    let next = first.finish(Duration::from_secs(10)).await;
    assert_eq!(next.code, Some(0), "{}", next.stderr);
    let handed_on = next.at - signalled;
    assert!(
        handed_on < Duration::from_secs(3),
        "released at once, not when the session or lease ran out: {handed_on:?}"
    );
    assert_eq!(scratch.log(), ["start", short, "first"]);
    eprintln!("{url}: {signal} to the holder; the next waiter ran {handed_on:?} later");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_sigterm_is_passed_on_and_the_lock_released() {
    signal_is_passed_on_and_the_lock_released(&zk_url(), Signal::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sigterm_is_passed_on_and_the_lock_released() {
    signal_is_passed_on_and_the_lock_released(&redis_url(), Signal::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_sigint_is_passed_on_and_the_lock_released() {
    signal_is_passed_on_and_the_lock_released(&zk_url(), Signal::SIGINT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sigint_is_passed_on_and_the_lock_released() {
    signal_is_passed_on_and_the_lock_released(&redis_url(), Signal::SIGINT).await;
}

// ---------------------------------------------------------------------------------------
// holders
// ---------------------------------------------------------------------------------------

/// A holder and two waiters that queued one after the other; `holders` lists them in that
/// order, and when the holder leaves, the first waiter listed is the next holder.
async fn holders_lists_the_queue(url: &str, backend: &str) -> (Value, Value) {
    let scratch = Scratch::new();
    let name = unique_name("cli-holders");
    let free = holders(&scratch, url, &name).await;
    assert_eq!(free["backend"], backend, "{free}");
    assert_eq!(free["name"], name.as_str(), "{free}");
    assert!(free["holder"].is_null(), "{free}");

    let section = |tag: &str, stop: &str| {
        format!(
            "echo {tag} $DISTLOCK_FENCING_TOKEN >> \"$LOG\"; {}",
            scratch.wait_for(stop)
        )
    };
    let (a, b, c) = (
        section("a", "stop-a"),
        section("b", "stop-b"),
        section("c", "stop-c"),
    );
    let first = scratch.spawn(&["run", "--url", url, "--name", &name, "--", "sh", "-c", &a]);
    scratch.wait_for_log("a ").await;
    let second = scratch.spawn(&["run", "--url", url, "--name", &name, "--", "sh", "-c", &b]);
    wait_for_waiters(&scratch, url, &name, 1).await;
    let third = scratch.spawn(&["run", "--url", url, "--name", &name, "--", "sh", "-c", &c]);
    let before = wait_for_waiters(&scratch, url, &name, 2).await;

    let text = scratch
        .run(&["holders", "--url", url, "--name", &name])
        .await;
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    let lines: Vec<_> = text.stdout.lines().collect();
    assert!(lines[0].contains(&format!("{name:?}")), "{lines:?}");
    assert!(lines[1].starts_with("holder"), "{lines:?}");
    assert!(lines[2].starts_with("waiter 1"), "{lines:?}");
    assert!(lines[3].starts_with("waiter 2"), "{lines:?}");

    scratch.touch("stop-a");
    scratch.wait_for_log("b ").await;
    let after = wait_for_waiters(&scratch, url, &name, 1).await;
    scratch.touch("stop-b");
    scratch.wait_for_log("c ").await;
    scratch.touch("stop-c");
    for process in [first, second, third] {
        let done = process.finish(BOUND).await;
        assert_eq!(done.code, Some(0), "{}", done.stderr);
    }
    let log = scratch.log();
    assert_eq!(
        log.iter().map(|line| &line[..1]).collect::<Vec<_>>(),
        ["a", "b", "c"],
        "first come, first served: {log:?}"
    );
    (before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_holders_lists_the_holder_and_the_queue_in_order() {
    let (before, after) = holders_lists_the_queue(&zk_url(), "zookeeper").await;
    let waiters = before["waiters"].as_array().unwrap();
    let sequence = |entry: &Value| entry["sequence"].as_i64().unwrap();
    assert!(
        sequence(&before["holder"]) < sequence(&waiters[0])
            && sequence(&waiters[0]) < sequence(&waiters[1]),
        "ordered by sequence: {before}"
    );
    assert!(
        before["location"]
            .as_str()
            .unwrap()
            .starts_with("/distlock/"),
        "{before}"
    );
    // The first waiter listed is the next holder: its node, its czxid as the token.
    assert_eq!(
        after["holder"]["place"], waiters[0]["place"],
        "{before} {after}"
    );
    assert_eq!(
        after["holder"]["fencing_token"], waiters[0]["czxid"],
        "{before} {after}"
    );
    assert_eq!(
        after["waiters"][0]["place"], waiters[1]["place"],
        "{before} {after}"
    );
    for entry in [&before["holder"], &waiters[0], &waiters[1]] {
        let node = entry["place"].as_str().unwrap();
        assert!(node.starts_with("_c_") && node.contains("-lock-"), "{node}");
        assert!(
            entry["session"].as_str().unwrap().starts_with("0x"),
            "{entry}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holders_lists_the_holder_and_the_queue_in_order() {
    let (before, after) = holders_lists_the_queue(&redis_url(), "redis").await;
    let waiters = before["waiters"].as_array().unwrap();
    assert_eq!(before["waiters_recorded"], true, "{before}");
    assert!(
        before["holder"]["lease_left_ms"].as_u64().unwrap() > 0,
        "{before}"
    );
    // The first waiter listed is the next holder, the second is next in line.
    assert_eq!(
        after["holder"]["place"], waiters[0]["place"],
        "{before} {after}"
    );
    assert_eq!(
        after["waiters"][0]["place"], waiters[1]["place"],
        "{before} {after}"
    );
    assert!(
        after["holder"]["fencing_token"].as_u64() > before["holder"]["fencing_token"].as_u64(),
        "{before} {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_holders_lists_the_holder_and_the_queue_in_order() {
    let (before, after) = holders_lists_the_queue(&etcd_url(), "etcd").await;
    let waiters = before["waiters"].as_array().unwrap();
    let revision = |entry: &Value| entry["create_revision"].as_i64().unwrap();
    assert!(
        revision(&before["holder"]) < revision(&waiters[0])
            && revision(&waiters[0]) < revision(&waiters[1]),
        "ordered by create revision: {before}"
    );
    // The first waiter listed is the next holder, its create revision the token.
    assert_eq!(
        after["holder"]["place"], waiters[0]["place"],
        "{before} {after}"
    );
    assert_eq!(
        after["holder"]["fencing_token"], waiters[0]["create_revision"],
        "{before} {after}"
    );
    assert_eq!(
        after["waiters"][0]["place"], waiters[1]["place"],
        "{before} {after}"
    );
    // Keys are named by their session's lease, in hex, as etcd's own mutex names them.
    for entry in [&before["holder"], &waiters[0], &waiters[1]] {
        let key = entry["place"].as_str().unwrap();
        let lease = entry["session"].as_str().unwrap();
        assert!(
            key.starts_with("/distlock/") && key.ends_with(lease),
            "{entry}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holders_lists_the_holder_and_the_queue_in_order() {
    let (before, after) = holders_lists_the_queue(&postgres_url(), "postgres").await;
    let waiters = before["waiters"].as_array().unwrap();
    assert_eq!(before["waiters_recorded"], true, "{before}");
    // The first waiter listed is the next holder (the server's queue), the second is next.
    assert_eq!(
        after["holder"]["place"], waiters[0]["place"],
        "{before} {after}"
    );
    assert_eq!(
        after["waiters"][0]["place"], waiters[1]["place"],
        "{before} {after}"
    );
    assert!(
        after["holder"]["fencing_token"].as_u64() > before["holder"]["fencing_token"].as_u64(),
        "{before} {after}"
    );
    for entry in [&before["holder"], &waiters[0], &waiters[1]] {
        assert!(
            entry["place"].as_str().unwrap().starts_with("pid "),
            "{entry}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_holders_says_it_sees_one_process() {
    let scratch = Scratch::new();
    let done = scratch
        .run(&["holders", "--url", "memory://", "--name", "x", "--json"])
        .await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    let view: Value = serde_json::from_str(&done.stdout).unwrap();
    assert!(view["holder"].is_null(), "{view}");
    assert!(view["note"].as_str().unwrap().contains("process"), "{view}");
}

// ---------------------------------------------------------------------------------------
// Configuration and connection errors
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_exits_2_with_one_line() {
    let scratch = Scratch::new();
    let cases: [(&str, &[&str], &str); 6] = [
        ("not a url", &[], "scheme"),
        ("ftp://127.0.0.1", &[], "ftp"),
        ("zk://127.0.0.1:2181?bogus=1", &[], "bogus"),
        ("redis://127.0.0.1:6379?ttl=soon", &[], "ttl"),
        ("redis://127.0.0.1:6379", &["--ttl", "1ms"], "ttl"),
        ("memory://", &["--ttl", "1s"], "--ttl"),
    ];
    for (url, extra, mentions) in cases {
        let mut args = vec!["run", "--url", url, "--name", "x"];
        args.extend(extra);
        args.extend(["--", "sh", "-c", "echo ran >> \"$LOG\""]);
        let done = scratch.run(&args).await;
        let line = done.expect_error(USAGE);
        assert!(line.contains(mentions), "{url}: {line}");
        assert!(done.took < Duration::from_secs(3), "{url}: {:?}", done.took);
    }
    for command in ["run", "holders"] {
        // Checked before any server is asked: this one does not exist.
        let mut args = vec![command, "--url", "zk://127.0.0.1:1", "--name", ""];
        if command == "run" {
            args.extend(["--", "true"]);
        }
        let done = scratch.run(&args).await;
        let line = done.expect_error(USAGE);
        assert!(line.contains("name"), "{line}");
    }
    let done = scratch
        .run(&[
            "holders",
            "--url",
            "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
            "--name",
            "x",
        ])
        .await;
    done.expect_error(USAGE);
    // Usage errors are clap's, also exit 2.
    let done = scratch.run(&["run", "--name", "x", "--", "true"]).await;
    assert_eq!(done.code, Some(USAGE), "{}", done.stderr);
    assert!(done.stderr.contains("--url"), "{}", done.stderr);
    assert!(scratch.log().is_empty(), "no command ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_has_examples_and_bench_points_to_the_herd_binary() {
    let scratch = Scratch::new();
    let done = scratch.run(&["--help"]).await;
    assert_eq!(done.code, Some(0));
    assert!(done.stdout.contains("Examples:"), "{}", done.stdout);
    let done = scratch.run(&["run", "--help"]).await;
    assert_eq!(done.code, Some(0));
    assert!(
        done.stdout.contains("DISTLOCK_FENCING_TOKEN"),
        "{}",
        done.stdout
    );
    let done = scratch.run(&["bench", "--help"]).await;
    assert_eq!(done.code, Some(0));
    assert!(
        done.stdout
            .contains("cargo run --release -p distlock-benches --bin herd -- --help"),
        "{}",
        done.stdout
    );
    let done = scratch.run(&["bench"]).await;
    assert_eq!(done.code, Some(USAGE));
    assert!(done.stderr.contains("distlock-benches"), "{}", done.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers_exit_69_in_bounded_time() {
    let scratch = Scratch::new();
    let refused = free_port().unwrap();
    let black_hole = FaultProxy::start(zk_addr()).unwrap();
    black_hole.black_hole();
    let cases = [
        format!("zk://127.0.0.1:{refused}?connect_timeout=1s"),
        format!("redis://127.0.0.1:{refused}?timeout=1s"),
        format!("zk://{}?connect_timeout=1s", black_hole.address()),
        format!("redis://{}?timeout=1s", black_hole.address()),
        format!("etcd://127.0.0.1:{refused}?timeout=1s"),
        format!("etcd://{}?timeout=1s", black_hole.address()),
    ];
    for url in &cases {
        for command in ["run", "holders"] {
            let mut args = vec![command, "--url", url, "--name", "x"];
            if command == "run" {
                args.extend(["--", "sh", "-c", "echo ran >> \"$LOG\""]);
            }
            let done = scratch.run(&args).await;
            let line = done.expect_error(UNAVAILABLE);
            assert!(line.contains("connect"), "{url}: {line}");
            // Read as a person would: the address, the cause and the tries, no client's dump.
            if url.starts_with("etcd") {
                assert!(line.contains("cannot reach 127.0.0.1:"), "{url}: {line}");
                assert!(line.contains("attempt(s) in"), "{url}: {line}");
                assert!(
                    !line.contains("tonic") && !line.contains('{'),
                    "{url}: {line}"
                );
                if url.contains(&format!(":{refused}")) {
                    assert!(line.contains("connection refused"), "{url}: {line}");
                }
            }
            assert!(
                done.took < Duration::from_secs(5),
                "{url}: {command} took {:?}",
                done.took
            );
            eprintln!("{command} {url}: exit 69 after {:?}: {line}", done.took);
        }
    }
    assert!(scratch.log().is_empty(), "no command ran");
    black_hole.shutdown().await;
}

/// A password comes from `DISTLOCK_PASSWORD`, from `--password-file` or from the URL; one in
/// a `--url` on the command line, where the process list shows it, draws a warning that does
/// not repeat it, and one in `DISTLOCK_URL` none; two sources are a usage error; a refused
/// password exits 69 without being repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_apart_from_the_url_and_refused_ones() {
    let scratch = Scratch::new();
    let server = RedisServer::start(RedisOptions::default().with_password("s3cret"))
        .await
        .expect("a Redis server with a password");
    let url = format!("redis://127.0.0.1:{}", server.port());
    let run = ["run", "--url", &url, "--name", "x", "--", "true"];
    let refused = scratch
        .run_with(&run, &[("DISTLOCK_PASSWORD", "wrong")])
        .await;
    let line = refused.expect_error(UNAVAILABLE);
    assert!(line.contains("authentication"), "{line}");
    assert!(!line.contains("wrong"), "the password is repeated: {line}");
    let from_env = scratch
        .run_with(&run, &[("DISTLOCK_PASSWORD", "s3cret")])
        .await;
    assert_eq!(from_env.code, Some(0), "{}", from_env.stderr);
    let file = scratch.path("password");
    std::fs::write(&file, "s3cret\n").unwrap();
    let file = file.display().to_string();
    let with_file = [
        "run",
        "--url",
        &url,
        "--password-file",
        &file,
        "--name",
        "x",
        "--",
        "true",
    ];
    let from_file = scratch.run(&with_file).await;
    assert_eq!(from_file.code, Some(0), "{}", from_file.stderr);
    let twice = scratch
        .run_with(&with_file, &[("DISTLOCK_PASSWORD", "s3cret")])
        .await;
    assert!(
        twice.expect_error(USAGE).contains("give one"),
        "{}",
        twice.stderr
    );
    let visible = format!("redis://:s3cret@127.0.0.1:{}", server.port());
    let on_the_line = scratch
        .run(&["run", "--url", &visible, "--name", "x", "--", "true"])
        .await;
    assert_eq!(on_the_line.code, Some(0), "{}", on_the_line.stderr);
    assert!(
        on_the_line.stderr.contains("process list") && !on_the_line.stderr.contains("s3cret"),
        "{}",
        on_the_line.stderr
    );
    let in_env = scratch
        .run_with(
            &["run", "--name", "x", "--", "true"],
            &[("DISTLOCK_URL", &visible)],
        )
        .await;
    assert_eq!(in_env.code, Some(0), "{}", in_env.stderr);
    assert!(!in_env.stderr.contains("process list"), "{}", in_env.stderr);
}

/// A planted password appears in no output of any command, at every log level (`-vvv` is
/// `trace` for every crate): `run`, `try` (busy), `holders --json` on Redis, with the password
/// from the environment, from a file and from the URL (which draws the warning), a refused
/// one, ZooKeeper's digest credentials, etcd's user (on a server without authentication,
/// which refuses it) and PostgreSQL's (on a server that trusts the role).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_password_appears_in_no_output() {
    const PLANTED: &str = "pl4nted-S3cret";
    let scratch = Scratch::new();
    let server = RedisServer::start(RedisOptions::default().with_password(PLANTED))
        .await
        .expect("a Redis server with a password");
    let url = format!("redis://127.0.0.1:{}", server.port());
    let visible = format!("redis://:{PLANTED}@127.0.0.1:{}", server.port());
    let file = scratch.path("password");
    std::fs::write(&file, format!("{PLANTED}\n")).unwrap();
    let file = file.display().to_string();
    let env = [("DISTLOCK_PASSWORD", PLANTED)];
    let mut outputs = Vec::new();
    let holder = scratch.spawn_with(
        &[
            "-vvv", "run", "--url", &url, "--name", "p", "--", "sleep", "2",
        ],
        &env,
    );
    sleep(Duration::from_millis(800)).await;
    for (args, env) in [
        (
            vec!["-vvv", "try", "--url", &url, "--name", "p", "--", "true"],
            &env[..],
        ),
        (
            vec!["-vvv", "holders", "--url", &url, "--name", "p", "--json"],
            &env[..],
        ),
        (
            vec![
                "-vvv",
                "run",
                "--url",
                &url,
                "--password-file",
                &file,
                "--name",
                "q",
                "--",
                "true",
            ],
            &[],
        ),
        (
            vec![
                "-vvv", "run", "--url", &visible, "--name", "q", "--", "true",
            ],
            &[],
        ),
        (
            vec!["-vvv", "run", "--url", &url, "--name", "q", "--", "true"],
            &[("DISTLOCK_PASSWORD", "not-the-planted-one")][..],
        ),
    ] {
        let done = scratch.run_with(&args, env).await;
        outputs.push((args.join(" "), done.code, done.stdout, done.stderr));
    }
    let held = holder.finish(BOUND).await;
    assert!(
        held.stderr.contains("INFO distlock"),
        "logging is on: {}",
        held.stderr
    );
    outputs.push(("the holder".to_owned(), held.code, held.stdout, held.stderr));
    let digest = zk_url().replace("zk://", &format!("zk://app:{PLANTED}@"));
    let zk = scratch
        .run_with(
            &["-vvv", "run", "--name", "z", "--", "true"],
            &[("DISTLOCK_URL", &digest)],
        )
        .await;
    outputs.push(("zk".to_owned(), zk.code, zk.stdout, zk.stderr));
    let etcd = etcd_url().replace("etcd://", &format!("etcd://app:{PLANTED}@"));
    let postgres = postgres_url().replacen("@", &format!(":{PLANTED}@"), 1);
    for (what, url) in [("etcd", etcd), ("postgres", postgres)] {
        let done = scratch
            .run_with(
                &["-vvv", "run", "--name", "e", "--", "true"],
                &[("DISTLOCK_URL", &url)],
            )
            .await;
        outputs.push((what.to_owned(), done.code, done.stdout, done.stderr));
    }
    for (what, code, stdout, stderr) in &outputs {
        assert!(
            !stdout.contains(PLANTED) && !stderr.contains(PLANTED),
            "{what} (exit {code:?}) shows the password:\n{stdout}\n{stderr}"
        );
    }
    let codes: Vec<_> = outputs.iter().map(|(_, code, ..)| *code).collect();
    assert_eq!(
        codes,
        [
            Some(BUSY),
            Some(0),
            Some(0),
            Some(0),
            Some(UNAVAILABLE),
            Some(0),
            Some(0),
            Some(UNAVAILABLE),
            Some(0)
        ],
        "{outputs:?}"
    );
}

// ---------------------------------------------------------------------------------------
// kazoo
// ---------------------------------------------------------------------------------------

/// kazoo's `Lock` with `extra_lock_patterns=["-lock-"]` on `/distlock/NAME`, as
/// `MODE` = `hold` (acquire, log a section while `STOP` is missing, release) or `try`
/// (one attempt; exit 3 when busy).
const KAZOO: &str = r#"
import os, sys, time
from kazoo.client import KazooClient
hosts, path, mode, log, stop = sys.argv[1:6]
zk = KazooClient(hosts=hosts, timeout=10.0)
zk.start(timeout=15)
lock = zk.Lock(path, "kazoo", extra_lock_patterns=["-lock-"])
if mode == "try":
    got = lock.acquire(blocking=False)
    if got:
        lock.release()
    zk.stop()
    sys.exit(0 if got else 3)
if not lock.acquire(timeout=30):
    sys.exit(4)
with open(log, "a") as f:
    f.write("start kazoo\n")
deadline = time.time() + 20
while not os.path.exists(stop) and time.time() < deadline:
    time.sleep(0.05)
with open(log, "a") as f:
    f.write("end\n")
lock.release()
zk.stop()
"#;

/// A Python with kazoo: `python3`, or the system's (where Debian's python3-kazoo goes).
fn python_with_kazoo() -> Option<String> {
    ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|python| {
            std::process::Command::new(python)
                .args(["-c", "import kazoo"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        })
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_and_distlock_exclude_each_other() {
    let Some(python) = python_with_kazoo() else {
        let why = "`python3 -c \"import kazoo\"` fails; install python3-kazoo (scripts/ensure-servers does)";
        assert!(
            !strict(),
            "not skipped under LOCK_CONFORMANCE_STRICT: {why}"
        );
        eprintln!("skipped: {why}");
        return;
    };
    let scratch = Scratch::new();
    let script = scratch.path("kazoo_lock.py");
    std::fs::write(&script, KAZOO).unwrap();
    let hosts = shared_zk().unwrap().connect_string();
    let url = zk_url();
    let name = unique_name("cli-kazoo");
    let path = format!("/distlock/{name}");
    let kazoo = |mode: &str, stop: &str| {
        Command::new(&python)
            .arg(&script)
            .args([hosts.as_str(), &path, mode])
            .arg(scratch.path("log"))
            .arg(scratch.path(stop))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("python runs")
    };

    // kazoo holds: distlock's try is refused, distlock's run queues behind kazoo's node.
    let mut kazoo_holder = kazoo("hold", "stop-kazoo");
    scratch.wait_for_log("start kazoo").await;
    let tried = scratch
        .run(&[
            "try", "--url", &url, "--name", &name, "--", "sh", "-c", SECTION,
        ])
        .await;
    tried.expect_error(BUSY);
    let view = holders(&scratch, &url, &name).await;
    let node = view["holder"]["place"].as_str().unwrap_or_default();
    assert!(node.contains("__lock__"), "kazoo's node holds: {view}");
    let run = scratch.spawn(&[
        "run", "--url", &url, "--name", &name, "--", "sh", "-c", SECTION,
    ]);
    wait_for_waiters(&scratch, &url, &name, 1).await;
    scratch.touch("stop-kazoo");
    let status = tokio::time::timeout(BOUND, kazoo_holder.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "kazoo held and released");
    let done = run.finish(BOUND).await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);

    // distlock holds: kazoo's try is refused, kazoo's blocking acquire waits for it.
    let hold = format!(
        "echo start $DISTLOCK_FENCING_TOKEN >> \"$LOG\"; {}; echo end >> \"$LOG\"",
        scratch.wait_for("stop-distlock")
    );
    let holder = scratch.spawn(&[
        "run", "--url", &url, "--name", &name, "--", "sh", "-c", &hold,
    ]);
    wait_for_waiters(&scratch, &url, &name, 0).await;
    let tried = tokio::time::timeout(BOUND, kazoo("try", "unused").wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        tried.code(),
        Some(3),
        "kazoo sees distlock's node as the holder"
    );
    let mut kazoo_waiter = kazoo("hold", "stop-kazoo-2");
    wait_for_waiters(&scratch, &url, &name, 1).await;
    scratch.touch("stop-distlock");
    let done = holder.finish(BOUND).await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    scratch.wait_for_lines("start kazoo", 2).await;
    scratch.touch("stop-kazoo-2");
    let status = tokio::time::timeout(BOUND, kazoo_waiter.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "kazoo got the lock after distlock");

    let log = scratch.log();
    let kinds: Vec<_> = log
        .iter()
        .map(|line| match line.as_str() {
            "start kazoo" => "kazoo",
            "end" => "end",
            _ if line.starts_with("start ") => "distlock",
            _ => "?",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "kazoo", "end", "distlock", "end", "distlock", "end", "kazoo", "end"
        ],
        "kazoo and distlock took turns, never overlapping: {log:?}"
    );
}

/// `distlock leader --json` for `name`.
async fn leader(scratch: &Scratch, url: &str, name: &str) -> Value {
    let done = scratch
        .run(&["leader", "--url", url, "--name", name, "--json"])
        .await;
    assert_eq!(done.code, Some(0), "leader: {}", done.stderr);
    serde_json::from_str(&done.stdout).expect("leader --json prints JSON")
}

/// Two `distlock elect` processes: the first leads and runs its command with its term, the
/// second waits without running its command, `leader` reports who leads, and when the
/// first's command exits it resigns and the second leads with a larger term; `leader
/// --watch` prints each leader as it comes; a third gives up after `--timeout` with 75.
async fn elect_hands_over(url: &str) {
    let scratch = Scratch::new();
    let name = unique_name("cli-elect");
    let lead = |who: &str| {
        format!(
            "echo \"{who} $DISTLOCK_FENCING_TOKEN $DISTLOCK_LOCK_NAME\" >> \"$LOG\"; {}",
            scratch.wait_for(&format!("stop-{who}"))
        )
    };
    let (lead_a, lead_b) = (lead("a"), lead("b"));
    let a = scratch.spawn(&[
        "elect", "--url", url, "--name", &name, "--value", "host-a", "--", "sh", "-c", &lead_a,
    ]);
    scratch.wait_for_log("a ").await;
    let watcher = scratch.spawn(&["leader", "--url", url, "--name", &name, "--watch"]);
    let b = scratch.spawn(&[
        "elect", "--url", url, "--name", &name, "--value", "host-b", "--", "sh", "-c", &lead_b,
    ]);
    let led = leader(&scratch, url, &name).await;
    assert_eq!(led["election"], name.as_str(), "{led}");
    assert_eq!(led["leader"]["value"], "host-a", "{led}");
    let term_a = led["leader"]["term"].as_u64().expect("a term");

    let gave_up = scratch
        .run(&[
            "elect",
            "--url",
            url,
            "--name",
            &name,
            "--value",
            "host-c",
            "--timeout",
            "300ms",
            "--",
            "sh",
            "-c",
            "echo c >> \"$LOG\"",
        ])
        .await;
    let line = gave_up.expect_error(BUSY);
    assert!(
        line.contains(&format!("{name:?}")),
        "names the election: {line}"
    );

    scratch.touch("stop-a");
    let a = a.finish(BOUND).await;
    assert_eq!(a.code, Some(0), "stderr: {}", a.stderr);
    scratch.wait_for_log("b ").await;
    let led = leader(&scratch, url, &name).await;
    assert_eq!(led["leader"]["value"], "host-b", "{led}");
    let term_b = led["leader"]["term"].as_u64().expect("a term");
    assert!(term_b > term_a, "terms grow: {term_a} then {term_b}");
    let log = scratch.log();
    assert_eq!(
        log,
        [format!("a {term_a} {name}"), format!("b {term_b} {name}")],
        "each leader ran its command with its term, one after the other; the one that gave up never ran"
    );
    // A watch may coalesce changes that come faster than it looks (Redis's observers poll),
    // but it never misses a leader that stays: b leads until the watch has shown it.
    let shown_b = format!("host-b (term {term_b})");
    wait_until("leader --watch printed b's leadership", || {
        std::fs::read_to_string(&watcher.stdout)
            .unwrap_or_default()
            .lines()
            .any(|line| line == shown_b)
    })
    .await;
    scratch.touch("stop-b");
    let b = b.finish(BOUND).await;
    assert_eq!(b.code, Some(0), "stderr: {}", b.stderr);
    let led = leader(&scratch, url, &name).await;
    assert!(
        led["leader"].is_null(),
        "nobody leads after both resigned: {led}"
    );

    wait_until("leader --watch printed the last change", || {
        std::fs::read_to_string(&watcher.stdout)
            .unwrap_or_default()
            .lines()
            .last()
            == Some("no leader")
    })
    .await;
    let watched = std::fs::read_to_string(&watcher.stdout).unwrap();
    // One line per change, in order. Should b have queued only after a resigned, there was
    // a moment without a leader, which the watch may or may not have caught.
    let lines: Vec<&str> = watched
        .lines()
        .filter(|line| *line != "no leader")
        .chain(std::iter::once("no leader"))
        .collect();
    assert_eq!(
        lines,
        [
            format!("host-a (term {term_a})"),
            format!("host-b (term {term_b})"),
            "no leader".to_owned()
        ],
        "leader --watch printed: {watched:?}"
    );
    assert!(
        watched.starts_with(&format!("host-a (term {term_a})\n")),
        "{watched:?}"
    );
    kill(watcher.pid(), Signal::SIGINT).unwrap();
    let watcher = watcher.finish(BOUND).await;
    assert_eq!(watcher.code, Some(128 + 2), "stderr: {}", watcher.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_elect_hands_over_and_leader_follows() {
    elect_hands_over(&zk_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_elect_hands_over_and_leader_follows() {
    elect_hands_over(&etcd_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_elect_hands_over_and_leader_follows() {
    elect_hands_over(&postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_elect_hands_over_and_leader_follows() {
    elect_hands_over(&redis_url()).await;
}

/// A leader cut off from ZooKeeper past its session: `elect` stops its command and exits
/// 76, and a candidate with a direct connection takes over with a larger term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_leader_cut_past_its_session_exits_76() {
    let proxy = FaultProxy::start(zk_addr()).expect("a fault proxy");
    let scratch = Scratch::new();
    let name = unique_name("cli-elect-cut");
    let lead = format!(
        "echo leads $DISTLOCK_FENCING_TOKEN >> \"$LOG\"; {}",
        scratch.wait_for("never")
    );
    let leader_url = format!("zk://{}", proxy.address());
    let leading = scratch.spawn(&[
        "elect",
        "--url",
        &leader_url,
        "--ttl",
        "2s",
        "--grace",
        "5s",
        "--name",
        &name,
        "--value",
        "cut-off",
        "--",
        "sh",
        "-c",
        &lead,
    ]);
    scratch.wait_for_log("leads").await;
    let zk = zk_url();
    let next = scratch.spawn(&[
        "elect",
        "--url",
        &zk,
        "--name",
        &name,
        "--value",
        "next",
        "--timeout",
        "30s",
        "--",
        "sh",
        "-c",
        "echo next $DISTLOCK_FENCING_TOKEN >> \"$LOG\"",
    ]);
    let led = leader(&scratch, &zk, &name).await;
    assert_eq!(led["leader"]["value"], "cut-off", "{led}");
    proxy.cut();
    let cut = leading.finish(Duration::from_secs(20)).await;
    let line = cut.expect_error(LOST);
    assert!(
        line.contains("leadership") && line.contains("lost"),
        "says the leadership was lost: {line}"
    );
    let next = next.finish(Duration::from_secs(30)).await;
    assert_eq!(
        next.code,
        Some(0),
        "the next candidate led: {}",
        next.stderr
    );
    let log = scratch.log();
    let term = |tag: &str| -> u64 {
        log.iter()
            .find_map(|line| line.strip_prefix(tag))
            .unwrap_or_else(|| panic!("{tag:?} in {log:?}"))
            .parse()
            .unwrap()
    };
    assert!(term("next ") > term("leads "), "terms grow: {log:?}");
    proxy.shutdown().await;
}
