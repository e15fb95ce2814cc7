-- settle.lua: make Redis agree with the orders of one shard the worker just
-- wrote, one call per shard and batch.
--
-- Normally the purchase script already recorded each buyer and took the
-- unit, and this only drops the orders from the pending index. After Redis
-- lost its data and the shard was rebuilt from MySQL while an order was in
-- a worker's hands (committed after the rebuild read MySQL), its buyer is
-- missing: record it and take the unit now. While the shard is not ready
-- (a rebuild is under way) nothing is settled: the caller tries again
-- later, after the rebuild.
--
-- KEYS[1] shard ready marker
-- KEYS[2] shard pending-order index
-- KEYS[2i+1], KEYS[2i+2] for order i (i = 1..n): its voucher's state
--   (hash: stock, ...) and buyers (hash: user id -> order id)
-- ARGV[2i-1], ARGV[2i] for order i: user id, order id
--
-- Returns 1 when settled (every buyer now recorded, or recorded before),
-- 0 when the shard is not ready.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV / 2 do
  local user, order = ARGV[2 * i - 1], ARGV[2 * i]
  local state, buyers = KEYS[2 * i + 1], KEYS[2 * i + 2]
  redis.call('HDEL', KEYS[2], order)
  if redis.call('HSETNX', buyers, user, order) == 1 and redis.call('HEXISTS', state, 'stock') == 1 then
    redis.call('HINCRBY', state, 'stock', -1)
  end
end
return 1
