-- settle.lua: make Redis agree with the orders of one shard the worker just
-- wrote, one call per shard and batch.
--
-- Normally the purchase script already recorded each buyer and took the
-- unit, and this only drops the orders from the pending index. After Redis
-- lost its data and the shard was rebuilt from MySQL while an order was in
-- a worker's hands (committed after the rebuild read MySQL), its buyer is
-- missing: record it and take the unit now, if one is left.
--
-- The buyer may also have bought again meanwhile: the entry names another
-- order of theirs, still in this shard's pending index. That order can
-- never be written (the database holds one order per buyer and voucher):
-- it will be dead-lettered as a duplicate. The written order takes over
-- the entry and that order's unit, so the dead letter later finds nothing
-- to give back, and Redis keeps exactly the unit the database took. An
-- entry naming an order no longer pending is left alone.
--
-- While the shard is not ready (a rebuild is under way) nothing is
-- settled: the caller tries again later, after the rebuild.
--
-- An order whose voucher's keys hold something else than this script
-- reads (not a hash, or a stock that is not an integer: a stray write, a
-- hand edit) is checked before anything is written for it, answered 4 and
-- left as it was, pending included; the other orders are settled. The
-- caller tries it again once the keys are mended.
--
-- It also records, in the shard's record of the database, the transaction
-- that wrote the orders (its GTID): the highest sequence number per origin
-- (domain and server_id) the shard's orders were committed at. A database
-- that later lacks one of them lost it (a failover to a replica that had
-- not received it): package failover reads the record.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:ready  shard ready marker
-- KEYS[2] seckill:{<shard>}:pending  shard pending-order index (hash: order id -> "user:voucher")
-- KEYS[3] seckill:{<shard>}:db  the shard's record of the database (hash: lineage -> token,
--   g:<domain>-<server> -> highest sequence number seen; a missing key is an empty record)
-- KEYS[2i+2], KEYS[2i+3] for order i (i = 1..n): its voucher's state
--   seckill:{<shard>}:voucher:<voucher id> (hash: stock, ...) and buyers
--   seckill:{<shard>}:voucher:<voucher id>:buyers (hash: user id -> order id)
-- ARGV[1] the GTID of the transaction that wrote the orders, domain-server-sequence,
--   or "" when the database tells none (no binary log, MySQL, SQLite)
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1] for order i: user id, order id,
--   voucher id
--
-- Returns {0} when the shard is not ready (nothing settled), else {1, a_1,
-- ..., a_n}: what was done for order i, so the caller can undo it for an
-- order that was cancelled meanwhile (its unit given back before this
-- ran):
--   0 nothing: the entry named the order already, or names another order
--     no longer pending
--   1 the buyer recorded and the unit taken
--   2 the buyer recorded, no unit left to take
--   3 the entry taken over from the buyer's later pending order
--   4 nothing: its voucher's keys cannot be read (see above)

-- readable remembers, per voucher state key, whether the key reads as a
-- hash whose stock is an integer or missing. Nothing else writes during the
-- call and this script only takes 1 from a positive stock, so the answer
-- holds for the whole call: the stock is checked once per voucher and call
-- (a batch's orders are mostly of one voucher), not once per order.
local readable = {}

-- read is what order i's keys hold that this script reads: the buyer's
-- entry, false when missing; ok is false when a key is not a hash or the
-- stock is not an integer. The reads are protected (pcall), so a key of
-- another type answers here, before any write, without TYPE calls of its
-- own on every order.
local function read(state, buyers, user)
  local held = redis.pcall('HGET', buyers, user)
  if type(held) == 'table' and held.err then
    return false
  end
  if readable[state] == nil then
    local stock = redis.pcall('HGET', state, 'stock')
    readable[state] = not (type(stock) == 'table' and stock.err) and
      (not stock or string.match(stock, '^-?%d+$') ~= nil)
  end
  if not readable[state] then
    return false
  end
  return true, held
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0}
end
local did = {1}
-- The orders leave the pending index in few HDELs rather than one per
-- order: one command for the script, the AOF and the replica instead of a
-- batch's hundreds. The first order that reads fine is dropped at once,
-- before anything else is written: that HDEL finds a pending index of the
-- wrong type before any write (the call fails having changed nothing), and
-- once a script has written, Redis no longer refuses its writes that grow
-- memory (maxmemory reached), as it always did for settle. The others,
-- listed in dropped, go in one HDEL per slice after the loop. gone answers
-- "dropped already?" for the reads of the pending index in between, so they
-- see what one HDEL per order would have left.
local dropped, gone, first = {}, {}, true
-- settle does order i and returns what it did (the answers above).
local function settle(i)
  local user, order, voucher = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local state, buyers = KEYS[2 * i + 2], KEYS[2 * i + 3]
  local ok, held = read(state, buyers, user)
  if not ok then
    return 4
  end
  if first then
    first = false
    redis.call('HDEL', KEYS[2], order)
    gone[order] = true
  elseif not gone[order] then
    gone[order] = true
    dropped[#dropped + 1] = order
  end
  if not held then
    redis.call('HSET', buyers, user, order)
    -- At 0 the unit was sold again after Redis lost this order (a failover
    -- lost writes the replica never had): the database took it for this
    -- order, so it will refuse one of the later ones as out of stock, whose
    -- dead letter gives nothing back. Redis stays at 0, as the database
    -- will, and never goes below.
    if tonumber(redis.call('HGET', state, 'stock') or '0') > 0 then
      redis.call('HINCRBY', state, 'stock', -1)
      return 1
    end
    return 2
  end
  if held ~= order and not gone[held] and redis.call('HGET', KEYS[2], held) == user .. ':' .. voucher then
    redis.call('HSET', buyers, user, order)
    return 3
  end
  return 0
end
for i = 1, (#ARGV - 1) / 3 do
  did[i + 1] = settle(i)
end
-- In slices: unpack's arguments go on Lua's stack, which is bounded.
local slice = 500
for from = 1, #dropped, slice do
  redis.call('HDEL', KEYS[2], unpack(dropped, from, math.min(from + slice - 1, #dropped)))
end
-- Last: by now a write was made, which a full memory no longer refuses. A
-- record of another type (a stray write) is left as it is, read
-- protected: the orders are settled all the same.
local origin, seq = string.match(ARGV[1], '^(%d+%-%d+)%-(%d+)$')
if origin and not first then
  local field = 'g:' .. origin
  local seen = redis.pcall('HGET', KEYS[3], field)
  if not (type(seen) == 'table' and seen.err) then
    local n = tonumber(seen)
    if n == nil or n < tonumber(seq) then
      redis.call('HSET', KEYS[3], field, seq)
    end
  end
end
return did
