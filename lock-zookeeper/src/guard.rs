//! Held locks, and the clean-up of nodes that nobody will use: after a cancel, a timeout,
//! an error, or a guard dropped without release.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::kit::{
    Abandon, Cleanup, HeldEntry, Removal, RemovalError, Retry, ServerSession,
    entry_guard_releasing, retry_in_background,
};
use lock_core::{Deadline, Guard, LockName, Metrics, lost_signal};
use uuid::Uuid;
use zookeeper_client::Error as ZkError;

use crate::error::{BACKEND, lock_error, outcome_unknown, session_over};
use crate::node::{SINGLE_NODE, has_uuid, token};
use crate::session::{HeldWatch, OwnNodeWatch, Session, Shared};

/// How a background clean-up backs off while the connection is down.
const CLEANUP_PAUSE: Duration = Duration::from_millis(200);

/// What a contender may have left on the server, and how to recognise it.
#[derive(Debug, Clone)]
pub(crate) enum Leftover {
    /// A sequential node named with `uuid`; its name once the create was confirmed.
    Sequential { uuid: Uuid, node: Option<String> },
    /// The single-node lock `{dir}/lock`, ours if it holds `uuid` and our session owns it.
    Single { uuid: Uuid },
    /// A granted node at a known path, with its creation zxid.
    Granted { path: String, czxid: i64 },
}

/// What a contender made on the server, to be removed if nobody will use it.
#[derive(Debug)]
pub(crate) struct Entry {
    session: Weak<Session>,
    dir: String,
    leftover: Leftover,
}

impl Abandon for Entry {
    fn abandon(self) {
        clean_up_in_background(self.session, self.dir, self.leftover);
    }
}

/// An acquisition in progress: its entry is removed in the background unless disarmed.
pub(crate) struct Pending(Cleanup<Entry>);

impl Pending {
    pub(crate) fn new(session: &Arc<Session>, dir: &str, leftover: Leftover) -> Self {
        Pending(Cleanup::new(Entry {
            session: Arc::downgrade(session),
            dir: dir.to_owned(),
            leftover,
        }))
    }

