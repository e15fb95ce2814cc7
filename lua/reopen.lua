-- reopen.lua: end a shard rebuild: set the ready marker and drop the
-- rebuild lease, if the caller still holds the lease and every guard still
-- holds the caller's value.
--
-- A guard is the fence a bucket's rebuild keeps on the bucket it rebuilt
-- (internal/bucket/quiesce.go): a rebuild that stalled past its voucher's
-- lease finds it overwritten by the newer holder, and must not make the
-- alloc it counted before live.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:rebuilding  shard rebuild lease (string: owner token)
-- KEYS[2] seckill:{<shard>}:ready  shard ready marker (string: the run_id of the master it was loaded into)
-- KEYS[3..] a guard's hash, in the same shard (one per guard, repeated as needed)
-- ARGV[1] owner token
-- ARGV[2] marker value: the run_id of the shard's master, read before the
--         rebuild began ("unknown" when the server does not tell it)
-- ARGV[3..] per guard, in the order of KEYS[3..]: field, value
--
-- Returns 1 when the shard was reopened, 0 when the lease is not the
-- caller's (another rebuild took over; it reopens the shard), 2 when a
-- guard holds another value (nothing written).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
for i = 3, #KEYS do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'hash' or redis.call('HGET', KEYS[i], ARGV[2 * i - 3]) ~= ARGV[2 * i - 2] then
    return 2
  end
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[1])
return 1
