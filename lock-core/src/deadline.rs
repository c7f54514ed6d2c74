//! Turning an `acquire` timeout into a deadline.

use std::time::Duration;

use tokio::time::Instant;

/// The deadline of one `acquire` call.
///
/// `None` waits forever; `Some(Duration::ZERO)` makes one attempt and never waits; a timeout
/// too large to add to the clock (up to `Duration::MAX`) is treated as no deadline rather
/// than an overflow.
///
/// ```
/// use std::time::Duration;
/// use lock_core::Deadline;
///
/// assert!(Deadline::after(Some(Duration::ZERO)).is_immediate());
/// assert!(Deadline::after(Some(Duration::MAX)).instant().is_none());
/// assert!(Deadline::after(None).remaining().is_none());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    timeout: Option<Duration>,
    at: Option<Instant>,
}

impl Deadline {
    /// The deadline `timeout` from now.
    pub fn after(timeout: Option<Duration>) -> Self {
        let at = timeout.and_then(|t| Instant::now().checked_add(t));
        Deadline { timeout, at }
    }

    /// The timeout this deadline was made from.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The deadline, if there is one the clock can represent.
    pub fn instant(&self) -> Option<Instant> {
        self.at
    }

    /// Whether the caller asked for a single attempt (`Some(Duration::ZERO)`).
    pub fn is_immediate(&self) -> bool {
        self.timeout == Some(Duration::ZERO)
    }

    /// Time left, zero once passed; `None` without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.at
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// `wait`, or the time left if that is shorter: how long a pause may last.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::Deadline;
    ///
    /// let second = Duration::from_secs(1);
    /// assert_eq!(Deadline::after(None).cap(second), second);
    /// assert_eq!(Deadline::after(Some(Duration::ZERO)).cap(second), Duration::ZERO);
    /// ```
    pub fn cap(&self, wait: Duration) -> Duration {
        self.remaining().map_or(wait, |left| left.min(wait))
    }

    /// Whether the deadline has passed.
    pub fn has_passed(&self) -> bool {
        self.at.is_some_and(|at| Instant::now() >= at)
    }

    /// Completes at the deadline; never without one.
    ///
    /// Cancel safety: cancel-safe, it only sleeps.
    pub async fn sleep(&self) {
        match self.at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}
