package voucher

import (
	"strings"
	"testing"
	"time"
)

// TestCheckPowBits: pow_bits is 0 to MaxPowBits, and only for a voucher
// with a draw (the proof of work is for entering it); the draw shows it
// with its challenge, which names the voucher, the commitment and the
// nonce, from its begin only (when entries open).
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
	v.ID, v.PowBits, v.DrawCommitment, v.DrawPowNonce = 42, 16, DrawCommitment("00ff"), "n0"
	if d := DrawOf(v, v.BeginAt.Add(-time.Millisecond)); d.PowBits != 16 || d.Challenge != "" || !d.OpensAt.Equal(v.BeginAt) {
		t.Fatalf("draw before its begin %+v, want pow_bits 16, no challenge, opens at the begin", d)
	}
	if d := DrawOf(v, v.BeginAt); d.Challenge != "seckill-draw:42:"+DrawCommitment("00ff")+":n0" {
		t.Fatalf("draw at its begin %+v, want the challenge seckill-draw:42:<commitment>:<nonce>", d)
	}
}
