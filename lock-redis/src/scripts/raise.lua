-- RAISE(token) -> 1: Redlock's second round. The fencing counter becomes at least the
-- grant's token, so that any later grant, whose majority shares a server with this one's,
-- counts past it there.
local counter_key = KEYS[1]
local token = tonumber(ARGV[1])

local counter = tonumber(redis.call('GET', counter_key) or '0')
if counter < token then redis.call('SET', counter_key, token) end
return 1
