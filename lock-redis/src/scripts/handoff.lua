-- Shared by the scripts that hand the lock on (ATTEMPT, RELEASE, CANCEL): the keys, in the
-- order every one of them is given them (all share the lock's hash tag), and the hand-off.
local owner_key = KEYS[1]     -- the holder's owner id; its expiry is the lease
local counter_key = KEYS[2]   -- the fencing counter
local queue_key = KEYS[3]     -- the waiters' owner ids, first come first
local deadlines_key = KEYS[4] -- owner id -> server time (ms) until which the waiter is live
local receipt_key = KEYS[5]   -- the owner id of the last release
-- The prefix of election candidates' values, `values .. id`; '' for a lock. Every script
-- that hands the lock on takes it as ARGV[8].
local values = ARGV[8]

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Who led last, while its value may outlive its lease (see `succeed`): `{…}:leader`.
local function last_leader_key()
  return string.sub(values, 1, -3) .. 'leader'
end

-- An election candidate's value: kept for `ms` more, or dropped.
local function keep_value(id, ms)
  if values ~= '' then redis.call('PEXPIRE', values .. id, ms) end
end
local function drop_value(id)
  if values == '' then return end
  redis.call('DEL', values .. id)
  local last_key = last_leader_key()
  if redis.call('GET', last_key) == id then redis.call('DEL', last_key) end
end

-- `id` now holds the owner key. The leader before it resigned (its value went with it) or
-- its lease ran out; a leader's value and lease run out together once it has renewed, but
-- one handed the lock that died before renewing leaves a value that outlives its short
-- claim: that value goes now, found through `{…}:leader`, which lives no longer than the
-- value it points to.
local function succeed(id)
  if values == '' then return end
  local last_key = last_leader_key()
  local before = redis.call('GET', last_key)
  if before and before ~= id then redis.call('DEL', values .. before) end
  local left = redis.call('PTTL', values .. id)
  if left > 0 then
    redis.call('SET', last_key, id, 'PX', left)
  else
    redis.call('DEL', last_key)
  end
end

-- Gives the lock to the first live waiter: the owner key becomes its id with the short
-- `claim` lease (the waiter renews it to the full ttl once it has the token, so a waiter
-- that died since its last refresh holds the lock no longer than that), the counter goes
-- up, and the token is pushed onto the waiter's own list. Dead waiters, and candidates
-- whose value is gone (see attempt.lua), are dropped on the way. Returns the new owner's
-- id, or false when nobody waits.
local function handoff(claim, liveness, prefix, now)
  while true do
    local head = redis.call('LPOP', queue_key)
    if not head then return false end
    local deadline = redis.call('HGET', deadlines_key, head)
    redis.call('HDEL', deadlines_key, head)
    if deadline and tonumber(deadline) >= now
        and (values == '' or redis.call('EXISTS', values .. head) == 1) then
      redis.call('SET', owner_key, head, 'PX', claim)
      succeed(head)
      local token = redis.call('INCR', counter_key)
      redis.call('RPUSH', prefix .. head, token)
      redis.call('PEXPIRE', prefix .. head, liveness)
      return head
    end
    redis.call('DEL', prefix .. head)
    drop_value(head)
  end
end

-- Tells the waiters the lock is free, the way the strategy `mode` waits.
local function announce(mode, claim, liveness, prefix, channel)
  if mode == 'queue' then
    handoff(claim, liveness, prefix, now_ms())
  elseif mode == 'pubsub' then
    redis.call('PUBLISH', channel, '1')
  elseif mode == 'spubsub' then
    redis.call('SPUBLISH', channel, '1')
  end
end
