-- forward.lua: move due members of a delay queue back onto their stream.
--
-- Members move in the same script that removes them, so a crash never loses
-- one and two pollers never move the same member. The types of both keys
-- are checked before the first write, and every member moved before an
-- error is moved whole (appended, then removed), so a failing call loses
-- nothing and moves nothing twice.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:delayed  delay queue (zset: member = payload, score = due time, unix ms)
-- KEYS[2] seckill:{<shard>}:orders  the stream the queue feeds
-- ARGV[1] now, unix ms: members with score <= now are due
-- ARGV[2] most members to move in one call
--
-- A payload is a JSON array of alternating field names and values, all
-- strings; a payload that is not, or that has more fields than one XADD
-- takes from a script (Lua's stack), is appended as one field, "raw".
--
-- Returns the number of members moved.

local queue_type = redis.call('TYPE', KEYS[1])['ok']
if queue_type ~= 'zset' and queue_type ~= 'none' then
  return redis.error_reply('WRONGTYPE forward: ' .. KEYS[1] .. ' is ' .. queue_type .. ', not a sorted set')
end
local stream_type = redis.call('TYPE', KEYS[2])['ok']
if stream_type ~= 'stream' and stream_type ~= 'none' then
  return redis.error_reply('WRONGTYPE forward: ' .. KEYS[2] .. ' is ' .. stream_type .. ', not a stream')
end

local max_fields = 1000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local ok, fields = pcall(cjson.decode, member)
  local args = {}
  if ok and type(fields) == 'table' and #fields > 0 and #fields % 2 == 0 and #fields <= max_fields then
    for _, f in ipairs(fields) do
      args[#args + 1] = tostring(f)
    end
  else
    args = {'raw', member}
  end
  redis.call('XADD', KEYS[2], '*', unpack(args))
  redis.call('ZREM', KEYS[1], member)
end
return #due
