package payment

import (
	"testing"

	"seckill/internal/order"
)

// TestDecide enumerates every payment status against every order state.
func TestDecide(t *testing.T) {
	t.Parallel()
	type decision struct {
		verdict verdict
		reason  string
	}
	want := map[string]map[string]decision{
		StatusCreated: {
			order.StatusAwaitingPayment: {pays, ""},
			order.StatusCancelled:       {refunds, ReasonLate}, // expired or cancelled before the money came
			order.StatusRefunded:        {refunds, ReasonDuplicate},
			order.StatusPaid:            {refunds, ReasonDuplicate}, // paid by another payment
			order.StatusUsed:            {refunds, ReasonDuplicate},
		},
	}
	for _, p := range []string{StatusSucceeded, StatusNeedsRefund, StatusRefunded} {
		want[p] = map[string]decision{}
		for _, o := range order.States {
			want[p][o] = decision{settled, ""} // settled before: a repeat changes nothing
		}
	}
	for p, row := range want {
		for _, o := range order.States {
			if v, r := decide(p, o); v != row[o].verdict || r != row[o].reason {
				t.Errorf("payment %s, order %s: verdict %d %q, want %d %q", p, o, v, r, row[o].verdict, row[o].reason)
			}
		}
	}
	for _, c := range [][2]string{{"bogus", order.StatusAwaitingPayment}, {StatusCreated, "bogus"}, {StatusCreated, order.StatusPending}} {
		if got, _ := decide(c[0], c[1]); got != broken {
			t.Errorf("payment %s, order %s: verdict %d, want broken", c[0], c[1], got)
		}
	}
}
