package order

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
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
