package order

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestStatusOfAnUnreadableShardIsNotNotFound: on a Redis Cluster an order
// not yet written is looked for in every shard's pending index. While one
// shard's master is down the order may be there: the answer is an error
// (503 at the edge), never "no such order" (404), which would tell a buyer
// who was just answered 202 that their order does not exist.
func TestStatusOfAnUnreadableShardIsNotNotFound(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	keys := voucher.KeysFor(testenv.Prefix(t), 3, true)
	rdb := cl.Client(t)
	h := NewHTTP(NewStore(e.db), nil, rdb, keys, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	const unknown = 424242
	if _, err := h.status(ctx, unknown); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unknown order with every shard up: %v, want ErrNotFound", err)
	}
	// Down: the master of the last shard (the pipeline's error is the
	// first failed command's; shards before it answer "not found").
	down := cl.MasterOf(t, keys.Pending(2))
	for s := range 2 {
		if cl.MasterOf(t, keys.Pending(s)) == down {
			t.Fatalf("shard %d shares shard 2's master", s)
		}
	}
	down.Kill(t)
	if _, err := h.status(ctx, unknown); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("an order looked for while shard 2's master is down: %v, want an error other than not found", err)
	}
}
