package verify

import (
	"fmt"
	"slices"
	"testing"
)

// TestInvariantsAlone: each invariant's check, run on what a check read,
// reports its own violations, in the words the pipeline tests read.
func TestInvariantsAlone(t *testing.T) {
	t.Parallel()
	// healthy is a drained sale of 3 out of 5 units: orders 901 to 903 of
	// users 1 to 3, all accepted, Redis in agreement.
	healthy := func() *sale {
		s := &sale{
			in: Input{VoucherID: 7, Accepted: map[int64]int64{901: 1, 902: 2, 903: 3}, Group: "g"},
			r:  Report{TotalStock: 5, DBStock: 2, RedisState: true, RedisStock: 2, Orders: 3},
		}
		s.orders = []order{paid(901, 1), paid(902, 2), paid(903, 3)}
		s.redisBuyers = map[string]string{"1": "901", "2": "902", "3": "903"}
		s.index()
		return s
	}
	for _, c := range []struct {
		name   string
		change func(s *sale)
		check  func(s *sale)
		want   []string
	}{
		{"I1 healthy", func(*sale) {}, (*sale).noOversell, nil},
		{"I1 oversold", func(s *sale) {
			s.r.TotalStock, s.r.DBStock, s.r.RedisStock = 2, -1, -1
		}, (*sale).noOversell, []string{
			"I1: 3 live orders for a stock of 2", "I1: database stock is -1", "I1: Redis stock is -1",
		}},
		{"I1 ended orders hold no stock", func(s *sale) {
			s.r.TotalStock = 3
			s.orders = append(s.orders, cancelled(904, 4), refunded(905, 5))
			s.index()
		}, (*sale).noOversell, nil},
		{"I2 two orders", func(s *sale) {
			s.orders = append(s.orders, paid(904, 3))
			s.index()
		}, (*sale).oneOrderPerBuyer, []string{"I2: user 3 holds 2 live orders"}},
		{"I2 a cancelled order beside a live one", func(s *sale) {
			s.orders = append(s.orders, cancelled(904, 3), refunded(905, 3))
			s.index()
		}, (*sale).oneOrderPerBuyer, nil},
		{"I3 missing and misattributed", func(s *sale) {
			s.in.Accepted = map[int64]int64{901: 1, 902: 5, 905: 4, 906: 6}
			s.dead = []row{{906, 6}}
		}, (*sale).acceptedWritten, []string{
			"I3: accepted order 905 (user 4) is not in the database",
			"I3: order 902 was accepted for user 5 but written for user 2",
		}},
		{"I4 never accepted and refused", func(s *sale) {
			s.in.Accepted = map[int64]int64{901: 1}
			s.in.Unsure = []int64{3}
			s.in.Refused = []int64{2, 9}
		}, (*sale).nothingUnaccepted, []string{
			"I4: order 902 (user 2) was never accepted", "I4: refused user 2 holds an order",
		}},
		{"I5 Redis disagrees", func(s *sale) {
			s.r.DBStock, s.r.RedisStock = 1, 3
			s.redisBuyers = map[string]string{"1": "901", "2": "999"}
		}, (*sale).conserved, []string{
			"I5: Redis has 2 buyers, the database 3 live orders",
			`I5: Redis names order "" for user 3, the database live order 903`,
			`I5: Redis names order "999" for user 2, the database live order 902`,
			"I5: Redis stock 3 != total stock 5 - live orders 3",
			"I5: total stock 5 != database stock 1 + live orders 3",
		}},
		{"I5 ended orders gave their units back", func(s *sale) {
			// User 3 cancelled 903 and bought again (906); user 4's
			// order expired; the units are back on both sides.
			s.orders = []order{paid(901, 1), paid(902, 2), cancelled(903, 3), cancelled(905, 4), paid(906, 3)}
			s.redisBuyers = map[string]string{"1": "901", "2": "902", "3": "906"}
			s.index()
		}, (*sale).conserved, nil},
		{"I5 an ended order still counted", func(s *sale) {
			// 903 was cancelled, but neither MySQL's stock nor Redis's
			// got its unit back, and Redis still names it.
			s.orders[2] = cancelled(903, 3)
			s.index()
		}, (*sale).conserved, []string{
			"I5: Redis has 3 buyers, the database 2 live orders",
			"I5: Redis stock 2 != total stock 5 - live orders 2",
			"I5: total stock 5 != database stock 2 + live orders 2",
		}},
		{"I5 no Redis state", func(s *sale) { s.r.RedisState, s.r.RedisStock = false, 0 }, (*sale).conserved, []string{
			"I5: no Redis state for the voucher",
		}},
		{"I6 not drained", func(s *sale) {
			s.noGroup, s.r.Pending, s.r.StreamLength, s.r.Delayed, s.indexed = true, 1, 2, 3, 4
		}, (*sale).drained, []string{
			"I6: 1 entries pending in group g", "I6: 2 entries left in the stream",
			"I6: 3 entries waiting in the delay queue", "I6: 4 orders left in the shard's pending-order index",
			"I6: no consumer group g on the stream",
		}},
		{"I7 both", func(s *sale) { s.dead = []row{{902, 2}, {907, 7}} }, (*sale).endedOnce, []string{
			"I7: order 902 is both an order and a dead letter",
		}},
		{"I8 every state as written", func(s *sale) {
			s.orders = []order{awaiting(901, 1), paid(902, 2), used(903, 3), cancelled(904, 4), refunded(905, 5)}
		}, (*sale).statesHold, nil},
		{"I8 inconsistent states", func(s *sale) {
			both := cancelled(904, 4)
			both.PaidAt, both.UsedAt = true, true
			unpaid := used(903, 3)
			unpaid.PaidAt = false
			stillLive := refunded(905, 5)
			stillLive.Live, stillLive.LiveSet, stillLive.PaidAt = true, true, false
			noDeadline := awaiting(906, 6)
			noDeadline.PayDeadline, noDeadline.UnitBackAt = false, true
			odd := cancelled(907, 7)
			odd.CancelReason = "bored"
			gone := paid(908, 8)
			gone.Live, gone.LiveSet = false, false
			s.orders = []order{both, unpaid, stillLive, noDeadline, odd, gone, {ID: 909, UserID: 9, Status: "created", Live: true, LiveSet: true}}
		}, (*sale).statesHold, []string{
			"I8: awaiting_payment order 906 (user 6) has no pay_deadline",
			"I8: awaiting_payment order 906 (user 6) has unit_back_at",
			"I8: cancelled order 904 (user 4) has paid_at",
			"I8: cancelled order 904 (user 4) has used_at",
			`I8: cancelled order 907 (user 7) has cancel_reason "bored"`,
			`I8: order 909 (user 9) is in unknown state "created"`,
			"I8: paid order 908 (user 8) is not live",
			"I8: refunded order 905 (user 5) has no paid_at",
			"I8: refunded order 905 (user 5) is still live",
			"I8: used order 903 (user 3) has no paid_at",
		}},
		{"I8 named ten, then counted", func(s *sale) {
			s.orders = nil
			for i := range int64(12) {
				o := paid(910+i, 10+i)
				o.PaidAt = false
				s.orders = append(s.orders, o)
			}
		}, func(s *sale) {
			s.statesHold()
			n := len(s.r.Violations)
			s.r.Violations = []string{fmt.Sprintf("%d reported, the last %q", n, s.r.Violations[n-1])}
		}, []string{`11 reported, the last "I8: ... 12 state violations in all"`}},
		{"I9 units back", func(s *sale) {
			s.orders = append(s.orders, cancelled(904, 4), refunded(905, 5))
		}, (*sale).unitsReturned, nil},
		{"I9 units not back", func(s *sale) {
			lost := cancelled(904, 4)
			lost.UnitBackAt = false
			s.orders = append(s.orders, lost, refunded(905, 5))
			s.redisBuyers["5"] = "905"
		}, (*sale).unitsReturned, []string{
			"I9: cancelled order 904 (user 4) did not give its unit back to Redis (no unit_back_at)",
			"I9: refunded order 905 (user 5) still holds Redis's buyer entry of user 5",
		}},
		{"I10 payments match", func(s *sale) {
			s.orders = append(s.orders, cancelled(904, 4), cancelled(905, 5), refunded(906, 6), cancelled(907, 7))
			// 7 and 8: paid twice (the second needs a refund, then refunded).
			s.payments = []payment{{1, 901, "succeeded"}, {2, 904, "needs_refund"}, {3, 905, "refunded"}, {4, 906, "needs_refund"}, {5, 906, "refunded"}, {6, 907, "created"},
				{7, 901, "needs_refund"}, {8, 901, "refunded"}}
			s.index()
		}, (*sale).paymentsMatch, nil},
		{"I10 payments at odds", func(s *sale) {
			s.orders = append(s.orders, cancelled(904, 4), awaiting(905, 5), refunded(906, 6))
			s.payments = []payment{{1, 904, "succeeded"}, {2, 905, "succeeded"}, {3, 905, "needs_refund"}, {4, 901, "succeeded"}, {5, 901, "succeeded"}, {6, 905, "refunded"},
				{7, 906, "succeeded"}}
			s.index()
		}, (*sale).paymentsMatch, []string{
			"I10: payment 1 succeeded but its order 904 is cancelled",
			"I10: payment 2 succeeded but its order 905 is awaiting_payment",
			"I10: payment 3 is needs_refund but its order 905 is awaiting_payment",
			"I10: payments 4 and 5 both paid order 901",
			"I10: payment 6 is refunded but its order 905 is awaiting_payment",
			"I10: payment 7 succeeded but its order 906 is refunded",
		}},
		{"I11 counters agree", func(s *sale) {
			s.orders = append(s.orders, cancelled(904, 4))
			s.orders[0].Amount, s.orders[3].Amount = 300, 300
			// Spread over slots as the writer and the lifecycle keep them;
			// a slot of nothing left is no count.
			s.counted = []counter{{Paid, "", 3, 300}, {Cancelled, "expired", 1, 300}, {Used, "", 0, 0}}
		}, (*sale).countsAgree, nil},
		{"I11 counters disagree", func(s *sale) {
			s.orders = append(s.orders, cancelled(904, 4))
			s.orders[0].Amount = 300
			s.counted = []counter{{Paid, "", 3, 0}, {Cancelled, "buyer", 1, 0}, {Refunded, "", -1, 0}}
		}, (*sale).countsAgree, []string{
			"I11: the counters hold 3 paid orders amounting to 0, the orders are 3 amounting to 300",
			"I11: the counters hold 1 cancelled (buyer) orders amounting to 0, the orders are 0 amounting to 0",
			"I11: the counters hold 0 cancelled (expired) orders amounting to 0, the orders are 1 amounting to 0",
			"I11: the counters hold -1 refunded orders amounting to 0, the orders are 0 amounting to 0",
		}},
	} {
		s := healthy()
		c.change(s)
		c.check(s)
		slices.Sort(s.r.Violations)
		slices.Sort(c.want)
		if !slices.Equal(s.r.Violations, c.want) {
			t.Errorf("%s: violations %q, want %q", c.name, s.r.Violations, c.want)
		}
	}
}

// The orders of each state, written as the order writer writes them.
func awaiting(id, user int64) order {
	return order{ID: id, UserID: user, Status: AwaitingPayment, Live: true, LiveSet: true, PayDeadline: true}
}

func paid(id, user int64) order {
	return order{ID: id, UserID: user, Status: Paid, Live: true, LiveSet: true, PaidAt: true}
}

func used(id, user int64) order {
	o := paid(id, user)
	o.Status, o.UsedAt = Used, true
	return o
}

func cancelled(id, user int64) order {
	return order{ID: id, UserID: user, Status: Cancelled, PayDeadline: true, CancelledAt: true, CancelReason: "expired", UnitBackAt: true}
}

func refunded(id, user int64) order {
	o := paid(id, user)
	o.Status, o.Live, o.LiveSet, o.RefundedAt, o.UnitBackAt = Refunded, false, false, true, true
	return o
}
