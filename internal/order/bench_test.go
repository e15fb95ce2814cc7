package order

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/db"
	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// BenchmarkWriterBatch writes orders to MySQL with the buyer locks on, in
// batches of the worker's default size and one at a time (and without
// locks, to see their price); orders/s is the figure to compare.
func BenchmarkWriterBatch(b *testing.B) {
	for _, c := range []struct {
		size  int
		locks bool
	}{{1, true}, {100, true}, {100, false}} {
		b.Run(fmt.Sprintf("batch=%d/locks=%v", c.size, c.locks), func(b *testing.B) {
			size := c.size
			e := newWriterEnv(b)
			if c.locks {
				// As many connections as the service has: a batch takes
				// its locks all at once.
				opts, err := redis.ParseURL(testenv.RedisURL(b))
				if err != nil {
					b.Fatal(err)
				}
				opts.PoolSize = 256
				node := redis.NewClient(opts)
				b.Cleanup(func() { node.Close() })
				locks := NewLocks([]redis.UniversalClient{node}, 10*time.Second, slog.New(slog.DiscardHandler))
				e.w = NewWriter(e.db, e.rdb, e.keys, WriterConfig{Locks: locks, KeyPrefix: e.keys.Prefix()}, slog.New(slog.DiscardHandler))
			}
			v := e.voucher(b, 1<<30)
			ctx := context.Background()
			next := int64(1)
			b.ResetTimer()
			for written := 0; written < b.N; {
				n := min(size, b.N-written)
				batch := make([]mq.Message, n)
				for i := range batch {
					m := voucher.Message{OrderID: next, UserID: next, VoucherID: v, AcceptedAt: time.Now()}
					batch[i] = mq.Message{Stream: "s", ID: "1-" + strconv.FormatInt(next, 10), Values: m.Encode()}
					next++
				}
				if _, err := e.w.Handle(ctx, batch); err != nil {
					b.Fatal(err)
				}
				written += n
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "orders/s")
		})
	}
}

// BenchmarkPayAtOnce pays written orders of one voucher from 64 callers at
// once on MariaDB, each its own order: what a sale's buyers do when the
// pay window opens. Every payment adds to the voucher's order counters;
// pays/s is the figure to compare (with slotOf returning one slot for
// every order, every payment queues on the voucher's one counter row of
// each state; with the counters' save left out of DoTx, payments without
// counters).
func BenchmarkPayAtOnce(b *testing.B) {
	g, err := db.OpenMySQL(testenv.MySQLDSN(b), 64)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close(g) })
	ctx := context.Background()
	if _, err := schema.Apply(ctx, g); err != nil {
		b.Fatal(err)
	}
	rdb := testenv.Redis(b)
	keys := voucher.NewKeys(testenv.Prefix(b), 1)
	if err := voucher.NewState(rdb, keys).MarkReady(ctx, 0); err != nil {
		b.Fatal(err)
	}
	v := voucher.Voucher{Title: "t", FaceValue: 5000, Price: 1990, TotalStock: 1 << 30, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
		b.Fatal(err)
	}
	w := NewWriter(g, rdb, keys, WriterConfig{PayWindow: time.Hour}, slog.New(slog.DiscardHandler))
	for next := int64(1); next <= int64(b.N); {
		batch := make([]mq.Message, 0, 300)
		for ; next <= int64(b.N) && len(batch) < 300; next++ {
			m := voucher.Message{OrderID: next, UserID: next, VoucherID: v.ID, AcceptedAt: time.Now()}
			batch = append(batch, mq.Message{Stream: "s", ID: "1-" + strconv.FormatInt(next, 10), Values: m.Encode()})
		}
		if _, err := w.Handle(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	life := NewLifecycle(g, rdb, keys, LifecycleConfig{}, slog.New(slog.DiscardHandler))
	var order atomic.Int64
	b.SetParallelism(64 / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := life.Do(ctx, Pay, order.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pays/s")
}
