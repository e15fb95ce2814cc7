-- draw_fence.lua: fence one bucket of a fair voucher for the drawer
-- buying its draw (internal/draw), or open it once the draw is done.
--
-- fence: the bucket's state field draw_fence holds the drawer's token
-- (given by draw_close.lua), and purchase.lua takes a drawer's purchase
-- only with that token. A fence only rises: a drawer holding an older
-- token than the bucket's is told so, and writes nothing.
-- open: draw_pending goes to 0, and purchase.lua sells to anyone.
--
-- KEYS[1] seckill:{<shard>}:voucher:<voucher id>  the bucket's sale state (hash)
-- ARGV[1] the drawer's fence token (decimal), or "open"
--
-- Returns, for open: 1 opened (now, or before), 2 no state (nothing written:
-- a state loaded later is loaded from the database, done). For a token:
--   1  fenced with this token (now, or before)
--   0  the bucket holds a newer token: another drawer took the draw over
--   2  no state for the bucket (not loaded, or being rebuilt): nothing written;
--      its purchases answer so, and the drawer fences it again when they
--      are refused as fenced

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 2
end
if ARGV[1] == 'open' then
  redis.call('HSET', KEYS[1], 'draw_pending', '0')
  return 1
end
local held = tonumber(redis.call('HGET', KEYS[1], 'draw_fence') or '0') or 0
local mine = tonumber(ARGV[1])
if held > mine then
  return 0
end
if held < mine then
  redis.call('HSET', KEYS[1], 'draw_fence', ARGV[1])
end
return 1
