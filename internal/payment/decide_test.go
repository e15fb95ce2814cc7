package payment

import (
	"testing"

	"seckill/internal/order"
)

// TestDecide enumerates every payment status against every order state.
func TestDecide(t *testing.T) {
	t.Parallel()
	want := map[string]map[string]verdict{
		StatusCreated: {
			order.StatusAwaitingPayment: pays,
			order.StatusCancelled:       refunds, // expired or cancelled before the money came
			order.StatusRefunded:        refunds,
			order.StatusPaid:            refunds, // paid by another payment
			order.StatusUsed:            refunds,
		},
	}
	for _, p := range []string{StatusSucceeded, StatusNeedsRefund, StatusRefunded} {
		want[p] = map[string]verdict{}
		for _, o := range order.States {
			want[p][o] = settled // settled before: a repeat changes nothing
		}
	}
	for p, row := range want {
		for _, o := range order.States {
			if got := decide(p, o); got != row[o] {
				t.Errorf("payment %s, order %s: verdict %d, want %d", p, o, got, row[o])
			}
		}
	}
	for _, c := range [][2]string{{"bogus", order.StatusAwaitingPayment}, {StatusCreated, "bogus"}, {StatusCreated, order.StatusPending}} {
		if got := decide(c[0], c[1]); got != broken {
			t.Errorf("payment %s, order %s: verdict %d, want broken", c[0], c[1], got)
		}
	}
}
