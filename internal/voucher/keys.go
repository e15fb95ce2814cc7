package voucher

import (
	"cmp"
	"fmt"
	"strconv"
)

// Keys spells every Redis key of the sale state and the order stream. All
// keys of one voucher, and the stream its orders go to, carry the hash tag of
// the voucher's shard, so one script's keys share a Redis Cluster slot.
type Keys struct {
	prefix string
	shards int
}

// NewKeys returns the key names under prefix (default "seckill") for the
// given number of stream shards (default 1). The shard count is fixed for the
// life of the data: changing it moves vouchers to other shards.
func NewKeys(prefix string, shards int) Keys {
	return Keys{prefix: cmp.Or(prefix, "seckill"), shards: max(shards, 1)}
}

// Shards is the number of stream shards.
func (k Keys) Shards() int { return k.shards }

// Prefix is the key prefix, for components that name keys of their own.
func (k Keys) Prefix() string { return k.prefix }

// Shard is the shard a voucher's keys and orders live in.
func (k Keys) Shard(voucherID int64) int { return int(uint64(voucherID) % uint64(k.shards)) }

// Tag is the hash-tagged head of every key of a shard.
func (k Keys) Tag(shard int) string { return k.prefix + ":{" + strconv.Itoa(shard) + "}" }

// Ready marks a shard whose state was loaded from MySQL; purchases fail
// closed while it is missing.
func (k Keys) Ready(shard int) string { return k.Tag(shard) + ":ready" }

// Rebuilding is held by the one instance rebuilding a shard's state.
func (k Keys) Rebuilding(shard int) string { return k.Tag(shard) + ":rebuilding" }

// State is a voucher's sale state: stock, begin_ms, end_ms.
func (k Keys) State(voucherID int64) string {
	return fmt.Sprintf("%s:voucher:%d", k.Tag(k.Shard(voucherID)), voucherID)
}

// Buyers maps each buyer of a voucher to their order id.
func (k Keys) Buyers(voucherID int64) string {
	return fmt.Sprintf("%s:voucher:%d:buyers", k.Tag(k.Shard(voucherID)), voucherID)
}

// Stream is a shard's order stream.
func (k Keys) Stream(shard int) string { return k.Tag(shard) + ":orders" }

// Pending indexes a shard's accepted orders not yet written to MySQL:
// order id -> "user id:voucher id".
func (k Keys) Pending(shard int) string { return k.Tag(shard) + ":pending" }

// Delayed is a shard's delay queue: orders waiting to go back onto the
// shard's stream (a buyer lock was held elsewhere).
func (k Keys) Delayed(shard int) string { return k.Tag(shard) + ":delayed" }
