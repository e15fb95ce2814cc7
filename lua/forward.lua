-- forward.lua: move due members of a delay queue back onto their stream.
--
-- Members move in the same script that removes them, so a crash never loses
-- one and two pollers never move the same member. Neither key is asked for
-- its type: a queue of another type fails the first read, a stream of
-- another type the first append, before anything was written; every member
-- moved before an error is moved whole (appended, then removed), so a
-- failing call loses nothing and moves nothing twice.
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
-- Returns {moved, next}: the number of members moved and, when none was
-- due, the due time of the first member (unix ms, as a string), or "" when
-- the queue is empty or members were moved. One read when nothing is due.

-- wrongtype returns, when reply is the error of a key holding another type,
-- that error naming the key; nil when reply is no error. Other errors are
-- raised.
local function wrongtype(reply, key, want)
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('WRONGTYPE forward: ' .. key .. ' is ' ..
        redis.call('TYPE', key)['ok'] .. ', not ' .. want)
    end
    error(reply)
  end
  return nil
end

local first = redis.pcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local err = wrongtype(first, KEYS[1], 'a sorted set')
if err then
  return err
end
if #first == 0 then
  return {0, ''}
end
if tonumber(first[2]) > tonumber(ARGV[1]) then
  return {0, first[2]}
end

local max_fields = 1000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for i, member in ipairs(due) do
  local ok, fields = pcall(cjson.decode, member)
  local args = {}
  if ok and type(fields) == 'table' and #fields > 0 and #fields % 2 == 0 and #fields <= max_fields then
    for _, f in ipairs(fields) do
      args[#args + 1] = tostring(f)
    end
  else
    args = {'raw', member}
  end
  -- Only the first append can meet a stream of another type: nothing
  -- is written yet then.
  local added = redis.pcall('XADD', KEYS[2], '*', unpack(args))
  if i == 1 then
    err = wrongtype(added, KEYS[2], 'a stream')
    if err then
      return err
    end
  elseif type(added) == 'table' and added.err then
    error(added)
  end
  redis.call('ZREM', KEYS[1], member)
end
return {#due, ''}
