package voucher

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestRebuildLeaseExpires: the rebuild lease of an instance that crashed
// mid-rebuild runs out, so another instance rebuilds the shard: it is
// taken with an expiry of rebuildLease, and each voucher replaced under it
// renews that expiry, so a long rebuild keeps it.
func TestRebuildLeaseExpires(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := NewKeys(testenv.Prefix(t), 1)
	st := NewState(rdb, keys)
	w := NewWarmer(nil, st, ledger{}, keys, time.Hour, slog.New(slog.DiscardHandler))
	took, err := w.takeRebuildLease(ctx, 0, "crashed")
	if err != nil || !took {
		t.Fatalf("take the lease of a shard without marker: %v, %v", took, err)
	}
	ttl := func() time.Duration {
		t.Helper()
		d, err := rdb.PTTL(ctx, keys.Rebuilding(0)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := ttl(); d <= 0 || d > rebuildLease {
		t.Fatalf("the lease expires in %v, want within %v", d, rebuildLease)
	}
	// Most of the lease went by; replacing a voucher renews it.
	if err := rdb.PExpire(ctx, keys.Rebuilding(0), time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	v := Voucher{ID: 7, TotalStock: 5, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := st.Replace(ctx, "crashed", rebuildLease, v, 5, nil); err != nil {
		t.Fatal(err)
	}
	if d := ttl(); d <= time.Second || d > rebuildLease {
		t.Fatalf("after a voucher replaced the lease expires in %v, want renewed to %v", d, rebuildLease)
	}
}
