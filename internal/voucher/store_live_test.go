package voucher

import (
	"context"
	"slices"
	"testing"
	"time"

	"seckill/internal/testenv"
	schema "seckill/sql"
)

// TestLiveFair: of the vouchers on sale, LiveFair reads those that open
// with a draw; Live reads them all; neither reads an ended one.
func TestLiveFair(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := testenv.DB(t, "sqlite")
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	s := NewStore(g)
	now := time.Now()
	mk := func(fairMs int64, end time.Time) int64 {
		v := Voucher{Title: "v", FaceValue: 1, TotalStock: 1, BeginAt: end.Add(-2 * time.Hour), EndAt: end, FairWindowMs: fairMs, DrawSecret: "s"}
		if err := s.Create(ctx, &v); err != nil {
			t.Fatal(err)
		}
		return v.ID
	}
	plain, fair := mk(0, now.Add(time.Hour)), mk(1000, now.Add(time.Hour))
	mk(1000, now.Add(-time.Minute)) // ended
	ids := func(vs []Voucher, err error) []int64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, v := range vs {
			out = append(out, v.ID)
		}
		return out
	}
	if got := ids(s.LiveFair(ctx, now)); !slices.Equal(got, []int64{fair}) {
		t.Errorf("LiveFair = %v, want [%d]", got, fair)
	}
	if got := ids(s.Live(ctx, now)); !slices.Equal(got, []int64{plain, fair}) {
		t.Errorf("Live = %v, want [%d %d]", got, plain, fair)
	}
}
