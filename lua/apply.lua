-- apply.lua: step T2 of a move (see internal/bucket/mover.go): add the
-- units a donor journaled to the receiving bucket, once per move id.
--
-- The mark written here is what makes the apply happen at most once: it
-- holds the move's outcome on the receiver, "applied" or "refused", and
-- the donor closes its journal entry with it. A move journaled too long
-- ago (by the receiver's clock) is refused, so that a rebuild that waited
-- the window out knows no unit it did not see can still arrive.
--
-- Every key is read and checked before the first write.
--
-- KEYS[1] seckill:{<shard>}:ready  the receiver shard's ready marker (any type)
-- KEYS[2] seckill:{<shard>}:voucher:<voucher id>  the receiving bucket's state (hash)
-- KEYS[3] seckill:{<shard>}:xfer:<move id>  the move's mark (string "applied" |
--         "refused", or missing)
-- ARGV[1] units
-- ARGV[2] the take's time on the donor (ms)
-- ARGV[3] apply window (ms): a move older than this is refused
-- ARGV[4] the mark's time to live (ms)
--
-- Returns (decoded in internal/bucket/scripts.go by decodeApply alone):
--   {0}            applied now: stock and alloc more units, mark "applied"
--   {1, mark}      marked before ("applied" or "refused"); nothing written
--   {4}            too old: mark "refused" written, nothing else
--   {6}            the shard is not ready; nothing written
--   {7}            no state, or a state without integer stock and alloc; nothing written
--   {8, key}       that key holds another type; nothing written

-- int reads an integer field: nil when absent or not an integer.
local function int(s)
  if s and string.match(s, '^-?%d+$') then
    return tonumber(s)
  end
  return nil
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {6}
end
local want = {'hash', 'string'}
for i = 2, 3 do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= want[i - 1] and t ~= 'none' then
    return {8, KEYS[i]}
  end
end
local mark = redis.call('GET', KEYS[3])
if mark then
  return {1, mark}
end
local s = redis.call('HMGET', KEYS[2], 'stock', 'alloc')
local stock, alloc = int(s[1]), int(s[2])
if stock == nil or alloc == nil then
  return {7}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now_ms - tonumber(ARGV[2]) > tonumber(ARGV[3]) then
  redis.call('SET', KEYS[3], 'refused', 'PX', ARGV[4])
  return {4}
end
local k = tonumber(ARGV[1])
redis.call('HSET', KEYS[2], 'stock', stock + k, 'alloc', alloc + k)
redis.call('SET', KEYS[3], 'applied', 'PX', ARGV[4])
return {0}
