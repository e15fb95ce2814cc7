-- settle.lua: make Redis agree with an order the worker just wrote.
--
-- Normally the purchase script already recorded the buyer and took the
-- unit, and this only drops the order from the pending index. After Redis
-- lost its data and the shard was rebuilt from MySQL while this order was
-- in a worker's hands (committed after the rebuild read MySQL), the buyer
-- is missing: record it and take the unit now. While the shard is not
-- ready (a rebuild is under way) nothing is settled: the caller tries
-- again later, after the rebuild.
--
-- KEYS[1] shard ready marker
-- KEYS[2] voucher state (hash: stock, ...)
-- KEYS[3] voucher buyers (hash: user id -> order id)
-- KEYS[4] shard pending-order index
-- ARGV[1] user id
-- ARGV[2] order id
--
-- Returns 1 when settled (buyer now recorded, or recorded before),
-- 0 when the shard is not ready.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HDEL', KEYS[4], ARGV[2])
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 1 and redis.call('HEXISTS', KEYS[2], 'stock') == 1 then
  redis.call('HINCRBY', KEYS[2], 'stock', -1)
end
return 1
