//! `chaos`: a Jepsen-style run of a distlock backend under a seeded nemesis.
//!
//! `chaos run --backend zookeeper --duration 60s --clients 5 --seed 1 --out DIR` starts the
//! servers, the fenced register and the client processes, injects the plan's faults, checks
//! the history, prints a summary and writes `DIR/report.json`; it exits 1 when the backend
//! broke one of its targets. `chaos client …` is one client process (the run starts them).
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool: its summary and errors are its output"
)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use lock_chaos::FaultKind;
use lock_chaos::client::{self, ClientOptions};
use lock_chaos::run::{self, Backend, RunOptions};
use lock_testbed::servers::ServerMode;

#[derive(Parser)]
#[command(about = "A Jepsen-style chaos run of a distlock backend")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the backend's servers, clients and nemesis, and checks what happened.
    Run {
        /// The backend.
        #[arg(long, value_enum)]
        backend: BackendArg,
        /// How long the clients run (e.g. 60s, 10m).
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// How many client processes.
        #[arg(long, default_value_t = 5)]
        clients: u32,
        /// The nemesis's seed: the same seed, the same plan.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The faults to draw from, comma-separated (default: every fault the backend's
        /// servers allow): server-pause, server-kill, leader-kill, client-freeze,
        /// client-kill, partition, member-partition, failover.
        #[arg(long, value_delimiter = ',')]
        faults: Vec<FaultKind>,
        /// How long a client holds the lock after its write.
        #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
        hold: Duration,
        /// Where the servers run: processes, or containers (zookeeper and etcd only: their
        /// members can then be cut off from each other, the member-partition fault; needs
        /// the engine and image `scripts/ensure-docker` sets up).
        #[arg(long, value_enum, default_value_t = ServersArg::Processes)]
        servers: ServersArg,
        /// Where the histories and report.json go.
        #[arg(long)]
        out: PathBuf,
        /// Redis: how many replicas must acknowledge each grant and renewal (WAIT, 100 ms).
        #[arg(long)]
        wait_replicas: Option<u32>,
    },
    /// Checks a finished run's directory again, from its files.
    Check {
        /// The run's directory (its `--out`).
        #[arg(long)]
        out: PathBuf,
    },
    /// One client process (started by `run`).
    Client {
        #[arg(long)]
        client: u32,
        #[arg(long)]
        url: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        register: SocketAddr,
        #[arg(long)]
        history: PathBuf,
        #[arg(long, default_value_t = 5)]
        hold_ms: u64,
        #[arg(long, default_value_t = 5_000)]
        acquire_timeout_ms: u64,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    Zookeeper,
    Redis,
    /// A Redis primary with two replicas under three sentinels.
    RedisSentinel,
    /// A Redis Cluster of three primaries with a replica each.
    RedisCluster,
    Redlock,
    Etcd,
    /// The in-memory reference backend, with its clients as tasks of this process.
    Memory,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ServersArg {
    Processes,
    Containers,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Run {
            backend,
            duration,
            clients,
            seed,
            faults,
            hold,
            servers,
            out,
            wait_replicas,
        } => {
            let backend = match backend {
                BackendArg::Zookeeper => Backend::Zookeeper,
                BackendArg::Redis => Backend::Redis,
                BackendArg::RedisSentinel => Backend::RedisSentinel,
                BackendArg::RedisCluster => Backend::RedisCluster,
                BackendArg::Redlock => Backend::Redlock,
                BackendArg::Etcd => Backend::Etcd,
                BackendArg::Memory => Backend::Memory,
            };
            let servers = match servers {
                ServersArg::Processes => ServerMode::Processes,
                ServersArg::Containers => ServerMode::Containers,
            };
            let executable = match std::env::current_exe() {
                Ok(executable) => executable,
                Err(error) => {
                    eprintln!("chaos: where am I? {error}");
                    return ExitCode::from(2);
                }
            };
            let options = RunOptions::new(backend, duration, clients, seed, executable, out)
                .with_faults(faults)
                .with_hold(hold)
                .with_servers(servers)
                .with_wait_replicas(wait_replicas);
            match run::run(&options).await {
                Ok(outcome) => verdict(&outcome),
                Err(error) => {
                    eprintln!("chaos: the run could not be made: {error}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Check { out } => match run::check_again(&out) {
            Ok(outcome) => verdict(&outcome),
            Err(error) => {
                eprintln!("chaos: cannot check {}: {error}", out.display());
                ExitCode::from(2)
            }
        },
        Command::Client {
            client,
            url,
            name,
            register,
            history,
            hold_ms,
            acquire_timeout_ms,
        } => {
            let options = ClientOptions::new(client, url, name, register, history)
                .with_acquire_timeout(Duration::from_millis(acquire_timeout_ms))
                .with_hold(Duration::from_millis(hold_ms));
            match client::main(&options).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("chaos client {client}: {error}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

/// Prints the summary; 0 when every target held, else 1.
fn verdict(outcome: &run::Outcome) -> ExitCode {
    println!("{}", outcome.summary());
    if outcome.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
