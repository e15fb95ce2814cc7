-- check_code.lua: check a submitted login code; a right code is used up, a
-- wrong one counts a try, and too many wrong tries lock the code.
--
-- Wrong tries are counted so that a stranger cannot lock the owner's code:
-- the requester that asked for the code (its "by") and requesters that
-- logged in to the phone lately (KEYS[3]) each have ARGV[2] tries of their
-- own; everybody else shares ARGV[2] tries. So a code takes at most a few
-- times ARGV[2] guesses, and the owner who asked for it keeps theirs.
--
-- A right code also starts the requester's code budget for the phone afresh
-- and remembers the requester as one that logged in to the phone (the
-- newest ARGV[6], for ARGV[5] ms), which send_code.lua lets past the
-- strangers' ceiling.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{login:<phone>}:code  the phone's code (hash: digest, tries, locked, by, t:<requester>)
-- KEYS[2] seckill:{login:<phone>}:sent:<requester>  codes sent to the phone in the window for this requester (counter)
-- KEYS[3] seckill:{login:<phone>}:known  requesters that logged in to the phone lately (zset: requester ->
--         last login, ms)
-- ARGV[1] digest of the submitted code
-- ARGV[2] wrong tries that lock the code
-- ARGV[3] the requester
-- ARGV[4] now, ms
-- ARGV[5] how long a requester stays remembered after a login, ms
-- ARGV[6] most requesters remembered per phone
--
-- Returns {status, tries_left}:
--   {0, 0}     right: the code is deleted (single use)
--   {1, 0}     no code: never sent, expired, already used, or malformed
--   {2, left}  wrong: left more tries before the code locks for this requester
--   {3, 0}     locked for this requester: too many wrong tries; only a new
--              code helps
--
-- A locked code keeps its expiry, so a lock never outlives the code.

local mine = 't:' .. ARGV[3]
local h = redis.call('HMGET', KEYS[1], 'digest', 'tries', 'locked', 'by', mine)
if not h[1] then
  return {1, 0}
end
local tries = tonumber(h[2])
local own = tonumber(h[5] or '0')
local max = tonumber(ARGV[2])
if tries == nil or own == nil or max == nil then
  return {1, 0}
end
local trusted = h[4] == ARGV[3] or redis.call('ZSCORE', KEYS[3], ARGV[3])
if trusted then
  if own >= max then
    return {3, 0}
  end
elseif h[3] then
  return {3, 0}
end

if h[1] == ARGV[1] then
  local now = tonumber(ARGV[4])
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('ZADD', KEYS[3], now, ARGV[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. string.format('%d', now - tonumber(ARGV[5])))
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(tonumber(ARGV[6]) + 1))
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
  return {0, 0}
end

if trusted then
  own = own + 1
  redis.call('HSET', KEYS[1], mine, own)
  if own >= max then
    return {3, 0}
  end
  return {2, max - own}
end
tries = tries + 1
if tries >= max then
  redis.call('HSET', KEYS[1], 'tries', tries, 'locked', 1)
  return {3, 0}
end
redis.call('HSET', KEYS[1], 'tries', tries)
return {2, max - tries}
