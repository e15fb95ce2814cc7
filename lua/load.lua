-- load.lua: write a voucher's sale state unless it is already there.
--
-- Loading never overwrites: a live stock counter in Redis is ahead of MySQL
-- while accepted orders wait in the stream, so only missing state is written.
-- Callers write the buyers hash before calling this, so a purchase never sees
-- the stock without the buyers.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:voucher:<voucher id>  voucher state (hash: stock, begin_ms, end_ms)
-- KEYS[2] optional: a guard's hash in the same shard (a bucket loaded beside
--         the voucher's others: the fence of the rebuild that counted them,
--         see internal/bucket/quiesce.go)
-- ARGV[1] stock
-- ARGV[2] sale begin, unix ms
-- ARGV[3] sale end, unix ms
-- ARGV[4], ARGV[5] with KEYS[2]: the guard's field and the value it must hold
-- ARGV[4..n] (ARGV[6..n] with KEYS[2]) further fields of a bucket of a voucher
--            of more than one bucket: field, value, ... (nb, total, alloc, out)
--
-- Returns 1 when the state was written, 0 when it was already there, 2 when
-- the guard holds another value (nothing written).

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local first = 4
if #KEYS >= 2 then
  if redis.call('TYPE', KEYS[2])['ok'] ~= 'hash' or redis.call('HGET', KEYS[2], ARGV[4]) ~= ARGV[5] then
    return 2
  end
  first = 6
end
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'begin_ms', ARGV[2], 'end_ms', ARGV[3], unpack(ARGV, first))
return 1
