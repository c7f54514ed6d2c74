-- PERMIT_ATTEMPT(id, ttl, liveness, prefix, claim, capacity, queue, weight) -> a token, 0,
-- or -1 (after permits.lua). Like the mutex's ATTEMPT:
--   admitted (now, or by a hand-off the caller had not picked up): its lease restarts now
--   and it takes its token from its list;
--   nobody waiting and `weight` fits: take the permits;
--   otherwise, with queue = '1', join the queue; with queue = '2' (a waiter's refresh),
--   stay in it, or answer -1 when one's place is gone; either way push one's deadline to
--   now + liveness.
local queue, weight = ARGV[7], tonumber(ARGV[8])

local used = admit(in_use())
if holds(id) then
  hold(id, ttl)
  local token = redis.call('LPOP', prefix .. id)
  redis.call('LREM', queue_key, 1, id)
  forget_waiter(id)
  -- A hand-off's token list outlives its claim, so it is there; should it not be, a new
  -- token is as good (it is above every one granted).
  return tonumber(token) or redis.call('INCR', counter_key)
end
local queued = redis.call('LPOS', queue_key, id)
if not queued and redis.call('LLEN', queue_key) == 0 and used + weight <= capacity then
  redis.call('HSET', weights_key, id, weight)
  hold(id, ttl)
  return redis.call('INCR', counter_key)
end
if queue == '1' then
  if not queued then
    -- A new place starts with an empty list: a token left there (a hand-off whose claim
    -- lapsed while this join's reply was lost) is no grant.
    redis.call('DEL', prefix .. id)
    redis.call('RPUSH', queue_key, id)
  end
elseif queue == '2' then
  if not queued then
    redis.call('HDEL', weights_key, id)
    forget_waiter(id)
    return -1
  end
else
  return 0
end
redis.call('HSET', weights_key, id, weight)
redis.call('HSET', deadlines_key, id, now + liveness)
for _, key in ipairs({queue_key, deadlines_key, weights_key}) do keep(key, liveness) end
return 0
