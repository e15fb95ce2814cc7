package bucket

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestRebalance: passes move stock from the richest bucket to the
// poorest until no bucket holds less than half of another's; a voucher
// with no state in Redis is skipped; a list that fails is an error.
func TestRebalance(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 100, 0, 0)
	ctx := context.Background()
	live := func(context.Context) ([]Live, error) { return []Live{{ID: 999, NB: 3}, {ID: e.v, NB: e.nb}}, nil }
	r := NewRebalancer(e.mover(Config{}), live)
	for range 10 {
		if err := r.Once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s := e.stocks()
	lo, hi := min(s[0], s[1], s[2]), max(s[0], s[1], s[2])
	if lo*2 < hi {
		t.Errorf("stocks %v after 10 passes, want within a factor of 2", s)
	}
	e.settled()

	broken := NewRebalancer(e.mover(Config{}), func(context.Context) ([]Live, error) { return nil, errors.New("down") })
	if err := broken.Once(ctx); err == nil {
		t.Error("Once with the list down = nil")
	}
}

// TestRebalanceLeavesTheLastUnit: one unit against none is no imbalance
// to move (half the gap is no unit): the pass moves nothing, fails
// nothing, and reports what it read.
func TestRebalanceLeavesTheLastUnit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, 0, 0)
	ctx := context.Background()
	r := NewRebalancer(e.mover(Config{}), func(context.Context) ([]Live, error) { return []Live{{ID: e.v, NB: e.nb}}, nil })
	var seen map[int64][]int64
	r.Report(func(p Pass) { seen = p.Stocks })
	if err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{1, 0, 0}) {
		t.Errorf("stocks %v, want [1 0 0]", got)
	}
	if !slices.Equal(seen[e.v], []int64{1, 0, 0}) {
		t.Errorf("reported %v, want the stocks read", seen)
	}
}
