-- retry.lua: move a stream entry to the delay queue, in one step.
--
-- The entry is scheduled first and acknowledged last, and the types of the
-- keys it writes are checked before the first write: a call that fails
-- leaves the entry pending (Redis does not undo a script's writes made
-- before an error), so it is never both pending and delayed, nor neither.
-- Only an entry pending with the calling consumer is moved: one that is
-- acknowledged, or was claimed by another consumer, is not this caller's
-- to move.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:orders  stream
-- KEYS[2] seckill:{<shard>}:delayed  delay queue (zset: member = payload, score = due time, unix ms)
-- ARGV[1] consumer group
-- ARGV[2] entry id
-- ARGV[3] due time, unix ms
-- ARGV[4] payload (what forward.lua appends to the stream when due)
-- ARGV[5] consumer the entry is pending with
--
-- Returns 1 when the entry was pending with the consumer and is now
-- delayed, 0 when it was not (nothing is written then). Raises an error,
-- having written nothing, when a key has the wrong type, or NOGROUP when
-- the stream or the group is missing.

-- A missing stream (Redis lost its data) is left to XPENDING below, whose
-- NOGROUP error makes the consumer create the group again.
local stream_type = redis.call('TYPE', KEYS[1])['ok']
if stream_type ~= 'stream' and stream_type ~= 'none' then
  return redis.error_reply('WRONGTYPE retry: ' .. KEYS[1] .. ' is ' .. stream_type .. ', not a stream')
end
local queue_type = redis.call('TYPE', KEYS[2])['ok']
if queue_type ~= 'zset' and queue_type ~= 'none' then
  return redis.error_reply('WRONGTYPE retry: ' .. KEYS[2] .. ' is ' .. queue_type .. ', not a sorted set')
end
-- Answers NOGROUP when the group is missing: nothing written yet. The
-- error is passed on as it came (code first), not raised, so that every
-- Redis, the embedded one too, reports it with the code in front.
local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1, ARGV[5])
if type(pending) == 'table' and pending.err then
  return redis.error_reply(pending.err)
end
if #pending == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
