//! `herd`: what waiting for a lock costs as contenders grow, for every strategy, side by
//! side, in one run. See `herd --help`.
#![allow(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "a command-line program: its output is the point"
)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use distlock_benches::scenario::{self, Release, RunOptions};
use distlock_benches::strategy::{Backend, Servers, Strategy};
use distlock_benches::{Measurement, ScaleMeasurement, report, scale};
use lock_testbed::servers::{
    EtcdOptions, EtcdServer, PostgresOptions, PostgresServer, RedisClusterOptions, RedisClusterSet,
    RedisOptions, RedisServer, ZkEnsemble, ZkOptions, ZkServer,
};

/// The herd comparison: N contenders, each its own client, pass one lock around.
///
/// For every strategy and every N it measures throughput, handoff latency (p50, p99)
/// against the floor of raw client operations, wake-ups and futile wake-ups per handoff,
/// server requests per handoff, and fairness. Without --zk, --redis, --etcd or --postgres it starts the
/// servers it needs on free loopback ports and stops them at the end.
#[derive(Debug, Parser)]
#[command(
    name = "herd",
    after_help = "Examples:\n  herd                                         # every strategy, N = 1, 10, 50, 100\n  herd --strategies zk-single,zk-predecessor --contenders 10,100,250\n  herd --redis redis://127.0.0.1:6379 --strategies redis-pubsub,redis-queue\n  herd --redis-cluster --strategies redis-polling,redis-pubsub,redis-queue\n  herd --scale 1000,10000,100000 --strategies zk-predecessor,redis-queue\n  herd --json results.json --report target/herd"
)]
struct Args {
    /// Strategies, comma-separated: zk-single, zk-children, zk-predecessor, zk-recipe,
    /// redis-polling, redis-pubsub, redis-queue, etcd-single, etcd-prefix,
    /// etcd-predecessor, etcd-v3lock, pg-advisory, pg-notify, pg-polling.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "zk-single,zk-children,zk-predecessor,zk-recipe,redis-polling,redis-pubsub,redis-queue,etcd-single,etcd-prefix,etcd-predecessor,etcd-v3lock,pg-advisory,pg-notify,pg-polling"
    )]
    strategies: Vec<Strategy>,
    /// Numbers of contenders, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50,100", value_parser = at_least_one)]
    contenders: Vec<usize>,
    /// Handoffs measured per run.
    #[arg(long, default_value_t = 100)]
    handoffs: u64,
    /// How long each holder keeps the lock, in milliseconds.
    #[arg(long, default_value_t = 0)]
    hold_ms: u64,
    /// How a holder lets go: `await` its release's answer, or `drop` the guard (the release
    /// goes out in the background), as the zk-recipe and etcd-v3lock peers always do.
    #[arg(long, value_enum, default_value_t = Release::Await)]
    release: Release,
    /// A run stops after this many seconds even with fewer handoffs (polling is slow).
    #[arg(long, default_value_t = 4.0)]
    max_seconds: f64,
    /// Rounds of the floor measurement per backend.
    #[arg(long, default_value_t = 100)]
    floor_rounds: usize,
    /// Seconds each server is warmed up for before the first measured run (the floors'
    /// operations, unmeasured): a freshly started server is slower at first.
    #[arg(long, default_value_t = 5.0)]
    warm_up_seconds: f64,
    /// The floors measured while this many more clients write to keys of their own on the
    /// same server (etcd and ZooKeeper), as a run's own requests load it: the floor a
    /// handoff can reach under that load rather than on an idle server.
    #[arg(long, default_value_t = 0)]
    floor_writers: usize,
    /// An existing ZooKeeper (`zk://host:port,…` or `host:port,…`) instead of a local one.
    #[arg(long, conflicts_with = "zk_ensemble")]
    zk: Option<String>,
    /// The ZooKeeper strategies on an ensemble of this many members started here, rather
    /// than on one standalone server (contenders connect to any member).
    #[arg(long, value_name = "MEMBERS")]
    zk_ensemble: Option<usize>,
    /// An existing Redis (`redis://host:port`, or a primary under Sentinel:
    /// `redis+sentinel://s1,s2/SERVICE`) instead of a local one.
    #[arg(long, conflicts_with = "redis_cluster")]
    redis: Option<String>,
    /// The Redis strategies on a Redis Cluster: the one at URL (`redis+cluster://n1,n2,…`),
    /// or without URL three primaries started here (each lock is on the primary serving its
    /// slot).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    redis_cluster: Option<String>,
    /// An existing etcd (`http://host:port`) instead of a local one.
    #[arg(long)]
    etcd: Option<String>,
    /// An existing PostgreSQL (`postgres://user@host:port/db`) instead of a local one.
    #[arg(long)]
    postgres: Option<String>,
    /// Write the measurements as a JSON array to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write plots (SVG), the JSON and a markdown summary into this directory.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Scale mode: one provider per strategy holds this many locks at once. Several
    /// numbers, comma-separated, are measured one after another; then each strategy and
    /// number runs in a fresh process of its own (on the same servers), so that every
    /// first round is a fresh process's.
    #[arg(long, value_delimiter = ',', value_parser = at_least_one)]
    scale: Vec<usize>,
}

