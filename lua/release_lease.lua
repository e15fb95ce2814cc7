-- release_lease.lua: drop a voucher's bucket lease (see
-- internal/bucket/quiesce.go) only while it still holds the caller's
-- token: a lease that expired and was taken by another is left alone.
--
-- KEYS[1] seckill:{<shard>}:voucher:<voucher id>:lease  the lease (string, or missing)
-- ARGV[1] the caller's token
--
-- Returns 1 when dropped, 0 when it held another token or was missing.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
