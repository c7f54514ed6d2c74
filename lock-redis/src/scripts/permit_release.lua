-- PERMIT_RELEASE(id, ttl, liveness, prefix, claim, capacity) -> 1 released, 0 not a holder
-- (after permits.lua). Leaves a receipt for a lease's length, so that the same release
-- sent again (its reply was lost) answers 1 too; then admits whoever now fits.
if not holds(id) then
  local receipt = redis.call('ZSCORE', receipts_key, id)
  if receipt and tonumber(receipt) >= now then return 1 end
  return 0
end
redis.call('ZADD', receipts_key, now + ttl, id)
keep(receipts_key, ttl)
let_go()
return 1
