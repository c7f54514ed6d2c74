-- RELEASE(id, ttl, liveness, prefix, mode, channel, claim, values) -> 1 released, 0 not
-- the owner. Compare-and-delete (after handoff.lua), leaving a receipt so that the same
-- release sent again (its reply was lost) answers 1 too; then the waiters are told the way
-- `mode` says. An election candidate's value goes with it.
local id, ttl, liveness, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local mode, channel, claim = ARGV[5], ARGV[6], ARGV[7]

if redis.call('GET', owner_key) ~= id then
  if redis.call('GET', receipt_key) == id then return 1 end
  return 0
end
redis.call('DEL', owner_key)
drop_value(id)
redis.call('SET', receipt_key, id, 'PX', ttl)
announce(mode, claim, liveness, prefix, channel)
return 1
