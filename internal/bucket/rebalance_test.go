package bucket

import (
	"context"
	"errors"
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
