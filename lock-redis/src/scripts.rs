//! The Lua scripts, one `.lua` file each in `scripts/`: every state change of a lock is one
//! script, so it is atomic on the server. Each script names its `KEYS` and `ARGV` positions
//! in locals at its top.
//!
//! The queue scripts (`ATTEMPT`, `RELEASE`, `CANCEL`) start with `handoff.lua`, which names
//! the five keys they all take, in this order (all with the lock's hash tag): the owner, the
//! fencing counter, the waiter queue (a list of owner ids), the waiters' deadlines (a hash:
//! owner id → server time in ms) and the receipt of the last release (its owner id, kept for
//! a lease's length). Their arguments are `id, ttl, liveness, prefix, mode, channel, claim`
//! (see `RedisLock::queue_args`), and `ATTEMPT` adds `queue`. A waiter's own list, where a
//! hand-off pushes its token, is `prefix .. id`.
//!
//! An id is in the queue at most once (it joins only when not found there), so removing it
//! stops at its one occurrence.

use std::sync::LazyLock;

use redis::Script;

/// The keys and the hand-off shared by the queue scripts.
const HANDOFF: &str = include_str!("scripts/handoff.lua");

/// A queue script: `handoff.lua`, then `body`.
fn with_handoff(body: &str) -> Script {
    Script::new(&format!("{HANDOFF}\n{body}"))
}

/// `GRANT(id, ttl)` → token, or 0 when held: the polling and pub/sub strategies' grant.
pub(crate) static GRANT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/grant.lua")));

/// `VOTE(id, ttl)` → `{token, ""}` or `{0, holder}`: Redlock's grant on one server.
pub(crate) static VOTE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/vote.lua")));

/// `ATTEMPT(…, queue)` → token, 0, or -1: the queue strategy's grant and a waiter's refresh.
pub(crate) static ATTEMPT: LazyLock<Script> =
    LazyLock::new(|| with_handoff(include_str!("scripts/attempt.lua")));

/// `RELEASE(…)` → 1 released, 0 not the owner; then the waiters are told.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| with_handoff(include_str!("scripts/release.lua")));

/// `CANCEL(…)` → 1 if a grant had raced the cancel and was passed on, else 0.
pub(crate) static CANCEL: LazyLock<Script> =
    LazyLock::new(|| with_handoff(include_str!("scripts/cancel.lua")));

/// `EXTEND(id, ttl)` on the owner key and the release receipt → 1 renewed, 2 released
/// already, 0 gone or someone else's.
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/extend.lua")));
