-- forward.lua: move due members of a delay queue back onto their stream.
--
-- Members move in the same script that removes them, so a crash never loses
-- one and two pollers never move the same member.
--
-- KEYS[1] delay queue (zset: member = payload, score = due time, unix ms)
-- KEYS[2] stream
-- ARGV[1] now, unix ms: members with score <= now are due
-- ARGV[2] most members to move in one call
--
-- A payload is a JSON array of alternating field names and values, all
-- strings; a payload that is not is appended as one field, "raw".
--
-- Returns the number of members moved.

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local ok, fields = pcall(cjson.decode, member)
  local args = {}
  if ok and type(fields) == 'table' and #fields > 0 and #fields % 2 == 0 then
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
