package voucher

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestWarmerAnnounces: a Warmer with Announce publishes each shard it
// rebuilds ("r <shard>") and each voucher state it loads into a ready
// shard ("l <voucher>"), so that every instance drops the local refusals
// those made wrong; a rebuild announces its shard, not its vouchers.
func TestWarmerAnnounces(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	e := newRestartEnv(t, rdb, 2, 10, ledger{})
	ctx := context.Background()
	ps := rdb.Subscribe(ctx, e.keys.Events())
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	msgs := ps.Channel()
	w := e.instance(&rebuildLog{})
	w.Announce(NewEvents(rdb, e.keys, slog.New(slog.DiscardHandler)))
	warm(t, w) // nothing in Redis yet: both shards rebuilt
	if err := rdb.Del(ctx, e.keys.State(e.ids[0])).Err(); err != nil {
		t.Fatal(err)
	}
	warm(t, w) // shard 0 ready, its voucher's state missing: loaded
	want := []string{"r 0", "r 1", "l " + strconv.FormatInt(e.ids[0], 10)}
	var got []string
	deadline := time.After(10 * time.Second)
	for len(got) < len(want) {
		select {
		case m := <-msgs:
			got = append(got, m.Payload)
		case <-deadline:
			t.Fatalf("events %q, want %q", got, want)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}
