//! The Lua scripts, one `.lua` file each in `scripts/`: every state change of a lock is one
//! script, so it is atomic on the server. Each script names its `KEYS` and `ARGV` positions
//! in locals at its top.
//!
//! The queue scripts (`ATTEMPT`, `RELEASE`, `CANCEL`) start with `handoff.lua`, and the
//! permit scripts (`PERMIT_*`, for read-write locks and semaphores) with `permits.lua`: the
//! keys they all take, in order, and what they share are named there; [`queue`] and
//! [`permits`] pass the arguments. A waiter's own list, where a hand-off pushes its token, is
//! `prefix .. id`. An id is in the queue at most once (it joins only when not found there),
//! so removing it stops at its one occurrence.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, ScriptInvocation};

use crate::keys::LockKeys;

/// The keys and the hand-off shared by the queue scripts.
const HANDOFF: &str = include_str!("scripts/handoff.lua");

/// The keys and the admission shared by the permit scripts.
const PERMITS: &str = include_str!("scripts/permits.lua");

/// A script made of a shared `prelude` (`HANDOFF` or `PERMITS`), then `body`.
fn after(prelude: &str, body: &str) -> Script {
    Script::new(&format!("{prelude}\n{body}"))
}

/// `GRANT(id, ttl)` → `{token, ""}` or `{0, holder}`: the polling and pub/sub strategies'
/// grant, and Redlock's vote on one server.
pub(crate) static GRANT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/grant.lua")));

/// `ATTEMPT(…, queue)` → token, 0, or -1: the queue strategy's grant and a waiter's refresh.
pub(crate) static ATTEMPT: LazyLock<Script> =
    LazyLock::new(|| after(HANDOFF, include_str!("scripts/attempt.lua")));

/// `RELEASE(…)` → 1 released, 0 not the owner; then the waiters are told.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| after(HANDOFF, include_str!("scripts/release.lua")));

/// `CANCEL(…)` → 1 if a grant had raced the cancel and was passed on, else 0.
pub(crate) static CANCEL: LazyLock<Script> =
    LazyLock::new(|| after(HANDOFF, include_str!("scripts/cancel.lua")));

/// `EXTEND(id, ttl)` on the owner key and the release receipt → 1 renewed, 2 released
/// already, 0 gone or someone else's.
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/extend.lua")));

/// `RAISE(token)` on the fencing counter → 1: Redlock's second round.
pub(crate) static RAISE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/raise.lua")));

/// `LEADER(values)` → `{owner id, value, fencing counter}`, or nil: who leads an election.
pub(crate) static LEADER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/leader.lua")));

/// `PERMIT_ATTEMPT(…, queue, weight)` → token, 0, or -1: a read-write lock's or
/// semaphore's grant and a waiter's refresh.
pub(crate) static PERMIT_ATTEMPT: LazyLock<Script> =
    LazyLock::new(|| after(PERMITS, include_str!("scripts/permit_attempt.lua")));

/// `PERMIT_RELEASE(…)` → 1 released, 0 not a holder; then whoever fits is admitted.
pub(crate) static PERMIT_RELEASE: LazyLock<Script> =
    LazyLock::new(|| after(PERMITS, include_str!("scripts/permit_release.lua")));

/// `PERMIT_CANCEL(…)` → 1 if an admission had raced the cancel and was passed on, else 0.
pub(crate) static PERMIT_CANCEL: LazyLock<Script> =
    LazyLock::new(|| after(PERMITS, include_str!("scripts/permit_cancel.lua")));

/// `PERMIT_EXTEND(…)` → 1 renewed, 2 released already, 0 gone.
pub(crate) static PERMIT_EXTEND: LazyLock<Script> =
    LazyLock::new(|| after(PERMITS, include_str!("scripts/permit_extend.lua")));

