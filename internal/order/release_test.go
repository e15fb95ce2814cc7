package order

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// hookedLedger is the order store as the voucher warmer reads it, with a
// hook that runs right after the rebuild has read the database: what the
// worker does there is what a rebuild must not overwrite.
type hookedLedger struct {
	*Store
	after func()
}

func (l hookedLedger) Reservations(ctx context.Context, voucherID int64) (map[int64]int64, map[int64]bool, error) {
	buyers, dead, err := l.Store.Reservations(ctx, voucherID)
	if l.after != nil {
		l.after()
	}
	return buyers, dead, err
}

// TestReleaseDuringRebuild: a message dead-lettered while its shard is
// rebuilt gives its unit back exactly once, and the rebuild does not put
// the reservation back: whether the dead letter is committed after the
// rebuild read the database (the rebuild counts the order as in flight)
// or before (the rebuild skips it). The writer gives nothing back while
// the shard is not ready; its batch comes again after the rebuild, as the
// consumer delivers a batch whose handler failed again, and gives back
// then. Redis ends with the unit in stock, no buyer entry, nothing
// pending, and agrees with the database.
func TestReleaseDuringRebuild(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// afterRead: the dead letter is committed after the rebuild read
		// the database, else before the rebuild starts.
		afterRead bool
	}{{"letter after the rebuild read", true}, {"letter before the rebuild", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newWriterEnv(t)
			ctx := context.Background()
			v := e.voucher(t, 10)
			stateEnv(t, e, v, 10, nil)
			if _, err := voucher.NewReserver(e.rdb, e.keys).Reserve(ctx, v, 7, 9001); err != nil {
				t.Fatal(err)
			}
			dead := msg(1, 9001, 7, v)
			dead.Deliveries = 99 // its consumers kept dying: delivery_limit, unit given back

			// The worker's first try at the batch, during the rebuild.
			var firstErr error
			first := func() { _, firstErr = e.w.Handle(ctx, []mq.Message{dead}) }

			// Redis was replaced (a failover): the shard is rebuilt.
			if err := e.rdb.Del(ctx, e.keys.Ready(0)).Err(); err != nil {
				t.Fatal(err)
			}
			l := hookedLedger{Store: NewStore(e.db)}
			if tc.afterRead {
				l.after = first
			} else {
				first()
			}
			warmer := voucher.NewWarmer(voucher.NewStore(e.db), voucher.NewState(e.rdb, e.keys), l, e.keys, time.Hour, slog.New(slog.DiscardHandler))
			if _, err := warmer.Warm(ctx); err != nil {
				t.Fatal(err)
			}
			if _, _, d := e.counts(t, v); d != 1 {
				t.Fatalf("%d dead letters committed during the rebuild, want 1", d)
			}
			if firstErr != nil {
				handle(t, e.w, []mq.Message{dead}) // the batch again, after the rebuild
			}
			stock, buyers := redisStock(t, e, v)
			if stock != 10 || len(buyers) != 0 {
				t.Fatalf("redis stock %d buyers %v; want 10 and none (the dead letter's unit given back once)", stock, buyers)
			}
			if !errors.Is(firstErr, errNotReady) {
				t.Fatalf("dead letter handled during the rebuild: %v, want errNotReady (tried again after it)", firstErr)
			}
			handle(t, e.w, []mq.Message{dead}) // once more: a no-op
			if stock, buyers := redisStock(t, e, v); stock != 10 || len(buyers) != 0 {
				t.Fatalf("after a redelivery: redis stock %d buyers %v; want 10 and none", stock, buyers)
			}
			if n, err := e.rdb.HLen(ctx, e.keys.Pending(0)).Result(); err != nil || n != 0 {
				t.Fatalf("%d orders still pending (%v), want 0", n, err)
			}
			if diffs, err := warmer.Reconcile(ctx); err != nil || len(diffs) != 0 {
				t.Fatalf("reconcile: %+v, %v; want no difference", diffs, err)
			}
			// The buyer can buy again.
			if _, err := voucher.NewReserver(e.rdb, e.keys).Reserve(ctx, v, 7, 9002); err != nil {
				t.Fatalf("buyer of a dead letter buys again: %v", err)
			}
		})
	}
}
