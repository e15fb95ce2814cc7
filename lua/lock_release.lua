-- lock_release.lua: release a batch's buyer locks on one lock node in one
-- call, each as redsync's Unlock does: deleted only while the key still
-- holds the lock's value (a lock that expired and was taken by another
-- order is left alone).
--
-- KEYS[i]   a buyer lock (lock_take.lua)
-- ARGV[i]   the value of lock i: "order:<order id>"
--
-- Returns an array with one entry per key: 1 when lock i was deleted, 0
-- when it held something else or nothing. A key of another type is 0 (GET
-- fails, pcall catches it), never an error half-way.
if #ARGV ~= #KEYS then
  return redis.error_reply('lock_release: want one value per key')
end
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = 0
  if redis.pcall('GET', k) == ARGV[i] then
    redis.call('DEL', k)
    out[i] = 1
  end
end
return out
