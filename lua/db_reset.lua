-- db_reset.lua: bring a shard's record of the database down to what the
-- database holds now, once what the database had lost was written again
-- (a failover) or once the database was found restored (another lineage).
-- The record then names only commits the database holds, so the same loss
-- is not found twice; a commit it names later, settled by a worker, is
-- again one the database holds or lost.
--
-- Only the origins the database holds fewer of are lowered (to what it
-- holds, or dropped when it holds none of them): an origin a worker raised
-- meanwhile past the database's history stays as it is only if the
-- database holds it. The lineage is compared and set in the same step:
-- two instances resetting one record agree, and a record that moved on to
-- another lineage meanwhile is left alone.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:db  the shard's record (hash: lineage -> token,
--   g:<domain>-<server> -> sequence number)
-- ARGV[1] the lineage the record was read with ("" when it had none)
-- ARGV[2] the database's lineage, set in the record
-- ARGV[3], ARGV[4], ... origin ("domain-server") and sequence number, for
--   each origin of the database's history
--
-- Returns 1 when the record was reset, 0 when its lineage was no longer
-- ARGV[1] (another reset, or a restore, came first): nothing written; -1
-- when the record is not a hash: nothing written.

local t = redis.call('TYPE', KEYS[1]).ok
if t ~= 'hash' and t ~= 'none' then
  return -1
end
local lineage = redis.call('HGET', KEYS[1], 'lineage') or ''
if lineage ~= ARGV[1] then
  return 0
end
local holds = {}
for i = 3, #ARGV, 2 do
  holds['g:' .. ARGV[i]] = ARGV[i + 1]
end
local record = redis.call('HGETALL', KEYS[1])
for i = 1, #record, 2 do
  local field, seq = record[i], tonumber(record[i + 1])
  if string.sub(field, 1, 2) == 'g:' then
    local held = holds[field]
    if not held then
      redis.call('HDEL', KEYS[1], field)
    elseif seq == nil or tonumber(held) < seq then
      redis.call('HSET', KEYS[1], field, held)
    end
  end
end
redis.call('HSET', KEYS[1], 'lineage', ARGV[2])
return 1
