package bucket

import "seckill/internal/voucher"

// Keys of the moves, spelled here alone, on the voucher package's shard
// tags so that each script's keys share its shard's slot.

// journalKey is a donor shard's journal of moves out of its buckets:
// move id -> record (see entry).
func journalKey(k voucher.Keys, shard int) string { return k.Tag(shard) + ":transfers" }

// markKey is a move's outcome on its receiver's shard: "applied" or
// "refused".
func markKey(k voucher.Keys, shard int, id string) string { return k.Tag(shard) + ":xfer:" + id }

// leaseKey is held by the one instance quiescing a voucher (for a
// rebuild of one of its buckets), beside the state of its bucket 0.
func leaseKey(k voucher.Keys, v int64, nb int) string { return k.Lease(v, nb) }

// turnKey is held for one pass by the one instance rebalancing a voucher,
// so that two instances do not both move half the same gap.
func turnKey(k voucher.Keys, v int64, nb int) string {
	return k.StateAt(k.BucketShard(v, 0, nb), v) + ":rebalancing"
}

// fencesKey is a shard's rebuild fences: voucher id -> "<nb>:<token>" of
// the rebuild (Quiesce) that fenced that voucher's bucket in the shard.
func fencesKey(k voucher.Keys, shard int) string { return k.Tag(shard) + ":fences" }
