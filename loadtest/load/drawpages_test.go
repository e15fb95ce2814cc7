package load

import (
	"testing"
	"time"
)

// TestPhasesSplitByTheDraw: a draw round's purchases are split by when
// they were due, against the close, the first status saying done and the
// pages' end; each phase has its count, span and latency.
func TestPhasesSplitByTheDraw(t *testing.T) {
	closes := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return closes.Add(time.Duration(s * float64(time.Second))) }
	obs := []slotLatency{
		{at(-1), 2 * time.Millisecond}, {at(-0.5), 2 * time.Millisecond},
		{at(0.5), 10 * time.Millisecond}, {at(3), 30 * time.Millisecond}, {at(4), 20 * time.Millisecond},
		{at(6), 50 * time.Millisecond},
		{at(12), 3 * time.Millisecond},
	}
	got := phases(obs, closes, DrawFigures{DoneAfter: 5, Seconds: 10})
	want := []struct {
		n        int
		from, to float64
		p99      float64
	}{{2, -1, 0, 2}, {3, 0, 5, 30}, {1, 5, 10, 50}, {1, 10, 12, 3}}
	if len(got) != len(want) {
		t.Fatalf("%d phases, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Purchases != w.n || g.From != w.from || g.To != w.to || g.Latency.P99 != w.p99 {
			t.Errorf("phase %q: %d purchases from %.1fs to %.1fs, p99 %.1f ms; want %d from %.1fs to %.1fs, p99 %.1f ms",
				g.Name, g.Purchases, g.From, g.To, g.Latency.P99, w.n, w.from, w.to, w.p99)
		}
	}
}
