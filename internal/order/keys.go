package order

import "fmt"

// lockKey names the buyer lock of one purchase. Lock nodes may be other
// Redis servers than the sale state's, so it carries no shard tag.
func lockKey(prefix string, voucherID, userID int64) string {
	return fmt.Sprintf("%s:lock:buyer:%d:%d", prefix, voucherID, userID)
}
