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

// TestExpectTheDatabaseOrderFirst: a buyer with an order in the database
// and another in flight (bought again after Redis lost the first) keeps
// the database's order: the one in flight is refused when written (one
// order per buyer and voucher). Only buyers without a database order
// count as in flight, and a dead-lettered order in flight holds nothing.
func TestExpectTheDatabaseOrderFirst(t *testing.T) {
	t.Parallel()
	w := &Warmer{ledger: ledgerOf{buyers: map[int64]int64{7: 100}, dead: map[int64]bool{400: true}}}
	flying := inFlight{5: {7: {200}, 8: {300}, 9: {400}}}
	e, err := w.expect(context.Background(), Voucher{ID: 5, TotalStock: 10}, flying)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.buyers) != 2 || e.buyers[7] != 100 || e.buyers[8] != 300 {
		t.Errorf("buyers %v, want user 7 with the database's order 100 and user 8 with 300", e.buyers)
	}
	if e.flying != 1 || e.stock != 8 {
		t.Errorf("%d in flight and stock %d, want 1 and 8", e.flying, e.stock)
	}
}
