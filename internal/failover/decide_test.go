package failover

import (
	"testing"

	"seckill/internal/order"
	"seckill/internal/voucher"
)

// TestDecideOrder enumerates decideOrder's table: every combination of
// what Redis and the database hold of an order Redis holds.
func TestDecideOrder(t *testing.T) {
	for _, c := range []struct {
		pending, written, lettered, otherLive bool
		want                                  orderFate
	}{
		{false, false, false, false, orderRequeue},
		{true, false, false, false, orderPending},
		{true, true, false, false, orderPending},
		{true, false, true, true, orderPending},
		{false, true, false, false, orderWritten},
		{false, true, true, true, orderWritten},
		{false, false, true, false, orderLettered},
		{false, false, true, true, orderLettered},
		{false, false, false, true, orderConflict},
	} {
		if got := decideOrder(c.pending, c.written, c.lettered, c.otherLive); got != c.want {
			t.Errorf("pending %v written %v lettered %v other live %v: %v, want %v", c.pending, c.written, c.lettered, c.otherLive, got, c.want)
		}
	}
}

// TestDecideEnd enumerates decideEnd's table: every state the database
// may hold an order in (or none), against every end Redis records.
func TestDecideEnd(t *testing.T) {
	hows := []string{voucher.EndedCancelled, voucher.EndedExpired, voucher.EndedRefunded}
	want := map[string][3]endFate{ // by database state, then cancelled, expired, refunded
		"":                          {endGone, endGone, endGone},
		order.StatusCancelled:       {endHeld, endHeld, endHeld},
		order.StatusRefunded:        {endHeld, endHeld, endHeld},
		order.StatusAwaitingPayment: {endCancel, endExpire, endCancel},
		order.StatusPaid:            {endConflict, endConflict, endRefund},
		order.StatusUsed:            {endConflict, endConflict, endConflict},
	}
	for status, fates := range want {
		for i, how := range hows {
			if got := decideEnd(status != "", status, how); got != fates[i] {
				t.Errorf("database %q, redis %s: %v, want %v", status, how, got, fates[i])
			}
		}
	}
	if len(want)-1 != len(order.States) {
		t.Fatalf("the table covers %d states; the lifecycle has %d", len(want)-1, len(order.States))
	}
}
