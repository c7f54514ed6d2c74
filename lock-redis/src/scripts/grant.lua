-- GRANT(id, ttl) -> {token, ''} when the key is (now) ours, {0, holder} when someone else's.
-- The plain grant of the polling and pub/sub strategies, and Redlock's vote on one server:
-- the owner key only if absent, and the counter in the same call. A retry after a lost reply
-- finds its own grant. It tells who holds the key, so that Redlock's split votes can be
-- settled.
local owner_key, counter_key = KEYS[1], KEYS[2]
local id, ttl = ARGV[1], ARGV[2]

local owner = redis.call('GET', owner_key)
if owner == id then
  redis.call('PEXPIRE', owner_key, ttl)
  return {tonumber(redis.call('GET', counter_key)), ''}
end
if owner then return {0, owner} end
redis.call('SET', owner_key, id, 'PX', ttl)
return {redis.call('INCR', counter_key), ''}
