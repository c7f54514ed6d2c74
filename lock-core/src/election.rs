//! Leader election: one leader at a time per name, with a term that fences the old one.
//!
//! An election is a queue of candidates, each with a value (a host name, an address); the
//! first in line leads. [`Election::campaign`] joins the queue and waits to lead;
//! [`Election::leader`] reads who leads now; [`Election::observe`] follows every change.
//!
//! Leadership is a held lock underneath: a [`Leadership`] wraps the [`Guard`] of the
//! election's grant, so it has the guard's guarantees. Its [term](Leadership::term) is the
//! grant's [fencing token](crate::FencingToken): larger for every later leader of the name
//! (as strong as the backend's [`Fencing`](crate::Fencing)), so that a resource that
//! remembers the largest term it has seen turns away an old leader that has not yet learned
//! it lost. Its [lost signal](Leadership::lost) fires when the backend stops vouching for
//! it; [`resign`](Leadership::resign) hands over to the next candidate.
//!
//! ```
//! use std::time::Duration;
//! use lock_core::{Election, LockError};
//!
//! async fn serve_while_leader(election: &dyn Election) -> Result<(), LockError> {
//!     let mut leadership = election.campaign(b"host-a", None).await?;
//!     let term = leadership.term(); // pass with every write to the shared resource
//!     let lost = leadership.lost();
//!     tokio::select! {
//!         _ = lost.wait() => return Err(LockError::Lost {
//!             backend: "demo",
//!             name: election.name().to_string(),
//!             reason: lost.reason().unwrap_or(lock_core::LossReason::SessionExpired),
//!         }),
//!         () = tokio::time::sleep(Duration::from_secs(1)) => {} // the work, with `term`
//!     }
//!     # let _ = term;
//!     leadership.resign().await
//! }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::{BoxStream, StreamExt};
use tokio::sync::watch;

use crate::error::copy_of;
use crate::{FencingToken, Guard, LockError, LockName, LostSignal};

/// Who leads an election: the value the leader campaigned with, and its term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The leader's value, as given to [`Election::campaign`].
    pub value: Vec<u8>,
    /// The leader's term: its grant's fencing token.
    pub term: FencingToken,
}

impl LeaderInfo {
    /// A leader with `value` in `term`.
    pub fn new(value: impl Into<Vec<u8>>, term: FencingToken) -> Self {
        LeaderInfo {
            value: value.into(),
            term,
        }
    }

    /// The value as text, with any invalid UTF-8 replaced.
    pub fn value_lossy(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.value)
    }
}

/// A won election: the [`Guard`] of the election's grant, and the value it leads with.
///
/// Dropping it resigns in the background, like dropping a guard releases; prefer
/// [`resign`](Self::resign) to learn the outcome.
#[derive(Debug)]
#[must_use = "leadership ends as soon as it is dropped"]
pub struct Leadership {
    guard: Guard,
    value: Vec<u8>,
}

impl Leadership {
    /// Leadership over `guard`, the grant of the election's lock, leading with `value`.
    /// Called by backends when a campaign wins.
    pub fn new(guard: Guard, value: impl Into<Vec<u8>>) -> Self {
        Leadership {
            guard,
            value: value.into(),
        }
    }

    /// The term: strictly larger than every earlier leader's of this election (as strong as
    /// the backend's fencing, see [`Capabilities::fencing`](crate::Capabilities::fencing)).
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The value this leader campaigned with.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// What [`Election::leader`] reports while this leadership lasts.
    pub fn info(&self) -> LeaderInfo {
        LeaderInfo::new(self.value.clone(), self.term())
    }

    /// Fires when the backend stops vouching for the leadership (session expired, lease
    /// lapsed, the entry removed by someone else); ends without firing on resign.
    pub fn lost(&self) -> LostSignal {
        self.guard.lost()
    }

