//! `distlock run` and `distlock try`: hold a lock while a command runs.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use distlock::multi::{MultiGuard, MultiLock, ReleaseErrors};
use distlock::{BackendConfig, Guard, LockError, LockName, LockProvider, LossReason, LostSignal};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::{failure_status, report, status};

/// How long the release after the command may take before distlock gives up on it (the
/// session or the lease frees the lock then).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long distlock waits, before it exits, for its clean-up on the server to finish: a
/// cancelled waiter's entry removed, the ZooKeeper session closed.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(3);

/// What the command holds while it runs.
#[derive(Debug)]
pub(crate) enum Hold {
    /// The lock `name` (`run`, `try`).
    Lock,
    /// The leadership of the election `name`, campaigning with this value (`elect`).
    Leadership { value: String },
}

/// What `run`, `try` and `elect` were asked to do.
#[derive(Debug)]
pub(crate) struct RunOptions {
    pub(crate) url: String,
    /// One name, or (`run`, `try`) several to hold together.
    pub(crate) names: Vec<String>,
    pub(crate) hold: Hold,
    /// `None`: one attempt (`try`); `Some(timeout)`: wait up to `timeout` (`run`).
    pub(crate) wait: Option<Option<Duration>>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) grace: Duration,
    pub(crate) foreground: bool,
    pub(crate) command: Vec<OsString>,
}

impl RunOptions {
    /// What is held, for messages: `lock "x"`, `locks "x", "y"`, or `the leadership of
    /// election "x"`.
    fn subject(&self) -> String {
        let quoted: Vec<String> = self.names.iter().map(|name| format!("{name:?}")).collect();
        match (&self.hold, &quoted[..]) {
            (Hold::Lock, [one]) => format!("lock {one}"),
            (Hold::Lock, several) => format!("locks {}", several.join(", ")),
            (Hold::Leadership { .. }, _) => {
                format!("the leadership of election {}", quoted.join(", "))
            }
        }
    }

    /// The names, comma-separated, for logs and the command's environment.
    fn joined_names(&self) -> String {
        self.names.join(",")
    }
}

pub(crate) async fn run(options: RunOptions) -> u8 {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(error) => {
            report(format_args!("cannot handle signals: {error}"));
            return status::SOFTWARE;
        }
    };
    // Everything that can be checked without a server is checked first.
    let names = options
        .names
        .iter()
        .try_for_each(|name| LockName::new(name).map(drop));
    let config = match names
        .and_then(|()| BackendConfig::from_url(&options.url))
        .and_then(|config| with_ttl(config, options.ttl))
    {
        Ok(config) => config,
        Err(error) => {
            report(&error);
            return failure_status(&error);
        }
    };
    let connected = tokio::select! {
        connected = Connection::open(config) => connected,
        signal = signals.recv() => return interrupted(signal, &options, "connecting"),
    };
    let connection = match connected {
        Ok(connection) => connection,
        Err(error) => {
            report(format_args!(
                "{error} (connecting to {})",
                hosts(&options.url)
            ));
            return failure_status(&error);
        }
    };
    let code = hold_and_run(&connection.provider, &options, &mut signals).await;
    if code == status::LOST {
        // The server could not be reached for the session's or the lease's length: there
        // is nothing to wait for there.
        drop(connection);
    } else {
        connection.close().await;
    }
    code
}

