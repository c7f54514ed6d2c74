//! `distlock`: flock(1) for a cluster.
//!
//! Runs a command while holding a distributed lock (ZooKeeper, Redis, Redlock, etcd or the
//! in-memory backend, chosen by URL) or while leading an election, and shows who holds a
//! lock and who waits for it, and who leads an election.
//! Built with the `cli` feature: `cargo install distlock --features cli`.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool reports on its standard streams"
)]

use std::ffi::OsString;
use std::fmt;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use distlock::LockError;
use lock_core::url;

mod cli_holders;
mod cli_leader;
mod cli_run;

/// Exit statuses besides the command's own.
mod status {
    /// A usage or configuration error: bad arguments, a bad URL, an unknown scheme or a
    /// backend not compiled in, an invalid lock name.
    pub(crate) const USAGE: u8 = 2;
    /// The backend cannot be reached, refused the credentials, or failed (`EX_UNAVAILABLE`).
    pub(crate) const UNAVAILABLE: u8 = 69;
    /// distlock itself failed (`EX_SOFTWARE`): a signal handler, waiting for the command.
    pub(crate) const SOFTWARE: u8 = 70;
    /// The lock is held by someone else: `try`, or `run --timeout` ran out (`EX_TEMPFAIL`,
    /// as `flock -w`).
    pub(crate) const BUSY: u8 = 75;
    /// The lock was lost while the command ran; the command was stopped.
    pub(crate) const LOST: u8 = 76;
    /// The command was found but could not be run.
    pub(crate) const CANNOT_EXECUTE: u8 = 126;
    /// The command was not found.
    pub(crate) const NOT_FOUND: u8 = 127;
}

const EXAMPLES: &str = "\
Examples:
  # One machine of the cluster at a time runs the nightly report
  distlock run --url zk://zk1:2181,zk2:2181,zk3:2181 --name nightly-report -- ./report.sh

  # Give up (exit 75) if the lock is still held after 30 seconds
  distlock run --timeout 30s --url redis://cache:6379 --name deploy -- make deploy

  # Skip the backup when another machine is already making one
  export DISTLOCK_URL=zk://zk1:2181/ops
  distlock try --name backup -- sh -c 'pg_dump app > /backups/app.sql'

  # Who holds the lock, who waits for it
  distlock holders --url zk://zk1:2181/ops --name backup --json

  # One worker of the cluster leads; the others wait to take over
  distlock elect --url zk://zk1:2181 --name billing --value \"$(hostname)\" -- ./worker
  distlock leader --url zk://zk1:2181 --name billing --watch

Exit status:
  the command's own (128+N when a signal N killed it), or
  2    usage or configuration error: bad URL, unknown scheme, invalid lock name
  69   the backend cannot be reached, or refused the credentials
  75   the lock is held: `try`, or `run --timeout` ran out (`elect --timeout` too)
  76   the lock (or leadership) was lost while the command ran; the command was stopped
  126  the command cannot be run; 127 it was not found

URLs (see the distlock crate docs for every parameter):
  zk://[user:password@]host:2181[,host...][/chroot]?session_timeout=10s
  redis://[user[:password]@]host:6379[/db]?ttl=30s   (rediss:// for TLS)
  redlock://host1,host2,host3?ttl=30s
  etcd://[user:password@]host:2379[,host...][/prefix]?lease_ttl=10s
  memory://   (one process only: for trying things out)";

const RUN_HELP: &str = "\
The command runs with these variables in its environment:
  DISTLOCK_FENCING_TOKEN  the grant's fencing token: a number that grows with every
                          holder of the lock; pass it with every write to the protected
                          resource so that it can reject a stale holder. With several
                          --name, every lock's, comma-separated, in the order of the names
  DISTLOCK_LOCK_NAME      the lock's name (with several, the names, comma-separated)

With several --name, distlock holds every lock or none: it takes them one at a time in one
order, by name, whatever order they are given in, so that two runs naming them in other
orders never wait on each other; a timeout or a failure releases those it took.

