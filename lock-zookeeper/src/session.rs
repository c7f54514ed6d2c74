//! One ZooKeeper session: its client, its health, and the lost signals of its guards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{LockError, LossReason, LostNotifier};
use zookeeper_client::{Acls, Client, SessionState};

use crate::config::{AclPolicy, ZkConfig};
use crate::error::{BACKEND, lock_error};

/// A live session and what depends on it.
pub(crate) struct Session {
    pub(crate) client: Client,
    /// The session id, as servers record it in a node's `ephemeralOwner`.
    pub(crate) id: i64,
    health: Arc<Health>,
    pub(crate) acls: Acls<'static>,
}

/// What the monitor task and the guards share.
#[derive(Default)]
struct Health {
    /// Disconnected, not yet expired: guards cannot be vouched for.
    suspect: AtomicBool,
    /// Expired, closed or failed: nothing more can be done with this session.
    over: AtomicBool,
    guards: Mutex<HashMap<u64, LostNotifier>>,
    next_guard: AtomicU64,
}

impl Health {
    fn fire_all(&self, reason: &LossReason) {
        let guards: Vec<_> = self
            .guards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        if !guards.is_empty() {
            tracing::warn!(%reason, guards = guards.len(), "zookeeper: guards lost");
        }
        for (_, notifier) in guards {
            notifier.fire(reason.clone());
        }
    }
}

impl Session {
    /// Connects, within the configured connect timeout, and starts watching the session.
    pub(crate) async fn open(config: &ZkConfig) -> Result<Arc<Session>, LockError> {
        let mut connector = Client::connector()
            .with_session_timeout(config.session_timeout)
            .with_connection_timeout(config.connect_timeout)
            .with_fail_eagerly();
        if let Some(auth) = &config.auth {
            connector = connector.with_auth(
                "digest",
                format!("{}:{}", auth.user, auth.password).as_bytes(),
            );
        }
        let connect_string = config.connect_string();
        let client =
            match tokio::time::timeout(config.connect_timeout, connector.connect(&connect_string))
                .await
            {
                Ok(Ok(client)) => client,
                Ok(Err(error)) => {
                    return Err(match lock_error(error, None) {
                        LockError::Connection {
                            message, source, ..
                        } => LockError::Connection {
                            backend: BACKEND,
                            name: None,
                            message: format!("cannot reach {}: {message}", config.hosts.join(",")),
                            source,
                        },
                        other => other,
                    });
                }
                Err(_) => {
                    return Err(LockError::Connection {
                        backend: BACKEND,
                        name: None,
                        message: format!(
                            "no session with {} within the connect timeout of {:?}",
                            config.hosts.join(","),
                            config.connect_timeout
                        ),
                        source: None,
                    });
                }
            };
        let health = Arc::new(Health::default());
        let timeout = client.session_timeout();
        tokio::spawn(monitor(
            client.state_watcher(),
            Arc::clone(&health),
            timeout,
        ));
        let id = client.session_id().0;
        tracing::debug!(session = %client.session_id(), ?timeout, "zookeeper: session established");
        let acls = match config.acl {
            AclPolicy::CreatorAll => Acls::creator_all(),
            _ => Acls::anyone_all(),
        };
        Ok(Arc::new(Session {
            client,
            id,
            health,
            acls,
        }))
    }

    /// Registers a grant's lost notifier; it fires when the session is lost.
    pub(crate) fn register(&self, notifier: LostNotifier) -> u64 {
        let id = self.health.next_guard.fetch_add(1, Ordering::Relaxed);
        self.health
            .guards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, notifier);
        if self.is_over() {
            // Lost before it was registered: fire now rather than never.
            self.health.fire_all(&LossReason::SessionExpired);
        }
        id
    }

    pub(crate) fn unregister(&self, registration: u64) {
        self.health
            .guards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&registration);
    }

    /// Ends the session on this side at once: its guards are lost and nothing more is
    /// done with it, whether or not the server hears of the close.
    pub(crate) fn close(&self) {
        self.health.over.store(true, Ordering::Release);
        self.health.fire_all(&LossReason::Other(
            "the provider was closed, ending its session".into(),
        ));
    }

    pub(crate) fn is_suspect(&self) -> bool {
        self.health.suspect.load(Ordering::Acquire)
    }

    pub(crate) fn is_over(&self) -> bool {
        self.health.over.load(Ordering::Acquire)
    }

    /// The negotiated session timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.client.session_timeout()
    }
}

/// Follows the session's states: suspect while disconnected, every guard lost once the
/// disconnection outlasts the session timeout or the session ends.
async fn monitor(
    mut states: zookeeper_client::StateWatcher,
    health: Arc<Health>,
    timeout: Duration,
) {
    let mut lost_at: Option<tokio::time::Instant> = None;
    loop {
        let state = match lost_at {
            Some(at) => tokio::select! {
                state = states.changed() => state,
                () = tokio::time::sleep_until(at) => {
                    // The server has surely expired the session by now, whatever the client
                    // hears later: the guards cannot be vouched for.
                    health.fire_all(&LossReason::Disconnected);
                    lost_at = None;
                    continue;
                }
            },
            None => states.changed().await,
        };
        match state {
            SessionState::Disconnected => {
                health.suspect.store(true, Ordering::Release);
                lost_at.get_or_insert_with(|| tokio::time::Instant::now() + timeout);
                tracing::debug!("zookeeper: disconnected; guards are suspect");
            }
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                health.suspect.store(false, Ordering::Release);
                lost_at = None;
                tracing::debug!("zookeeper: reconnected");
            }
            terminal => {
                health.over.store(true, Ordering::Release);
                health.suspect.store(false, Ordering::Release);
                let reason = match terminal {
                    SessionState::Expired => LossReason::SessionExpired,
                    SessionState::AuthFailed => {
                        LossReason::Other("the session failed authentication".into())
                    }
                    _ => LossReason::Other("the session was closed".into()),
                };
                health.fire_all(&reason);
                tracing::debug!(?terminal, "zookeeper: session over");
                return;
            }
        }
    }
}
