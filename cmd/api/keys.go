package main

// shardCountKey records the SECKILL_SHARDS the sale's data in Redis was
// written with: the shard of a voucher and the key of every stream follow
// from it.
func shardCountKey(prefix string) string { return prefix + ":shards" }
