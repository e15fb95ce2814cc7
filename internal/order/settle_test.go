package order

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

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

// TestSettleTakesOverRepurchase: after Redis restarted empty and was
// rebuilt while a worker held buyer 7's order 2001, the buyer bought again
// (order 2002 accepted). The database keeps one of the two as the order,
// the other becomes a duplicate_buyer dead letter, and Redis ends agreeing
// with it: one unit taken, the buyer entry naming the written order,
// nothing pending. Whichever is written first, alone or in one batch.
func TestSettleTakesOverRepurchase(t *testing.T) {
	t.Parallel()
	const held, again = 2001, 2002
	for _, tc := range []struct {
		name    string
		batches [][]int64 // order ids, as handed to the writer
		written int64     // the one that ends as the order
		// rebuilt: the shard is rebuilt again after the repurchase, from
		// the database and the pending index.
		rebuilt bool
	}{
		{"held order first", [][]int64{{held}, {again}}, held, false},
		{"repurchase first", [][]int64{{again}, {held}}, again, false},
		{"one batch, held order first", [][]int64{{held, again}}, held, false},
		{"one batch, repurchase first", [][]int64{{again, held}}, again, false},
		{"rebuilt, then held order first", [][]int64{{held}, {again}}, held, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newWriterEnv(t)
			ctx := context.Background()
			v := e.voucher(t, 10)
			stateEnv(t, e, v, 10, nil) // rebuilt: knows nothing of order 2001
			if _, err := voucher.NewReserver(e.rdb, e.keys).Reserve(ctx, v, 7, again); err != nil {
				t.Fatal(err)
			}
			if tc.rebuilt {
				if err := e.rdb.Del(ctx, e.keys.Ready(0)).Err(); err != nil {
					t.Fatal(err)
				}
				warmer := voucher.NewWarmer(voucher.NewStore(e.db), voucher.NewState(e.rdb, e.keys), NewStore(e.db), e.keys, time.Hour, slog.New(slog.DiscardHandler))
				if _, err := warmer.Warm(ctx); err != nil {
					t.Fatal(err)
				}
				if stock, buyers := redisStock(t, e, v); stock != 9 || buyers["7"] != strconv.Itoa(again) {
					t.Fatalf("rebuilt: redis stock %d buyers %v; want 9 and buyer 7 -> %d", stock, buyers, again)
				}
			}
			n := 0
			for _, ids := range tc.batches {
				var batch []mq.Message
				for _, id := range ids {
					n++
					batch = append(batch, msg(n, id, 7, v))
				}
				for _, o := range handle(t, e.w, batch) {
					if o != mq.Ack {
						t.Fatalf("outcome %v, want Ack", o)
					}
				}
			}
			if s, o, d := e.counts(t, v); s != 9 || o != 1 || d != 1 {
				t.Fatalf("stock %d orders %d dead %d; want 9 1 1", s, o, d)
			}
			if _, err := NewStore(e.db).Get(ctx, tc.written); err != nil {
				t.Fatalf("order %d: %v", tc.written, err)
			}
			stock, buyers := redisStock(t, e, v)
			if stock != 9 || len(buyers) != 1 || buyers["7"] != strconv.FormatInt(tc.written, 10) {
				t.Fatalf("redis stock %d buyers %v; want 9 and buyer 7 -> %d", stock, buyers, tc.written)
			}
			if n, err := e.rdb.HLen(ctx, e.keys.Pending(0)).Result(); err != nil || n != 0 {
				t.Fatalf("%d orders still pending (%v), want 0", n, err)
			}
			_, err := voucher.NewReserver(e.rdb, e.keys).Reserve(ctx, v, 7, 2003)
			if p := (*voucher.PurchasedError)(nil); !errors.As(err, &p) || p.OrderID != tc.written {
				t.Fatalf("buyer 7 buys a third time: %v, want already purchased (order %d)", err, tc.written)
			}
		})
	}
}

// TestSettleNeverTakesStockBelowZero: after a failover lost buyer 7's
// purchase (order 2001, already in a worker's hands), the rebuilt shard
// sold both units of the voucher again (orders 2002 and 2003). When 2001
// is written, the Redis stock is already 0: settling it records the buyer
// but must not take a unit that is not there. The database then refuses
// one of the later orders (out_of_stock, no unit to give back), and Redis
// ends at the database's stock, 0, never below.
func TestSettleNeverTakesStockBelowZero(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v := e.voucher(t, 2)
	stateEnv(t, e, v, 0, map[int64]int64{8: 2002, 9: 2003})
	handle(t, e.w, []mq.Message{msg(1, 2001, 7, v)})
	stock, buyers := redisStock(t, e, v)
	if stock != 0 || buyers["7"] != "2001" {
		t.Fatalf("after settling the lost order: redis stock %d buyers %v; want 0 and buyer 7 -> 2001", stock, buyers)
	}
	handle(t, e.w, []mq.Message{msg(2, 2002, 8, v), msg(3, 2003, 9, v)})
	stock, buyers = redisStock(t, e, v)
	s, o, d := e.counts(t, v)
	if stock != int64(s) || stock != 0 || o != 2 || d != 1 {
		t.Fatalf("redis stock %d buyers %v; database stock %d orders %d dead letters %d; want 0 everywhere, 2 orders, 1 dead letter", stock, buyers, s, o, d)
	}
}
