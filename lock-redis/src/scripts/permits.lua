-- Shared by the permit scripts (read-write locks and semaphores): the keys, in the order
-- every one of them is given them (all share the lock's hash tag), and admission.
--
-- One core for both: a holder takes `weight` of `capacity` permits. A semaphore of N has
-- capacity N and weight 1; a read-write lock has a capacity no count of readers reaches,
-- a reader weighing 1 and a writer the whole capacity. Waiters are admitted first come,
-- first served: a head that does not fit keeps everyone behind it waiting (a waiting
-- writer holds back later readers).
local holders_key = KEYS[1]   -- holder id -> server time (ms) its lease ends (sorted set)
local counter_key = KEYS[2]   -- the fencing counter
local queue_key = KEYS[3]     -- the waiters' ids, first come first
local deadlines_key = KEYS[4] -- waiter id -> server time (ms) until which it is live
local receipts_key = KEYS[5]  -- released holder id -> server time (ms) the receipt lasts
local weights_key = KEYS[6]   -- holder or waiter id -> the permits it takes
local id, ttl, liveness = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local prefix, claim, capacity = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local now = now_ms()

-- Lets `key` live `ms` more at least: only lengthened, so that it outlives every entry.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

local function holds(who)
  local ends = redis.call('ZSCORE', holders_key, who)
  return ends and tonumber(ends) >= now
end

local function hold(who, ms)
  redis.call('ZADD', holders_key, now + ms, who)
  keep(holders_key, ms)
  keep(weights_key, math.max(ttl, liveness))
end

-- Drops holders whose lease ran out and stale receipts; the permits the others take.
local function in_use()
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', holders_key, '-inf', '(' .. now)) do
    redis.call('ZREM', holders_key, gone)
    redis.call('HDEL', weights_key, gone)
    -- A token its claim lapsed on, never picked up, must not be taken for a grant later.
    redis.call('DEL', prefix .. gone)
  end
  redis.call('ZREMRANGEBYSCORE', receipts_key, '-inf', '(' .. now)
  local used = 0
  for _, holder in ipairs(redis.call('ZRANGE', holders_key, 0, -1)) do
    used = used + tonumber(redis.call('HGET', weights_key, holder) or '1')
  end
  return used
end

local function forget_waiter(who)
  redis.call('HDEL', deadlines_key, who)
  redis.call('DEL', prefix .. who)
end

-- Admits the live waiters at the head of the queue while they fit: each becomes a holder
-- with the short `claim` lease (renewed to the full ttl once it has its token, so that one
-- that died since its last refresh holds its permits no longer than that), and its token
-- is pushed onto its own list, which wakes it and only it. Dead waiters are dropped on the
-- way. Returns the permits in use after.
local function admit(used)
  while true do
    local head = redis.call('LINDEX', queue_key, 0)
    if not head then return used end
    local deadline = redis.call('HGET', deadlines_key, head)
    if deadline and tonumber(deadline) >= now then
      local weight = tonumber(redis.call('HGET', weights_key, head) or '1')
      if used + weight > capacity then return used end
      redis.call('LPOP', queue_key)
      redis.call('HDEL', deadlines_key, head)
      hold(head, claim)
      redis.call('RPUSH', prefix .. head, redis.call('INCR', counter_key))
      redis.call('PEXPIRE', prefix .. head, liveness)
      used = used + weight
    else
      redis.call('LPOP', queue_key)
      redis.call('HDEL', weights_key, head)
      forget_waiter(head)
    end
  end
end

-- `id` gave its permits back (or lost them): admit whoever now fits.
local function let_go()
  redis.call('ZREM', holders_key, id)
  redis.call('HDEL', weights_key, id)
  admit(in_use())
end