The command runs in a process group of its own (unless --foreground). SIGINT, SIGTERM and
SIGHUP sent to distlock are passed on to that group; the lock is released once the command
has exited, and distlock exits with the command's status. If the lock is lost while the
command runs (its ZooKeeper session expired, its Redis or etcd lease ran out unrenewed), distlock
says so, sends the group SIGTERM, then SIGKILL after --grace, and exits 76.

--ttl sets how long the lock outlives a distlock that died or lost its network: the lease
(`ttl=` in redis://, rediss:// and redlock:// URLs, `lease_ttl=` in etcd:// URLs; renewed
at a third) or the session timeout (`session_timeout=` in zk:// URLs). It replaces the
URL's value.

Examples:
  distlock run --url zk://zk1:2181 --name nightly -- ./nightly.sh --full
  distlock run --url redis://cache:6379 --ttl 10s --timeout 1m --name deploy -- make deploy
  distlock run --name import -- sh -c 'importer --token \"$DISTLOCK_FENCING_TOKEN\"'
  distlock run --url etcd://e1:2379 --name account/17 --name account/4 -- ./transfer 17 4

Exit status: the command's own (128+N for signal N); 75 timed out; 76 lock lost; 2 usage or
configuration error; 69 backend unreachable or credentials refused; 126/127 command not runnable.";

const TRY_HELP: &str = "\
The same as `run` without waiting: exits 75 at once, without running the command, when
the lock is held (also by a waiter ahead in the queue). See `distlock run --help` for the
environment, signals and --ttl.

Examples:
  distlock try --url zk://zk1:2181 --name backup -- ./backup.sh || echo \"skipped: $?\"
  DISTLOCK_URL=redis://cache:6379 distlock try --name cache-warmup -- ./warm.sh";

const HOLDERS_HELP: &str = "\
What the backend records for the lock now, holder first, then the waiters in the order
they will get it:
  zk://     the contenders in the lock directory {root}/{name}, ordered by sequence
            number (distlock's, Curator's and kazoo's alike), each with the session
            that owns it and its creation zxid, which is the holder's fencing token
  redis://  the holder's owner id, its lease and fencing token, and the waiter queue
            (queue strategy only; the other strategies keep no queue on the server)
  etcd://   the keys in the lock directory {prefix}/{name}/, ordered by create revision
            (distlock's and etcdctl lock's alike), each with the lease it hangs on and
            its create revision, which is the holder's fencing token
  memory:// only this process's own view, which is always empty: the in-memory
            backend does not reach across processes
redlock:// is not supported: ask each server with a redis:// URL.

Examples:
  distlock holders --url zk://zk1:2181 --name nightly
  distlock holders --url redis://cache:6379 --name deploy --json | jq .waiters";

const ELECT_HELP: &str = "\
Campaigns in the election with --value and waits its turn (at most --timeout), then runs
the command while it leads, and resigns when the command exits, handing over to the next
candidate. The command sees DISTLOCK_FENCING_TOKEN (the leadership's term: it grows with
every leader, so pass it with every write) and DISTLOCK_LOCK_NAME (the election's name).
Signals, --ttl, --grace and the exit statuses are those of `run`: if the leadership is
lost while the command runs, distlock stops it and exits 76.

Examples:
  distlock elect --url zk://zk1:2181 --name billing-worker --value host-a -- ./worker
  distlock elect --url etcd://etcd1:2379 --name scheduler -- ./scheduler --active

`distlock leader` shows who leads. On ZooKeeper the election is {root}/{name}.election
(Curator's LeaderLatch and kazoo's Election see distlock's candidates there); on etcd
{prefix}/{name}.election/ (`etcdctl elect {prefix}/{name}.election` is the same election).";

const LEADER_HELP: &str = "\
Prints the value the leader campaigned with and its term, or `no leader`; --json prints
{\"election\": NAME, \"leader\": {\"value\": VALUE, \"term\": TERM} or null}. With --watch
it prints one line per change until interrupted (a signal ends it with 128+N) or until the
backend cannot be reached (69).

Examples:
  distlock leader --url zk://zk1:2181 --name billing-worker
  distlock leader --url etcd://etcd1:2379 --name scheduler --watch --json";

const BENCH_HELP: &str = "\
The herd benchmark is not built into this tool: it is the `herd` binary of the
`distlock-benches` package in the distlock workspace, which starts its own ZooKeeper and
Redis servers and compares the herd and herd-free strategies. From a checkout:

  cargo run --release -p distlock-benches --bin herd -- --help

`distlock bench` only prints this and exits 2.";

/// flock(1) for a cluster: run a command while holding a distributed lock.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, after_help = EXAMPLES)]
struct Cli {
    /// Log to stderr what distlock and its backend do; repeat for more detail
    /// (-v info, -vv debug, -vvv trace). RUST_LOG, when set, replaces the filter.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Wait for the lock, run the command while holding it, release it when the command
    /// exits.
    #[command(
        after_help = RUN_HELP,
        override_usage = "distlock run [OPTIONS] --url <URL> --name <NAME> -- <COMMAND> [ARGS]..."
    )]
    Run(RunArgs),
    /// Like `run`, but exit 75 at once when the lock is held.
    #[command(
        after_help = TRY_HELP,
        override_usage = "distlock try [OPTIONS] --url <URL> --name <NAME> -- <COMMAND> [ARGS]..."
    )]
    Try(CommandArgs),
    /// Show who holds the lock and who waits for it, in order.
    #[command(after_help = HOLDERS_HELP)]
    Holders(HoldersArgs),
    /// Wait to lead the election, run the command while leader, resign when it exits.
    #[command(
        after_help = ELECT_HELP,
        override_usage = "distlock elect [OPTIONS] --url <URL> --name <NAME> [--value <VALUE>] -- <COMMAND> [ARGS]..."
    )]
    Elect(ElectArgs),
    /// Show who leads the election; with --watch, every change.
    #[command(after_help = LEADER_HELP)]
    Leader(LeaderArgs),
    /// Where the herd benchmark is (the `herd` binary of `distlock-benches`).
    #[command(after_help = BENCH_HELP)]
    Bench {
        /// Ignored.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<OsString>,
    },
}