    /// Shorthand for `self.lost().is_lost()`.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// The guard underneath, for its [`is_suspect`](Guard::is_suspect) and
    /// [`valid_until`](Guard::valid_until).
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The guard underneath, for code that holds any grant the same way (it releases, so
    /// resigns, like [`resign`](Self::resign)).
    pub fn into_guard(self) -> Guard {
        self.guard
    }

    /// Steps down, handing over to the next candidate. The same contract as
    /// [`Guard::release`]: only this leadership's own entry is removed; when it was already
    /// lost, [`LockError::Lost`]; a second call is a no-op; cancel-safe.
    ///
    /// # Errors
    ///
    /// As [`Guard::release`].
    pub async fn resign(&mut self) -> Result<(), LockError> {
        self.guard.release().await
    }
}

/// What an observer sees: the leader or no leader, or the error that ended the observation
/// (shared by every clone of the watch).
type Seen = Result<Option<LeaderInfo>, Arc<LockError>>;

fn seen_to_result(seen: &Seen) -> Result<Option<LeaderInfo>, LockError> {
    seen.clone().map_err(|err| copy_of(&err))
}

/// A follower of an election's leader, from [`Election::observe`].
///
/// It always holds the latest state it has seen. [`changed`](Self::changed) waits for the
/// next one; changes that come faster than they are read are coalesced, but the latest is
/// never skipped. Once the observation ends (the provider's session is over, the server
/// cannot be reached for longer than the backend retries), every call returns that error.
/// Clones follow the same observation; dropping every clone stops it. As a
/// [`Stream`](futures_util::Stream): [`into_stream`](Self::into_stream).
#[derive(Debug, Clone)]
pub struct LeaderWatch {
    seen: watch::Receiver<Seen>,
    backend: &'static str,
    name: LockName,
}

impl LeaderWatch {
    /// The latest state seen: the leader, `None` when nobody campaigns, or the error that
    /// ended the observation.
    ///
    /// # Errors
    ///
    /// The error that ended the observation.
    pub fn current(&self) -> Result<Option<LeaderInfo>, LockError> {
        seen_to_result(&self.seen.borrow())
    }

    /// Waits until the state changes after the one this watch last returned from `changed`
    /// or [`wait_for`](Self::wait_for) (or, the first time, after the state when the watch
    /// was made), and returns the latest. A change and its undoing that come before the
    /// read (a leader who came and went) are coalesced: the same state is returned again.
    ///
    /// Cancel safety: cancel-safe; a change seen by a dropped call is returned by the next.
    ///
    /// # Errors
    ///
    /// The error that ended the observation, at once and for good.
    pub async fn changed(&mut self) -> Result<Option<LeaderInfo>, LockError> {
        if self.seen.borrow().is_ok() && self.seen.changed().await.is_err() {
            return Err(self.follower_gone());
        }
        seen_to_result(&self.seen.borrow_and_update())
    }

    /// Waits until `until` holds for the leader (checked on the current state first), and
    /// returns that leader.
    ///
    /// Cancel safety: cancel-safe.
    ///
    /// # Errors
    ///
    /// The error that ended the observation.
    pub async fn wait_for(
        &mut self,
        mut until: impl FnMut(Option<&LeaderInfo>) -> bool + Send,
    ) -> Result<Option<LeaderInfo>, LockError> {
        loop {
            let now = seen_to_result(&self.seen.borrow_and_update())?;
            if until(now.as_ref()) {
                return Ok(now);
            }
            if self.seen.changed().await.is_err() {
                return Err(self.follower_gone());
            }
        }
    }

    /// The observation as a [`Stream`](futures_util::Stream): the current state first, then each change as
    /// [`changed`](Self::changed) returns it (coalesced, never missing the latest); after
    /// the error that ends the observation, the stream ends.
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use lock_core::{Election, LockError};
    ///
    /// async fn log_leaders(election: std::sync::Arc<dyn Election>) -> Result<(), LockError> {
    ///     let mut leaders = election.observe().await?.into_stream();
    ///     while let Some(leader) = leaders.next().await {
    ///         match leader? {
    ///             Some(leader) => tracing::info!(value = %leader.value_lossy(), term = %leader.term, "leader"),
    ///             None => tracing::info!("nobody leads"),
    ///         }
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn into_stream(self) -> BoxStream<'static, Result<Option<LeaderInfo>, LockError>> {
        // (watch, first item still to give, ended)
        futures_util::stream::unfold(
            (self, true, false),
            |(mut watch, first, ended)| async move {
                if ended {
                    return None;
                }
                let next = if first {
                    seen_to_result(&watch.seen.borrow_and_update())
                } else {
                    watch.changed().await
                };
                let ended = next.is_err();
                Some((next, (watch, false, ended)))
            },
        )
        .boxed()
    }

