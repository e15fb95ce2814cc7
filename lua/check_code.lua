-- check_code.lua: check a submitted login code; a right code is used up, a
-- wrong one counts a try, and too many wrong tries lock the code.
--
-- KEYS[1] the phone's code (hash: digest, tries, locked)
-- ARGV[1] digest of the submitted code
-- ARGV[2] wrong tries that lock the code
--
-- Returns {status, tries_left}:
--   {0, 0}     right: the code is deleted (single use)
--   {1, 0}     no code: never sent, expired, already used, or malformed
--   {2, left}  wrong: left more tries before the code locks
--   {3, 0}     locked: too many wrong tries; only a new code helps
--
-- A locked code keeps its expiry, so a lock never outlives the code.

local h = redis.call('HMGET', KEYS[1], 'digest', 'tries', 'locked')
if not h[1] then
  return {1, 0}
end
if h[3] then
  return {3, 0}
end
local tries = tonumber(h[2])
local max = tonumber(ARGV[2])
if tries == nil or max == nil then
  return {1, 0}
end
if h[1] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {0, 0}
end
tries = tries + 1
if tries >= max then
  redis.call('HSET', KEYS[1], 'tries', tries, 'locked', 1)
  return {3, 0}
end
redis.call('HSET', KEYS[1], 'tries', tries)
return {2, max - tries}
