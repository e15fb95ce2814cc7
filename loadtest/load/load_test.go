package load

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"
)

func TestScheduleEveryBuyerPresses(t *testing.T) {
	t.Parallel()
	s := schedule(2000, 5000, 1, 0, false)
	seen := map[int32]int{}
	for _, u := range s {
		if u < 0 || u >= 2000 {
			t.Fatalf("buyer %d out of range", u)
		}
		seen[u]++
	}
	if len(s) != 5000 || len(seen) != 2000 {
		t.Fatalf("%d purchases by %d buyers, want 5000 by 2000", len(s), len(seen))
	}
	// Fewer purchases than buyers: each a different buyer.
	s = schedule(100, 40, 1, 0, false)
	seen = map[int32]int{}
	for _, u := range s {
		seen[u]++
	}
	if len(seen) != 40 {
		t.Fatalf("40 purchases by %d buyers, want 40", len(seen))
	}
	// The same seed, the same order.
	a, b := schedule(50, 80, 7, 0, false), schedule(50, 80, 7, 0, false)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("schedule is not reproducible")
	}
}

// TestSchedulePresses: with presses, every buyer presses exactly that many
// times; with first presses first, no repeat comes before the last buyer's
// first press, so a warm-up of one press per buyer leaves only repeats.
func TestSchedulePresses(t *testing.T) {
	t.Parallel()
	s := schedule(1000, 3000, 1, 3, false)
	seen := map[int32]int{}
	for _, u := range s {
		seen[u]++
	}
	for u := range int32(1000) {
		if seen[u] != 3 {
			t.Fatalf("buyer %d pressed %d times, want 3", u, seen[u])
		}
	}
	if fmt.Sprint(s[:20]) == fmt.Sprint(schedule(1000, 3000, 1, 3, false)[:20]) && s[0] == 0 && s[1] == 0 {
		t.Fatal("presses are not shuffled")
	}

	s = schedule(500, 2000, 1, 0, true)
	first := map[int32]bool{}
	for _, u := range s[:500] {
		first[u] = true
	}
	if len(first) != 500 {
		t.Fatalf("the first 500 purchases came from %d buyers, want every one of the 500", len(first))
	}
	if fmt.Sprint(s[:10]) == fmt.Sprint([]int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Fatal("first presses are not shuffled")
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status int
		code   string
		err    error
		key    string
		kind   kind
	}{
		{202, "", nil, "202 accepted", accepted},
		{409, "sold_out", nil, "409 sold_out", refused},
		{409, "already_purchased", nil, "409 already_purchased", refused},
		{429, "rate_limited", nil, "429 rate_limited", refused},
		{503, "not_ready", nil, "503 not_ready", refused},
		{503, "unavailable", nil, "503 unavailable", indeterminate},
		{502, "bad_gateway", nil, "502 bad_gateway", indeterminate},
		{504, "gateway_timeout", nil, "504 gateway_timeout", indeterminate},
		{0, "", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), "error connection_refused", indeterminate},
		{0, "", fmt.Errorf("read: %w", syscall.ECONNRESET), "error connection_reset", indeterminate},
		{0, "", context.Canceled, "error canceled", indeterminate},
		{0, "", errors.New("odd"), "error other", indeterminate},
	} {
		key, k := classify(c.status, c.code, c.err)
		if key != c.key || k != c.kind {
			t.Errorf("classify(%d, %q, %v) = %q, %d; want %q, %d", c.status, c.code, c.err, key, k, c.key, c.kind)
		}
	}
}

func TestLatencyPercentiles(t *testing.T) {
	t.Parallel()
	d := make([]time.Duration, 100)
	for i := range d {
		d[i] = time.Duration(100-i) * time.Millisecond // 1..100 ms, reversed
	}
	l := latencyOf(d)
	if l.P50 != 50 || l.P90 != 90 || l.P99 != 99 || l.Max != 100 || l.Mean != 50.5 {
		t.Fatalf("latency %+v", l)
	}
	if (latencyOf(nil) != Latency{}) {
		t.Fatal("latency of nothing")
	}
}

// TestRecordFlagsContradictions: a buyer accepted twice, or told it holds
// another order than the one accepted, is a problem the run reports.
func TestRecordFlagsContradictions(t *testing.T) {
	t.Parallel()
	f := &firer{cfg: Config{UserBase: 1000}, ids: buyerIDs(1000, 3, 0, 1), buyers: make([]buyer, 3)}
	f.record(0, accepted, "", 11)
	f.record(0, refused, "already_purchased", 11)
	if p := f.problems(); len(p) != 0 {
		t.Fatalf("consistent answers flagged: %v", p)
	}
	f.record(1, accepted, "", 21)
	f.record(1, accepted, "", 22)
	f.record(2, indeterminate, "bad_gateway", 0)
	f.record(2, refused, "already_purchased", 31)
	f.record(2, refused, "already_purchased", 32)
	if p := f.problems(); len(p) != 2 {
		t.Fatalf("problems %v, want 2", p)
	}
	if b := f.buyers[2]; !b.indeterminate || b.held == 0 {
		t.Fatalf("buyer 2: %+v", b)
	}
}
