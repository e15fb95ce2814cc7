-- drop_ready.lua: close a shard whose ready marker names another master
-- than the one serving it now, and take the shard's rebuild lease, if the
-- marker still holds the value the caller read and nobody holds the lease.
--
-- Compare and delete in one step: between the caller's read and this call
-- another instance may have rebuilt the shard and written a new marker,
-- which must stay (dropping it would close the shard and rebuild it again).
-- The lease is taken in the same step, so the instance that closes the
-- shard is the one that rebuilds it: no other finds the marker missing
-- and the lease free in between.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:ready  shard ready marker (string: the run_id of the master it was loaded into)
-- KEYS[2] seckill:{<shard>}:rebuilding  shard rebuild lease (string: owner token)
-- ARGV[1] the marker value the caller read
-- ARGV[2] owner token
-- ARGV[3] lease time, ms
--
-- Returns 1 when the marker was dropped and the lease is the caller's, 0
-- when the marker holds something else or is gone, or another holds the
-- lease (nothing written then).

if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' or redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
