-- LEADER(values) -> {owner id, value, fencing counter}, or nil when nobody holds the owner
-- key. While a leader holds it, the counter is its token: only a grant moves it.
local owner_key, counter_key = KEYS[1], KEYS[2]
local values = ARGV[1]

local id = redis.call('GET', owner_key)
if not id then return false end
local value = redis.call('GET', values .. id) or ''
return {id, value, tonumber(redis.call('GET', counter_key)) or 0}