/// A count of contenders or locks: a whole number, 1 or more.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(count) => Ok(count),
        Err(error) => Err(error.to_string()),
    }
}

/// The servers of the run: given, or started here (and stopped when this is dropped).
struct Started {
    servers: Servers,
    _zk: Option<ZkServer>,
    _zk_ensemble: Option<ZkEnsemble>,
    _redis: Option<RedisServer>,
    _redis_cluster: Option<RedisClusterSet>,
    _etcd: Option<EtcdServer>,
    _postgres: Option<PostgresServer>,
}

async fn servers(args: &Args) -> Result<Started, String> {
    let wants = |backend: Backend| args.strategies.iter().any(|s| s.backend() == backend);
    let mut started = Started {
        servers: Servers::default(),
        _zk: None,
        _zk_ensemble: None,
        _redis: None,
        _redis_cluster: None,
        _etcd: None,
        _postgres: None,
    };
    let zk = match (&args.zk, args.zk_ensemble) {
        (Some(url), _) => Some(
            url.trim_start_matches("zk://")
                .trim_end_matches('/')
                .to_owned(),
        ),
        (None, Some(members)) if wants(Backend::ZooKeeper) => {
            eprintln!("starting a ZooKeeper ensemble of {members} ...");
            let ensemble = ZkEnsemble::start(members, ZkOptions::default())
                .await
                .map_err(|e| format!("starting a ZooKeeper ensemble: {e}"))?;
            let connect = ensemble.connect_string();
            started._zk_ensemble = Some(ensemble);
            Some(connect)
        }
        (None, None) if wants(Backend::ZooKeeper) => {
            eprintln!("starting ZooKeeper ...");
            let server = ZkServer::start(ZkOptions::default())
                .await
                .map_err(|e| format!("starting ZooKeeper: {e}"))?;
            let connect = server.connect_string();
            started._zk = Some(server);
            Some(connect)
        }
        (None, _) => None,
    };
    // Every contender is a client of its own, with connections of its own.
    let redis_options = RedisOptions::default()
        .with_arg("--maxclients")
        .with_arg("20000");
    let redis = match (&args.redis, &args.redis_cluster) {
        (Some(url), _) => Some(url.clone()),
        (None, Some(url)) if !url.is_empty() => Some(url.clone()),
        (None, Some(_)) if wants(Backend::Redis) => {
            eprintln!("starting a Redis Cluster ...");
            let options = RedisClusterOptions::default()
                .with_server(redis_options)
                .with_replicas(0);
            let set = RedisClusterSet::start(options)
                .await
                .map_err(|e| format!("starting a Redis Cluster: {e}"))?;
            let url = set.url(None);
            started._redis_cluster = Some(set);
            Some(url)
        }
        (None, None) if wants(Backend::Redis) => {
            eprintln!("starting Redis ...");
            let server = RedisServer::start(redis_options)
                .await
                .map_err(|e| format!("starting Redis: {e}"))?;
            let url = server.url();
            started._redis = Some(server);
            Some(url)
        }
        (None, _) => None,
    };
    let etcd = match &args.etcd {
        Some(endpoint) => Some(endpoint.clone()),
        None if wants(Backend::Etcd) => {
            eprintln!("starting etcd ...");
            let server = EtcdServer::start(EtcdOptions::default())
                .await
                .map_err(|e| format!("starting etcd: {e}"))?;
            let endpoint = server.endpoint();
            started._etcd = Some(server);
            Some(endpoint)
        }
        None => None,
    };
    let postgres = match &args.postgres {
        Some(url) => Some(url.clone()),
        None if wants(Backend::Postgres) => {
            eprintln!("starting PostgreSQL ...");
            // Every contender holds a connection of its own while it waits; the scale mode
            // holds up to 100 000 advisory locks, and the server's lock table has room for
            // max_locks_per_transaction × (max_connections + its own processes) of them.
            let options = PostgresOptions::default()
                .with_setting("max_connections", "1000")
                .with_setting("max_locks_per_transaction", "256");
            let server = PostgresServer::start(options)
                .await
                .map_err(|e| format!("starting PostgreSQL: {e}"))?;
            let url = server.url();
            started._postgres = Some(server);
            Some(url)
        }
        None => None,
    };
    started.servers = Servers::new(zk, redis)
        .with_etcd(etcd)
        .with_postgres(postgres);
    Ok(started)
}

