-- reopen.lua: end a shard rebuild: set the ready marker and drop the
-- rebuild lease, if the caller still holds the lease.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:rebuilding  shard rebuild lease (string: owner token)
-- KEYS[2] seckill:{<shard>}:ready  shard ready marker (string: the run_id of the master it was loaded into)
-- ARGV[1] owner token
-- ARGV[2] marker value: the run_id of the shard's master, read before the
--         rebuild began ("unknown" when the server does not tell it)
--
-- Returns 1 when the shard was reopened, 0 when the lease is not the
-- caller's (another rebuild took over; it reopens the shard).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[1])
return 1
