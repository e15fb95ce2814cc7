package voucher

import (
	"strings"
	"testing"
	"time"
)

// TestCheckPowBits: pow_bits is 0 to MaxPowBits, and only for a voucher
// with a draw (the proof of work is for entering it); the draw shows it
// with its challenge, which names the voucher and the commitment.
func TestCheckPowBits(t *testing.T) {
	t.Parallel()
	now := time.Now()
	base := Voucher{Title: "t", FaceValue: 100, TotalStock: 1, BeginAt: now.Add(time.Minute).Truncate(time.Millisecond),
		EndAt: now.Add(time.Hour).Truncate(time.Millisecond), Buckets: 1, FairWindowMs: 1000}
	for _, c := range []struct {
		pow, window int64
		ok          bool
	}{{0, 1000, true}, {16, 1000, true}, {MaxPowBits, 1000, true}, {MaxPowBits + 1, 1000, false}, {-1, 1000, false}, {16, 0, false}, {0, 0, true}} {
		v := base
		v.PowBits, v.FairWindowMs = int(c.pow), c.window
		msg := v.check(now, 1)
		if (msg == "") != c.ok || (!c.ok && !strings.Contains(msg, "pow_bits")) {
			t.Errorf("pow_bits %d, fair_window_ms %d: %q, want ok %v", c.pow, c.window, msg, c.ok)
		}
	}
	v := base
	v.ID, v.PowBits, v.DrawSecret = 42, 16, "00ff"
	d := DrawOf(v, now)
	if d.PowBits != 16 || d.Challenge != "seckill-draw:42:"+DrawCommitment("00ff") {
		t.Fatalf("draw %+v, want pow_bits 16 and the challenge seckill-draw:42:<commitment>", d)
	}
}
