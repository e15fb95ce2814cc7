-- replace.lua: overwrite a voucher's sale state during a shard rebuild, if
-- the caller still holds the shard's rebuild lease.
--
-- A rebuild that outlived its lease must not overwrite what a newer
-- rebuild (or purchases after it) wrote. The lease is extended on success.
--
-- KEYS[1] shard rebuild lease (string: owner token)
-- KEYS[2] voucher state (hash: stock, begin_ms, end_ms)
-- KEYS[3] voucher buyers (hash: user id -> order id)
-- ARGV[1] owner token
-- ARGV[2] lease time, ms
-- ARGV[3] stock
-- ARGV[4] sale begin, unix ms
-- ARGV[5] sale end, unix ms
-- ARGV[6..n] user id, order id, user id, order id, ...
--
-- Returns 1 when replaced, 0 when the lease is not the caller's.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[2], KEYS[3])
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[2], 'stock', ARGV[3], 'begin_ms', ARGV[4], 'end_ms', ARGV[5])
return 1
