-- draw_close.lua: close a fair voucher's draw on Redis's clock, before the
-- drawer reads its entries (internal/draw), and give the drawer its fence
-- token. Once the close time has come on Redis's clock the draw is marked
-- closed, and draw_enter.lua takes no entry after that: the entries the
-- drawer then reads are every entry that was ever answered. A drawer whose
-- own clock runs ahead of Redis's is told to wait.
--
-- The fence token is above every token given before for this draw (a
-- counter, and never below Redis's clock in microseconds, so a counter
-- lost with its shard still gives a higher one): draw_fence.lua lets a
-- bucket's fence only rise, and purchase.lua takes a drawer's purchase
-- only with the bucket's token, so a drawer that paused and resumed after
-- a newer one began buys nothing.
--
-- KEYS[1] seckill:{<shard>}:voucher:<voucher id>:draw    entries (hash: user id -> ticket id)
-- KEYS[2] seckill:{<shard>}:voucher:<voucher id>:closed  the closed mark (written here)
-- KEYS[3] seckill:{<shard>}:voucher:<voucher id>:fence   the last fence token given (written here)
-- ARGV[1] close, unix milliseconds (Redis server time)
--
-- Returns {code, n, token}:
--   {0, ms}              not closed yet on Redis's clock: ms milliseconds to go, at least 1
--   {1, entries, token}  closed (now, or before): how many entries the draw holds, and
--                        this drawer's fence token (decimal)
--   {8, key}             KEYS[1] holds another type than a hash: nothing written

local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  return {8, KEYS[1]}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[2]) == 0 then
  if now_ms < tonumber(ARGV[1]) then
    return {0, tonumber(ARGV[1]) - now_ms}
  end
  redis.call('SET', KEYS[2], ARGV[1])
end
-- Microseconds since 1970 stay below 2^53: exact in Lua's numbers.
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
if token <= last then
  token = last + 1
end
local s = string.format('%.0f', token)
redis.call('SET', KEYS[3], s)
return {1, redis.call('HLEN', KEYS[1]), s}
