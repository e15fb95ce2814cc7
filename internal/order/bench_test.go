package order

import (
	"context"
	"strconv"
	"testing"
	"time"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// BenchmarkWriterBatch writes orders to MySQL in batches of the worker's
// default size and one at a time; orders/s is the figure to compare.
func BenchmarkWriterBatch(b *testing.B) {
	for _, size := range []int{1, 100} {
		b.Run("batch="+strconv.Itoa(size), func(b *testing.B) {
			e := newWriterEnv(b)
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
