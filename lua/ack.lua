-- ack.lua: acknowledge stream entries and delete them, in one step.
--
-- Only acknowledged entries are deleted, so no unacknowledged work is ever
-- dropped; deleting them keeps the stream from growing with history.
-- Entries go to XACK and XDEL in slices of at most 500 ids: unpack puts
-- every id of a call on Lua's stack, which holds about 8,000, and a worker
-- batch can be larger.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:orders  stream (the order workers' shard stream)
-- ARGV[1] consumer group
-- ARGV[2..n] entry ids
--
-- Returns the number of entries acknowledged.

local slice = 500
local acked = 0
for first = 2, #ARGV, slice do
  local last = math.min(first + slice - 1, #ARGV)
  acked = acked + redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, first, last))
  redis.call('XDEL', KEYS[1], unpack(ARGV, first, last))
end
return acked
