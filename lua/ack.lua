-- ack.lua: acknowledge stream entries and delete them, in one step.
--
-- Only acknowledged entries are deleted, so no unacknowledged work is ever
-- dropped; deleting them keeps the stream from growing with history.
--
-- KEYS[1] stream
-- ARGV[1] consumer group
-- ARGV[2..n] entry ids
--
-- Returns the number of entries acknowledged.

local ids = {}
for i = 2, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
if #ids == 0 then
  return 0
end
local acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
redis.call('XDEL', KEYS[1], unpack(ids))
return acked