/// Acquires the lock (or wins the election), runs the command, releases the lock (or
/// resigns); the exit status.
async fn hold_and_run(
    provider: &Arc<dyn LockProvider>,
    options: &RunOptions,
    signals: &mut Signals,
) -> u8 {
    let name = &options.joined_names();
    let what = match (&options.hold, options.names.len()) {
        (Hold::Lock, 1) => "the lock",
        (Hold::Lock, _) => "the locks",
        (Hold::Leadership { .. }, _) => "the leadership",
    };
    match options.wait {
        None => tracing::info!(name = %name, "trying for {what} once"),
        Some(timeout) => tracing::info!(name = %name, ?timeout, "waiting for {what}"),
    }
    let asked = std::time::Instant::now();
    let acquired = tokio::select! {
        acquired = acquire(provider.as_ref(), options) => acquired,
        // Dropping the acquisition removes the waiter's entry (in the background, which
        // `Connection::close` waits for).
        signal = signals.recv() => return interrupted(signal, options, &format!("waiting for {what}")),
    };
    let held_by = match options.hold {
        Hold::Lock if options.names.len() > 1 => {
            format!(
                "{} are not all free (another client holds one)",
                options.subject()
            )
        }
        Hold::Lock => format!("{} is held by another client", options.subject()),
        Hold::Leadership { .. } => format!("election {name:?} is led by another client"),
    };
    let held = match acquired {
        Ok(Some(held)) => held,
        Ok(None) => {
            report(format_args!("{held_by}; not running the command"));
            return status::BUSY;
        }
        Err(LockError::Timeout { waited, .. }) => {
            report(format_args!(
                "{held_by} still after waiting {}; not running the command",
                humantime::format_duration(waited)
            ));
            return status::BUSY;
        }
        Err(error) => {
            report(&error);
            return failure_status(&error);
        }
    };
    let waited = format!("{:.1?}", asked.elapsed());
    tracing::info!(name = %name, tokens = %held.tokens(), waited, "{what} acquired; running the command");
    supervise(held, options, signals).await
}

/// What the command runs under: a lock's or a won election's guard, or a set of locks'.
enum Held {
    One(Guard),
    Set(MultiGuard),
}

impl Held {
    fn lost(&self) -> LostSignal {
        match self {
            Held::One(guard) => guard.lost(),
            Held::Set(set) => set.lost(),
        }
    }

    /// The fencing tokens, comma-separated, in the order of the names.
    fn tokens(&self) -> String {
        let tokens = match self {
            Held::One(guard) => vec![guard.fencing_token()],
            Held::Set(set) => set.fencing_tokens(),
        };
        let tokens: Vec<String> = tokens.iter().map(|token| token.0.to_string()).collect();
        tokens.join(",")
    }

    /// Releases everything; of a set's failures, a lost lock's if any.
    async fn release(&mut self) -> Result<(), LockError> {
        match self {
            Held::One(guard) => guard.release().await,
            Held::Set(set) => set.release().await.map_err(ReleaseErrors::into_error),
        }
    }
}

/// The locks' guards, or the won election's: `None` when `try` finds a lock held.
async fn acquire(
    provider: &dyn LockProvider,
    options: &RunOptions,
) -> Result<Option<Held>, LockError> {
    match (&options.hold, &options.names[..]) {
        (Hold::Lock, [name]) => {
            let lock = provider.lock(name)?;
            let guard = match options.wait {
                None => lock.try_acquire().await?,
                Some(timeout) => Some(lock.acquire(timeout).await?),
            };
            Ok(guard.map(Held::One))
        }
        (Hold::Lock, names) => {
            let set = MultiLock::locks(provider, names.iter().map(String::as_str))?;
            let held = match options.wait {
                None => set.try_acquire().await?,
                Some(timeout) => Some(set.acquire(timeout).await?),
            };
            Ok(held.map(Held::Set))
        }
        (Hold::Leadership { value }, names) => {
            let election = provider.election(&names.join(","))?;
            let timeout = options.wait.unwrap_or(Some(Duration::ZERO));
            let won = election.campaign(value.as_bytes(), timeout).await?;
            Ok(Some(Held::One(won.into_guard())))
        }
    }
}

/// The status for a signal that ended distlock before the command ran.
fn interrupted(signal: Signal, options: &RunOptions, doing: &str) -> u8 {
    report(format_args!(
        "{signal} while {doing} ({}); not running the command",
        options.subject()
    ));
    signal_status(signal as i32)
}

