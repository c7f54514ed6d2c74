//! A provider's current session, replaced once it is over.

use std::future::Future;
use std::sync::{Arc, Mutex};

use super::{Closed, unpoisoned};
use crate::{LockError, LockName};

/// A server-side session that a [`SessionSlot`] holds: a ZooKeeper session, an etcd lease.
pub trait ServerSession: Send + Sync + 'static {
    /// Whether the session is over (expired, closed, failed for good): nothing more can be
    /// acquired on it.
    fn is_over(&self) -> bool;

    /// Ends the session on this side at once, its guards lost; the server is told in the
    /// background where it can be.
    fn close(&self);
}

/// A provider's current session: acquisitions run on it while it lives, and the first
/// acquisition after it is over opens a new one (one at a time), as Curator's client makes
/// a new session after an expiry. Guards granted on an earlier session keep hanging on
/// that one, and are lost with it.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use lock_core::kit::{Closed, SessionSlot, ServerSession};
/// use lock_core::{LockError, LockName};
///
/// #[derive(Default)]
/// struct Lease(AtomicBool);
///
/// impl ServerSession for Lease {
///     fn is_over(&self) -> bool {
///         self.0.load(Ordering::SeqCst)
///     }
///     fn close(&self) {
///         self.0.store(true, Ordering::SeqCst);
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let (closed, name) = (Closed::new(), LockName::new("jobs")?);
/// let slot = SessionSlot::new(Arc::new(Lease::default()));
/// let open = || async { Ok(Arc::new(Lease::default())) };
/// let first = slot.live(&closed, "demo", &name, open).await?;
/// first.0.store(true, Ordering::SeqCst); // expired
/// let second = slot.live(&closed, "demo", &name, open).await?;
/// assert!(!Arc::ptr_eq(&first, &second));
/// slot.close(&closed);
/// assert!(second.is_over());
/// assert!(matches!(
///     slot.live(&closed, "demo", &name, open).await,
///     Err(LockError::SessionExpired { .. })
/// ));
/// # Ok(()) }
/// ```
pub struct SessionSlot<S> {
    latest: Mutex<Option<Arc<S>>>,
    /// Serialises opening a replacement.
    opening: tokio::sync::Mutex<()>,
}

impl<S: ServerSession> SessionSlot<S> {
    /// A slot holding the provider's first session.
    pub fn new(first: Arc<S>) -> Self {
        SessionSlot {
            latest: Mutex::new(Some(first)),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    /// The latest session, over or not; `None` once the provider is closed.
    pub fn latest(&self) -> Option<Arc<S>> {
        unpoisoned(&self.latest).clone()
    }

    fn live_latest(&self) -> Option<Arc<S>> {
        self.latest().filter(|session| !session.is_over())
    }

    /// A live session for an acquisition of `name`: the latest, or a new one from `open`
    /// when the latest is over.
    ///
    /// # Errors
    ///
    /// [`LockError::SessionExpired`] once `closed` is (the provider's last handle is gone,
    /// also while the new session was opening: that one is closed again); `open`'s error.
    pub async fn live<F, Fut>(
        &self,
        closed: &Closed,
        backend: &'static str,
        name: &LockName,
        open: F,
    ) -> Result<Arc<S>, LockError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Arc<S>, LockError>>,
    {
        closed.check(backend, name)?;
        if let Some(session) = self.live_latest() {
            return Ok(session);
        }
        let _opening = self.opening.lock().await;
        if let Some(session) = self.live_latest() {
            return Ok(session);
        }
        closed.check(backend, name)?;
        tracing::info!(backend, lock = %name, "the session is over; opening a new one");
        let session = open().await?;
        // Checked and stored under the lock `close` takes, so that a close in between
        // cannot miss the new session.
        let mut latest = unpoisoned(&self.latest);
        if let Err(error) = closed.check(backend, name) {
            drop(latest);
            session.close();
            return Err(error);
        }
        *latest = Some(Arc::clone(&session));
        crate::observe::record_reconnect(backend, "session");
        Ok(session)
    }

    /// The provider's last handle is gone: marks `closed` and closes the latest session.
    pub fn close(&self, closed: &Closed) {
        let taken = {
            let mut latest = unpoisoned(&self.latest);
            closed.close();
            latest.take()
        };
        if let Some(session) = taken {
            session.close();
        }
    }
}
