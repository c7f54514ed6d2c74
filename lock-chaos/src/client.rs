//! One chaos client: an OS process of its own (a task of the run's process for the
//! in-process memory backend) that loops acquire → read the register →
//! write one more with the grant's token → release, and records every operation and every
//! lost signal as an [`Event`] line in its history file, written at once so that a killed
//! client's history holds everything up to its death.

use std::fs::File;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{DistributedLock, LockError, LockProvider};
use tokio::sync::watch;

use crate::history::{Event, EventKind, Outcome};
use crate::register::{RegisterClient, RegisterError, Verdict};

/// What one client does.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Its number in the run.
    pub client: u32,
    /// The lock's backend, as a distlock URL.
    pub url: String,
    /// The lock's name.
    pub name: String,
    /// Where the fenced register listens.
    pub register: SocketAddr,
    /// How long an acquire may wait.
    pub acquire_timeout: Duration,
    /// How long it holds the lock after its write.
    pub hold: Duration,
    /// Its history file.
    pub history: PathBuf,
}

impl ClientOptions {
    /// Client `client` of the lock `name` at `url`, writing to the register at `register`
    /// and its history to `history`; acquires wait 5 s, holds last 5 ms.
    pub fn new(
        client: u32,
        url: impl Into<String>,
        name: impl Into<String>,
        register: SocketAddr,
        history: impl Into<PathBuf>,
    ) -> Self {
        ClientOptions {
            client,
            url: url.into(),
            name: name.into(),
            register,
            acquire_timeout: Duration::from_secs(5),
            hold: Duration::from_millis(5),
            history: history.into(),
        }
    }

    /// Sets [`acquire_timeout`](Self::acquire_timeout).
    #[must_use]
    pub fn with_acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Sets [`hold`](Self::hold).
    #[must_use]
    pub fn with_hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }
}

/// Nanoseconds on the clock every process of the run shares (`CLOCK_MONOTONIC`).
pub fn now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |now| {
        let nanos = i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec());
        u64::try_from(nanos).unwrap_or(0)
    })
}

/// Appends events to the history file, one line each, as they happen.
#[derive(Debug, Clone)]
struct History(Arc<Mutex<File>>);

impl History {
    fn record(&self, event: &Event) {
        let mut file = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(error) = file.write_all(event.to_line().as_bytes()) {
            tracing::warn!(%error, "chaos client: the history file cannot be written");
        }
    }
}