/// Which lock, on which backend.
#[derive(Debug, Args)]
struct Target {
    /// The backend: zk://, redis://, rediss://, redis+sentinel://, redis+cluster://,
    /// redlock://, etcd:// or memory:// URL.
    #[arg(long, env = "DISTLOCK_URL", hide_env_values = true, value_name = "URL")]
    url: String,

    /// The password, kept out of the URL and so out of the process list: the first line
    /// of this file. `DISTLOCK_PASSWORD` gives it too; a URL's own `password_file=`
    /// parameter works as well.
    #[arg(long, value_name = "PATH")]
    password_file: Option<String>,

    /// The lock's name: any non-empty UTF-8 string; processes using the same name on
    /// the same backend exclude each other. `run` and `try` take it again to hold several
    /// locks together, all or none (taken in one order, by name, so that runs naming them
    /// in other orders never wait on each other).
    #[arg(long = "name", value_name = "NAME", required = true)]
    names: Vec<String>,
}

/// The environment variable that gives the URL's password, kept out of the process list.
pub(crate) const PASSWORD_ENV: &str = "DISTLOCK_PASSWORD";

impl Target {
    /// The URL with the password given apart from it (`--password-file` or
    /// `DISTLOCK_PASSWORD`), if one is; a usage error for two passwords or an unreadable
    /// file (never showing the password).
    fn url(&self) -> Result<String, u8> {
        let from_env = match std::env::var_os(PASSWORD_ENV) {
            Some(value) if value.is_empty() => None,
            Some(value) => match value.into_string() {
                Ok(password) => Some(password),
                Err(_) => {
                    report(format_args!("{PASSWORD_ENV} is not valid UTF-8"));
                    return Err(status::USAGE);
                }
            },
            None => None,
        };
        let password = match (&self.password_file, from_env) {
            (Some(_), Some(_)) => Err(LockError::config(format!(
                "--password-file and {PASSWORD_ENV} both give a password; give one"
            ))),
            (Some(path), None) => url::read_password_file(path).map(Some),
            (None, from_env) => Ok(from_env),
        };
        let url = password.and_then(|password| match password {
            Some(password) => url::with_password(&self.url, &password),
            None => Ok(self.url.clone()),
        });
        url.map_err(|error| {
            report(error);
            status::USAGE
        })
    }