fn progress(done: usize, total: usize, what: &str) {
    let width = 30;
    let filled = (done * width).checked_div(total).unwrap_or(width);
    eprint!(
        "\r[{}{}] {done}/{total} {what:<40}",
        "#".repeat(filled),
        "-".repeat(width - filled)
    );
    let _ = std::io::stderr().flush();
}

/// Every strategy at every N. A run that fails is reported and left out, and the others go
/// on: the failures come back beside the measurements.
async fn comparison(args: &Args, servers: &Servers) -> (Vec<Measurement>, Vec<String>) {
    let options = RunOptions::new(
        args.handoffs,
        Duration::from_millis(args.hold_ms),
        Duration::from_secs_f64(args.max_seconds),
    )
    .with_release(args.release);
    let total = args.strategies.len() * args.contenders.len();
    let mut results = Vec::with_capacity(total);
    let mut failures = Vec::new();
    let mut backends: Vec<Backend> = Vec::new();
    for backend in args.strategies.iter().map(|strategy| strategy.backend()) {
        if !backends.contains(&backend) {
            backends.push(backend);
        }
    }
    for backend in backends {
        progress(0, total, &format!("warming up {}", backend.as_str()));
        let warm_up = Duration::from_secs_f64(args.warm_up_seconds);
        if let Err(e) = scenario::warm_up(backend, servers, warm_up).await {
            eprintln!("\nherd: warming up {}: {e}", backend.as_str());
        }
    }
    for strategy in &args.strategies {
        for &n in &args.contenders {
            progress(
                results.len() + failures.len(),
                total,
                &format!("{strategy} N={n}"),
            );
            // The floor is measured next to the run it is compared with (the servers warm
            // up as the comparison goes on).
            let measured = match scenario::floors_under_writes(
                strategy.backend(),
                servers,
                args.floor_rounds,
                n,
                options.hold,
                args.floor_writers,
            )
            .await
            {
                Ok(floors) => scenario::run(*strategy, n, servers, options, floors)
                    .await
                    .map_err(|e| format!("{strategy} with {n} contenders: {e}")),
                Err(e) => Err(format!("the {} floor: {e}", strategy.backend().as_str())),
            };
            match measured {
                Ok(measured) => results.push(measured),
                Err(failure) => {
                    eprintln!("\nherd: {failure}");
                    failures.push(failure);
                }
            }
        }
    }
    progress(total, total, "done");
    eprintln!();
    (results, failures)
}

