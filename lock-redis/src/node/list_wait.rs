//! A queue waiter's blocking wait on its own list.

use std::time::Duration;

use lock_core::LockError;

use super::{Blocking, Node};

/// Pause before a waiter whose blocking wait failed goes on (to its next refresh).
const AFTER_FAILED_WAIT: Duration = Duration::from_millis(100);

/// A queue waiter's blocking pops (`BLPOP`) on its own list, over a dedicated connection
/// kept from one wait to the next and given back to the node when the waiter is done. A
/// connection whose request was abandoned (a timeout, a cancelled wait) is never given
/// back: the server may still be blocked on it.
pub(crate) struct ListWait<'n> {
    node: &'n Node,
    /// The lock's name, for errors.
    name: &'n str,
    /// The connection of the last wait, which completed.
    connection: Option<Blocking>,
}

impl Node {
    /// The blocking waits of a waiter of the lock `name`.
    pub(crate) fn list_wait<'n>(&'n self, name: &'n str) -> ListWait<'n> {
        ListWait {
            node: self,
            name,
            connection: None,
        }
    }
}

impl ListWait<'_> {
    /// Pops `list`, blocking for up to `wait`: the token a hand-off pushed onto it, or
    /// `None` when nothing came in time or the wait failed in a way that the waiter's next
    /// refresh rides out (the server went away, or stopped being the primary: a demoted
    /// primary unblocks its waiters with `UNBLOCKED` and refuses with `READONLY`).
    ///
    /// # Errors
    ///
    /// A refusal that waiting again would not change (an ACL without `BLPOP`, say).
    pub(crate) async fn pop(
        &mut self,
        list: &str,
        wait: Duration,
    ) -> Result<Option<u64>, LockError> {
        // A connection to a server that is no longer the primary would block on a list
        // that no hand-off reaches.
        let kept = self
            .connection
            .take()
            .filter(|kept| self.node.is_current(kept));
        let mut blocking = match kept {
            Some(kept) => kept,
            None => match self.node.dedicated(self.name).await {
                Ok(dedicated) => dedicated,
                Err(error) if error.is_retryable() => {
                    tokio::time::sleep(AFTER_FAILED_WAIT).await;
                    return Ok(None);
                }
                Err(error) => return Err(error),
            },
        };
        let mut blpop = redis::cmd("BLPOP");
        blpop
            .arg(list)
            .arg(format!("{:.3}", wait.as_secs_f64().max(0.001)));
        self.node.0.settings.metrics.record_server_requests(1);
        let budget = wait + self.node.timeout();
        let popping = blpop.query_async::<Option<(String, u64)>>(&mut blocking.connection);
        match tokio::time::timeout(budget, popping).await {
            Ok(Ok(popped)) => {
                self.connection = Some(blocking);
                Ok(popped.map(|(_, token)| token))
            }
            Ok(Err(error)) => {
                self.node.failed_on(&blocking, &error);
                let error = self.node.lock_error(error, Some(self.name));
                if !error.is_retryable() {
                    return Err(error);
                }
                tracing::debug!(lock = %self.name, %error, "redis: blocking wait failed; reconnecting");
                tokio::time::sleep(AFTER_FAILED_WAIT).await;
                Ok(None)
            }
            // The reply may still come on this connection, which goes with it: the next
            // `ATTEMPT` picks up a grant it carried.
            Err(_) => Ok(None),
        }
    }

    /// Lets the kept connection go: the next wait opens another (after a refresh failed,
    /// the server it reaches may be gone).
    pub(crate) fn reconnect(&mut self) {
        self.connection = None;
    }
}

impl Drop for ListWait<'_> {
    /// Done waiting: a connection whose last request completed goes back to the node.
    fn drop(&mut self) {
        if let Some(done) = self.connection.take() {
            self.node.give_back(done);
        }
    }
}