/// Runs the command while `guard` holds the locks, then releases them.
async fn supervise(mut guard: Held, options: &RunOptions, signals: &mut Signals) -> u8 {
    let subject = options.subject();
    let mut child = match spawn(&guard, options) {
        Ok(child) => child,
        Err(error) => {
            let program = options
                .command
                .first()
                .map(|program| program.to_string_lossy().into_owned())
                .unwrap_or_default();
            report(format_args!("cannot run {program:?}: {error}"));
            release(&mut guard, &subject).await;
            return match error.kind() {
                io::ErrorKind::NotFound => status::NOT_FOUND,
                _ => status::CANNOT_EXECUTE,
            };
        }
    };
    // The child's pid, and while it runs in a group of its own, the group's id too.
    let target = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(|pid| Target {
            pid: Pid::from_raw(pid),
            group: !options.foreground,
        });
    let lost = guard.lost();
    let mut lost_wait: Pin<Box<dyn Future<Output = Option<LossReason>> + Send>> =
        Box::pin(async move { lost.wait().await });
    let mut watching = true;
    let mut loss: Option<LossReason> = None;
    let mut kill_at: Option<Instant> = None;
    let waited = loop {
        tokio::select! {
            waited = child.wait() => break waited,
            reason = &mut lost_wait, if watching => {
                watching = false;
                if let Some(reason) = reason {
                    report(format_args!(
                        "{subject} was lost while the command ran ({reason}); stopping it: SIGTERM, then SIGKILL after {}",
                        humantime::format_duration(options.grace)
                    ));
                    send(target, Signal::SIGTERM);
                    kill_at = Some(Instant::now() + options.grace);
                    loss = Some(reason);
                }
            }
            () = sleep_until(kill_at), if kill_at.is_some() => {
                kill_at = None;
                report(format_args!(
                    "the command is still running {} after SIGTERM; sending SIGKILL",
                    humantime::format_duration(options.grace)
                ));
                send(target, Signal::SIGKILL);
            }
            signal = signals.recv() => {
                tracing::info!(%signal, "passing the signal on to the command");
                send(target, signal);
            }
        }
    };
    let code = match &waited {
        Ok(exit) => exit_status(*exit),
        Err(error) => {
            report(format_args!("cannot wait for the command: {error}"));
            status::SOFTWARE
        }
    };
    if loss.is_some() {
        // What is left of the command's group (its children) goes too: it no longer holds
        // the lock.
        if let Some(target) = target.filter(|target| target.group) {
            let _ = killpg(target.pid, Signal::SIGKILL);
        }
        drop(guard);
        return status::LOST;
    }
    tracing::info!(name = %options.joined_names(), status = code, "the command exited; releasing {subject}");
    match tokio::time::timeout(RELEASE_TIMEOUT, guard.release()).await {
        Ok(Ok(())) => code,
        Ok(Err(LockError::Lost { reason, .. })) => {
            report(format_args!(
                "{subject} turned out to be lost when it was released ({reason}); the command exited with {code}"
            ));
            status::LOST
        }
        Ok(Err(error)) => {
            report(format_args!(
                "cannot release {subject} ({error}); it is freed when the session or lease ends"
            ));
            code
        }
        Err(_) => {
            report(format_args!(
                "releasing {subject} took longer than {}; it is freed when the session or lease ends",
                humantime::format_duration(RELEASE_TIMEOUT)
            ));
            code
        }
    }
}

async fn release(guard: &mut Held, subject: &str) {
    match tokio::time::timeout(RELEASE_TIMEOUT, guard.release()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => report(format_args!("cannot release {subject}: {error}")),
        Err(_) => report(format_args!(
            "releasing {subject} took too long; it is freed when the session or lease ends"
        )),
    }
}

