-- replace.lua: overwrite a voucher's sale state during a shard rebuild, in
-- steps of a bounded number of buyers, if the caller still holds the
-- shard's rebuild lease.
--
-- A voucher with many buyers is replaced in several calls so that no one
-- call blocks Redis for long: the first call drops the old state and
-- buyers, each call adds its buyers, the last one writes the state. In
-- between, the voucher has no state; that is safe because the shard's
-- ready marker is missing, so no purchase, settle or release touches it. A
-- rebuild that dies half-way leaves the marker missing and the next one
-- starts over.
--
-- A rebuild that outlived its lease must not overwrite what a newer
-- rebuild (or purchases after it) wrote. The lease is extended on success.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:rebuilding  shard rebuild lease (string: owner token)
-- KEYS[2] seckill:{<shard>}:voucher:<voucher id>  voucher state (hash: stock, begin_ms, end_ms)
-- KEYS[3] seckill:{<shard>}:voucher:<voucher id>:buyers  voucher buyers (hash: user id -> order id)
-- ARGV[1] owner token
-- ARGV[2] lease time, ms
-- ARGV[3] "1" on the first call of a voucher: drop its state and buyers
-- ARGV[4] "1" on the last call: write the state
-- ARGV[5] stock
-- ARGV[6] sale begin, unix ms
-- ARGV[7] sale end, unix ms
-- ARGV[8] e, the number of further state fields (0, or for a bucket of a voucher
--         of more than one: nb, total, alloc, out)
-- ARGV[9..8+2e] field, value, ... written with the state on the last call
-- ARGV[9+2e..n] user id, order id, user id, order id, ...
--
-- A first call that is not also the last and carries no buyers drops the
-- state and writes nothing (State.DropAt: a bucket the rebuild could not
-- count, loaded later).
--
-- Returns 1 when replaced, 0 when the lease is not the caller's.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[3] == '1' then
  redis.call('UNLINK', KEYS[2], KEYS[3])
end
local e = tonumber(ARGV[8])
if #ARGV >= 10 + 2 * e then
  redis.call('HSET', KEYS[3], unpack(ARGV, 9 + 2 * e))
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'stock', ARGV[5], 'begin_ms', ARGV[6], 'end_ms', ARGV[7])
  if e > 0 then
    redis.call('HSET', KEYS[2], unpack(ARGV, 9, 8 + 2 * e))
  end
end
return 1
