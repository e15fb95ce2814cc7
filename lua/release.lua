-- release.lua: give back the Redis reservation of an order that will never
-- be written (it was dead-lettered), or the unit of an order that ended
-- (cancelled, expired or refunded).
--
-- For an order that ended, it also records how, beside the voucher's
-- buyers: what Redis still knows of the end if the database loses it (a
-- failover to a replica that had not received it). Package failover
-- writes such an end again.
--
-- Idempotent: the buyer entry is removed only while it still names this
-- order, and the stock is returned in the same step, so a reservation is
-- given back exactly once however often this runs.
--
-- While the shard is not ready (Redis lost its data, or a rebuild is under
-- way) nothing is written: a rebuild that read the database before this
-- order's dead letter was committed counts the order as in flight, and
-- would write its reservation back over a give-back made meanwhile. The
-- shard's pending index, which the rebuild reads, also stays as it was.
-- The caller tries again after the rebuild, which then either skipped the
-- order (its dead letter was read) or holds its reservation, given back
-- now.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:ready  shard ready marker
-- KEYS[2] seckill:{<shard>}:voucher:<voucher id>  voucher state (hash: stock, begin_ms, end_ms)
-- KEYS[3] seckill:{<shard>}:voucher:<voucher id>:buyers  voucher buyers (hash: user id -> order id)
-- KEYS[4] seckill:{<shard>}:pending  shard pending-order index (hash: order id -> "user:voucher")
-- KEYS[5] seckill:{<shard>}:voucher:<voucher id>:ended  the bucket's ended orders (hash: order
--         id -> "user id:how"); only with ARGV[4]
-- ARGV[1] user id
-- ARGV[2] order id
-- ARGV[3] "1" to return the unit to stock, "0" to only drop the buyer entry
-- ARGV[4] for an order that ended, how (cancelled, expired, refunded): recorded in
--         KEYS[5], whether or not the unit was still held; absent for a dead letter
--
-- Everything is read and checked before the first write: a key of the
-- wrong type (a stray write, a hand edit) would raise half-way, after the
-- buyer entry was dropped and before the unit was returned, and every
-- later call would find nothing to give back. Such an order is answered
-- -2 instead, with nothing written, and is tried again once the key is
-- mended; the other orders of the caller's batch go on.
--
-- Returns 1 when the reservation was given back now, 0 when it was not
-- held (given back before, never held, or taken over by the buyer's
-- written order: see settle.lua), -1 when the shard is not ready and
-- nothing was written, -2 when a key holds something else than this
-- script reads (not a hash, or a stock that is not an integer) and
-- nothing was written.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
for i = 2, #KEYS do
  local t = redis.call('TYPE', KEYS[i]).ok
  if t ~= 'hash' and t ~= 'none' then
    return -2
  end
end
local stock = redis.call('HGET', KEYS[2], 'stock')
if stock and not string.match(stock, '^-?%d+$') then
  return -2
end
redis.call('HDEL', KEYS[4], ARGV[2])
if ARGV[4] and KEYS[5] then
  redis.call('HSET', KEYS[5], ARGV[2], ARGV[1] .. ':' .. ARGV[4])
end
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[3] == '1' and stock then
  redis.call('HINCRBY', KEYS[2], 'stock', 1)
end
return 1
