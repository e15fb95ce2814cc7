package verify

import (
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
		s.orders = []row{{901, 1}, {902, 2}, {903, 3}}
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
			"I1: 3 orders for a stock of 2", "I1: database stock is -1", "I1: Redis stock is -1",
		}},
		{"I2 two orders", func(s *sale) {
			s.orders = append(s.orders, row{904, 3})
			s.index()
		}, (*sale).oneOrderPerBuyer, []string{"I2: user 3 holds 2 orders"}},
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
			"I5: Redis has 2 buyers, the database 3 orders",
			`I5: Redis names order "" for user 3, the database 903`,
			`I5: Redis names order "999" for user 2, the database 902`,
			"I5: Redis stock 3 != database stock 1",
			"I5: total stock 5 != database stock 1 + orders 3",
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
