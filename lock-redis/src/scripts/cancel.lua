-- CANCEL(id, ttl, liveness, prefix, mode, channel, claim, values) -> 1 if a grant had raced
-- the cancel and was passed on, else 0 (after handoff.lua). Removes the waiter from the
-- queue, its deadline, its list and its value (an election candidate's).
local id, liveness, prefix = ARGV[1], ARGV[3], ARGV[4]
local mode, channel, claim = ARGV[5], ARGV[6], ARGV[7]

redis.call('LREM', queue_key, 1, id)
redis.call('HDEL', deadlines_key, id)
redis.call('DEL', prefix .. id)
drop_value(id)
if redis.call('GET', owner_key) ~= id then return 0 end
redis.call('DEL', owner_key)
announce(mode, claim, liveness, prefix, channel)
return 1
