-- unsend_code.lua: take back a login code the SMS gateway did not deliver,
-- so that a gateway outage costs the buyer neither the code's budget nor
-- the resend wait.
--
-- Only the code that was stored for this send is taken back: if another
-- code replaced it meanwhile, the phone's code and resend guard are left
-- as they are. The counters go down by one each, never below zero and
-- keeping their expiry (a counter without expiry would hold for ever).
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{login:<phone>}:code  the phone's code (hash: digest, ...)
-- KEYS[2] seckill:{login:<phone>}:resend  resend guard (string)
-- KEYS[3] seckill:{login:<phone>}:sent  codes sent to the phone for requesters that never logged in (counter)
-- KEYS[4] seckill:{login:<phone>}:sent:<requester>  codes sent to the phone for this requester (counter)
-- KEYS[5] seckill:{login:<phone>}:total  codes sent to the phone for anyone (counter)
-- ARGV[1] digest of the code that was not delivered
-- ARGV[2] "1" when send_code.lua counted it in KEYS[3] too, else "0"
--
-- Returns 1 when the code was still the phone's and was removed, else 0.

local function give_back(key)
  local n = tonumber(redis.call('GET', key) or '0')
  if n and n > 0 then
    redis.call('DECR', key)
  end
end

give_back(KEYS[4])
give_back(KEYS[5])
if ARGV[2] == '1' then
  give_back(KEYS[3])
end
if redis.call('HGET', KEYS[1], 'digest') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
