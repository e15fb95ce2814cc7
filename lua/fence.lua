-- fence.lua: set or lift a rebuild's fence on one bucket of a
-- voucher (see internal/bucket/quiesce.go). A fence is the rebuild's
-- fencing token, written in the bucket's shard: take.lua refuses to move
-- units out of a fenced bucket, and the rebuilt bucket's shard reopens
-- only while its fence still holds the rebuild's token (reopen.lua).
--
-- A fence has no time to live: it holds until its holder lifts it, or a
-- newer holder of the voucher's lease overwrites it (set). A holder that
-- stalls past its lease therefore never lets units move under it; it
-- finds its token gone instead, and its writes are refused.
--
-- KEYS[1] seckill:{<shard>}:fences  the shard's fences (hash: voucher id ->
--         "<nb>:<token>", or missing)
-- ARGV[1] "set" | "lift"
-- ARGV[2] voucher id
-- ARGV[3] the holder's value "<nb>:<token>"
--
-- Returns (decoded in internal/bucket/scripts.go by decodeFence alone):
--   set:   {1}          written (no fence before, or this value already)
--          {2, value}   written over another holder's fence (a takeover)
--   lift:  {1}          the fence held the value: dropped
--          {0, value}   another value, or "" when none: nothing written
--   {8, key}           the key holds another type: nothing written

local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'hash' and t ~= 'none' then
  return {8, KEYS[1]}
end
local cur = redis.call('HGET', KEYS[1], ARGV[2])
local mode = ARGV[1]
if mode == 'set' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  if cur and cur ~= ARGV[3] then
    return {2, cur}
  end
  return {1}
end
if mode ~= 'lift' then
  error('fence.lua: mode must be set or lift, got ' .. tostring(mode))
end
if cur ~= ARGV[3] then
  return {0, cur or ''}
end
redis.call('HDEL', KEYS[1], ARGV[2])
return {1}
