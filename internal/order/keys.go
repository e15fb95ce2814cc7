package order

import (
	"fmt"

	"seckill/internal/voucher"
)

// lockKey names the buyer lock of one purchase. Lock nodes may be other
// Redis servers than the sale state's, so it carries no shard tag.
func lockKey(prefix string, voucherID, userID int64) string {
	return fmt.Sprintf("%s:lock:buyer:%d:%d", prefix, voucherID, userID)
}

// ExpiryKeys names one shard's pay-deadline stream and its delay queue,
// for the checks that see them drain.
func ExpiryKeys(k voucher.Keys, shard int) (stream, queue string) {
	return expiryStream(k, shard), expiryQueue(k, shard)
}

// expiryStream is the stream of one shard's due pay deadlines: the
// expirers' consumer group reads it.
func expiryStream(k voucher.Keys, shard int) string { return k.Tag(shard) + ":expiries" }

// expiryQueue is the delay queue (zset) of one shard's pay deadlines; due
// members move onto expiryStream.
func expiryQueue(k voucher.Keys, shard int) string { return k.Tag(shard) + ":expiries:due" }