/// A duration as the scripts take it: whole milliseconds.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `GRANT(id, ttl)` on the lock's owner key and fencing counter.
pub(crate) fn grant(keys: &LockKeys, id: &str, ttl: Duration) -> ScriptInvocation<'static> {
    let mut invocation = GRANT.prepare_invoke();
    invocation
        .key(&keys.owner)
        .key(&keys.fence)
        .arg(id)
        .arg(millis(ttl));
    invocation
}

/// `RAISE(token)` on the lock's fencing counter.
pub(crate) fn raise(keys: &LockKeys, token: u64) -> ScriptInvocation<'static> {
    let mut invocation = RAISE.prepare_invoke();
    invocation.key(&keys.fence).arg(token);
    invocation
}

/// `EXTEND` of `id`'s lease, and of its value when it is an election candidate.
pub(crate) fn extend(
    keys: &LockKeys,
    id: &str,
    ttl: Duration,
    candidate: bool,
) -> ScriptInvocation<'static> {
    let mut invocation = EXTEND.prepare_invoke();
    invocation.key(&keys.owner).key(&keys.released);
    if candidate {
        invocation.key(format!("{}{id}", keys.value_prefix));
    }
    invocation.arg(id).arg(millis(ttl));
    invocation
}

/// `LEADER`: the owner id, its value and the fencing counter, or nothing.
pub(crate) fn leader(keys: &LockKeys) -> ScriptInvocation<'static> {
    let mut invocation = LEADER.prepare_invoke();
    invocation
        .key(&keys.owner)
        .key(&keys.fence)
        .arg(&keys.value_prefix);
    invocation
}

/// What the queue scripts take after the owner id, but for the keys' names.
pub(crate) struct QueueArgs {
    /// The lease.
    pub(crate) ttl: Duration,
    /// How long a waiter that stopped refreshing keeps its place.
    pub(crate) liveness: Duration,
    /// How a release tells the waiters: `queue` (a hand-off), `pubsub` (a broadcast),
    /// `spubsub` (a sharded broadcast, on a cluster), or anything else for not at all.
    pub(crate) mode: &'static str,
    /// The lease a hand-off gives the waiter until it has picked the token up.
    pub(crate) claim: Duration,
    /// Whether the contender is an election candidate, whose value the scripts keep.
    pub(crate) candidate: bool,
}

/// A queue script (`ATTEMPT`, `RELEASE`, `CANCEL`) for owner `id` on the lock's five keys.
pub(crate) fn queue(
    script: &'static Script,
    keys: &LockKeys,
    id: &str,
    args: &QueueArgs,
) -> ScriptInvocation<'static> {
    let mut invocation = script.prepare_invoke();
    for key in keys.script_keys() {
        invocation.key(key);
    }
    invocation
        .arg(id)
        .arg(millis(args.ttl))
        .arg(millis(args.liveness))
        .arg(&keys.waiter_prefix)
        .arg(args.mode)
        .arg(&keys.channel)
        .arg(millis(args.claim))
        .arg(if args.candidate {
            keys.value_prefix.as_str()
        } else {
            ""
        });
    invocation
}

/// A permit script (`PERMIT_ATTEMPT`, `PERMIT_RELEASE`, `PERMIT_CANCEL`, `PERMIT_EXTEND`)
/// for holder or waiter `id` on the six keys: `id, ttl, liveness, prefix, claim, capacity`
/// (`PERMIT_ATTEMPT` takes two more).
pub(crate) fn permits(
    script: &'static Script,
    keys: &LockKeys,
    id: &str,
    args: &QueueArgs,
    capacity: u64,
) -> ScriptInvocation<'static> {
    let mut invocation = script.prepare_invoke();
    for key in keys.script_keys() {
        invocation.key(key);
    }
    invocation
        .key(&keys.weights)
        .arg(id)
        .arg(millis(args.ttl))
        .arg(millis(args.liveness))
        .arg(&keys.waiter_prefix)
        .arg(millis(args.claim))
        .arg(capacity);
    invocation
}