    /// The follower task ended without leaving an error (its runtime shut down): the
    /// observation is over as if the session were.
    fn follower_gone(&self) -> LockError {
        match &*self.seen.borrow() {
            Err(err) => copy_of(err),
            Ok(_) => LockError::SessionExpired {
                backend: self.backend,
                name: Some(self.name.to_string()),
            },
        }
    }
}

/// A named leader election shared by every client of the same backend.
///
/// Object-safe: use it as `Arc<dyn Election>`, from
/// [`LockProvider::election`](crate::LockProvider::election). At most one [`Leadership`]
/// for a name is live across all clients at any time, as far as the backend can vouch (see
/// [`Leadership::lost`]). Elections live apart from locks: the election `"x"` and the mutex
/// `"x"` are different things.
#[async_trait]
pub trait Election: Send + Sync + fmt::Debug {
    /// The election's name.
    fn name(&self) -> &LockName;

    /// Joins the candidates with `value` and waits to lead, for at most `timeout` (`None`:
    /// no limit; zero: lead now or fail).
    ///
    /// # Cancel safety
    ///
    /// As [`DistributedLock::acquire`](crate::DistributedLock::acquire): dropping the future
    /// before it completes leaves no candidate behind, and if leadership was won in the
    /// meantime it is handed on.
    ///
    /// # Errors
    ///
    /// [`LockError::Timeout`] when `timeout` passes first; otherwise as
    /// [`DistributedLock::acquire`](crate::DistributedLock::acquire).
    async fn campaign(
        &self,
        value: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Leadership, LockError>;

    /// Who leads now, read from the server; `None` when nobody campaigns.
    ///
    /// # Errors
    ///
    /// As any request: [`LockError::Connection`] and the like, [`LockError::SessionExpired`]
    /// after the provider's session ended.
    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError>;

    /// Follows the leader from now on: the watch starts at the current leader and moves with
    /// every change (herd-free for candidates: observers are woken per change, candidates
    /// only when their turn comes). Needs a Tokio runtime; the follower runs as a task until
    /// every clone of the watch is dropped or the session ends.
    ///
    /// # Errors
    ///
    /// As [`leader`](Self::leader), for the first read.
    async fn observe(self: Arc<Self>) -> Result<LeaderWatch, LockError>;
}

/// How a backend follows its leader, for [`follow`]: read it, and wait for a change.
#[async_trait]
pub trait LeaderSource: Send + Sync + 'static {
    /// Who leads now.
    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError>;

    /// Returns once the leader may differ from `seen` (a watch fired, the session ended),
    /// or with the error that ends the observation. Returning early is harmless: the
    /// follower reads the leader again and waits again if nothing changed.
    async fn changed(&self, seen: &Option<LeaderInfo>) -> Result<(), LockError>;
}

#[async_trait]
impl<T: LeaderSource> LeaderSource for Arc<T> {
    async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        T::leader(self).await
    }

    async fn changed(&self, seen: &Option<LeaderInfo>) -> Result<(), LockError> {
        T::changed(self, seen).await
    }
}

/// Starts a follower of `source` on the current Tokio runtime and returns its watch: the
/// implementation of [`Election::observe`] for a backend that can read its leader and wait
/// for a change. `backend` and `name` go into errors.
///
/// # Errors
///
/// The first read's error; and [`LockError::InvalidArgument`] without a Tokio runtime.
pub async fn follow(
    source: impl LeaderSource,
    backend: &'static str,
    name: &LockName,
) -> Result<LeaderWatch, LockError> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Err(LockError::InvalidArgument {
            backend,
            message: format!(
                "observing election {:?} needs a Tokio runtime",
                name.as_str()
            ),
        });
    };
    let first = source.leader().await?;
    let (sender, receiver) = watch::channel(Ok(first));
    runtime.spawn(async move {
        loop {
            let seen = match &*sender.borrow() {
                Ok(seen) => seen.clone(),
                Err(_) => return,
            };
            let next = tokio::select! {
                () = sender.closed() => return,
                changed = source.changed(&seen) => match changed {
                    Ok(()) => source.leader().await,
                    Err(err) => Err(err),
                },
            };
            let next = next.map_err(Arc::new);
            sender.send_if_modified(|now| {
                let differs = match (&*now, &next) {
                    (Ok(now), Ok(next)) => now != next,
                    _ => true,
                };
                if differs {
                    *now = next;
                }
                differs
            });
        }
    });
    Ok(LeaderWatch {
        seen: receiver,
        backend,
        name: name.clone(),
    })
}

