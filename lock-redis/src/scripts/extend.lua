-- EXTEND(id, ttl[, value_key]) -> 1 renewed, 2 this owner released it already (a release
-- whose reply was lost), 0 gone or someone else's. Compare-and-pexpire, of an election
-- leader's value too.
local owner_key, receipt_key, value_key = KEYS[1], KEYS[2], KEYS[3]
local id, ttl = ARGV[1], ARGV[2]

if redis.call('GET', owner_key) == id then
  if value_key then redis.call('PEXPIRE', value_key, ttl) end
  return redis.call('PEXPIRE', owner_key, ttl)
end
if redis.call('GET', receipt_key) == id then return 2 end
return 0
