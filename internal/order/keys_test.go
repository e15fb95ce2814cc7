package order

import (
	"fmt"
	"math"
	"testing"
)

// TestLockKeyAndValue: the buyer lock's key and value are spelled as
// always (prefix:lock:buyer:voucher:user, order:id), whatever the ids'
// lengths and a prefix longer than the key's buffer.
func TestLockKeyAndValue(t *testing.T) {
	t.Parallel()
	long := fmt.Sprintf("%0120d", 7)
	for _, c := range []struct {
		prefix        string
		voucher, user int64
	}{{"seckill", 1, 2}, {"", 0, 0}, {"t:{x}", math.MaxInt64, 120675968935596032}, {long, 42, -1}} {
		if got, want := lockKey(c.prefix, c.voucher, c.user), fmt.Sprintf("%s:lock:buyer:%d:%d", c.prefix, c.voucher, c.user); got != want {
			t.Errorf("lockKey = %q, want %q", got, want)
		}
		if got, want := lockValue(c.user), fmt.Sprintf("order:%d", c.user); got != want {
			t.Errorf("lockValue = %q, want %q", got, want)
		}
	}
}
