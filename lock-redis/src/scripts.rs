//! The Lua scripts: every state change of a lock is one script, so it is atomic on the
//! server.
//!
//! Keys, always in this order (all share the lock's hash tag): `KEYS[1]` owner,
//! `KEYS[2]` fencing counter, `KEYS[3]` waiter queue (a list of owner ids), `KEYS[4]`
//! waiter deadlines (a hash: owner id → server-TIME milliseconds), `KEYS[5]` the receipt
//! of the last release (its owner id, for a lease's length). A waiter's own list,
//! where a handoff pushes its token, is `ARGV[waiter prefix] .. id`.
//!
//! An id is in the queue at most once (it joins only when not found there), so removing it
//! stops at its one occurrence.

use std::sync::LazyLock;

use redis::Script;

/// Lua shared by the scripts that hand the lock on.
///
/// `handoff(claim, liveness, prefix, now)`: gives the lock to the first live waiter: sets
/// the owner key to its id with the short `claim` lease (the waiter renews it to the full
/// ttl once it has the token, so a waiter that died since its last refresh holds the lock
/// for no longer than that), bumps the counter, pushes the token onto its list. Waiters
/// whose deadline passed are dropped on the way.
const HANDOFF: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function handoff(claim, liveness, prefix, now)
  while true do
    local head = redis.call('LPOP', KEYS[3])
    if not head then return false end
    local deadline = redis.call('HGET', KEYS[4], head)
    redis.call('HDEL', KEYS[4], head)
    if deadline and tonumber(deadline) >= now then
      redis.call('SET', KEYS[1], head, 'PX', claim)
      local token = redis.call('INCR', KEYS[2])
      redis.call('RPUSH', prefix .. head, token)
      redis.call('PEXPIRE', prefix .. head, liveness)
      return head
    end
    redis.call('DEL', prefix .. head)
  end
end
"#;

/// `GRANT(id, ttl)` → token, or 0 when held. The plain grant of the polling and pub/sub
/// strategies and of Redlock: the owner key only if absent, and the counter in the same
/// call. Idempotent for one owner id: a retry after a lost reply finds its own grant.
pub(crate) static GRANT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]))
end
if owner then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('INCR', KEYS[2])
"#,
    )
});

/// `VOTE(id, ttl)` → `{token, ""}` when the key is (now) ours, `{0, holder}` when someone
/// else's: Redlock's grant on one server, telling who holds it so that split votes can be
/// settled.
pub(crate) static VOTE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {tonumber(redis.call('GET', KEYS[2])), ''}
end
if owner then return {0, owner} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {redis.call('INCR', KEYS[2]), ''}
"#,
    )
});

/// `ATTEMPT(id, ttl, liveness, prefix, mode, channel, claim, queue)` → token, or 0. The queue strategy's grant
/// and the waiter's periodic refresh in one:
///
/// - already the owner (a handoff raced the caller's wait): take the token from the list;
/// - the lock free and nobody (live) ahead: take it, leaving the queue;
/// - the lock free with a live waiter ahead (its holder's lease ran out): hand it to that
///   waiter;
/// - otherwise, with `queue` = 1, join the queue; with `queue` = 2 (a waiter's refresh),
///   stay in it, or return -1 when one's place is gone (deleted by someone, or dropped as
///   dead after refreshing too late); either way push one's deadline to server time +
///   liveness.
pub(crate) static ATTEMPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{HANDOFF}
local id, ttl, liveness, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
if redis.call('GET', KEYS[1]) == id then
  -- A hand-off this waiter had not picked up: its lease restarts now.
  redis.call('PEXPIRE', KEYS[1], ttl)
  local token = redis.call('LPOP', prefix .. id)
  redis.call('DEL', prefix .. id)
  redis.call('LREM', KEYS[3], 1, id)
  redis.call('HDEL', KEYS[4], id)
  return tonumber(token) or tonumber(redis.call('GET', KEYS[2]))
end
-- Drop dead waiters at the head, so that they keep nobody out.
while true do
  local head = redis.call('LINDEX', KEYS[3], 0)
  if not head then break end
  local deadline = redis.call('HGET', KEYS[4], head)
  if head == id or (deadline and tonumber(deadline) >= now) then break end
  redis.call('LPOP', KEYS[3])
  redis.call('HDEL', KEYS[4], head)
  redis.call('DEL', prefix .. head)
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('LINDEX', KEYS[3], 0)
  if not head or head == id then
    redis.call('SET', KEYS[1], id, 'PX', ttl)
    redis.call('LREM', KEYS[3], 1, id)
    redis.call('HDEL', KEYS[4], id)
    return redis.call('INCR', KEYS[2])
  end
  handoff(ARGV[7], liveness, prefix, now)
end
-- The list, not the deadline hash, says whether one is queued: an entry removed by
-- someone else must be noticed.
local queued = redis.call('LPOS', KEYS[3], id)
if ARGV[8] == '1' then
  if not queued then redis.call('RPUSH', KEYS[3], id) end
elseif ARGV[8] == '2' then
  if not queued then
    redis.call('HDEL', KEYS[4], id)
    return -1
  end
else
  return 0
end
redis.call('HSET', KEYS[4], id, now + tonumber(liveness))
return 0
"#
    ))
});

/// `RELEASE(id, ttl, liveness, prefix, mode, channel, claim)` → 1 released, 0 not the owner.
/// Compare-and-delete, leaving a receipt so that the same release sent again (its reply
/// was lost) answers 1 too; then `mode` `queue` hands the lock to the first live waiter,
/// `pubsub` broadcasts on `channel`.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{HANDOFF}
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if redis.call('GET', KEYS[5]) == ARGV[1] then return 1 end
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[5], ARGV[1], 'PX', ARGV[2])
if ARGV[5] == 'queue' then
  handoff(ARGV[7], ARGV[3], ARGV[4], now_ms())
elseif ARGV[5] == 'pubsub' then
  redis.call('PUBLISH', ARGV[6], '1')
end
return 1
"#
    ))
});

/// `CANCEL(id, ttl, liveness, prefix, mode, channel, claim)` → 1 if a grant had raced the cancel
/// and was passed on, else 0. Removes the waiter from the queue, its deadline and its list.
pub(crate) static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{HANDOFF}
local id, prefix = ARGV[1], ARGV[4]
redis.call('LREM', KEYS[3], 1, id)
redis.call('HDEL', KEYS[4], id)
redis.call('DEL', prefix .. id)
if redis.call('GET', KEYS[1]) ~= id then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[5] == 'queue' then
  handoff(ARGV[7], ARGV[3], prefix, now_ms())
elseif ARGV[5] == 'pubsub' then
  redis.call('PUBLISH', ARGV[6], '1')
end
return 1
"#
    ))
});

/// `EXTEND(id, ttl)` on `KEYS[1]` owner, `KEYS[2]` release receipt → 1 renewed, 2 this
/// owner released it already (a release whose reply was lost), 0 gone or someone else's.
/// Compare-and-pexpire.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if redis.call('GET', KEYS[2]) == ARGV[1] then return 2 end
return 0
"#,
    )
});
