-- retry.lua: move a stream entry to the delay queue, in one step.
--
-- The entry is scheduled and acknowledged atomically, so it is never both
-- pending and delayed, nor neither.
--
-- KEYS[1] stream
-- KEYS[2] delay queue (zset: member = payload, score = due time, unix ms)
-- ARGV[1] consumer group
-- ARGV[2] entry id
-- ARGV[3] due time, unix ms
-- ARGV[4] payload (what forward.lua appends to the stream when due)
--
-- Returns 1 when the entry was pending and is now delayed, 0 when it was no
-- longer pending (acknowledged or claimed away): nothing is scheduled then.

local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if acked == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
