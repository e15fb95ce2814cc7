-- db_sync.lua: bring a shard's record of the database in line with the
-- server the database's address reaches now, by the database watcher
-- (internal/failover/watch.go):
--
--   raise  the server holds every commit the record names: each origin is
--          raised to what the server holds (so a commit older than the last
--          check is found if a later failover loses it, whoever made it:
--          the order writer, a payment, a cancellation), and the record
--          names the server
--   set    what the server lacked was written back (or the database was
--          restored): the record becomes what the server holds, its
--          lineage and the server; the same loss is not found twice
--
-- The record's lineage is compared and set in the same step: two instances
-- syncing one record agree, and a record that moved on to another lineage
-- meanwhile is left alone. A worker's settle may raise an origin between
-- the watcher's read and this step; raise keeps it, set lowers it to what
-- the server holds (at worst one more heal, which finds nothing to do).
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:db  the shard's record (hash: lineage -> token, server ->
--   identity, g:<domain>-<server id> -> sequence number; missing: empty)
-- ARGV[1] the lineage the record was read with ("" when it had none)
-- ARGV[2] the database's lineage, set in the record
-- ARGV[3] the server's identity, set in the record
-- ARGV[4] "raise" or "set"
-- ARGV[5], ARGV[6], ... origin ("domain-server id") and sequence number, for
--   each origin of the server's history
--
-- Returns 1 when the record was synced, 0 when its lineage was no longer
-- ARGV[1] (another sync, or a restore, came first): nothing written; -1
-- when the record is not a hash: nothing written.

local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'hash' and t ~= 'none' then
  return -1
end
if (redis.call('HGET', KEYS[1], 'lineage') or '') ~= ARGV[1] then
  return 0
end
local holds = {}
for i = 5, #ARGV, 2 do
  holds['g:' .. ARGV[i]] = ARGV[i + 1]
end
if ARGV[4] == 'set' then
  local record = redis.call('HGETALL', KEYS[1])
  for i = 1, #record, 2 do
    local field = record[i]
    if string.sub(field, 1, 2) == 'g:' and not holds[field] then
      redis.call('HDEL', KEYS[1], field)
    end
  end
end
for field, seq in pairs(holds) do
  local seen = tonumber(redis.call('HGET', KEYS[1], field))
  if ARGV[4] == 'set' or seen == nil or seen < tonumber(seq) then
    redis.call('HSET', KEYS[1], field, seq)
  end
end
redis.call('HSET', KEYS[1], 'lineage', ARGV[2], 'server', ARGV[3])
return 1