    pub(crate) fn set_node(&mut self, name: String) {
        let leftover = self.0.entry_mut().map(|entry| &mut entry.leftover);
        if let Some(Leftover::Sequential { node, .. }) = leftover {
            *node = Some(name);
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.0.disarm();
    }

    /// Removes the node now (timeout, try that lost); on failure leaves it to the background.
    pub(crate) async fn remove_now(&mut self, metrics: &Metrics) {
        let Some(entry) = self.0.entry() else {
            return;
        };
        let Some(session) = entry.session.upgrade() else {
            self.0.disarm();
            return;
        };
        metrics.record_server_requests(1);
        match remove(&session, &entry.dir, &entry.leftover).await {
            Ok(()) => self.disarm(),
            Err(error) => {
                tracing::debug!(%error, "zookeeper: removal failed; retrying in the background")
            }
        }
    }
}

/// Removes what `leftover` names, if it is still there and ours.
async fn remove(session: &Session, dir: &str, leftover: &Leftover) -> Result<(), ZkError> {
    let client = &session.client;
    match leftover {
        Leftover::Sequential {
            node: Some(node), ..
        } => ignore_gone(client.delete(&format!("{dir}/{node}"), None).await),
        Leftover::Sequential { uuid, node: None } => {
            // The create's outcome is unknown: find the node by its uuid.
            let children = match client.list_children(dir).await {
                Err(ZkError::NoNode) => return Ok(()),
                listed => listed?,
            };
            for child in children.into_iter().filter(|child| has_uuid(child, *uuid)) {
                ignore_gone(client.delete(&format!("{dir}/{child}"), None).await)?;
            }
            Ok(())
        }
        Leftover::Single { uuid } => {
            let path = format!("{dir}/{SINGLE_NODE}");
            match client.get_data(&path).await {
                Ok((data, stat))
                    if stat.ephemeral_owner == session.id && data == uuid.as_bytes() =>
                {
                    ignore_gone(client.delete(&path, Some(stat.version)).await)
                }
                Ok(_) | Err(ZkError::NoNode) => Ok(()),
                Err(error) => Err(error),
            }
        }
        Leftover::Granted { path, czxid } => match client.check_stat(path).await? {
            Some(stat) if stat.ephemeral_owner == session.id && stat.czxid == *czxid => {
                ignore_gone(client.delete(path, Some(stat.version)).await)
            }
            _ => Ok(()),
        },
    }
}

fn ignore_gone(result: Result<(), ZkError>) -> Result<(), ZkError> {
    match result {
        Err(ZkError::NoNode | ZkError::BadVersion) => Ok(()),
        other => other,
    }
}

/// Retries [`remove`] until it succeeds or the session is gone (which removes the node anyway).
fn clean_up_in_background(session: Weak<Session>, dir: String, leftover: Leftover) {
    // Asked here too, not only in the task: every guard of a closed provider lands here as
    // it drops, and a task each would be a burst of thousands for nothing.
    if session.upgrade().is_none_or(|session| session.is_over()) {
        return;
    }
    let what = format!("clean-up of {leftover:?}");
    // Until the session ends: then the server removes the node itself.
    let give_up = Deadline::after(None);
    retry_in_background(BACKEND, what, CLEANUP_PAUSE, give_up, move || {
        let (session, dir, leftover) = (session.clone(), dir.clone(), leftover.clone());
        async move {
            let Some(session) = session.upgrade().filter(|session| !session.is_over()) else {
                return Retry::Done;
            };
            match remove(&session, &dir, &leftover).await {
                Ok(()) => Retry::Done,
                Err(error) if session_over(&error) => Retry::Done,
                Err(error) if outcome_unknown(&error) => Retry::Again(error.to_string()),
                Err(error) => {
                    tracing::warn!(%error, ?leftover, "zookeeper: cannot remove an abandoned node");
                    Retry::GiveUp(error.to_string())
                }
            }
        }
    });
}

/// Deletes a granted sequential node, which only this session made: the delete is sent
/// before this returns, so that it goes ahead of any later request of the session (the next
/// acquisition's create among them), as a release's would. Only an unknown outcome leaves
/// the node to [`clean_up_in_background`].
fn delete_now(session: Weak<Session>, dir: String, leftover: Leftover) {
    let (Some(live), Ok(runtime), Leftover::Granted { path, .. }) = (
        session.upgrade().filter(|session| !session.is_over()),
        tokio::runtime::Handle::try_current(),
        &leftover,
    ) else {
        clean_up_in_background(session, dir, leftover);
        return;
    };
    let deleting = live.client.delete(path, None);
    runtime.spawn(async move {
        match deleting.await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(error) if session_over(&error) => {}
            Err(error) => {
                tracing::debug!(%error, ?leftover, "zookeeper: delete of a dropped guard's node failed; retrying in the background");
                clean_up_in_background(session, dir, leftover);
            }
        }
    });
}

/// A node the server granted the lock to, as a strategy found it.
pub(crate) struct Granted {
    pub(crate) path: String,
    /// The node's creation zxid: the fencing token.
    pub(crate) czxid: i64,
    /// The single-node lock's path is shared: release only after checking owner and czxid.
    pub(crate) checked: bool,
    /// When the request that confirmed the grant was sent.
    pub(crate) asked: tokio::time::Instant,
    /// A watch on the node, set while it queued; the guard sets its own when there is none.
    pub(crate) own_watch: Option<OwnNodeWatch>,
}

impl Granted {
    /// The grant of a sequential node, which only its creator deletes: released unchecked.
    pub(crate) fn new(
        path: String,
        czxid: i64,
        asked: tokio::time::Instant,
        own_watch: Option<OwnNodeWatch>,
    ) -> Self {
        Granted {
            path,
            czxid,
            checked: false,
            asked,
            own_watch,
        }
    }
}

