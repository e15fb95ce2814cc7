package order

import (
	"strconv"

	"seckill/internal/voucher"
)

// lockKey names the buyer lock of one purchase,
// prefix:lock:buyer:voucher:user. Lock nodes may be other Redis servers
// than the sale state's, so it carries no shard tag. Built by appending:
// a batch names hundreds at once, and fmt cost three allocations each.
func lockKey(prefix string, voucherID, userID int64) string {
	var buf [96]byte
	b := append(buf[:0], prefix...)
	b = append(b, ":lock:buyer:"...)
	b = strconv.AppendInt(b, voucherID, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, userID, 10)
	return string(b)
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
