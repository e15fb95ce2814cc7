-- reopen.lua: end a shard rebuild: set the ready marker and drop the
-- rebuild lease, if the caller still holds the lease.
--
-- KEYS[1] shard rebuild lease (string: owner token)
-- KEYS[2] shard ready marker
-- ARGV[1] owner token
-- ARGV[2] marker value
--
-- Returns 1 when the shard was reopened, 0 when the lease is not the
-- caller's (another rebuild took over; it reopens the shard).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[1])
return 1
