-- RAISE(token) -> 1: Redlock's second round, on each server that voted for a grant. The
-- fencing counter becomes at least the grant's token, so that any later grant, which must
-- vote on one of these servers after this grant let go there, counts past it.
local counter_key = KEYS[1]
local token = tonumber(ARGV[1])

local counter = tonumber(redis.call('GET', counter_key) or '0')
if counter < token then redis.call('SET', counter_key, token) end
return 1
