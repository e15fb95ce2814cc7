package order

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// TestReplayDeadLetter: an order dead-lettered over its attempt limit gave
// its reservation back; an operator replays it, it goes through the
// purchase script with its own id and lands; a second replay reserves
// nothing again.
func TestReplayDeadLetter(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 5)
	st := voucher.NewState(e.rdb, e.keys)
	if err := st.MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	stateEnv(t, e, v, 4, map[int64]int64{7: 1101}) // Redis reserved order 1101 of buyer 7
	m := msg(1, 1101, 7, v)
	m.Deliveries = 99
	handle(t, e.w, []mq.Message{m}) // dead-lettered, reservation given back
	d, err := NewStore(e.db).DeadLetterOf(ctx, 1101)
	if err != nil || d.Reason != ReasonDeliveryLimit {
		t.Fatalf("dead letter %+v, %v", d, err)
	}

	dl := NewDeadLetters(e.db, voucher.NewReserver(e.rdb, e.keys))
	if _, err := dl.Replay(ctx, d.ID); err != nil {
		t.Fatalf("replay: %v", err)
	}
	stock, buyers := redisStock(t, e, v)
	if stock != 4 || buyers["7"] != "1101" {
		t.Fatalf("after replay: redis stock %d buyers %v; want 4 and buyer 7 -> 1101", stock, buyers)
	}
	if _, err := dl.Replay(ctx, d.ID); err != nil {
		t.Fatalf("second replay: %v", err)
	}
	if stock, _ := redisStock(t, e, v); stock != 4 {
		t.Fatalf("a second replay reserved again: stock %d", stock)
	}
	// The worker writes the replayed message: an order now, not a dead
	// letter any more.
	entries, err := e.rdb.XRange(ctx, e.keys.Stream(0), "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("stream after two replays: %d entries, %v; want 1", len(entries), err)
	}
	out := handle(t, e.w, []mq.Message{{Stream: e.keys.Stream(0), ID: entries[0].ID, Values: entries[0].Values, Deliveries: 1}})
	if out[0] != mq.Ack {
		t.Fatalf("outcome %v", out[0])
	}
	if s, o, _ := e.counts(t, v); s != 4 || o != 1 {
		t.Fatalf("stock %d orders %d; want 4 1", s, o)
	}
	// An undecodable dead letter holds nothing to replay.
	bad := mq.Message{Stream: "s", ID: "9-9", Values: map[string]any{"junk": "1"}}
	handle(t, e.w, []mq.Message{bad})
	var row DeadLetter
	if err := e.db.Where("message_id = ?", "9-9").Take(&row).Error; err != nil {
		t.Fatal(err)
	}
	if _, err := dl.Replay(ctx, row.ID); !errors.Is(err, ErrNotReplayable) {
		t.Fatalf("replay of an undecodable message: %v, want ErrNotReplayable", err)
	}
}

// TestReplayDeadLetterKeptByMessage: a dead letter kept without its order
// id (another buyer's dead letter has the id) is replayed with the id
// from its message.
func TestReplayDeadLetterKeptByMessage(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v1, v2 := oneIDTwoBuyers(t, e, 1901)
	handle(t, e.w, []mq.Message{msg(1, 1901, 1, v1)}) // out of stock: holds the id
	over := msg(2, 1901, 2, v2)
	over.Deliveries = 99
	handle(t, e.w, []mq.Message{over}) // kept by its message
	d := deadLetterOf(t, e, 2, v2)
	if d.OrderID != nil || d.Reason != ReasonDeliveryLimit {
		t.Fatalf("dead letter %+v, want delivery_limit without an order id", d)
	}
	if _, err := NewDeadLetters(e.db, voucher.NewReserver(e.rdb, e.keys)).Replay(ctx, d.ID); err != nil {
		t.Fatalf("replay: %v", err)
	}
	if stock, buyers := redisStock(t, e, v2); stock != 9 || buyers["2"] != "1901" {
		t.Fatalf("after replay: redis stock %d buyers %v; want 9 and buyer 2 -> 1901", stock, buyers)
	}
}

// TestReplayStampede: 100 operators replay one dead letter at once: one
// purchase is sent, the reservation taken once, and none of them fails.
func TestReplayStampede(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 5)
	stateEnv(t, e, v, 4, map[int64]int64{7: 1201})
	m := msg(1, 1201, 7, v)
	m.Deliveries = 99
	handle(t, e.w, []mq.Message{m}) // dead-lettered, reservation given back
	d := deadLetterOf(t, e, 7, v)
	dl := NewDeadLetters(e.db, voucher.NewReserver(e.rdb, e.keys))
	start := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 100 {
		wg.Go(func() {
			<-start
			if _, err := dl.Replay(ctx, d.ID); err != nil {
				failed.Add(1)
				t.Log(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d replays failed", failed.Load())
	}
	n, err := e.rdb.XLen(ctx, e.keys.Stream(0)).Result()
	if err != nil || n != 1 {
		t.Fatalf("stream: %d entries (%v), want the one replayed purchase", n, err)
	}
	if stock, buyers := redisStock(t, e, v); stock != 4 || buyers["7"] != "1201" {
		t.Fatalf("redis stock %d buyers %v; want 4 and buyer 7 once", stock, buyers)
	}
}