/// Turns a granted node into a guard: lost signal registered with the session, and a
/// watch on the node so that a deletion by someone else is noticed.
pub(crate) fn grant(
    shared: &Shared,
    session: &Arc<Session>,
    name: &LockName,
    granted: Granted,
) -> Guard {
    shared.metrics.record_grant();
    let (notifier, lost) = lost_signal();
    let registration = session.register(notifier.clone(), granted.asked);
    let path: Arc<str> = Arc::from(granted.path);
    let node = HeldNode {
        session: Arc::downgrade(session),
        metrics: Arc::clone(&shared.metrics),
        name: name.clone(),
        path: Arc::clone(&path),
        czxid: granted.czxid,
        checked: granted.checked,
        registration,
    };
    let (guard, releasing) = entry_guard_releasing(name, token(granted.czxid), node, lost);
    let watch = HeldWatch::new(
        session,
        &shared.metrics,
        path,
        granted.own_watch,
        (releasing, notifier),
    );
    session.watch_held(watch);
    guard
}

/// A granted node, as its guard releases it.
#[derive(Debug)]
struct HeldNode {
    /// Weak: a guard never keeps its session open (the provider is the session).
    session: Weak<Session>,
    metrics: Arc<Metrics>,
    name: LockName,
    path: Arc<str>,
    czxid: i64,
    /// The single-node lock's path is shared: delete only after checking owner and czxid.
    checked: bool,
    registration: u64,
}

#[async_trait]
impl HeldEntry for HeldNode {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn remove(&mut self, sent: &AtomicBool) -> Result<Removal, RemovalError> {
        let Some(session) = self.session.upgrade().filter(|session| !session.is_over()) else {
            return Err(RemovalError::SessionOver);
        };
        let metrics = &self.metrics;
        let mut version = None;
        if self.checked {
            let stat = session.resend(|client| {
                metrics.record_server_requests(1);
                client.check_stat(&self.path)
            });
            match stat.await {
                Ok(Some(stat))
                    if stat.ephemeral_owner == session.id && stat.czxid == self.czxid =>
                {
                    version = Some(stat.version);
                }
                Ok(_) => return Ok(Removal::Gone),
                Err(error) => return Err(self.failed(error)),
            }
        }
        sent.store(true, Ordering::Release);
        // A delete sent again after a lost answer may find its own work done.
        let mut attempts = 0;
        let deleted = session.resend(|client| {
            attempts += 1;
            metrics.record_server_requests(1);
            client.delete(&self.path, version)
        });
        match deleted.await {
            Ok(()) => Ok(Removal::Removed),
            Err(ZkError::NoNode | ZkError::BadVersion) if attempts > 1 => Ok(Removal::Removed),
            Err(ZkError::NoNode | ZkError::BadVersion) => Ok(Removal::Gone),
            Err(error) => Err(self.failed(error)),
        }
    }

    fn forget(&self) {
        if let Some(session) = self.session.upgrade() {
            session.unregister(self.registration);
        }
    }

    fn abandon(self: Box<Self>) {
        self.metrics.record_server_requests(1);
        let dir = self.path.rsplit_once('/').unwrap_or_default().0.to_owned();
        let leftover = Leftover::Granted {
            path: self.path.to_string(),
            czxid: self.czxid,
        };
        if self.checked {
            clean_up_in_background(self.session, dir, leftover);
        } else {
            delete_now(self.session, dir, leftover);
        }
    }

    fn is_suspect(&self) -> bool {
        self.session
            .upgrade()
            .is_some_and(|session| session.is_suspect())
    }
}

impl HeldNode {
    /// A failed request of a release.
    fn failed(&self, error: ZkError) -> RemovalError {
        if session_over(&error) {
            RemovalError::SessionOver
        } else if outcome_unknown(&error) {
            RemovalError::Unknown(lock_error(error, Some(self.name.as_str())))
        } else {
            RemovalError::Failed(lock_error(error, Some(self.name.as_str())))
        }
    }
}