/// The longest value a candidate may campaign with: 64 KiB. Values are read by every
/// observer on every change; an address or a small JSON document fits with room to spare.
pub const MAX_LEADER_VALUE_LEN: usize = 64 * 1024;

/// [`LockError::InvalidArgument`] for a value longer than [`MAX_LEADER_VALUE_LEN`].
///
/// # Errors
///
/// As above.
pub fn check_value(backend: &'static str, name: &LockName, value: &[u8]) -> Result<(), LockError> {
    if value.len() > MAX_LEADER_VALUE_LEN {
        return Err(LockError::InvalidArgument {
            backend,
            message: format!(
                "election {:?}: a value of {} bytes; at most {MAX_LEADER_VALUE_LEN} are allowed",
                name.as_str(),
                value.len()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_info_shows_its_value() {
        let info = LeaderInfo::new("host-a", FencingToken(7));
        assert_eq!(info.value_lossy(), "host-a");
        assert_eq!(
            LeaderInfo::new(vec![0xff], FencingToken(1)).value_lossy(),
            "\u{fffd}"
        );
    }

    /// A source whose leader is whatever the test last put in.
    struct Scripted(watch::Receiver<Result<Option<LeaderInfo>, &'static str>>);

    #[async_trait]
    impl LeaderSource for Scripted {
        async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
            self.0
                .borrow()
                .clone()
                .map_err(|message| LockError::Connection {
                    backend: "test",
                    name: None,
                    message: message.to_owned(),
                    source: Some("the cause".into()),
                })
        }

        async fn changed(&self, _seen: &Option<LeaderInfo>) -> Result<(), LockError> {
            let mut next = self.0.clone();
            let _ = next.changed().await;
            Ok(())
        }
    }

    #[tokio::test]
    async fn observers_see_every_latest_leader_then_the_final_error() {
        let (script, source) = watch::channel(Ok(None));
        let name = LockName::new("svc").unwrap();
        let mut watch = follow(Scripted(source), "test", &name).await.unwrap();
        assert_eq!(watch.current().unwrap(), None);
        let a = LeaderInfo::new("a", FencingToken(1));
        script.send(Ok(Some(a.clone()))).unwrap();
        assert_eq!(watch.changed().await.unwrap(), Some(a));
        // Two changes before a read: the latest is seen.
        script.send(Ok(None)).unwrap();
        let b = LeaderInfo::new("b", FencingToken(2));
        script.send(Ok(Some(b.clone()))).unwrap();
        let seen = watch.wait_for(|leader| leader == Some(&b)).await.unwrap();
        assert_eq!(seen, Some(b));
        script.send(Err("down")).unwrap();
        let ended = watch.changed().await.unwrap_err();
        assert!(ended.to_string().contains("down"), "{ended}");
        let cause = std::error::Error::source(&ended).map(ToString::to_string);
        assert_eq!(cause.as_deref(), Some("the cause"));
        // For good, in every clone.
        assert!(watch.changed().await.is_err());
        assert!(watch.clone().current().is_err());
    }

    #[tokio::test]
    async fn the_stream_starts_with_the_current_leader_and_ends_after_the_error() {
        let a = LeaderInfo::new("a", FencingToken(1));
        let (script, source) = watch::channel(Ok(Some(a.clone())));
        let name = LockName::new("svc").unwrap();
        let watch = follow(Scripted(source), "test", &name).await.unwrap();
        let mut leaders = watch.into_stream();
        assert_eq!(leaders.next().await.unwrap().unwrap(), Some(a));
        let b = LeaderInfo::new("b", FencingToken(2));
        script.send(Ok(Some(b.clone()))).unwrap();
        assert_eq!(leaders.next().await.unwrap().unwrap(), Some(b));
        script.send(Err("down")).unwrap();
        let ended = leaders.next().await.unwrap().unwrap_err();
        assert!(ended.to_string().contains("down"), "{ended}");
        assert!(
            leaders.next().await.is_none(),
            "the stream ends after the error"
        );
    }
}
