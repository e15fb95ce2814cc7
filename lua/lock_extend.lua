-- lock_extend.lua: renew the expiry of a batch's buyer locks on one lock
-- node in one call, each as redsync's Extend does: only where the key still
-- holds the lock's value (a lock that expired and was taken by another
-- order is left alone).
--
-- KEYS[i]   a buyer lock (lock_take.lua)
-- ARGV[1]   expiry in milliseconds (a positive integer)
-- ARGV[1+i] the value of lock i: "order:<order id>"
--
-- Returns an array with one entry per key: 1 when lock i holds its value
-- and its expiry was renewed, 0 otherwise (gone, or another value). A key
-- of another type is 0 (GET fails, pcall catches it), never an error
-- half-way.
local ttl = tonumber(ARGV[1])
if #ARGV ~= #KEYS + 1 or ttl == nil or ttl < 1 or ttl % 1 ~= 0 then
  return redis.error_reply('lock_extend: want an expiry in ms and one value per key')
end
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = 0
  if redis.pcall('GET', k) == ARGV[i + 1] then
    redis.call('PEXPIRE', k, ttl)
    out[i] = 1
  end
end
return out