fn spawn(guard: &Held, options: &RunOptions) -> io::Result<Child> {
    let Some((program, args)) = options.command.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command"));
    };
    let mut command = Command::new(program);
    command
        .args(args)
        // The backend's password is distlock's, not the command's (nor its children's).
        .env_remove(crate::PASSWORD_ENV)
        .env("DISTLOCK_FENCING_TOKEN", guard.tokens())
        .env("DISTLOCK_LOCK_NAME", options.joined_names());
    if !options.foreground {
        command.process_group(0);
    }
    command.spawn()
}

/// Where signals for the command go.
#[derive(Debug, Clone, Copy)]
struct Target {
    pid: Pid,
    /// Whether the command leads a process group of its own (signal the whole group).
    group: bool,
}

fn send(target: Option<Target>, signal: Signal) {
    let Some(target) = target else {
        return;
    };
    let sent = if target.group {
        killpg(target.pid, signal)
    } else {
        kill(target.pid, signal)
    };
    if let Err(error) = sent {
        tracing::debug!(%signal, %error, "the command could not be signalled (it may have exited)");
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The shell's convention: the exit code, or 128 + the signal that killed the process.
fn exit_status(exit: ExitStatus) -> u8 {
    match (exit.code(), exit.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(status::SOFTWARE),
        (None, Some(signal)) => signal_status(signal),
        (None, None) => status::SOFTWARE,
    }
}

pub(crate) fn signal_status(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(status::SOFTWARE)
}

/// The signals distlock passes on to the command (or that end a wait for the lock).
pub(crate) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received. Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Signal::SIGINT,
            Some(()) = self.terminate.recv() => Signal::SIGTERM,
            Some(()) = self.hangup.recv() => Signal::SIGHUP,
            else => std::future::pending().await,
        }
    }
}

/// `config` with `--ttl` applied through its setter, and checked again: the lease of the
/// Redis schemes and of etcd's session, the session timeout of ZooKeeper, replacing the
/// URL's own value.
pub(crate) fn with_ttl(
    config: BackendConfig,
    ttl: Option<Duration>,
) -> Result<BackendConfig, LockError> {
    let Some(ttl) = ttl else {
        return Ok(config);
    };
    match config {
        BackendConfig::ZooKeeper(config) => {
            let config = config.with_session_timeout(ttl);
            config.validate().map(|()| BackendConfig::ZooKeeper(config))
        }
        BackendConfig::Redis(config) => {
            let config = config.with_ttl(ttl);
            config.validate().map(|()| BackendConfig::Redis(config))
        }
        BackendConfig::Redlock(config) => {
            let config = config.with_ttl(ttl);
            config.validate().map(|()| BackendConfig::Redlock(config))
        }
        BackendConfig::Etcd(config) => {
            let config = config.with_lease_ttl(ttl);
            config.validate().map(|()| BackendConfig::Etcd(config))
        }
        other => Err(LockError::config(format!(
            "--ttl has no meaning for {}:// (it sets the lease of redis://, rediss://, \
             redlock:// and etcd:// locks and the session timeout of zk:// locks)",
            other.backend()
        ))),
    }
}

/// The servers a URL names, for messages (never its credentials).
pub(crate) fn hosts(url: &str) -> String {
    match lock_core::url::LockUrl::parse(url) {
        Ok(url) if !url.hosts.is_empty() => url
            .hosts
            .iter()
            .map(|host| match host.port {
                Some(port) => format!("{}:{port}", host.host),
                None => host.host.clone(),
            })
            .collect::<Vec<_>>()
            .join(","),
        Ok(url) => format!("{}://", url.scheme),
        Err(_) => "the server".to_owned(),
    }
}

/// A connected provider, and what to wait for before exiting so that its clean-up on the
/// server is done.
pub(crate) struct Connection {
    pub(crate) provider: Arc<dyn LockProvider>,
    closed: Closed,
}

