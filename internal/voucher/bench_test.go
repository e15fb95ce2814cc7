package voucher

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// BenchmarkReserveDurability runs the purchase script against a Redis with
// AOF and an fsync per write (appendfsync always, the set-up we ship) and
// against one that persists nothing: the price of losing no accepted
// order when Redis crashes. Compare purchases/s of the two.
func BenchmarkReserveDurability(b *testing.B) {
	for _, mode := range []struct {
		name string
		opt  testenv.RedisOptions
	}{
		{"aof=always", testenv.RedisOptions{AppendOnly: true}},
		{"aof=everysec", testenv.RedisOptions{AppendOnly: true, ExtraArgs: []string{"--appendfsync", "everysec"}}},
		{"persistence=none", testenv.RedisOptions{}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			srv := testenv.StartRedis(b, mode.opt)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
			b.Cleanup(func() { rdb.Close() })
			keys := NewKeys("bench", 1)
			st := NewState(rdb, keys)
			ctx := context.Background()
			v := Voucher{ID: 1, Stock: 1 << 30, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
			if _, err := st.Load(ctx, v, nil); err != nil {
				b.Fatal(err)
			}
			if err := st.MarkReady(ctx, 0); err != nil {
				b.Fatal(err)
			}
			res := NewReserver(rdb, keys)
			var n atomic.Int64
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					if _, err := res.Reserve(ctx, 1, i, i); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "purchases/s")
		})
	}
}

// BenchmarkReserveCoalesce runs many parallel buyers against one Redis
// with coalescing off (one round trip per purchase) and on (one pipeline
// per flush): compare purchases/s and allocs/op. Run the modes alternated
// over several rounds (-count) and compare medians; every mode gets a
// fresh server.
func BenchmarkReserveCoalesce(b *testing.B) {
	for _, mode := range []struct {
		name string
		opt  ReserveOption
	}{
		{"coalesce=off", Coalesce(0)},
		{"coalesce=on", Coalesce(128)},
	} {
		b.Run(mode.name, func(b *testing.B) {
			srv := testenv.StartRedis(b, testenv.RedisOptions{})
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
			b.Cleanup(func() { rdb.Close() })
			keys := NewKeys("bench", 1)
			st := NewState(rdb, keys)
			ctx := context.Background()
			v := Voucher{ID: 1, Stock: 1 << 30, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
			if _, err := st.Load(ctx, v, nil); err != nil {
				b.Fatal(err)
			}
			if err := st.MarkReady(ctx, 0); err != nil {
				b.Fatal(err)
			}
			res := NewReserver(rdb, keys, mode.opt)
			if _, err := res.Reserve(ctx, 1, 1, 1); err != nil { // loads the script
				b.Fatal(err)
			}
			var n atomic.Int64
			n.Store(1)
			b.ReportAllocs()
			b.SetParallelism(64)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					if _, err := res.Reserve(ctx, 1, i, i); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "purchases/s")
			if s := res.CoalesceStats(); s.Flushes > 0 {
				b.ReportMetric(float64(s.Purchases)/float64(s.Flushes), "batch")
			}
		})
	}
}
