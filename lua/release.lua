-- release.lua: give back the Redis reservation of an order that will never
-- be written (it was dead-lettered).
--
-- Idempotent: the buyer entry is removed only while it still names this
-- order, and the stock is returned in the same step, so a reservation is
-- given back exactly once however often this runs.
--
-- KEYS[1] voucher state (hash: stock, begin_ms, end_ms)
-- KEYS[2] voucher buyers (hash: user id -> order id)
-- KEYS[3] shard pending-order index (hash: order id -> "user:voucher")
-- ARGV[1] user id
-- ARGV[2] order id
-- ARGV[3] "1" to return the unit to stock, "0" to only drop the buyer entry
--
-- Returns 1 when the reservation was given back now, 0 when it was not
-- held (given back before, or never).

redis.call('HDEL', KEYS[3], ARGV[2])
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[1], 'stock') == 1 then
  redis.call('HINCRBY', KEYS[1], 'stock', 1)
end
return 1
