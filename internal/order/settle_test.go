package order

import (
	"context"
	"errors"
	"testing"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// TestWriterSettlesRedis: an order written after a rebuild of Redis missed
// it (it was in a worker's hands) is recorded in Redis by the writer: the
// buyer is held and the unit taken. While the shard is not ready, the
// writer does not ack and tries again later.
func TestWriterSettlesRedis(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 10)
	// The rebuilt state knows nothing of order 1201.
	stateEnv(t, e, v, 10, nil)
	handle(t, e.w, []mq.Message{msg(1, 1201, 7, v)})
	stock, buyers := redisStock(t, e, v)
	if stock != 9 || buyers["7"] != "1201" {
		t.Fatalf("after settle: redis stock %d buyers %v; want 9 and buyer 7 -> 1201", stock, buyers)
	}
	// Delivered again: nothing changes.
	handle(t, e.w, []mq.Message{msg(1, 1201, 7, v)})
	if stock, _ := redisStock(t, e, v); stock != 9 {
		t.Fatalf("a redelivery settled twice: stock %d", stock)
	}
	// A shard being rebuilt: the batch is written but not acked.
	if err := e.rdb.Del(ctx, e.keys.Ready(0)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.w.Handle(ctx, []mq.Message{msg(2, 1202, 8, v)}); !errors.Is(err, errNotReady) {
		t.Fatalf("handle during a rebuild: %v, want errNotReady", err)
	}
	if err := voucher.NewState(e.rdb, e.keys).MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	handle(t, e.w, []mq.Message{msg(2, 1202, 8, v)})
	if stock, buyers := redisStock(t, e, v); stock != 8 || buyers["8"] != "1202" {
		t.Fatalf("after the rebuild: redis stock %d buyers %v", stock, buyers)
	}
	if s, o, d := e.counts(t, v); s != 8 || o != 2 || d != 0 {
		t.Fatalf("stock %d orders %d dead %d; want 8 2 0", s, o, d)
	}
}

// TestWriterSeesConcurrentCommit: a worker that took over a message while
// its first worker was only stalled must see that worker's commit, not an
// older snapshot: the order ends as one order, never also a dead letter.
func TestWriterSeesConcurrentCommit(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 10)
	late := &item{msg: msg(1, 1301, 9, v)}
	o, err := voucher.Decode(late.msg.Values)
	if err != nil {
		t.Fatal(err)
	}
	late.ord = o
	tx := e.db.WithContext(ctx).Begin(e.w.txOptions())
	defer tx.Rollback()
	fresh, err := e.w.unseen(tx, []*item{late})
	if err != nil || len(fresh) != 1 {
		t.Fatalf("unseen: %v, %v", fresh, err)
	}
	// The other worker writes and commits the same order meanwhile.
	handle(t, e.w, []mq.Message{msg(1, 1301, 9, v)})
	// The stalled worker goes on the careful way: it must find the order.
	if err := e.w.one(tx, late, "m0"); err != nil {
		t.Fatal(err)
	}
	if late.reason != "" {
		t.Fatalf("the stalled worker dead-lettered a written order: %s", late.reason)
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	if s, o, d := e.counts(t, v); s != 9 || o != 1 || d != 0 {
		t.Fatalf("stock %d orders %d dead %d; want 9 1 0", s, o, d)
	}
}
