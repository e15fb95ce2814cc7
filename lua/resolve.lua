-- resolve.lua: settle a move's outcome on its receiver (see
-- internal/bucket/mover.go) when the move's mover may have died: the mark
-- if the move was applied or refused, else a "refused" mark written now,
-- a tombstone that makes a later apply of the move refuse it. After this
-- the move's outcome never changes, and its donor can close it.
--
-- No ready check: the tombstone is what keeps a late apply out, whatever
-- the receiver's state.
--
-- KEYS[1] seckill:{<shard>}:xfer:<move id>  the move's mark (string, or missing)
-- ARGV[1] the mark's time to live (ms)
--
-- Returns (decoded in internal/bucket/scripts.go by decodeResolve alone):
--   {0, "refused"}  no mark: the tombstone written now
--   {1, mark}       the mark as it was ("applied" or "refused"); nothing written
--   {8, key}        the key holds another type; nothing written

local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'string' and t ~= 'none' then
  return {8, KEYS[1]}
end
local mark = redis.call('GET', KEYS[1])
if mark then
  return {1, mark}
end
redis.call('SET', KEYS[1], 'refused', 'PX', ARGV[1])
return {0, 'refused'}
