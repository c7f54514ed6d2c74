-- ATTEMPT(id, ttl, liveness, prefix, mode, channel, claim, values, queue[, value]) -> a
-- token, 0, or -1.
-- The queue strategy's grant and a waiter's refresh in one (after handoff.lua):
--   already the owner (a hand-off raced the caller's wait): take the token from the list;
--   the lock free and nobody live ahead: take it, leaving the queue;
--   the lock free with a live waiter ahead (its holder's lease ran out): hand it over;
--   otherwise, with queue = '1', join the queue; with queue = '2' (a waiter's refresh), stay
--   in it, or answer -1 when one's place is gone (deleted by someone, or dropped as dead
--   after refreshing too late, or an election candidate's value gone); either way push
--   one's deadline to now + liveness.
-- An election candidate passes its value when it joins or tries (a refresh keeps it), kept
-- in `values .. id` as long as its place (liveness) or its lease (ttl), whichever is
-- longer, and dropped when it gives up.
local id, ttl, liveness, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local claim, queue, value = ARGV[7], ARGV[9], ARGV[10]

if values ~= '' and value then
  redis.call('SET', values .. id, value, 'PX', math.max(tonumber(ttl), tonumber(liveness)))
end

local now = now_ms()
if redis.call('GET', owner_key) == id then
  -- A hand-off this waiter had not picked up: its lease restarts now.
  redis.call('PEXPIRE', owner_key, ttl)
  local token = redis.call('LPOP', prefix .. id)
  redis.call('DEL', prefix .. id)
  redis.call('LREM', queue_key, 1, id)
  redis.call('HDEL', deadlines_key, id)
  return tonumber(token) or tonumber(redis.call('GET', counter_key))
end
-- A candidate's value lasts as long as its place. A refresh that finds it gone (a failover
-- lost it, the refreshes stopped for longer) gives the place up: leading without it would
-- announce an empty value.
if queue == '2' and values ~= '' and redis.call('EXISTS', values .. id) == 0 then
  redis.call('LREM', queue_key, 1, id)
  redis.call('HDEL', deadlines_key, id)
  redis.call('DEL', prefix .. id)
  return -1
end
-- Drop dead waiters at the head, so that they keep nobody out.
while true do
  local head = redis.call('LINDEX', queue_key, 0)
  if not head then break end
  local deadline = redis.call('HGET', deadlines_key, head)
  if head == id or (deadline and tonumber(deadline) >= now) then break end
  redis.call('LPOP', queue_key)
  redis.call('HDEL', deadlines_key, head)
  redis.call('DEL', prefix .. head)
  drop_value(head)
end
if redis.call('EXISTS', owner_key) == 0 then
  local head = redis.call('LINDEX', queue_key, 0)
  if not head or head == id then
    redis.call('SET', owner_key, id, 'PX', ttl)
    succeed(id)
    redis.call('LREM', queue_key, 1, id)
    redis.call('HDEL', deadlines_key, id)
    return redis.call('INCR', counter_key)
  end
  handoff(claim, liveness, prefix, now)
end
-- The list, not the deadline hash, says whether one is queued: an entry removed by
-- someone else must be noticed.
local queued = redis.call('LPOS', queue_key, id)
if queue == '1' then
  if not queued then
    -- A new place starts with an empty list: a token left there (a hand-off whose claim
    -- lapsed while this join's reply was lost) is no grant.
    redis.call('DEL', prefix .. id)
    redis.call('RPUSH', queue_key, id)
  end
elseif queue == '2' then
  if not queued then
    redis.call('HDEL', deadlines_key, id)
    drop_value(id)
    return -1
  end
else
  drop_value(id)
  return 0
end
redis.call('HSET', deadlines_key, id, now + tonumber(liveness))
keep_value(id, math.max(tonumber(ttl), tonumber(liveness)))
-- The queue outlives its last live waiter by no more than that waiter's liveness: waiters
-- that all died (their server restarted under them, their process was killed) leave
-- nothing behind for good. Only lengthened, never shortened, by a waiter.
for _, key in ipairs({queue_key, deadlines_key}) do
  if redis.call('PTTL', key) < tonumber(liveness) then
    redis.call('PEXPIRE', key, liveness)
  end
end
return 0
