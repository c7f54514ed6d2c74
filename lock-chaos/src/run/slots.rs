//! Client slots: each holds one client at a time, an OS process (`chaos client`) behind
//! fault proxies of its own, or, for the memory backend, a task of the run's own process
//! with a provider of the in-process server. A slot freezes, kills and replaces its client.

use std::future::Future;
use std::time::Duration;

use lock_core::memory::MemoryLockProvider;
use lock_testbed::proxy::FaultProxy;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::{self, ClientOptions};

/// One client slot: its proxies (one per server; none in process) and its current client.
pub(super) struct Slot {
    pub(super) proxies: Vec<FaultProxy>,
    pub(super) client: Option<Body>,
    pub(super) generation: u32,
}

/// A slot's client.
pub(super) enum Body {
    /// A `chaos client` process: frozen by SIGSTOP, killed by SIGKILL.
    Process(Child),
    /// A task of the run's process, for a backend that lives in it.
    Task(TaskClient),
}

impl Slot {
    pub(super) fn new(proxies: Vec<FaultProxy>) -> Self {
        Slot {
            proxies,
            client: None,
            generation: 0,
        }
    }

    /// Freezes the client where it stands, or lets it go on. A task's session ends
    /// `session` into its freeze (the in-process server has no timeouts of its own), as a
    /// server ends the session of a client that stopped answering.
    pub(super) fn freeze(&mut self, freeze: bool, session: Duration) {
        match &mut self.client {
            Some(Body::Process(child)) => {
                let signal_to_send = if freeze {
                    Signal::SIGSTOP
                } else {
                    Signal::SIGCONT
                };
                signal(child, signal_to_send);
            }
            Some(Body::Task(task)) => task.freeze(freeze, Some(session)),
            None => {}
        }
    }

    /// Kills the client at once: a process by SIGKILL. A task first stands still for
    /// [`LAST_BYTES`], then is dropped where it stands, which ends its session.
    pub(super) async fn kill(&mut self) {
        match self.client.take() {
            Some(Body::Process(mut child)) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            Some(Body::Task(mut task)) => {
                task.freeze(true, None);
                tokio::time::sleep(LAST_BYTES).await;
                task.abort();
                if let Some(handle) = task.handle.take() {
                    report_panic(handle.await);
                }
            }
            None => {}
        }
    }

    /// Cuts the client off from every server, or lets it through again.
    pub(super) fn cut(&self, cut: bool) {
        for proxy in &self.proxies {
            if cut { proxy.cut() } else { proxy.pass() }
        }
    }

    /// Asks the client to finish its turn and leave (SIGTERM to a process).
    pub(super) fn ask_to_leave(&self) {
        match &self.client {
            Some(Body::Process(child)) => signal(child, Signal::SIGTERM),
            Some(Body::Task(task)) => {
                let _ = task.stop.send(true);
            }
            None => {}
        }
    }

    /// Waits until the client asked to leave has left; one that has not by `deadline` is
    /// killed.
    pub(super) async fn wait_until_left(&mut self, deadline: Instant) {
        let left = match &mut self.client {
            Some(Body::Process(child)) => tokio::time::timeout_at(deadline, child.wait())
                .await
                .is_ok(),
            Some(Body::Task(task)) => match task.handle.as_mut() {
                Some(handle) => match tokio::time::timeout_at(deadline, handle).await {
                    Ok(joined) => {
                        task.handle = None;
                        report_panic(joined);
                        true
                    }
                    Err(_) => false,
                },
                None => true,
            },
            None => true,
        };
        if left {
            self.client = None;
        } else {
            self.kill().await;
        }
    }
}

fn signal(child: &Child, signal: Signal) {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// How long a killed task stands still before it is dropped. A killed process's last
/// bytes (a register write in flight) still reach their peer; a task dropped at once would
/// also free its lock at once, before those bytes landed, which no server can do: it
/// learns of a death from the connection or the session, later.
const LAST_BYTES: Duration = Duration::from_millis(50);

fn report_panic(joined: Result<(), tokio::task::JoinError>) {
    if let Err(error) = joined
        && error.is_panic()
    {
        tracing::error!(%error, "chaos: a task client panicked");
    }
}

/// A client running as a task of the run's process, with a session of its own on the
/// in-process server. Dropping it stops the task.
pub(super) struct TaskClient {
    /// `None` once joined.
    handle: Option<JoinHandle<()>>,
    frozen: watch::Sender<bool>,
    stop: watch::Sender<bool>,
    provider: MemoryLockProvider,
    /// The session's end, pending while the client is frozen.
    expiry: Option<JoinHandle<()>>,
}

impl TaskClient {
    /// Starts the client loop of `options` on `provider` as a task.
    pub(super) fn spawn(options: ClientOptions, provider: MemoryLockProvider) -> Self {
        let (frozen, frozen_rx) = watch::channel(false);
        let (stop, stop_rx) = watch::channel(false);
        let session = std::sync::Arc::new(provider.clone());
        let handle = tokio::spawn(freezable(
            async move {
                if let Err(error) = client::run(&options, session, stop_rx).await {
                    tracing::warn!(client = options.client, %error, "chaos: a task client ended");
                }
            },
            frozen_rx,
        ));
        TaskClient {
            handle: Some(handle),
            frozen,
            stop,
            provider,
            expiry: None,
        }
    }

    /// Freezes the task, its session ending `session` into the freeze (or never, for
    /// `None`), or lets it go on with the session it has then.
    fn freeze(&mut self, freeze: bool, session: Option<Duration>) {
        let _ = self.frozen.send(freeze);
        if let Some(expiry) = self.expiry.take() {
            expiry.abort();
        }
        if let (true, Some(session)) = (freeze, session) {
            let provider = self.provider.clone();
            self.expiry = Some(tokio::spawn(async move {
                tokio::time::sleep(session).await;
                provider.expire_session();
            }));
        }
    }

    fn abort(&mut self) {
        if let Some(expiry) = self.expiry.take() {
            expiry.abort();
        }
        if let Some(handle) = &self.handle {
            handle.abort();
        }
    }
}

impl Drop for TaskClient {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Runs `work`, not polling it at all while `frozen` says so: the task stands still at
/// whatever point it had reached, as a process does under SIGSTOP, and its timers are due
/// the moment it goes on.
async fn freezable<F: Future>(work: F, mut frozen: watch::Receiver<bool>) -> F::Output {
    tokio::pin!(work);
    loop {
        if *frozen.borrow_and_update() {
            if frozen.changed().await.is_err() {
                return work.await;
            }
            continue;
        }
        tokio::select! {
            biased;
            changed = frozen.changed() => {
                if changed.is_err() {
                    return work.await;
                }
            }
            output = &mut work => return output,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_frozen_task_makes_no_step_until_thawed() {
        let steps = Arc::new(AtomicU32::new(0));
        let (frozen, frozen_rx) = watch::channel(false);
        let counted = Arc::clone(&steps);
        let task = tokio::spawn(freezable(
            async move {
                for _ in 0..10 {
                    counted.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            frozen_rx,
        ));
        tokio::time::sleep(Duration::from_millis(25)).await;
        frozen.send(true).unwrap();
        let at_freeze = steps.load(Ordering::SeqCst);
        assert!(at_freeze >= 2, "{at_freeze} steps before the freeze");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            steps.load(Ordering::SeqCst),
            at_freeze,
            "steps while frozen"
        );
        frozen.send(false).unwrap();
        task.await.unwrap();
        assert_eq!(steps.load(Ordering::SeqCst), 10);
    }
}
