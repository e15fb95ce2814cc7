-- lock_take.lua: take a batch's buyer locks on one lock node in one call,
-- each as redsync's Mutex takes one: a string key holding the lock's value
-- with an expiry in milliseconds, set only where the key is absent (SET NX
-- PX). A key that already holds this lock's value (an earlier try of the
-- same order left it) is taken over: its expiry is renewed, as redsync's
-- Extend does. The worker then holds each lock as a redsync Mutex with the
-- same value: redsync's Unlock releases it and its Extend renews it.
--
-- KEYS[i]   a buyer lock: <prefix>:lock:buyer:<voucher id>:<user id>
-- ARGV[1]   expiry in milliseconds (a positive integer)
-- ARGV[1+i] the value of lock i: "order:<order id>"
--
-- Returns an array with one entry per key: 1 when lock i holds its value
-- now (set by this call, or taken over), 0 when it holds something else
-- (another order's lock, or a key of another type, which no lock is: fail
-- closed, as held).
--
-- The arguments are checked before the first write: a wrong count or
-- expiry is an error with nothing written. A key of another type makes SET
-- ... GET fail without writing; pcall turns that into 0, never an error
-- half-way. One command per lock in the common case (absent: set).
local ttl = tonumber(ARGV[1])
if #ARGV ~= #KEYS + 1 or ttl == nil or ttl < 1 or ttl % 1 ~= 0 then
  return redis.error_reply('lock_take: want an expiry in ms and one value per key')
end
local out = {}
for i, k in ipairs(KEYS) do
  -- SET NX GET answers the value the key held (not set), or nil (set).
  local old = redis.pcall('SET', k, ARGV[i + 1], 'PX', ttl, 'NX', 'GET')
  if old == false then
    out[i] = 1
  elseif old == ARGV[i + 1] then
    redis.call('PEXPIRE', k, ttl)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