/// Why a client stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The history file could not be made.
    #[error("history file: {0}")]
    History(#[from] io::Error),
    /// The handler that stops the client on SIGTERM could not be installed.
    #[error("SIGTERM handler: {0}")]
    Signal(io::Error),
    /// The lock's name was refused.
    #[error("lock: {0}")]
    Lock(#[from] LockError),
}

/// The client process: connects (asking again while the servers cannot be reached), runs
/// [`run`] until SIGTERM or until the process that started it is gone, and returns.
///
/// # Errors
///
/// As [`run`]; or when no signal handler can be installed.
pub async fn main(options: &ClientOptions) -> Result<(), ClientError> {
    let (stop, stopped) = watch::channel(false);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ClientError::Signal)?;
    // SIGTERM from the run, or the run gone (killed, so that it could not stop its
    // clients): a client has no business outliving it.
    let parent = nix::unistd::getppid();
    tokio::spawn(async move {
        let mut orphaned = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = terminate.recv() => break,
                _ = orphaned.tick() => {
                    if nix::unistd::getppid() != parent {
                        break;
                    }
                }
            }
        }
        let _ = stop.send(true);
    });
    let provider = loop {
        match distlock::connect(&options.url).await {
            Ok(provider) => break provider,
            Err(error) if error.is_retryable() => {
                tracing::debug!(%error, "chaos client: cannot connect yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(ClientError::Lock(error)),
        }
        if *stopped.borrow() {
            return Ok(());
        }
    };
    run(options, provider, stopped).await
}

/// Runs the client's loop until `stop` says so: a turn under way is finished first (an
/// acquire still waiting is given up), so that the client leaves nothing behind.
///
/// # Errors
///
/// When the history file cannot be made or the lock's name is refused; everything else
/// (an unreachable server, a lost lock) is recorded and the loop goes on.
pub async fn run(
    options: &ClientOptions,
    provider: Arc<dyn LockProvider>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ClientError> {
    let history = History(Arc::new(Mutex::new(File::create(&options.history)?)));
    let lock = provider.lock(&options.name)?;
    let mut register: Option<RegisterClient> = None;
    while !*stop.borrow_and_update() && stop.has_changed().is_ok() {
        turn(options, lock.as_ref(), &mut register, &history, &mut stop).await;
    }
    Ok(())
}

/// One acquire → read → write → release, recorded.
async fn turn(
    options: &ClientOptions,
    lock: &dyn DistributedLock,
    register: &mut Option<RegisterClient>,
    history: &History,
    stop: &mut watch::Receiver<bool>,
) {
    let client = options.client;
    let started = now_ns();
    let acquired = tokio::select! {
        acquired = lock.acquire(Some(options.acquire_timeout)) => acquired,
        _ = stop.changed() => return,
    };
    let mut guard = match acquired {
        Ok(guard) => guard,
        Err(error) => {
            history.record(&Event::new(
                client,
                EventKind::Acquire,
                started,
                now_ns(),
                Outcome::Failed(error.to_string()),
            ));
            if !matches!(error, LockError::Timeout { .. }) {
                // An unreachable server answers at once: do not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            return;
        }
    };
    let token = guard.fencing_token().0;
    history.record(
        &Event::new(client, EventKind::Acquire, started, now_ns(), Outcome::Ok).with_token(token),
    );
    let lost = guard.lost();
    // Watched beside the work rather than in a task of its own, so that a client frozen
    // as a task (the run's `freezable`) notices its loss no sooner than a frozen process would.
    let watcher = async {
        if lost.wait().await.is_some() {
            let at = now_ns();
            history.record(
                &Event::new(client, EventKind::Lost, at, at, Outcome::Ok).with_token(token),
            );
        }
    };
    let work = async {
        increment(options, token, register, history).await;
        tokio::time::sleep(options.hold).await;
        let releasing = now_ns();
        let outcome = match guard.release().await {
            Ok(()) => Outcome::Ok,
            Err(error) if error.is_retryable() => Outcome::Unknown(error.to_string()),
            Err(error) => Outcome::Failed(error.to_string()),
        };
        history.record(
            &Event::new(client, EventKind::Release, releasing, now_ns(), outcome).with_token(token),
        );
        // The watcher ends with the guard; a loss it saw first is already recorded.
        drop(guard);
    };
    tokio::join!(work, watcher);
}

/// Reads the register and writes one more with `token`, both recorded.
async fn increment(
    options: &ClientOptions,
    token: u64,
    register: &mut Option<RegisterClient>,
    history: &History,
) {
    let client = options.client;
    let started = now_ns();
    let read = match register {
        Some(connection) => connection.read().await,
        None => match RegisterClient::connect(options.register).await {
            Ok(connection) => register.insert(connection).read().await,
            Err(error) => Err(error),
        },
    };
    let (value, connection) = match (read, register.as_mut()) {
        (Ok(value), Some(connection)) => (value, connection),
        (read, _) => {
            *register = None;
            let error = read
                .err()
                .map_or_else(|| "no connection".to_owned(), |e| e.to_string());
            history.record(&Event::new(
                client,
                EventKind::Read,
                started,
                now_ns(),
                Outcome::Failed(error),
            ));
            return;
        }
    };
    history.record(
        &Event::new(client, EventKind::Read, started, now_ns(), Outcome::Ok).with_value(value),
    );
    let writing = now_ns();
    let outcome = match connection.write(client, token, value + 1).await {
        Ok(Verdict::Accepted) => Outcome::Ok,
        Ok(Verdict::Rejected { .. }) => Outcome::Rejected,
        Err(error @ RegisterError::Protocol(_)) => Outcome::Failed(error.to_string()),
        Err(error) => {
            *register = None;
            Outcome::Unknown(error.to_string())
        }
    };
    history.record(
        &Event::new(client, EventKind::Write, writing, now_ns(), outcome)
            .with_token(token)
            .with_value(value + 1),
    );
}
