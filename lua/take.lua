-- take.lua: step T1 of a move between two buckets of a voucher (see
-- internal/bucket/mover.go): take up to want units out of the donor
-- bucket and journal the move under its id, in one step, so a unit that
-- leaves the bucket is always in the journal.
--
-- Every key is read and checked before the first write: Redis does not
-- roll back the writes a script made before an error.
--
-- Keys are shown with the default prefix seckill.
-- KEYS[1] seckill:{<shard>}:ready  the donor shard's ready marker (any type)
-- KEYS[2] seckill:{<shard>}:voucher:<voucher id>  the donor bucket's state (hash:
--         stock, alloc, out, fence_until, ...)
-- KEYS[3] seckill:{<shard>}:transfers  the donor's journal (hash: move id ->
--         "<voucher id>:<to bucket>:<units>:<nb>:<at ms>", or missing)
-- KEYS[4] seckill:{<shard>}:fences  the shard's rebuild fences (hash: voucher id ->
--         "<nb>:<token>", or missing): a voucher with an entry is fenced
-- ARGV[1] move id (random, chosen by the caller; a retry sends the same one)
-- ARGV[2] units wanted (an integer > 0; checked by the caller)
-- ARGV[3] voucher id
-- ARGV[4] receiving bucket
-- ARGV[5] the voucher's bucket count
--
-- Returns (decoded in internal/bucket/scripts.go by decodeTake alone):
--   {0, record} taken now: stock and alloc less the record's units, out more,
--               the record journaled
--   {1, record} this id is journaled already (its record as journaled); nothing written
--   {2}         the bucket's stock is 0; nothing written
--   {3}         the bucket is fenced (a rebuild's fence in KEYS[4], or a
--               fence_until after now, as an older version fenced); nothing written
--   {6}         the shard is not ready; nothing written
--   {7}         no state, or a state without integer stock and alloc (out and
--               fence_until: integers or absent); nothing written
--   {8, key}    that key holds another type; nothing written

-- int reads an integer field: nil when absent or not an integer.
local function int(s)
  if s and string.match(s, '^-?%d+$') then
    return tonumber(s)
  end
  return nil
end

local function kind(key)
  return redis.call('TYPE', key)['ok']
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {6}
end
for i = 2, 4 do
  local t = kind(KEYS[i])
  if t ~= 'hash' and t ~= 'none' then
    return {8, KEYS[i]}
  end
end
local done = redis.call('HGET', KEYS[3], ARGV[1])
if done then
  return {1, done}
end
local s = redis.call('HMGET', KEYS[2], 'stock', 'alloc', 'out', 'fence_until')
local stock, alloc = int(s[1]), int(s[2])
local out, fence = int(s[3] or '0'), int(s[4] or '0')
if stock == nil or alloc == nil or out == nil or fence == nil then
  return {7}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if fence > now_ms or redis.call('HEXISTS', KEYS[4], ARGV[3]) == 1 then
  return {3}
end
if stock <= 0 then
  return {2}
end
local want = tonumber(ARGV[2])
local k = math.min(want, stock)
redis.call('HSET', KEYS[2], 'stock', stock - k, 'alloc', alloc - k, 'out', out + k)
local record = ARGV[3] .. ':' .. ARGV[4] .. ':' .. k .. ':' .. ARGV[5] .. ':' .. now_ms
redis.call('HSET', KEYS[3], ARGV[1], record)
return {0, record}
