-- send_code.lua: store a new login code for a phone, unless the phone or the
-- requester (the client address asking) has had enough codes.
--
-- The limits bound the SMS sent to a phone without letting a stranger lock
-- its owner out:
--   * one code per resend interval to a phone, whoever asks;
--   * a requester gets ARGV[5] codes per window for one phone (its own
--     budget: nobody else can use it up); a login from it starts it afresh;
--   * requesters that never logged in to the phone share a ceiling of
--     ARGV[4] codes per window for it: the bound on SMS that strangers
--     can make a phone receive;
--   * requesters that logged in to the phone lately (KEYS[5], kept by
--     check_code.lua) are not held by that ceiling, only by their own budget:
--     an owner asking from a device they used before gets a code even while
--     strangers have used the ceiling up;
--   * everyone together gets ARGV[8] codes per window for the phone (KEYS[6];
--     a login does not reset it): the bound on SMS sent to one phone, which
--     logging in again and again cannot lift. It is above ARGV[4] + ARGV[5],
--     so strangers cannot fill it before the owner's own budget.
-- Every code the phone receives is the phone's current code, whoever asked
-- for it, so the owner can also log in with a code a stranger made it send.
--
-- Every check runs before the first write.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{login:<phone>}:code  the phone's code (hash: digest, tries, locked, by, t:<requester>)
-- KEYS[2] seckill:{login:<phone>}:resend  resend guard (string; exists while no new code may be sent)
-- KEYS[3] seckill:{login:<phone>}:sent  codes sent to the phone in the window for requesters that never
--         logged in to it (counter)
-- KEYS[4] seckill:{login:<phone>}:sent:<requester>  codes sent to the phone in the window for this requester (counter)
-- KEYS[5] seckill:{login:<phone>}:known  requesters that logged in to the phone lately (zset: requester ->
--         last login, ms)
-- KEYS[6] seckill:{login:<phone>}:total  codes sent to the phone in the window for anyone (counter)
-- ARGV[1] digest of the new code (HMAC; the code itself never reaches Redis)
-- ARGV[2] code lifetime, ms
-- ARGV[3] resend interval, ms
-- ARGV[4] most codes per window for requesters that never logged in
-- ARGV[5] most codes per window for one requester
-- ARGV[6] window, ms
-- ARGV[7] the requester
-- ARGV[8] most codes per window for the phone, whoever asks
--
-- Returns {status, detail}:
--   {0, c}   stored; a previous code of the phone is replaced (its tries too);
--            c is 1 when it counts against the ceiling of KEYS[3], else 0
--            (what unsend_code.lua gives back if the SMS is not sent)
--   {1, ms}  a code was sent less than the resend interval ago; wait ms
--   {2, ms}  this requester's codes for the phone are used up; wait ms
--   {3, ms}  the ceiling for requesters that never logged in, or the phone's
--            ceiling, is reached; wait ms

-- sent reads a window counter.
local function sent(key)
  local n = tonumber(redis.call('GET', key) or '0')
  if n == nil then
    error('sent counter ' .. key .. ' is not a number')
  end
  return n
end

-- left is how long a full counter's window still runs.
local function left(key)
  local ms = redis.call('PTTL', key)
  if ms < 0 then
    -- A counter without expiry would lock the phone out for ever.
    redis.call('PEXPIRE', key, ARGV[6])
    ms = tonumber(ARGV[6])
  end
  return ms
end

local wait = redis.call('PTTL', KEYS[2])
if wait > 0 then
  return {1, wait}
end
if sent(KEYS[4]) >= tonumber(ARGV[5]) then
  return {2, left(KEYS[4])}
end
local known = redis.call('ZSCORE', KEYS[5], ARGV[7])
if not known and sent(KEYS[3]) >= tonumber(ARGV[4]) then
  return {3, left(KEYS[3])}
end
if sent(KEYS[6]) >= tonumber(ARGV[8]) then
  return {3, left(KEYS[6])}
end

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'digest', ARGV[1], 'tries', 0, 'by', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
if redis.call('INCR', KEYS[4]) == 1 then
  redis.call('PEXPIRE', KEYS[4], ARGV[6])
end
if redis.call('INCR', KEYS[6]) == 1 then
  redis.call('PEXPIRE', KEYS[6], ARGV[6])
end
if known then
  return {0, 0}
end
if redis.call('INCR', KEYS[3]) == 1 then
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end
return {0, 1}
