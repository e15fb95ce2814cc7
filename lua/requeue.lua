-- requeue.lua: queue again an order the database lost while Redis still
-- holds it: the buyer entry names it, and it is not pending (not on its way
-- to the database). It goes on the shard's order stream as the purchase
-- put it there, with the same fields (the caller's, from the order's
-- id and bucket) plus "healed", and back in the pending index, so the
-- worker writes it through its own path and guards; nothing else changes
-- (the unit stays taken, as it was since the purchase).
--
-- Called by package failover's heal, after it read that the database holds
-- neither the order nor a dead letter of it. Whatever the worker then
-- finds in the database decides: a copy of an order written meanwhile is
-- acknowledged and changes nothing.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:ready  shard ready marker
-- KEYS[2] seckill:{<shard>}:voucher:<voucher id>:buyers  the bucket's buyers (hash: user id -> order id)
-- KEYS[3] seckill:{<shard>}:orders  shard order stream
-- KEYS[4] seckill:{<shard>}:pending  shard pending-order index (hash: order id -> "user id:voucher id")
-- ARGV[1] user id
-- ARGV[2] order id
-- ARGV[3] voucher id
-- ARGV[4..] the message's fields and values, as the purchase writes them
--
-- Returns:
--   0  queued
--   1  already pending: on its way to the database; nothing written
--   2  Redis no longer holds it (the buyer entry names another order, or
--      none): nothing written
--   3  the shard is not ready (being rebuilt): nothing written
--   4  a key holds another type than the one above: nothing written

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 3
end
for i, want in ipairs({'hash', 'stream', 'hash'}) do
  local t = redis.call('TYPE', KEYS[i + 1]).ok
  if t ~= 'none' and t ~= want then
    return 4
  end
end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
  return 2
end
if redis.call('HEXISTS', KEYS[4], ARGV[2]) == 1 then
  return 1
end
redis.call('XADD', KEYS[3], '*', unpack(ARGV, 4))
redis.call('HSET', KEYS[4], ARGV[2], ARGV[1] .. ':' .. ARGV[3])
return 0
