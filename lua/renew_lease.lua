-- renew_lease.lua: extend a lease (a shard's rebuild lease, a voucher's
-- bucket lease) only while it still holds the caller's token: the
-- watchdog of internal/lease. A lease that expired, or was taken by
-- another, is not brought back.
--
-- KEYS[1] the lease (string: the holder's token, or missing)
-- ARGV[1] the caller's token
-- ARGV[2] the lease's new time to live, ms
--
-- Returns 1 when extended, 0 when it held another token or was missing.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
