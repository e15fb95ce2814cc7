-- close.lua: step T3 of a move (see internal/bucket/mover.go): drop the
-- move from the donor's journal with its outcome on the receiver; a
-- refused move gives its units back to the donor in the same step.
--
-- A donor that is not ready lost its state (or is being rebuilt), and a
-- donor bucket without state in a ready shard was left out of its shard's
-- rebuild (voucher.State.DropAt): either way the entry is dropped with no
-- change to the state, and the bucket's rebuild or load recomputes its
-- alloc from the other buckets.
--
-- Every key is read and checked before the first write.
--
-- KEYS[1] seckill:{<shard>}:ready  the donor shard's ready marker (any type)
-- KEYS[2] seckill:{<shard>}:voucher:<voucher id>  the donor bucket's state (hash)
-- KEYS[3] seckill:{<shard>}:transfers  the donor's journal (hash)
-- ARGV[1] move id
-- ARGV[2] the outcome: "applied" or "refused"
--
-- Returns (decoded in internal/bucket/scripts.go by decodeClose alone):
--   {0, units}  closed now (refused: units back in stock and alloc); out less units
--   {1}         no such entry: closed before; nothing written
--   {2}         the donor is not ready, or has no state: the entry dropped, the
--               state untouched
--   {7}         the donor is ready but its state lacks an integer stock, alloc
--               or out; nothing written
--   {8, key}    that key holds another type, or the entry is not a move
--               record; nothing written
-- An outcome other than the two raises an error before any write.

-- int reads an integer field: nil when absent or not an integer.
local function int(s)
  if s and string.match(s, '^-?%d+$') then
    return tonumber(s)
  end
  return nil
end

if ARGV[2] ~= 'applied' and ARGV[2] ~= 'refused' then
  error('close.lua: outcome must be applied or refused, got ' .. tostring(ARGV[2]))
end
for i = 2, 3 do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'hash' and t ~= 'none' then
    return {8, KEYS[i]}
  end
end
local rec = redis.call('HGET', KEYS[3], ARGV[1])
if not rec then
  return {1}
end
local k = tonumber(string.match(rec, '^[^:]*:[^:]*:(%d+):'))
if k == nil then
  return {8, KEYS[3]}
end
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('HDEL', KEYS[3], ARGV[1])
  return {2}
end
local s = redis.call('HMGET', KEYS[2], 'stock', 'alloc', 'out')
local stock, alloc, out = int(s[1]), int(s[2]), int(s[3] or '0')
if stock == nil or alloc == nil or out == nil then
  return {7}
end
if ARGV[2] == 'refused' then
  redis.call('HSET', KEYS[2], 'stock', stock + k, 'alloc', alloc + k, 'out', out - k)
else
  redis.call('HSET', KEYS[2], 'out', out - k)
end
redis.call('HDEL', KEYS[3], ARGV[1])
return {0, k}
