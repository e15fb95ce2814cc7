package load

import (
	"math"
	"slices"
	"testing"
)

func TestQuantilesOfNearestRank(t *testing.T) {
	t.Parallel()
	// 1..200 shuffled: the p-quantile is the value at rank round(p*n).
	xs := make([]float64, 200)
	for i := range xs {
		xs[i] = float64((i*77)%200 + 1)
	}
	q := QuantilesOf(xs)
	want := Quantiles{N: 200, Min: 1, P50: 100, P90: 180, P99: 198, Max: 200}
	if q != want {
		t.Fatalf("QuantilesOf(1..200) = %+v, want %+v", q, want)
	}
	if !slices.IsSorted(xs) {
		t.Error("the sample is not sorted in place")
	}
	if q := QuantilesOf([]float64{2.5}); q != (Quantiles{N: 1, Min: 2.5, P50: 2.5, P90: 2.5, P99: 2.5, Max: 2.5}) {
		t.Errorf("one sample: %+v", q)
	}
	if q := QuantilesOf(nil); q != (Quantiles{}) {
		t.Errorf("no sample: %+v", q)
	}
}

func TestMedianTakesTheUpperMiddle(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{9, 1, 5}, 5},
		{[]float64{4, 1, 3, 2}, 3}, // bench's rule: xs[n/2] of the sorted runs
	} {
		if got := Median(slices.Clone(c.in)); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestBurstOrderAlternates(t *testing.T) {
	t.Parallel()
	firsts := map[string]int{}
	for r := range 4 {
		o := burstOrder(r)
		if len(o) != 2 || o[0] == o[1] || !slices.Contains(o, BurstFree) || !slices.Contains(o, BurstPriced) {
			t.Fatalf("round %d runs %v, want one free and one priced burst", r, o)
		}
		if r > 0 && o[0] == burstOrder(r - 1)[0] {
			t.Errorf("rounds %d and %d both start with %s", r-1, r, o[0])
		}
		firsts[o[0]]++
	}
	if firsts[BurstFree] != 2 || firsts[BurstPriced] != 2 {
		t.Errorf("first bursts over 4 rounds: %v, want each kind twice", firsts)
	}
}

func TestExpiryStatsInSeconds(t *testing.T) {
	t.Parallel()
	rows := []struct{ BackUS, CancelUS, WindowUS int64 }{
		{BackUS: 1_500_000, CancelUS: 1_400_000, WindowUS: 5_000_000},
		{BackUS: 250_000, CancelUS: 200_000, WindowUS: 5_000_000},
		{BackUS: 3_000_000, CancelUS: 2_900_000, WindowUS: 5_001_000},
	}
	st := expiryStatsOf(rows, 120_000, 3_120_000)
	if st.Orders != 3 || st.BackLate.P50 != 1.5 || st.BackLate.Max != 3 || st.BackLate.Min != 0.25 {
		t.Errorf("unit back after deadline: %+v", st.BackLate)
	}
	if st.CancelLate.P50 != 1.4 || st.CancelLate.Max != 2.9 {
		t.Errorf("cancelled after deadline: %+v", st.CancelLate)
	}
	if st.DeadlineSpread != 0.12 || st.AllBack != 3.12 || st.Window != 5 {
		t.Errorf("spread %v, all back %v, window %v; want 0.12, 3.12, 5", st.DeadlineSpread, st.AllBack, st.Window)
	}
}

func TestExpirySummariseMediansRatioAndPooledTail(t *testing.T) {
	t.Parallel()
	priced := func(round int, rate float64, back ...float64) Burst {
		return Burst{Round: round, Kind: BurstPriced, Drain: DrainResult{Rate: rate},
			Check: Report{OK: true}, Expiry: &ExpiryStats{back: back}}
	}
	free := func(round int, rate float64) Burst {
		return Burst{Round: round, Kind: BurstFree, Drain: DrainResult{Rate: rate}, Check: Report{OK: true}}
	}
	r := ExpiryResult{Bursts: []Burst{
		free(1, 20000), priced(1, 15000, 0.1, 0.2),
		priced(2, 9000, 0.3, 4), free(2, 18000),
		free(3, 22000), priced(3, 16000, 0.5),
	}}
	r.Summarise()
	if r.FreeDrainRate != 20000 || r.PricedDrainRate != 15000 {
		t.Errorf("medians: free %v, priced %v; want 20000, 15000", r.FreeDrainRate, r.PricedDrainRate)
	}
	if math.Abs(r.DrainRatio-0.75) > 1e-9 {
		t.Errorf("priced / free = %v, want 0.75", r.DrainRatio)
	}
	if r.BackLate.N != 5 || r.BackLate.Max != 4 || r.BackLate.P50 != 0.3 {
		t.Errorf("pooled unit back after deadline: %+v, want 5 samples, p50 0.3, max 4", r.BackLate)
	}
	if !r.OK || len(r.Violations) != 0 {
		t.Errorf("OK %v, violations %v", r.OK, r.Violations)
	}

	r.Bursts[3].Check = Report{OK: false, Violations: []string{"I5: Redis stock 1999 != 2000"}}
	r.Bursts[3].VoucherID = 42
	r.Summarise()
	if r.OK || len(r.Violations) != 1 || r.Violations[0] != "round 2, free voucher 42: I5: Redis stock 1999 != 2000" {
		t.Errorf("a burst's violation: OK %v, %q", r.OK, r.Violations)
	}
}
