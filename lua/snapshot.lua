-- snapshot.lua: read a shard's in-flight orders in one atomic step: every
-- entry of its stream and every member of its delay queue. An order moving
-- between the two is seen exactly once.
--
-- KEYS[1] stream
-- KEYS[2] delay queue (zset)
--
-- Returns {stream entries as XRANGE returns them, delay-queue members}.

return {redis.call('XRANGE', KEYS[1], '-', '+'), redis.call('ZRANGE', KEYS[2], 0, -1)}
