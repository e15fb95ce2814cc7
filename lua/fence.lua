-- fence.lua: refuse (or allow again) moves out of one bucket of a voucher
-- (see internal/bucket/mover.go): take.lua refuses while fence_until is
-- after the server's time. A rebuild of another bucket fences every other
-- bucket so the units stand still while it counts them.
--
-- The fence is set from this server's own clock, so the masters' clocks
-- need not agree.
--
-- KEYS[1] seckill:{<shard>}:voucher:<voucher id>  the bucket's state (hash, or missing)
-- ARGV[1] how long the fence holds (ms) from now; "0" lifts it (fence_until 0)
--
-- Returns (decoded in internal/bucket/scripts.go by decodeFence alone):
--   1   fence_until written
--   0   no state: nothing written
--   -1  the key holds another type: nothing written

local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  return 0
end
if t ~= 'hash' then
  return -1
end
local until_ms = 0
local ttl = tonumber(ARGV[1])
if ttl and ttl > 0 then
  local now = redis.call('TIME')
  until_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + ttl
end
redis.call('HSET', KEYS[1], 'fence_until', until_ms)
return 1