    /// The one name `holders`, `leader` and `elect` take; a usage error for several.
    fn one_name(&self, command: &str) -> Result<&str, u8> {
        match &self.names[..] {
            [name] => Ok(name),
            _ => {
                report(format_args!("{command} takes one --name"));
                Err(status::USAGE)
            }
        }
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Give up waiting after this long and exit 75, e.g. 500ms, 30s, 2m (default: wait
    /// as long as it takes; 0 makes one attempt).
    #[arg(long, short = 'w', visible_alias = "wait", value_name = "DURATION", value_parser = parse_duration)]
    timeout: Option<Duration>,

    #[command(flatten)]
    common: CommandArgs,
}

#[derive(Debug, Args)]
struct CommandArgs {
    #[command(flatten)]
    target: Target,

    /// How long the lock outlives a distlock that died or was cut off: the Redis lease
    /// (`ttl=`), the etcd lease (`lease_ttl=`) or the ZooKeeper session timeout
    /// (`session_timeout=`), replacing the URL's.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    ttl: Option<Duration>,

    /// After a lost lock, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    grace: Duration,

    /// Run the command in distlock's process group, so that it can read the terminal. The
    /// terminal's signals (Ctrl-C) then reach it directly as well as through distlock, and
    /// only the command's own process, not its children, is signalled.
    #[arg(long)]
    foreground: bool,

    /// The command to run and its arguments (after `--`).
    #[arg(
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct ElectArgs {
    /// What this candidate leads with, for `distlock leader` and the other participants
    /// to read (default: this machine's host name).
    #[arg(long, value_name = "VALUE")]
    value: Option<String>,

    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Args)]
struct LeaderArgs {
    #[command(flatten)]
    target: Target,

    /// Keep printing: one line at every change of leader (changes in quick succession may
    /// be coalesced; the latest is always printed), until interrupted.
    #[arg(long)]
    watch: bool,

    /// Print JSON objects instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct HoldersArgs {
    #[command(flatten)]
    target: Target,

    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|error| format!("{error} (write it like 500ms, 10s or 2m)"))
}

/// Reports an error on one line of stderr.
pub(crate) fn report(message: impl fmt::Display) {
    let message = message.to_string();
    let one_line: Vec<&str> = message.split_whitespace().collect();
    eprintln!("distlock: {}", one_line.join(" "));
}

/// The exit status for a failure of the backend or of the configuration.
pub(crate) fn failure_status(error: &LockError) -> u8 {
    match error {
        LockError::Config { .. }
        | LockError::InvalidName { .. }
        | LockError::InvalidArgument { .. }
        | LockError::Unsupported { .. } => status::USAGE,
        LockError::Timeout { .. } => status::BUSY,
        LockError::Lost { .. } => status::LOST,
        _ => status::UNAVAILABLE,
    }
}

/// Turns on logging to stderr at the level `-v` asked for.
fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    if verbose == 0 {
        return;
    }
    let ours = [
        "distlock",
        "lock_core",
        "lock_zookeeper",
        "lock_redis",
        "lock_etcd",
        "lock_postgres",
    ];
    let default = match verbose {
        1 => format!("warn,{}", ours.map(|c| format!("{c}=info")).join(",")),
        2 => format!("info,{}", ours.map(|c| format!("{c}=debug")).join(",")),
        _ => "trace".to_owned(),
    };
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|value| !value.trim().is_empty())
        .and_then(|value| EnvFilter::try_new(value).ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn main() -> ExitCode {
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches).map(|cli| (cli, matches)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() { status::USAGE } else { 0 });
        }
    };
    init_logging(cli.verbose);
    warn_of_a_visible_password(&matches);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            report(format_args!("cannot start the async runtime: {error}"));
            return ExitCode::from(status::SOFTWARE);
        }
    };
    let code = runtime.block_on(dispatch(cli.command));
    // Whatever is still running (a connection's housekeeping) must not hold up the exit.
    runtime.shutdown_background();
    ExitCode::from(code)
}

