-- GRANT(id, ttl) -> the token, or 0 when someone else holds the lock.
-- The plain grant of the polling and pub/sub strategies: the owner key only if absent, and
-- the counter in the same call. A retry after a lost reply finds its own grant.
local owner_key, counter_key = KEYS[1], KEYS[2]
local id, ttl = ARGV[1], ARGV[2]

local owner = redis.call('GET', owner_key)
if owner == id then
  redis.call('PEXPIRE', owner_key, ttl)
  return tonumber(redis.call('GET', counter_key))
end
if owner then return 0 end
redis.call('SET', owner_key, id, 'PX', ttl)
return redis.call('INCR', counter_key)
