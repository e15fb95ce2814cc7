package voucher

import (
	"context"
	"testing"
)

// ledgerOf is a Ledger of fixed answers: what the database holds.
type ledgerOf struct {
	buyers map[int64]int64
	dead   map[int64]bool
}

func (l ledgerOf) Reservations(context.Context, int64) (map[int64]int64, map[int64]bool, error) {
	b := map[int64]int64{}
	for u, o := range l.buyers {
		b[u] = o
	}
	return b, l.dead, nil
}

// TestExpectNeverBelowZero: a failover lost purchases the rebuilt shard
// then sold again, so the database's orders and the orders in flight
// together hold more units than there are. The rebuild keeps every buyer
// and a stock of 0: the database refuses the extra orders as out of stock
// and gives nothing back, so a negative stock would stay negative.
func TestExpectNeverBelowZero(t *testing.T) {
	w := &Warmer{ledger: ledgerOf{buyers: map[int64]int64{1: 101, 2: 102}}}
	flying := inFlight{5: {3: {103}, 4: {104}}}
	cases := []struct {
		total      int
		wantStock  int64
		wantBuyers int
	}{
		{total: 5, wantStock: 1, wantBuyers: 4},
		{total: 4, wantStock: 0, wantBuyers: 4},
		{total: 2, wantStock: 0, wantBuyers: 4},
	}
	for _, c := range cases {
		e, err := w.expect(context.Background(), Voucher{ID: 5, TotalStock: c.total}, flying)
		if err != nil {
			t.Fatal(err)
		}
		if e.stock != c.wantStock || len(e.buyers) != c.wantBuyers {
			t.Errorf("total %d: stock %d with %d buyers, want %d with %d", c.total, e.stock, len(e.buyers), c.wantStock, c.wantBuyers)
		}
	}
}
