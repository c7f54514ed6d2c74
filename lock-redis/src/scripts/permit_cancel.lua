-- PERMIT_CANCEL(id, ttl, liveness, prefix, claim, capacity) -> 1 if an admission had raced
-- the cancel and was passed on, else 0 (after permits.lua). Removes the waiter from the
-- queue, its deadline, its weight and its list, and admits whoever it kept out.
local left = redis.call('LREM', queue_key, 1, id)
forget_waiter(id)
if not holds(id) then
  redis.call('ZREM', holders_key, id)
  redis.call('HDEL', weights_key, id)
  -- A waiter that kept the others out (a writer at the head) lets in those who now fit.
  if left > 0 then admit(in_use()) end
  return 0
end
let_go()
return 1
