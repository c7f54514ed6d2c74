-- PERMIT_EXTEND(id, ttl, liveness, prefix, claim, capacity) -> 1 renewed, 2 this holder
-- released already (a release whose reply was lost), 0 gone (after permits.lua).
if holds(id) then
  hold(id, ttl)
  return 1
end
local receipt = redis.call('ZSCORE', receipts_key, id)
if receipt and tonumber(receipt) >= now then return 2 end
return 0