async fn scale_runs(args: &Args, servers: &Servers) -> Result<Vec<ScaleMeasurement>, String> {
    let runs: Vec<(Strategy, usize)> = args
        .strategies
        .iter()
        .filter(|strategy| !strategy.is_peer())
        .flat_map(|&strategy| args.scale.iter().map(move |&locks| (strategy, locks)))
        .collect();
    let mut results = Vec::new();
    for &(strategy, locks) in &runs {
        eprintln!("scale: {strategy}, {locks} locks ...");
        let measured = match runs.len() {
            1 => scale::run(strategy, locks, servers)
                .await
                .map_err(|e| e.to_string()),
            _ => scale_run_apart(strategy, locks, servers).await,
        };
        results.push(measured.map_err(|e| format!("scale {strategy}, {locks} locks: {e}"))?);
    }
    Ok(results)
}

/// One scale run in a fresh process of this program, on `servers`: what it measured.
async fn scale_run_apart(
    strategy: Strategy,
    locks: usize,
    servers: &Servers,
) -> Result<ScaleMeasurement, String> {
    let program = std::env::current_exe().map_err(|e| format!("finding herd itself: {e}"))?;
    let json = tempfile::NamedTempFile::new().map_err(|e| format!("a temporary file: {e}"))?;
    let mut command = std::process::Command::new(program);
    command
        .args(["--scale", &locks.to_string()])
        .args(["--strategies", strategy.as_str()])
        .arg("--json")
        .arg(json.path())
        .stdout(std::process::Stdio::null());
    if let Some(zk) = &servers.zk {
        command.args(["--zk", zk]);
    }
    match &servers.redis {
        Some(url) if url.starts_with("redis+cluster://") => {
            command.args(["--redis-cluster", url]);
        }
        Some(url) => {
            command.args(["--redis", url]);
        }
        None => {}
    }
    if let Some(etcd) = &servers.etcd {
        command.args(["--etcd", etcd]);
    }
    if let Some(postgres) = &servers.postgres {
        command.args(["--postgres", postgres]);
    }
    let status = tokio::task::spawn_blocking(move || command.status())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("starting herd: {e}"))?;
    if !status.success() {
        return Err(format!("its process ended with {status}"));
    }
    let written = std::fs::read_to_string(json.path()).map_err(|e| e.to_string())?;
    let mut measured: Vec<ScaleMeasurement> =
        serde_json::from_str(&written).map_err(|e| format!("its JSON: {e}"))?;
    measured
        .pop()
        .ok_or_else(|| "it measured nothing".to_owned())
}

async fn main_async(args: Args) -> Result<(), String> {
    if args.contenders.contains(&0) {
        return Err("--contenders: every N must be at least 1".into());
    }
    let started = servers(&args).await?;
    let began = Instant::now();
    let (measurements, scaled, failures) = if args.scale.is_empty() {
        let (measurements, failures) = comparison(&args, &started.servers).await;
        (measurements, Vec::new(), failures)
    } else {
        let scaled = scale_runs(&args, &started.servers).await?;
        (Vec::new(), scaled, Vec::new())
    };
    if !measurements.is_empty() {
        println!("{}", report::table(&measurements));
    }
    if !scaled.is_empty() {
        println!("{}", report::scale_table(&scaled));
    }
    if let Some(path) = &args.json {
        let json = if scaled.is_empty() {
            serde_json::to_string_pretty(&measurements)
        } else {
            serde_json::to_string_pretty(&scaled)
        }
        .map_err(|e| format!("JSON: {e}"))?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(path, json).map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("JSON written to {}", path.display());
    }
    if let Some(dir) = &args.report {
        let context = format!(
            "{} CPUs, {} — `herd {}` in {:.0} s",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            std::env::consts::OS,
            std::env::args()
                .skip(1)
                .map(|arg| lock_core::url::without_password(&arg))
                .collect::<Vec<_>>()
                .join(" "),
            began.elapsed().as_secs_f64()
        );
        let written = report::write_report(dir, &measurements, &scaled, &context)
            .map_err(|e| format!("writing the report to {}: {e}", dir.display()))?;
        eprintln!(
            "report written to {} ({} files; start with summary.md)",
            dir.display(),
            written.len()
        );
    }
    if !failures.is_empty() {
        return Err(format!(
            "{} runs failed and are left out of the results:\n  {}",
            failures.len(),
            failures.join("\n  ")
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("herd: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main_async(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("\nherd: {error}");
            ExitCode::FAILURE
        }
    }
}