/// How to tell that a provider's clean-up has finished once it is dropped.
enum Closed {
    /// The ZooKeeper session has ended: its close request was answered, which comes after
    /// every request of its own clean-up (nodes of cancelled waiters) and removes its
    /// ephemeral nodes in any case.
    Session(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// No task of the runtime is left: the background clean-up tasks have finished.
    Tasks,
}

impl Connection {
    pub(crate) async fn open(config: BackendConfig) -> Result<Self, LockError> {
        match config {
            BackendConfig::ZooKeeper(config) => Ok(Self::from_zookeeper(
                distlock::zookeeper::ZkLockProvider::connect(config).await?,
            )),
            other => Ok(Connection {
                provider: other.connect().await?,
                closed: Closed::Tasks,
            }),
        }
    }

    fn from_zookeeper(provider: distlock::zookeeper::ZkLockProvider) -> Self {
        let closed = match provider.client() {
            Some(client) => {
                let mut states = client.state_watcher();
                Closed::Session(Box::pin(async move {
                    while !states.peek_state().is_terminated() {
                        states.changed().await;
                    }
                }))
            }
            None => Closed::Tasks,
        };
        Connection {
            provider: Arc::new(provider),
            closed,
        }
    }

    /// Drops the provider and waits, a bounded time, for its clean-up to finish.
    pub(crate) async fn close(self) {
        let Connection { provider, closed } = self;
        drop(provider);
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        match closed {
            Closed::Session(ended) => {
                if tokio::time::timeout_at(deadline, ended).await.is_err() {
                    tracing::debug!("the ZooKeeper session did not close in time");
                }
            }
            Closed::Tasks => {
                let runtime = tokio::runtime::Handle::current();
                while runtime.metrics().num_alive_tasks() > 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ttl(url: &str, ttl: Option<Duration>) -> Result<BackendConfig, String> {
        let config = BackendConfig::from_url(url).map_err(|e| e.to_string())?;
        with_ttl(config, ttl).map_err(|e| e.to_string())
    }

    #[test]
    fn ttl_sets_the_lease_or_the_session_timeout() {
        let secs = |n| Some(Duration::from_secs(n));
        let Ok(BackendConfig::Redis(redis)) = ttl("redis://h?ttl=30s&prefix=p", secs(2)) else {
            panic!("not a Redis config");
        };
        assert_eq!(
            (redis.lease.ttl, redis.lease.key_prefix.as_str()),
            (Duration::from_secs(2), "p")
        );
        let Ok(BackendConfig::Redlock(redlock)) = ttl("redlock://a,b,c", secs(3)) else {
            panic!("not a Redlock config");
        };
        assert_eq!(redlock.lease.ttl, Duration::from_secs(3));
        let url = "zk://h?session_timeout=10s";
        let Ok(BackendConfig::ZooKeeper(zk)) = ttl(url, secs(4)) else {
            panic!("not a ZooKeeper config");
        };
        assert_eq!(zk.session_timeout, Duration::from_secs(4));
        let Ok(BackendConfig::Etcd(etcd)) = ttl("etcd://h?lease_ttl=10s", secs(5)) else {
            panic!("not an etcd config");
        };
        assert_eq!(etcd.lease_ttl, Duration::from_secs(5));
        assert_eq!(
            ttl(url, None),
            BackendConfig::from_url(url).map_err(|e| e.to_string())
        );
    }

    #[test]
    fn ttl_is_checked_and_only_where_it_means_something() {
        let e = ttl("redis://h", Some(Duration::from_millis(1))).unwrap_err();
        assert!(e.contains("ttl is 1ms"), "{e}");
        let e = ttl("zk://h", Some(Duration::from_secs(7200))).unwrap_err();
        assert!(e.contains("session_timeout is 7200s"), "{e}");
        let e = ttl("memory://", Some(Duration::from_secs(1))).unwrap_err();
        assert!(e.contains("--ttl has no meaning for memory://"), "{e}");
    }
}