async fn dispatch(command: Command) -> u8 {
    match command {
        Command::Run(args) => match args.common.into_options(Some(args.timeout)) {
            Ok(options) => cli_run::run(options).await,
            Err(code) => code,
        },
        Command::Try(args) => match args.into_options(None) {
            Ok(options) => cli_run::run(options).await,
            Err(code) => code,
        },
        Command::Holders(args) => {
            match args
                .target
                .one_name("holders")
                .and_then(|name| Ok((name, args.target.url()?)))
            {
                Ok((name, url)) => cli_holders::holders(&url, name, args.json).await,
                Err(code) => code,
            }
        }
        Command::Elect(args) => {
            if let Err(code) = args.run.common.target.one_name("elect") {
                return code;
            }
            let value = match args.value.map_or_else(host_name, Ok) {
                Ok(value) => value,
                Err(error) => {
                    report(format_args!(
                        "cannot tell this machine's host name ({error}); give --value"
                    ));
                    return status::USAGE;
                }
            };
            match args.run.common.into_options(Some(args.run.timeout)) {
                Ok(mut options) => {
                    options.hold = cli_run::Hold::Leadership { value };
                    cli_run::run(options).await
                }
                Err(code) => code,
            }
        }
        Command::Leader(args) => {
            match args
                .target
                .one_name("leader")
                .and_then(|name| Ok((name, args.target.url()?)))
            {
                Ok((name, url)) => cli_leader::leader(&url, name, args.watch, args.json).await,
                Err(code) => code,
            }
        }
        Command::Bench { .. } => {
            eprintln!("{BENCH_HELP}");
            status::USAGE
        }
    }
}

/// Says on stderr that the `--url` given on the command line holds a password, which other
/// users of the machine can read in the process list, and how to keep it out.
fn warn_of_a_visible_password(matches: &clap::ArgMatches) {
    let Some((_, command)) = matches.subcommand() else {
        return;
    };
    if !command.ids().any(|id| id == "url")
        || command.value_source("url") != Some(clap::parser::ValueSource::CommandLine)
    {
        return;
    }
    if let Ok(Some(given)) = command.try_get_one::<String>("url")
        && url::holds_password(given)
    {
        report(format_args!(
            "the --url on the command line holds a password, which other users of this \
             machine can read in its process list; give the password in {PASSWORD_ENV} or \
             --password-file instead (and the URL in DISTLOCK_URL)"
        ));
    }
}

/// This machine's host name, the default value of a candidate.
fn host_name() -> Result<String, String> {
    nix::unistd::gethostname()
        .map_err(|error| error.to_string())
        .and_then(|name| name.into_string().map_err(|_| "not UTF-8".to_owned()))
}

impl CommandArgs {
    /// `wait`: `None` for `try`, `Some(timeout)` for `run`; a usage error's status for a
    /// password that cannot be read or is given twice.
    fn into_options(self, wait: Option<Option<Duration>>) -> Result<cli_run::RunOptions, u8> {
        Ok(cli_run::RunOptions {
            url: self.target.url()?,
            names: self.target.names,
            hold: cli_run::Hold::Lock,
            wait,
            ttl: self.ttl,
            grace: self.grace,
            foreground: self.foreground,
            command: self.command,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_command_follows_the_double_dash() {
        let cli = Cli::try_parse_from([
            "distlock",
            "run",
            "--url",
            "memory://",
            "--name",
            "x",
            "--timeout",
            "500ms",
            "--",
            "sh",
            "-c",
            "exit 3",
        ]);
        let Ok(Cli {
            command: Command::Run(args),
            ..
        }) = cli
        else {
            unreachable!("parses: {cli:?}");
        };
        assert_eq!(args.timeout, Some(Duration::from_millis(500)));
        assert_eq!(args.common.command, ["sh", "-c", "exit 3"]);
        assert_eq!(args.common.grace, Duration::from_secs(10));
    }
}
