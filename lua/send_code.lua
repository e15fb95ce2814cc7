-- send_code.lua: store a new login code for a phone, unless one was sent too
-- recently or too many were sent in the window.
--
-- Every check runs before the first write.
--
-- KEYS[1] the phone's code (hash: digest, tries, locked)
-- KEYS[2] resend guard (string; exists while no new code may be sent)
-- KEYS[3] codes sent in the current window (counter)
-- ARGV[1] digest of the new code (HMAC; the code itself never reaches Redis)
-- ARGV[2] code lifetime, ms
-- ARGV[3] resend interval, ms
-- ARGV[4] most codes per window
-- ARGV[5] window, ms
--
-- Returns {status, wait_ms}:
--   {0, 0}   stored; a previous code of the phone is replaced (its tries too)
--   {1, ms}  a code was sent less than the resend interval ago; wait ms
--   {2, ms}  the window's codes are used up; the window ends in ms

local wait = redis.call('PTTL', KEYS[2])
if wait > 0 then
  return {1, wait}
end
local sent = tonumber(redis.call('GET', KEYS[3]) or '0')
if sent == nil then
  return redis.error_reply('sent counter is not a number')
end
if sent >= tonumber(ARGV[4]) then
  local left = redis.call('PTTL', KEYS[3])
  if left < 0 then
    -- A counter without expiry would lock the phone out for ever.
    redis.call('PEXPIRE', KEYS[3], ARGV[5])
    left = tonumber(ARGV[5])
  end
  return {2, left}
end

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'digest', ARGV[1], 'tries', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
if redis.call('INCR', KEYS[3]) == 1 then
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
return {0, 0}
