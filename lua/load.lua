-- load.lua: write a voucher's sale state unless it is already there.
--
-- Loading never overwrites: a live stock counter in Redis is ahead of MySQL
-- while accepted orders wait in the stream, so only missing state is written,
-- with its buyers in the same step, so a purchase never sees the stock
-- without the buyers.
--
-- The buyers are staged by the caller in a key of their own and moved into
-- place here, only when the state is written: a load that finds the state
-- there (or its guard gone) leaves the live buyers as they are, never
-- writing back entries that a release has removed since.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:voucher:<voucher id>  voucher state (hash: stock, begin_ms, end_ms)
-- KEYS[2] seckill:{<shard>}:voucher:<voucher id>:buyers  the buyers (hash: user id -> order id)
-- KEYS[3] the staged buyers (hash, or missing when there are none): renamed to KEYS[2]
-- KEYS[4] optional: a guard's hash in the same shard (a bucket's fence: the
--         rebuild or first load that counted the voucher's buckets, see
--         internal/bucket/quiesce.go)
-- ARGV[1] stock
-- ARGV[2] sale begin, unix ms
-- ARGV[3] sale end, unix ms
-- ARGV[4], ARGV[5] with KEYS[4]: the guard's field and the value it must hold
-- ARGV[4..n] (ARGV[6..n] with KEYS[4]) further fields of a bucket of a voucher
--            of more than one bucket: field, value, ... (nb, total, alloc, out)
--
-- Returns 1 when the state was written, 0 when it was already there, 2 when
-- the guard holds another value; the staged buyers are dropped when 0 or 2.

if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('DEL', KEYS[3])
  return 0
end
local first = 4
if #KEYS >= 4 then
  if redis.call('TYPE', KEYS[4])['ok'] ~= 'hash' or redis.call('HGET', KEYS[4], ARGV[4]) ~= ARGV[5] then
    redis.call('DEL', KEYS[3])
    return 2
  end
  first = 6
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('RENAME', KEYS[3], KEYS[2])
  redis.call('PERSIST', KEYS[2])
else
  redis.call('DEL', KEYS[2])
end
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'begin_ms', ARGV[2], 'end_ms', ARGV[3], unpack(ARGV, first))
return 1
