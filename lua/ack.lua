-- ack.lua: acknowledge stream entries and delete them, in one step.
--
-- Only acknowledged entries are deleted, so no unacknowledged work is ever
-- dropped; deleting them keeps the stream from growing with history.
--
-- Two ways to delete, both only of acknowledged entries:
-- * XTRIM MINID floor removes every entry below the floor: whole stream
--   nodes at once and one walk of the node the floor falls in. The floor
--   is, over every group of the stream, the earlier of its oldest entry
--   still pending (delivered, not acknowledged) and the entry after the
--   last one it was delivered: below it every entry was delivered to
--   every group and acknowledged. Undelivered entries lie
--   above a group's last delivered one, so they are never below the floor.
-- * XDEL for the ids given that are at or above the floor (acknowledged
--   here while an older entry is still pending). XDEL looks each id up on
--   its own, walking its node from the start: several times the cost per
--   entry of the trim, which is why the trim goes first.
-- Each id given is thus deleted by this call, one way or the other, as
-- when every id went to XDEL.
--
-- Entries go to XACK and XDEL in slices of at most 500 ids: unpack puts
-- every id of a call on Lua's stack, which holds about 8,000, and a worker
-- batch can be larger.
--
-- Keys are shown with the default prefix seckill (SECKILL_KEY_PREFIX).
-- KEYS[1] seckill:{<shard>}:orders  stream (the order workers' shard stream)
-- ARGV[1] consumer group
-- ARGV[2..n] entry ids
--
-- Returns the number of entries acknowledged.

local slice = 500

-- parse splits a stream id "ms-seq" into its two parts, as decimal strings.
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms, seq
end

-- less compares two decimal strings without leading zeros as numbers
-- (stream ids' parts go up to 2^64, past Lua's exact integers).
local function less(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- before reports whether stream id a sorts before stream id b.
local function before(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  if ams ~= bms then
    return less(ams, bms)
  end
  return less(aseq, bseq)
end

-- after is the id right after a group's last delivered one, or that id
-- itself when its sequence part is too long to add one to exactly (the
-- entry at it is then left to XDEL).
local function after(id)
  local ms, seq = parse(id)
  if #seq > 15 then
    return id
  end
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end

-- floor is the id below which every entry is acknowledged by every group,
-- or nil when there is no such bound (no stream, no group, or an answer
-- not understood: then nothing is trimmed, and every id goes to XDEL).
local function floor()
  local groups = redis.pcall('XINFO', 'GROUPS', KEYS[1])
  if type(groups) ~= 'table' or groups.err then
    return nil
  end
  local low = nil
  for _, g in ipairs(groups) do
    local name, pending, last
    for i = 1, #g, 2 do
      if g[i] == 'name' then
        name = g[i + 1]
      elseif g[i] == 'pending' then
        pending = g[i + 1]
      elseif g[i] == 'last-delivered-id' then
        last = g[i + 1]
      end
    end
    if not name or type(pending) ~= 'number' or type(last) ~= 'string' or not parse(last) then
      return nil
    end
    -- The entry after the last delivered one, or the oldest pending one
    -- when that is earlier (always, unless the group was set back: then
    -- the entries it will read again lie below its pending ones).
    local bound = after(last)
    if pending > 0 then
      local first = redis.pcall('XPENDING', KEYS[1], name, '-', '+', 1)
      if type(first) ~= 'table' or first.err or #first == 0 or type(first[1]) ~= 'table' or type(first[1][1]) ~= 'string' or not parse(first[1][1]) then
        return nil
      end
      if before(first[1][1], bound) then
        bound = first[1][1]
      end
    end
    if not low or before(bound, low) then
      low = bound
    end
  end
  return low
end

local acked = 0
for first = 2, #ARGV, slice do
  local last = math.min(first + slice - 1, #ARGV)
  acked = acked + redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, first, last))
end
local low = floor()
local rest = {}
for i = 2, #ARGV do
  if not low or not parse(ARGV[i]) or not before(ARGV[i], low) then
    rest[#rest + 1] = ARGV[i]
  end
end
if low then
  redis.call('XTRIM', KEYS[1], 'MINID', low)
end
for first = 1, #rest, slice do
  redis.call('XDEL', KEYS[1], unpack(rest, first, math.min(first + slice - 1, #rest)))
end
return acked
